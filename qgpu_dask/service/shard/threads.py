"""The hop from a shard's event loop to one of its threads: every part of the shard does its real work on
pools of its own (queries, loads, ingests, copies, inspections), so a long load never blocks a short query
and the event loop stays free to receive the next call."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable


async def on(pool: ThreadPoolExecutor, fn: Callable, *args) -> Any:
    """``fn(*args)`` on one of ``pool``'s threads, awaited on the event loop."""
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
