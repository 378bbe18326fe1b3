"""Stopping a load or an ingest under way on its shard.

A client whose wait for a load is interrupted (Ctrl-C, an error, a client that
leaves), or a release of a name still loading, asks the owner to stop it. The
load checks its ``Stop`` between its steps (each block of frames read, the wait
for a load slot or for room) and then undoes what it claimed: its reserved
budget, what it built, its name in the catalog. An ingest stops reading its
stream and keeps the frames that arrived.
"""

from __future__ import annotations

import asyncio

from .errors import Cancelled


class Stop:
    """The stop of one load (or one ingest) of ``names`` on a shard, asked for by ``asker`` (a client's id, or
    None for the shard's own loads: a re-home). ``ask`` comes on the shard's event loop; the load's threads read
    ``why`` between blocks."""

    def __init__(self, names: list[str], asker: str | None):
        self.names = names
        self.asker = asker
        self.why: str | None = None
        self.ended = asyncio.Event()  # set once the load or ingest has ended and undone what it claimed

    def ask(self, why: str) -> None:
        if self.why is None:
            self.why = why

    @property
    def asked(self) -> bool:
        return self.why is not None

    def check(self) -> None:
        """Cancelled once a stop was asked: the load's next step undoes it."""
        if self.why is not None:
            raise Cancelled(f"the load of {', '.join(map(repr, self.names))} was cancelled ({self.why}): nothing of it was kept")
