"""The package's settings: the ``qgpu`` namespace of dask.config, with its defaults in ``qgpu.yaml`` beside this
file. They are read where they act (a worker reads its own, which a local cluster's nanny hands it from the
client's), so ``dask.config.set({"qgpu.lane": False})`` takes effect at the next call. The environment
variables of earlier versions (``QGPU_DASK_CPU`` and the like) are refused by name, with the setting that
replaced each."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import dask.config
import yaml

DEFAULTS = Path(__file__).with_name("qgpu.yaml")
RETIRED = {"QGPU_DASK_CPU": "cpu", "QGPU_DASK_BUDGET": "budget", "QGPU_DASK_WARM_UP": "warm-up", "QGPU_DASK_LANE": "lane",
           "QGPU_DASK_HANDOFF": "handoff", "QGPU_DASK_COPIES": "copies", "QGPU_DASK_DIRECT_READS": "direct-reads"}

dask.config.update_defaults(yaml.safe_load(DEFAULTS.read_text()))


@functools.cache
def check_retired() -> None:
    """RuntimeError naming each environment variable of an earlier version that is set, and its setting now;
    looked at once per process (a refusal is not cached: it is raised again at every read)."""
    found = [f"{name} (now qgpu.{key}: DASK_QGPU__{key.upper().replace('-', '_')}=... or dask.config.set"
             f"({{'qgpu.{key}': ...}}))" for name, key in RETIRED.items() if name in os.environ]
    if found:
        raise RuntimeError("qgpu-dask no longer reads " + "; ".join(found) + ": unset the old variable")


def setting(key: str) -> Any:
    """The value of ``qgpu.<key>`` in force in this process (KeyError naming the known keys otherwise)."""
    check_retired()
    known = dask.config.get("qgpu")
    canonical = dask.config.canonical_name(key, known)
    if canonical not in known:
        raise KeyError(f"no setting qgpu.{key}: the settings are {', '.join(sorted(known))}")
    return known[canonical]


def settings() -> dict[str, Any]:
    """Every ``qgpu`` setting in force in this process."""
    check_retired()
    return {key.replace("_", "-"): value for key, value in dask.config.get("qgpu").items()}
