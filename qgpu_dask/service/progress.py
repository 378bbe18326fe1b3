"""A progress bar for one call that may take long (a single-file load, a fit): tqdm (terminals and
notebooks), shown only once the call has run ``DELAY`` seconds, so quick calls print nothing."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable

from tqdm.auto import tqdm

from .calls import QueryFuture

DELAY = 1.0  # seconds a call runs before its bar appears
POLL = 0.25  # seconds between looks at how far it is


def waited(future: concurrent.futures.Future | QueryFuture, desc: str, total: float | None = None, unit: str = "it",
           count: Callable[[], float] | None = None, enabled: bool = True) -> Any:
    """``future.result()``; while it runs, a bar of ``count()`` (polled; coarse progress reported by the
    worker) out of ``total``, or of the time alone without ``count``."""
    inner = future.future if isinstance(future, QueryFuture) else future
    shown = time.monotonic() + DELAY  # no look at the count before the bar shows (each may be a round trip)
    with tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", unit_divisor=1024, delay=DELAY, disable=not enabled) as bar:
        while not concurrent.futures.wait([inner], timeout=POLL).done:
            seen = bar.n
            if count is not None and enabled and time.monotonic() >= shown:
                try:
                    seen = count()
                except Exception:  # progress is a courtesy: a failed look leaves the bar where it was
                    pass
            bar.update(max(seen - bar.n, 0))
        if total is not None and inner.exception() is None:
            bar.update(total - bar.n)
    return future.result()
