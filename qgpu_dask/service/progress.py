"""Progress bars (tqdm: terminals and notebooks) of calls that may take long: one call (a single-file load, a
fit), and the loads of a series; shown only once they have run ``DELAY`` seconds, so quick calls print nothing.
A call whose owners are compiling kernels meanwhile (the first on a machine, ``jit.py``) says so after the bar's
text: "compiling <kernel>"."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable, Iterable, Iterator

from tqdm.auto import tqdm

from .calls import QueryFuture
from .shard import Shard

DELAY = 1.0  # seconds a call runs before its bar appears
POLL = 0.25  # seconds between looks at how far it is


def compiling_on(router, owners: Iterable[str]) -> str | None:
    """The kernel one of the shards on ``owners`` is compiling now, or None (one call to each)."""
    calls = [router.call(owner, Shard.compiling) for owner in set(owners)]
    for call in calls:
        try:
            name = call.result()
        except Exception:  # progress is a courtesy: a shard that cannot say (lost meanwhile) is compiling nothing
            continue
        if name:
            return name
    return None


def waited(future: concurrent.futures.Future | QueryFuture, desc: str, total: float | None = None, unit: str = "it",
           count: Callable[[], float] | None = None, enabled: bool = True, compiling: Callable[[], str | None] | None = None) -> Any:
    """``future.result()``; while it runs, a bar of ``count()`` (polled; coarse progress reported by the
    worker) out of ``total``, or of the time alone without ``count``; ``compiling()`` (polled) names the kernel
    the call's owners are compiling, shown after the bar ("compiling <kernel>")."""
    inner = future.future if isinstance(future, QueryFuture) else future
    shown = time.monotonic() + DELAY  # no look at the count before the bar shows (each may be a round trip)
    with tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", unit_divisor=1024, delay=DELAY, disable=not enabled) as bar:
        while not concurrent.futures.wait([inner], timeout=POLL).done:
            seen = bar.n
            if enabled and time.monotonic() >= shown:
                try:
                    seen = bar.n if count is None else count()
                    if compiling is not None:
                        kernel = compiling()
                        if (f"compiling {kernel}" if kernel else "") != bar.postfix:
                            bar.set_postfix_str(f"compiling {kernel}" if kernel else "")
                except Exception:  # progress is a courtesy: a failed look leaves the bar where it was
                    pass
            bar.update(max(seen - bar.n, 0))
        if total is not None and inner.exception() is None:
            bar.update(total - bar.n)
    return future.result()


class LoadProgress:
    """The bar of a series' loads in bytes, advancing as each file is read (its owner is asked how far its
    loads are once they have run DELAY seconds), with the acquisitions done as postfix. ``loads``: the
    futures, names, raw bytes and owners of the loads (``Service.start_loads``)."""

    def __init__(self, loads, enabled: bool, verb: str, router):
        self.loads = loads
        self.enabled = enabled
        self.router = router
        self.count = 0
        self.compiling: str | None = None  # the kernel the loads' owners were compiling at the last look
        self.bar = tqdm(total=sum(loads.raw_bytes), desc=verb, unit="B", unit_scale=True, unit_divisor=1024, disable=not enabled)

    def finished(self) -> Iterator[concurrent.futures.Future]:
        """The loads' futures as they finish (the first done first), the bar kept up to date meanwhile."""
        pending = dict(enumerate(self.loads.futures))
        shown = time.monotonic() + DELAY
        done_bytes = 0
        while pending:
            done, _ = concurrent.futures.wait(pending.values(), timeout=POLL, return_when=concurrent.futures.FIRST_COMPLETED)
            for i in [i for i, f in pending.items() if f in done]:
                done_bytes += self.loads.raw_bytes[i]
                self.count += 1
                self.show(done_bytes)
                yield pending.pop(i)
            if pending and self.enabled and time.monotonic() >= shown:
                self.compiling = compiling_on(self.router, [self.loads.owners[i] for i in pending])
                self.show(done_bytes + self.reading(pending))

    def reading(self, pending: dict[int, concurrent.futures.Future]) -> int:
        """Bytes of counts read so far by the loads still running: one call to each of their owners."""
        names: dict[str, list[str]] = {}
        for i in pending:
            names.setdefault(self.loads.owners[i], []).append(self.loads.names[i])
        calls = [self.router.call(owner, Shard.load_progress, mine) for owner, mine in names.items()]
        total = 0
        for call in calls:
            try:
                total += call.result()
            except Exception:  # progress is a courtesy: a shard that cannot say (lost meanwhile) adds nothing
                pass
        return total

    def show(self, nbytes: int) -> None:
        self.bar.update(max(nbytes - self.bar.n, 0))
        compiling = f", compiling {self.compiling}" if self.compiling else ""
        self.bar.set_postfix_str(f"{self.count}/{len(self.loads.futures)} acquisitions{compiling}")

    def close(self) -> None:
        self.bar.close()
