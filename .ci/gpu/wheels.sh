#!/usr/bin/env bash
# Here, from the repository root: the wheels the GPU machine lacks, into .whl/ (ignored; the device call
# carries it). The machine has Python 3.12 with numpy, CuPy, h5py, numba, pytest and xdist; it has no Dask,
# Zarr or hdf5plugin. hdf5plugin keeps only the filters the package writes and reads (bitshuffle, LZ4, zstd,
# blosc): its other plugins are 170 MB and the carried tree may hold 64 MiB (their absence is logged at debug level).
#   bash .ci/gpu/wheels.sh            # the package's needs (~14 MB)
#   bash .ci/gpu/wheels.sh --peers    # and the suite's peers with what they need (~29 MB): HyperSpy, RosettaSciIO,
#                                     # LiberTEM, mrcfile, ncempy, emdfile (those the image has are left out)
#   bash .ci/gpu/wheels.sh NAME==V    # and more (one LiberTEM-live receiver at a time: each is ~30 MB)
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64)
peers_too=false
if [ "${1:-}" = "--peers" ]; then peers_too=true; shift; fi
PKGS=(dask==2026.7.1 distributed==2026.7.1 dask-cuda==26.10.0 rapids-dask-dependency==26.10.0
      zarr==3.1.6 numcodecs==0.17.1 donfig google-crc32c partd locket tblib zict tornado platformdirs hdf5plugin==7.1.0 "$@")
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d .whl "${PKGS[@]}" 2>&1 | grep -v '^WARNING: Location' || true
for wheel in .whl/hdf5plugin-*.whl; do
  python3 - "$wheel" <<'PY'
import sys, zipfile
KEEP = ("libh5bshuf", "libh5lz4", "libh5zstd", "libh5blosc.")
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    items = [(i, z.read(i)) for i in z.infolist()
             if "/plugins/" not in i.filename or i.filename.split("/")[-1].startswith(KEEP)]
with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
    for info, data in items:
        if info.filename.endswith("hdf5plugin/_utils.py"):  # the left-out filters are not errors on every import
            data = data.replace(b'logger.error("Cannot initialize filter', b'logger.debug("Cannot initialize filter')
            data = data.replace(b'logger.error(f"Cannot initialize filter', b'logger.debug(f"Cannot initialize filter')
        z.writestr(info, data)
PY
done
if $peers_too; then  # after the package's own, so that one version of each is kept
  peers=$(mktemp -d)
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" -d "$peers" \
    hyperspy==2.5.0 rosettasciio==0.15.0 libertem==0.16.0 mrcfile==1.5.4 ncempy==1.16 emdfile==0.0.16 2>&1 | grep -v '^WARNING' || true
  python3 - "$peers" .ci/gpu/device-packages.txt <<'PY'
import re, shutil, sys
from pathlib import Path
peers, listed = Path(sys.argv[1]), Path(sys.argv[2])
name = lambda wheel: re.split(r"-\d", wheel.name)[0].lower().replace("_", "-")
have = {line.strip().lower() for line in listed.read_text().splitlines() if line.strip() and not line.startswith("#")}
have |= {name(w) for w in Path(".whl").glob("*.whl")}
for wheel in peers.glob("*.whl"):
    if name(wheel) not in have:
        shutil.move(wheel, Path(".whl") / wheel.name)
PY
  rm -rf "$peers"
fi
ls .whl | sed 's/^/  /'
du -sh .whl
