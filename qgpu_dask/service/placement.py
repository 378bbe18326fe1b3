"""Placement: which shard a new acquisition goes to.

By free budget first (an acquisition goes only where it fits; shards sharing a
GPU share its memory), then spread: a series is laid evenly across shards so
its queries use every GPU, and among equally used shards the one with the most
free memory wins.
"""

from __future__ import annotations

from dask.utils import format_bytes

from .errors import OverBudget


def holders(entry: dict) -> list[str]:
    """The shards whose memory an acquisition takes: its owner (unless lost) and a re-home or move target."""
    return ([entry["owner"]] if entry["state"] != "lost" else []) + ([entry["target"]] if entry.get("target") else [])


def gpu_groups(shards: dict) -> dict[str, list[str]]:
    """Shards by the GPU they compute on (its UUID), those whose budget is the GPU's default share: a
    budget the user gave is taken as given, and CPU shards each have their own memory."""
    groups: dict[str, list[str]] = {}
    for a, s in shards.items():
        if s["device"]["kind"] == "cuda" and not s.get("budget_given"):
            groups.setdefault(s["device"]["uuid"], []).append(a)
    return groups


class Room:
    """Free bytes of each shard, and of each GPU that several shards with the default budget share (the
    GPU's largest budget less what all of them hold); placing an acquisition takes from both."""

    def __init__(self, state: dict):
        shards = state["shards"]
        self.own = {a: s["budget"] for a, s in shards.items()}
        for entry in state["acquisitions"].values():
            for a in holders(entry):
                if a in self.own:
                    self.own[a] -= entry["nbytes"]
        self.gpu_of: dict[str, str] = {}
        self.gpu: dict[str, int] = {}
        for uuid, members in gpu_groups(shards).items():
            if len(members) > 1:
                self.gpu[uuid] = max(shards[a]["budget"] for a in members) - sum(shards[a]["budget"] - self.own[a] for a in members)
                self.gpu_of.update(dict.fromkeys(members, uuid))

    def free(self, shard: str) -> int:
        uuid = self.gpu_of.get(shard)
        return self.own[shard] if uuid is None else min(self.own[shard], self.gpu[uuid])

    def take(self, shard: str, nbytes: int) -> None:
        self.own[shard] -= nbytes
        if shard in self.gpu_of:
            self.gpu[self.gpu_of[shard]] -= nbytes


def free_bytes(state: dict) -> dict[str, int]:
    """Free budget of each shard in a catalog state (see :class:`Room`)."""
    room = Room(state)
    return {a: room.free(a) for a in room.own}


class Placer:
    """Owners for acquisitions placed one after another, from one catalog state: each placed takes its bytes
    from the room the next ones see, so placing a list piece by piece gives the owners placing it at once does."""

    def __init__(self, state: dict, pinned: str | None = None):
        self.room = Room(state)
        if not self.room.own:
            raise RuntimeError("the cluster has no shards (no workers?)")
        if pinned is not None and pinned not in self.room.own:
            raise KeyError(f"no shard on worker {pinned!r} (shards: {', '.join(sorted(self.room.own))})")
        self.pinned = pinned
        self.count = dict.fromkeys(self.room.own, 0)

    def owner(self, what: str, size: int) -> str:
        """The owner of ``what`` (an acquisition, as an error names it) of ``size`` bytes, or ValueError naming
        what does not fit."""
        room = self.room
        free = {a: room.free(a) for a in room.own}
        fits = [a for a in ([self.pinned] if self.pinned else free) if free[a] >= size]
        if not fits:
            best = max(free, key=free.get)
            where = f"worker {self.pinned}" if self.pinned else f"any shard (largest free: {format_bytes(free[best])} on {best})"
            raise OverBudget(f"{what} needs {format_bytes(size)}, more than fits on {where}: release acquisitions "
                             f"to make room, or add workers")
        owner = min(fits, key=lambda a: (self.count[a], -free[a], a))
        room.take(owner, size)
        self.count[owner] += 1
        return owner


def place(sizes: list[int], state: dict, pinned: str | None = None) -> list[str]:
    """An owner for each acquisition of ``sizes`` bytes, or ValueError naming what does not fit."""
    placer = Placer(state, pinned)
    return [placer.owner(f"acquisition {i}", size) for i, size in enumerate(sizes)]
