"""Masks sent once: a shard keeps recent mask stacks by digest, and the query plans made from them.

Interactive use repeats masks (the same BF disk on every acquisition, a viewer
asking again). A client sends a mask stack with its digest the first time a
shard sees it and only the digest afterwards; the shard keeps the stack and,
per resident, the prepared plan (weights checked, accumulator chosen, weights
on the device). A shard that has dropped a stack answers ``MaskNotCached`` and
the client sends it again.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

STACK_BYTES = 256 * 2**20
PLANS = 512


class MaskNotCached(KeyError):
    """The shard does not hold the mask stack of this digest (evicted, or a restarted worker)."""


def mask_digest(stack: np.ndarray) -> str:
    """A digest of a mask stack's dtype, shape and values."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{stack.dtype.str}{stack.shape}".encode())
    h.update(np.ascontiguousarray(stack).view(np.uint8).data)
    return h.hexdigest()


class MaskCache:
    """Mask stacks by digest (bounded in bytes) and plans by (acquisition, digest) (bounded in count)."""

    def __init__(self, stack_bytes: int = STACK_BYTES, plans: int = PLANS):
        self.stack_bytes = stack_bytes
        self.max_plans = plans
        self.stacks: OrderedDict[str, np.ndarray] = OrderedDict()
        self.plans: OrderedDict[tuple[str, str], Callable] = OrderedDict()
        self.lock = threading.Lock()  # the event loop and the query thread both use the cache

    def stack(self, digest: str, stack: np.ndarray | None) -> np.ndarray:
        """The stack of ``digest``: stored if given (checked against the digest), else looked up."""
        if stack is not None:
            stack = np.asarray(stack)
            if mask_digest(stack) != digest:
                raise ValueError("mask stack does not match its digest")
        with self.lock:
            if stack is not None:
                self.stacks[digest] = stack
                while sum(s.nbytes for s in self.stacks.values()) > self.stack_bytes and len(self.stacks) > 1:
                    self.stacks.popitem(last=False)
            if digest not in self.stacks:
                raise MaskNotCached(digest)
            self.stacks.move_to_end(digest)
            return self.stacks[digest]

    def plan(self, name: str, digest: str, make: Callable[[], Callable]) -> Callable:
        """The plan of acquisition ``name`` for ``digest``, made with ``make()`` the first time."""
        key = (name, digest)
        with self.lock:
            plan = self.plans.get(key)
            if plan is not None:
                self.plans.move_to_end(key)
                return plan
        plan = make()
        with self.lock:
            self.plans[key] = plan
            while len(self.plans) > self.max_plans:
                self.plans.popitem(last=False)
        return plan

    def forget(self, name: str) -> None:
        """Drop the plans of an acquisition (released, or its name about to be reused)."""
        with self.lock:
            for key in [k for k in self.plans if k[0] == name]:
                del self.plans[key]
