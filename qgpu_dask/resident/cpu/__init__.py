"""CPU kernels (NumPy, Numba): the twins of the CUDA kernels."""
