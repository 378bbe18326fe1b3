"""Placement: which shard a new acquisition goes to.

By free budget first (an acquisition goes only where it fits), then spread: a
series is laid evenly across shards so its queries use every GPU, and among
equally used shards the one with the most free memory wins.
"""

from __future__ import annotations

from dask.utils import format_bytes


def free_bytes(state: dict) -> dict[str, int]:
    """Free budget of each shard in a catalog state (budget minus acquisitions it owns or is loading)."""
    free = {a: s["budget"] for a, s in state["shards"].items()}
    for acq in state["acquisitions"].values():
        if acq["owner"] in free and acq["state"] != "lost":
            free[acq["owner"]] -= acq["nbytes"]
    return free


def place(sizes: list[int], state: dict, pinned: str | None = None) -> list[str]:
    """An owner for each acquisition of ``sizes`` bytes, or ValueError naming what does not fit."""
    free = free_bytes(state)
    if not free:
        raise RuntimeError("the cluster has no shards (no workers?)")
    if pinned is not None and pinned not in free:
        raise KeyError(f"no shard on worker {pinned!r} (shards: {', '.join(sorted(free))})")
    count = dict.fromkeys(free, 0)
    owners = []
    for i, size in enumerate(sizes):
        fits = [a for a in ([pinned] if pinned else free) if free[a] >= size]
        if not fits:
            best = max(free, key=free.get)
            where = f"worker {pinned}" if pinned else f"any shard (largest free: {format_bytes(free[best])} on {best})"
            raise ValueError(f"acquisition {i} needs {format_bytes(size)}, more than fits on {where}")
        owner = min(fits, key=lambda a: (count[a], -free[a], a))
        free[owner] -= size
        count[owner] += 1
        owners.append(owner)
    return owners
