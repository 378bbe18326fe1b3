"""Detector-side helpers: masks for virtual images."""

from . import masks

__all__ = ["masks"]
