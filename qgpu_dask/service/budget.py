"""A shard's memory budget: what its residents, loads under way and kept query state hold, and the refusal
of an allocation that would not fit, before anything is allocated."""

from __future__ import annotations

import threading

from dask.utils import format_bytes

from ..device import device_info, free_cached_memory
from ..queries.base import Kept
from ..resident import Resident
from .errors import OverBudget


class Budget:
    """``limit`` bytes for the residents of one shard, what loads have reserved, and what its queries keep
    (kept spare bytes make room before a refusal)."""

    def __init__(self, limit: int, address: str, kind: str, residents: dict[str, Resident], kept: dict[str, Kept]):
        self.limit = limit
        self.address = address
        self.kind = kind
        self.residents = residents
        self.kept = kept
        self.reserved = 0
        self.lock = threading.Lock()  # loads reserve more from their threads while the event loop admits and ends others

    def held_bytes(self) -> int:
        """Bytes held by residents, loads under way and what queries keep until dropped."""
        residents, kept = list(self.residents.values()), list(self.kept.values())  # taken at once: loads ask from their threads
        return sum(r.nbytes for r in residents) + self.reserved + sum(k.held_bytes() for k in kept)

    def spare_bytes(self) -> int:
        return sum(k.spare_bytes() for k in list(self.kept.values()))

    def free_bytes(self) -> int:
        """Bytes not held (what queries keep to spare makes room when asked, so it counts as free)."""
        return max(self.limit - self.held_bytes(), 0)

    def check_room(self, what_needs: str, nbytes: int) -> None:
        """OverBudget ("<what_needs> <bytes>, but ...") if ``nbytes`` more do not fit beside what is held
        (what queries keep to spare makes room first)."""
        short = nbytes - (self.limit - self.held_bytes() - self.spare_bytes())
        for kept in list(self.kept.values()):
            if short > 0:
                short -= kept.release(short)
        free = self.limit - self.held_bytes() - self.spare_bytes()
        if nbytes > free:
            raise OverBudget(f"{what_needs} {format_bytes(nbytes)}, but the shard on {self.address} has "
                             f"{format_bytes(max(free, 0))} free of its {format_bytes(self.limit)} budget")

    def admit(self, name: str, nbytes: int) -> None:
        """Reserve ``nbytes`` for a new resident ``name``, or refuse before anything is allocated."""
        if name in self.residents:
            raise ValueError(f"an acquisition named {name!r} is already resident on {self.address}")
        with self.lock:
            self.check_room(f"acquisition {name!r} needs", nbytes)
            if self.kind == "cuda":
                device_free = device_info().free_bytes
                if nbytes > 0.95 * device_free:  # CuPy's cached blocks (freed batches and payload room) go back first
                    free_cached_memory()
                    device_free = device_info().free_bytes
                if nbytes > 0.95 * device_free:
                    raise OverBudget(
                        f"acquisition {name!r} needs {format_bytes(nbytes)}, but the GPU of {self.address} has only "
                        f"{format_bytes(device_free)} free (shared with other processes?)"
                    )
            self.reserved += nbytes

    def reserve_more(self, what_needs: str, nbytes: int) -> None:
        """Reserve ``nbytes`` more for a load under way (``what_needs`` as in :meth:`check_room`), or refuse."""
        with self.lock:
            self.check_room(what_needs, nbytes)
            self.reserved += nbytes

    def unreserve(self, nbytes: int) -> None:
        with self.lock:
            self.reserved -= nbytes
