"""Real detectors' stream interfaces, one module each: a source whose ``frames(det_shape, dtype, xp)`` yields
the frames ``svc.ingest`` appends, read on the owning worker straight from the detector's socket."""
