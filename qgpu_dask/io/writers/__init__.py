"""One writer per export format (``io.export`` picks one by the path's suffix): HyperSpy's HDF5 and Zarr
layouts (hyperspy.py), EMD 1.0 as py4DSTEM writes a DataCube (emd.py), and what they share (base.py)."""
