"""Time-series ptychography across GPUs, fed from residents where they live (see ``reconstruct``)."""

from .reconstruct import Reconstruction, reconstruct

__all__ = ["Reconstruction", "reconstruct"]
