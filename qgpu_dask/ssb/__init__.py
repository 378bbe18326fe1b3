"""Phase from the residents: optics, detector calibration, DPC (and, next, parallax and SSB)."""
