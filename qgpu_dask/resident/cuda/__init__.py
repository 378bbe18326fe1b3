"""CUDA backends of the resident layer: CuPy wrappers around kernels/*.cu, twins of ``resident.cpu``.

Imported only where CuPy is present (see ``qgpu_dask.device``).
"""
