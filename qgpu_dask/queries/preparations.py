"""The phase preparations kept on the owning shard: G(k, Q) of an acquisition's bright-field pixels, and the
direct-ptychography equations prepared from it.

G depends only on the counts and on which detector pixels form the bright
field (the calibrated disk), not on the aberrations, so a second ``ssb`` with
other aberrations costs only the final sum; the direct-ptychography equations
depend on the whole optics and the upsampling, not on the strength. G is about
as large as the dense counts of those pixels (complex64), so the cache is
bounded in bytes (least recently used goes first), its bytes count against
the shard's budget (a load evicts preparations before it is refused), and
``svc.info()`` reports them (``ssb_cache_bytes``).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from .base import Context, Kept


def pixels_key(indices: np.ndarray) -> str:
    """A digest of a bright-field pixel selection."""
    return hashlib.blake2b(np.ascontiguousarray(indices, np.int64).tobytes(), digest_size=16).hexdigest()


class PreparedCache(Kept):
    """Preparations (anything with ``nbytes``) by (acquisition, key), at most half the shard's budget in all."""

    def __init__(self, ctx: Context):
        self.limit = ctx.budget // 2
        self.entries: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.lock = threading.Lock()

    def spare_bytes(self) -> int:
        with self.lock:
            return self.held()

    def held(self) -> int:
        """Bytes of every kept preparation (lock held)."""
        return sum(int(value.nbytes) for value in self.entries.values())

    def get(self, name: str, key: str, make: Callable[[], Any]) -> tuple[Any, bool]:
        """(the preparation ``key`` of ``name``, whether it was made now): made with ``make()`` the first
        time, and kept when it fits."""
        entry = (name, key)
        with self.lock:
            if entry in self.entries:
                self.entries.move_to_end(entry)
                return self.entries[entry], False
        value = make()
        if value.nbytes <= self.limit:
            with self.lock:
                self.entries[entry] = value
                self.shrink(self.limit)
        return value, True

    def retain(self, name: str, prefix: str, keep: str) -> None:
        """Drop the preparations of ``name`` whose key starts with ``prefix`` but not with ``keep``."""
        with self.lock:
            for entry in [e for e in self.entries if e[0] == name and e[1].startswith(prefix) and not e[1].startswith(keep)]:
                del self.entries[entry]

    def shrink(self, limit: int) -> None:
        """Drop the least recently used preparations until at most ``limit`` bytes remain (lock held)."""
        while self.entries and self.held() > limit:
            self.entries.popitem(last=False)

    def release(self, nbytes: int) -> int:
        """Free at least ``nbytes`` (for a load), or everything; the bytes freed."""
        with self.lock:
            before = self.held()
            self.shrink(max(0, before - nbytes))
            return before - self.held()

    def forget(self, name: str) -> None:
        with self.lock:
            for key in [k for k in self.entries if k[0] == name]:
                del self.entries[key]
