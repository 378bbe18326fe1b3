"""GPU-free file formats: codec tables, container headers, checksums, images."""
