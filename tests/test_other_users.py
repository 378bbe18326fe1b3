"""On a machine many people share, another user (a process under another uid, started by the test) can read no
result and no node-local copy of ours; a copies folder that another user made first is refused. The lane's
refusal of another user is in tests/test_lane.py. Needs root (to run a process as ``nobody``), as CI has."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import dask.config
import numpy as np
import pytest

from qgpu_dask.queries.results import SEGMENT_BYTES, SHM, memory_of, result_array
from qgpu_dask.service.shard import copies

NOBODY = 65534
PYTHON = shutil.which("python3", path="/usr/bin:/bin")
as_root = pytest.mark.skipif(os.getuid() != 0 or PYTHON is None, reason="needs root and /usr/bin/python3 to run a process as nobody")


def as_nobody(code: str) -> str:
    """What ``code`` prints, run by /usr/bin/python3 as uid nobody."""
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, user=NOBODY, group=NOBODY, cwd="/", timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def readable_by_nobody(path: str) -> str:
    return as_nobody(f"""
try:
    open({path!r}, "rb").read(1)
    print("read")
except PermissionError:
    print("refused")
except FileNotFoundError:
    print("missing")
""")


@as_root
def test_another_user_cannot_read_a_result():
    out = result_array((SEGMENT_BYTES // 8 + 1,), np.float64)
    out[:] = 7
    segment = str(SHM / memory_of(out).name)
    assert segment.startswith("/dev/shm/qgpu-result-") and os.stat(segment).st_mode & 0o077 == 0
    assert readable_by_nobody(segment) == "refused"


@pytest.fixture
def open_folder():
    """A folder anyone may enter (pytest's tmp_path is root's alone, which would hide what is tested)."""
    where = Path(tempfile.mkdtemp(prefix="qgpu-others-", dir="/tmp"))
    os.chmod(where, 0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


@as_root
def test_copies_are_in_a_folder_of_ours_alone(open_folder, monkeypatch):
    tmp_path = open_folder
    chosen = tmp_path / "chosen"
    with dask.config.set({"qgpu.copies": str(chosen)}):
        path = copies.room_for("scan", 10, ".qgpu")
    assert path is not None and path.parent == chosen and chosen.stat().st_mode & 0o777 == 0o700
    path.write_bytes(b"counts")
    os.chmod(path, 0o644)  # even a file others could read is out of their reach in the folder
    assert readable_by_nobody(str(tmp_path / "absent")) == "missing"  # nobody may enter the folder above: the refusal is the copies folder's
    assert readable_by_nobody(str(path)) == "refused"

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the default folder, <tmp>/qgpu-dask-copies-<uid>
    default = tmp_path / f"qgpu-dask-copies-{os.getuid()}"
    default.mkdir(mode=0o755)
    with dask.config.set({"qgpu.copies": ""}):
        assert copies.room_for("scan", 10, ".qgpu").parent == default
        assert default.stat().st_mode & 0o777 == 0o700  # ours, opened to others: closed again
        os.chown(default, NOBODY, NOBODY)  # another user's, made before us
        assert copies.room_for("scan", 10, ".qgpu") is None
