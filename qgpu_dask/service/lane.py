"""A shard's local lane: calls from a client on the shard's host over a Unix socket, not Dask's comm.

Dask's round trip to a worker costs about 1 ms on one host (each message goes through msgpack, Dask's
frames and Tornado's streams, with an event loop at both ends); a Unix socket's costs about 0.02 ms. A
viewer asks for frames one at a time, so that millisecond is most of what it waits for.

The shard listens on a socket of Linux's abstract namespace, ``"\\0qgpu-lane-<pid>-<hex>"`` (no file to
remove; visible only inside the shard's network namespace, so a client on another host or in another
container cannot reach it and uses Dask's comm as before). It serves the methods it is given (the shard's
``ask_here`` as ``ask``, and ``ping``): each connection has a thread that reads a request, calls the method
there and writes the reply; the method hops to the worker's event loop or the shard's threads as it needs (a
frame is decoded on the connection's thread: a hop to the loop and back costs about 0.2 ms). It refuses a
peer of another user (``SO_PEERCRED``), and greets each connection with its name, which the client checks
against the name the shard gave it through Dask. A message is a pickle (protocol 5; cloudpickle where pickle
fails or would name ``__main__``, as in Dask) after its length (8 bytes, little-endian): a request ``(method, args, kwargs)``, a reply
``(True, value)`` or ``(False, exception)``.

A client learns a shard's lane through Dask (``Shard.lane``) and keeps its idle connections, one per call
in flight: those of its event loop, and blocking ones that a query reading little (a frame) is asked through
from the caller's own thread (``Lane.call_here``; the hops to the client's loop and back cost several times a
frame's round trip). A lane it cannot reach at first is not tried again for that worker; one that cannot be reached
later, or a connection that breaks mid-call, raises ``ConnectionResetError`` (an ``OSError``, like Dask's
comm errors, so the call is routed again as for a lost worker, and the lane asked for again). A lane that
refuses a connection is gone with its process (``LaneGone``): the client then calls that worker no more, not
even through Dask (whose connect would wait out its timeout), until the catalog says what became of it.
The ``qgpu.lane`` setting False on the client sends every call through Dask.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct
import sys
import threading
import uuid
from typing import Any, Callable

import cloudpickle

from ..config import setting
from ..device import use_own_stream
from .errors import LaneGone

LANE_PREFIX = "qgpu-lane-"
LENGTH = struct.Struct("<Q")
PEER = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid
IDLE_CONNECTIONS = 8  # a client keeps at most this many idle connections to one lane


def address(name: str) -> str:
    """The abstract-namespace socket address of the lane ``name``."""
    return "\0" + name


def packed(value: Any) -> bytes:
    """``value`` as a message: pickled (a quarter of the time Dask's pickle takes on a frame's array), or with
    cloudpickle where pickle cannot, or would refer to ``__main__`` (a user's function), as Dask does."""
    try:
        body = pickle.dumps(value, protocol=5)
        if b"__main__" in body:
            raise pickle.PicklingError("refers to __main__")
    except (pickle.PicklingError, AttributeError, TypeError):
        body = cloudpickle.dumps(value, protocol=5)
    return LENGTH.pack(len(body)) + body


# -- the shard's half -----------------------------------------------------------------


def read_exactly(sock: socket.socket, n: int) -> bytearray | None:
    """``n`` bytes from ``sock``; None if the peer closed it first."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            return None
        got += k
    return buf


def read_body(sock: socket.socket) -> bytearray | None:
    """The next message's pickled bytes from the blocking ``sock``; None if the peer closed it first."""
    head = read_exactly(sock, LENGTH.size)
    return None if head is None else read_exactly(sock, LENGTH.unpack(head)[0])


class LaneServer:
    """A shard's lane: the listening socket and a thread per connection, serving ``methods`` (name -> function,
    called on the connection's thread)."""

    def __init__(self, methods: dict[str, Callable]):
        self.methods = methods
        self.name = f"{LANE_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(address(self.name))
            self.listener.listen(64)
        except BaseException:
            self.listener.close()
            raise
        threading.Thread(target=self.accept, name="qgpu-lane", daemon=True).start()

    @classmethod
    def started(cls, methods: dict[str, Callable]) -> "LaneServer | None":
        """A lane serving ``methods``, or None where there is none to be had (not Linux, no Unix sockets)."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            return cls(methods)
        except OSError:
            return None

    def accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            _, uid, _ = PEER.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER.size))
            if uid != os.getuid():
                conn.close()
                continue
            threading.Thread(target=self.serve, args=(conn,), name="qgpu-lane-call", daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        """Answer the calls of one connection until the client closes it (on a CUDA stream of the thread's own,
        as the shard's other threads: the legacy default stream would wait for their work)."""
        use_own_stream()
        with conn:
            try:
                conn.sendall(packed(self.name))
                while (body := read_body(conn)) is not None:
                    conn.sendall(self.answer(body))
            except OSError:
                return  # the client went away mid-call

    def answer(self, body: bytearray) -> bytes:
        """The packed reply to one packed request."""
        try:
            method, args, kwargs = pickle.loads(body)
            if method not in self.methods:
                raise ValueError(f"the lane serves {sorted(self.methods)}, not {method!r}")
            return packed((True, self.methods[method](*args, **kwargs)))
        except BaseException as err:  # the caller gets it, as through Dask
            try:
                return packed((False, err))
            except Exception:
                return packed((False, RuntimeError(f"{type(err).__name__}: {err}")))


# -- the client's half ---------------------------------------------------------------


def wanted() -> bool:
    """Whether this client sends calls through lanes (the ``qgpu.lane`` setting False: through Dask alone)."""
    return bool(setting("lane")) and sys.platform.startswith("linux")


class Lane:
    """A client's way to one shard's lane: its name and idle connections, those of the client's event loop
    and the blocking ones any thread may call through (``call_here``)."""

    def __init__(self, name: str):
        self.name = name
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.idle_here: list[socket.socket] = []
        self.lock = threading.Lock()  # over idle_here

    @classmethod
    async def opened(cls, name: str | None) -> "Lane | None":
        """The lane ``name`` if it can be reached from here (one connection made and its greeting checked), else None."""
        if not name or not name.startswith(LANE_PREFIX) or not wanted():
            return None
        lane = cls(name)
        try:
            lane.idle.append(await lane.connect())
        except (OSError, EOFError, pickle.UnpicklingError, asyncio.IncompleteReadError):
            return None
        return lane

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_unix_connection(address(self.name), limit=1 << 20)
        greeting = await received(reader)
        if greeting != self.name:
            writer.close()
            raise ConnectionResetError(f"lane {self.name!r} answered as {greeting!r}")
        return reader, writer

    async def call(self, method: str, *args, **kwargs) -> Any:
        """``method(*args, **kwargs)`` on the shard; its exception re-raised here; ConnectionResetError if the lane
        could not be reached or the connection broke."""
        writer = None
        try:
            reader, writer = self.idle.pop() if self.idle else await self.connect()
            writer.write(packed((method, args, kwargs)))
            ok, value = await received(reader)
        except (OSError, EOFError, asyncio.IncompleteReadError) as err:
            if writer is not None:
                writer.close()
            raise broken(self.name, err) from None
        except BaseException:
            if writer is not None:
                writer.close()  # cancelled mid-call, or a reply this process cannot unpickle: the connection goes
            raise
        if len(self.idle) < IDLE_CONNECTIONS:
            self.idle.append((reader, writer))
        else:
            writer.close()
        if not ok:
            raise value
        return value

    def call_here(self, method: str, *args, **kwargs) -> Any:
        """``call`` from this thread, on a blocking connection: no hop to the event loop and back (a frame's
        round trip is mostly such hops). Raises as ``call``."""
        with self.lock:
            sock = self.idle_here.pop() if self.idle_here else None
        try:
            if sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(address(self.name))
                if message(sock) != self.name:
                    raise ConnectionResetError(f"lane {self.name!r} answered as another")
            sock.sendall(packed((method, args, kwargs)))
            ok, value = message(sock)
        except (OSError, EOFError, pickle.UnpicklingError) as err:
            if sock is not None:
                sock.close()
            raise broken(self.name, err) from None
        except BaseException:
            if sock is not None:
                sock.close()
            raise
        with self.lock:
            keep = len(self.idle_here) < IDLE_CONNECTIONS
            if keep:
                self.idle_here.append(sock)
        if not keep:
            sock.close()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()
        with self.lock:
            for sock in self.idle_here:
                sock.close()
            self.idle_here.clear()


def broken(name: str, err: BaseException) -> ConnectionResetError:
    """The error of a call through lane ``name`` that failed with ``err``: LaneGone where the lane refuses
    connections (this one, or a new one made to ask, after a connection broke), else the connection broke
    (or its greeting was wrong)."""
    if isinstance(err, ConnectionRefusedError) or not listening(name):
        return LaneGone(f"lane {name!r} refuses connections: its shard's process is gone ({err})")
    return ConnectionResetError(f"lane {name!r} could not be reached, or its connection broke mid-call ({err})")


def listening(name: str) -> bool:
    """Whether something listens on lane ``name``'s socket (a local connect: microseconds)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(address(name))
        return True
    except ConnectionRefusedError:
        return False
    except OSError:
        return True  # not known to be gone
    finally:
        probe.close()


def message(sock: socket.socket) -> Any:
    """The next message on the blocking ``sock``, unpickled; EOFError if the peer closed it first."""
    body = read_body(sock)
    if body is None:
        raise EOFError("the lane closed the connection")
    return pickle.loads(body)


async def received(reader: asyncio.StreamReader) -> Any:
    """The next message on ``reader``, unpickled."""
    head = await reader.readexactly(LENGTH.size)
    return pickle.loads(await reader.readexactly(LENGTH.unpack(head)[0]))
