"""The service's own exceptions. Each subclasses the built-in type a user (or older code) already catches, so
``except KeyError`` still sees an acquisition that is not resident; the service's own control flow is keyed
on these types, never on the built-in ones (a KeyError from a query's arguments is that query's error, not a
sign that its acquisition moved)."""

from __future__ import annotations


class NotResident(KeyError):
    """A shard was asked for an acquisition it does not hold (released, never loaded, or moved to another
    shard): the router asks the catalog where it is now."""

    def __str__(self) -> str:  # the message, not KeyError's quoted repr of it
        return str(self.args[0]) if self.args else ""


class OverBudget(ValueError):
    """A resident that does not fit a shard's budget (or its GPU's free memory) beside what it holds: a load
    waits while reservations of loads under way may end, else it is refused before anything is allocated."""


class AcquisitionLost(RuntimeError):
    """An acquisition's shard was lost and no surviving shard could hold it again."""


class HandoffLost(RuntimeError):
    """A reply's shared-memory segment was gone (or unreadable) when the client came to take it."""


class ShardUnreachable(ConnectionError):
    """A call to a shard over Dask's comm could not be made or its reply did not come (the worker gone, or the
    network between): the shard did not answer, as against an error the shard raised."""


class LaneGone(ConnectionResetError):
    """A lane refused a connection: nothing listens on its socket any more, so its shard's process is gone
    (an abstract socket goes with its process); the worker need not be asked through Dask, whose connect
    would wait out its timeout."""


class Cancelled(Exception):
    """A load was stopped before it finished (its client was interrupted or left, or its name was released);
    nothing of it was kept. Not an OSError or RuntimeError: the readers' error handling must let it through."""
