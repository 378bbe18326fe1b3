"""Numba's compiled code: where it is cached, and what this process is compiling now.

Every kernel is ``numba.njit(cache=True)``; Numba writes its cache next to the source by default
(``__pycache__`` in site-packages, often read-only or shared), so the package sets ``NUMBA_CACHE_DIR``
to a folder of the user's cache (:func:`use_user_cache`, as it is imported, before any kernel is): the
first process on a machine compiles, later ones (and their worker processes, which inherit the variable)
load. A user's own ``NUMBA_CACHE_DIR`` is kept. :func:`compiling` names the kernel a compile is under way
for, so a call that waits for one can say so; :func:`one_at_a_time` lets the processes of a machine that
start together (a node's workers) compile in turn, each after the first loading what it cached.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numba.core.config
import numba.core.event
from platformdirs import user_cache_dir

APP = "qgpu-dask"


def cache_folder() -> Path:
    """Where Numba caches compiled kernels: ``NUMBA_CACHE_DIR`` where set, else ``numba`` in qgpu-dask's
    folder of the user cache (``$XDG_CACHE_HOME/qgpu-dask/numba``, ``~/.cache/qgpu-dask/numba`` on Linux)."""
    return Path(os.environ.get("NUMBA_CACHE_DIR") or Path(user_cache_dir(APP, appauthor=False)) / "numba")


def use_user_cache() -> Path:
    """Set ``NUMBA_CACHE_DIR`` to :func:`cache_folder` unless the user set it, and have Numba read it
    (kernels defined afterwards cache there); the folder."""
    folder = cache_folder()
    os.environ["NUMBA_CACHE_DIR"] = str(folder)
    numba.core.config.reload_config()
    return folder


@contextlib.contextmanager
def one_at_a_time() -> Iterator[None]:
    """Held by one process of the machine at a time (a lock file in :func:`cache_folder`): work that compiles
    many kernels, done under it by several processes, is compiled once and loaded from the cache by the rest."""
    folder = cache_folder()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "compiling.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        yield


class Compiles(numba.core.event.Listener):
    """Numba's compile events of this process: the kernels being compiled in each thread, outermost first
    (a kernel compiles the kernels it calls within its own compile)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.active: dict[int, list[str]] = {}

    def on_start(self, event: numba.core.event.Event) -> None:
        with self.lock:
            self.active.setdefault(threading.get_ident(), []).append(event.data["dispatcher"].py_func.__qualname__)

    def on_end(self, event: numba.core.event.Event) -> None:
        with self.lock:
            names = self.active.get(threading.get_ident())
            if names:
                names.pop()
            if not names:
                self.active.pop(threading.get_ident(), None)

    def now(self) -> str | None:
        """The kernel the oldest compile under way is for, or None."""
        with self.lock:
            return next((names[0] for names in self.active.values() if names), None)


COMPILES = Compiles()
numba.core.event.register("numba:compile", COMPILES)


def compiling() -> str | None:
    """The name of the kernel this process is compiling now (a cache load is no compile), or None."""
    return COMPILES.now()
