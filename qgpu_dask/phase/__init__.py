"""Phase from the residents: optics, detector calibration and DPC, parallax, the aberration fit, SSB and
regularized direct ptychography."""
