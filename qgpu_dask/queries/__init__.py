"""Queries: one module per query type, each holding its client half (check, assemble) and its owner half
(run on the shard), registered by name (``base``); importing this package registers every built-in."""

from . import calibration, direct, fit, functions, parallax, ptycho, reductions, sideband, udf, virtual_images
from .base import Context, Kept, Query, lookup, register

__all__ = ["Context", "Kept", "Query", "calibration", "direct", "fit", "functions", "lookup", "parallax", "ptycho",
           "reductions", "register", "sideband", "udf", "virtual_images"]
