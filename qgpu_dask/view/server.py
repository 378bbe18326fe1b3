"""The viewer as a web page for every acquisition of a running service (``qgpu-dask view``), on tornado.

Routes: ``/`` lists the acquisitions with their shapes (and links the Dask dashboard), offering a series of
each shape held more than once; ``/acq/<name>/`` views one and ``/series/?names=a,b`` those as one series
(no names: every acquisition, where all have one shape); each page loads ``viewer.js`` and talks over ``ws``
beside it (the protocol's frames). The server binds 127.0.0.1 unless told otherwise, and asks for a token (given,
or made and printed as Jupyter does) on every request, loopback too: on a shared node any user's process can
reach a loopback port, and any web page a user opens can try one. A WebSocket is accepted only from a page of
the server's own origin (a browser says which page opens it). Each page gets its own view (a Session): pages
read residents, never change or release them.
"""

from __future__ import annotations

import asyncio
import html
import hmac
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, unquote

import tornado.httpserver
import tornado.netutil
import tornado.web
import tornado.websocket

from ..phase.optics import Optics
from ..service import Acquisition, Series, Service
from .protocol import frame
from .session import Session
from .state import ViewState

HERE = Path(__file__).parent


class Guarded(tornado.web.RequestHandler):
    """A handler that refuses requests without the server's token (where it has one)."""

    def initialize(self, app: "ViewServer"):
        self.app = app

    def prepare(self):
        if not self.app.admits(self.get_argument("token", "")):
            raise tornado.web.HTTPError(403, "this viewer asks for its token: open the URL it printed (…?token=…)")

    def link(self, path: str) -> str:
        return f"{path}?token={quote(self.app.token)}"


def shape_text(shape) -> str:
    rows, cols, det_rows, det_cols = shape
    return f"{rows}×{cols} × {det_rows}×{det_cols}"


def by_shape(acquisitions: list[Acquisition]) -> dict[tuple, list[Acquisition]]:
    """The acquisitions grouped by shape (scan and detector): those of one group can be viewed as one series,
    slider and grid alike."""
    groups: dict[tuple, list[Acquisition]] = {}
    for acq in acquisitions:
        groups.setdefault(tuple(acq.shape), []).append(acq)
    return groups


class Listing(Guarded):
    async def get(self):
        held = await asyncio.get_running_loop().run_in_executor(None, self.app.service.acquisitions)
        groups = by_shape(held)
        rows = "".join(f'<li><a href="{html.escape(self.link("/acq/" + quote(a.name, safe="") + "/"))}">{html.escape(a.name)}</a> '
                       f'({shape_text(a.shape)} {a.dtype})</li>' for a in held)
        series = [
            f'<li><a href="{html.escape(self.series_link(group))}">the {len(group)} of shape {shape_text(shape)} as one series</a></li>'
            for shape, group in groups.items() if len(group) > 1]
        if series:
            offer = f"<p>Series (a series is of acquisitions of one shape):</p><ul>{''.join(series)}</ul>"
        elif len(held) > 1:
            offer = "<p>No series: a series is of acquisitions of one shape, and no two of these have the same shape.</p>"
        else:
            offer = ""
        dashboard = self.app.dashboard
        self.write(f"""<!doctype html><meta charset="utf-8"><title>qgpu-dask viewer</title>
<body style="font-family: sans-serif"><h1>qgpu-dask: resident acquisitions</h1>
{f'<p><a href="{html.escape(dashboard)}" target="_blank">Dask dashboard</a></p>' if dashboard else ''}
<p>{len(held)} held.</p><ul>{rows}</ul>{offer}</body>""")

    def series_link(self, group: list[Acquisition]) -> str:
        names = ",".join(quote(a.name, safe="") for a in group)
        return f"/series/?names={names}&token={quote(self.app.token)}"


class Page(Guarded):
    def get(self, name: str | None = None):
        title = f"qgpu-dask: {unquote(name)}" if name else "qgpu-dask: series"
        text = (HERE / "page.html").read_text().replace("{{TITLE}}", html.escape(title)).replace("{{DASHBOARD}}", html.escape(self.app.dashboard or ""))
        self.write(text)


class Script(Guarded):
    def get(self, prefix: str):
        self.set_header("Content-Type", "text/javascript; charset=utf-8")
        self.write((HERE / "viewer.js").read_bytes())


class Socket(tornado.websocket.WebSocketHandler):
    """One page's viewer: asks read on the event loop, handled in order on a thread of their own."""

    def initialize(self, app: "ViewServer"):
        self.app = app
        self.session: Session | None = None
        self.asks = ThreadPoolExecutor(1, thread_name_prefix="qgpu-view-asks")
        self.loop = asyncio.get_running_loop()

    async def open(self, name: str | None = None):
        self.set_nodelay(True)  # answers are several writes: Nagle's wait for the ACK of the first cost 40 ms a step
        if not self.app.admits(self.get_argument("token", "")):
            self.close(4003, "this viewer asks for its token")
            return
        try:
            names = [unquote(n) for n in self.get_argument("names", "").split(",") if n]
            state = await self.loop.run_in_executor(self.asks, self.app.view_of, name, names)
        except Exception as err:  # unknown name, nothing held, a closed service: said, then closed
            self.write_frame(frame({"type": "error", "seq": None, "ask": "open", "message": str(err).strip('"')}, []))
            self.close(4004, str(err)[:120])
            return
        self.session = Session(state, self.send)
        self.app.sockets.add(self)

    def on_message(self, message):
        if self.session is not None:
            self.asks.submit(self.session.handle, message)

    def send(self, header: dict, buffers: list[bytes]) -> None:
        """Called from any thread: the frame goes out on the event loop."""
        data = frame(header, buffers)
        try:
            self.loop.call_soon_threadsafe(self.write_frame, data)
        except RuntimeError:
            pass  # the server stopped (its loop is closed): no page is left to tell

    def write_frame(self, data: bytes) -> None:
        try:
            self.write_message(data, binary=True)
        except tornado.websocket.WebSocketClosedError:
            pass  # the page left

    def on_close(self):
        self.app.sockets.discard(self)
        if self.session is not None:
            self.session.close()
        self.asks.shutdown(wait=False)


class ViewServer:
    """The viewer's web server over ``service``, on its own event loop thread; ``url`` opens the listing."""

    def __init__(self, service: Service, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 optics: Optics | None = None):
        self.service = service
        self.optics = optics
        self.host = host
        if token is not None and not (isinstance(token, str) and token.strip()):
            raise ValueError(f"the viewer's token is a non-empty string (or None to make one), got {token!r}")
        self.token = token or secrets.token_urlsafe(24)
        self.dashboard = getattr(service.client, "dashboard_link", None)
        self.sockets: set[Socket] = set()  # the pages connected now (touched on the event loop only)
        started = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self.run, args=(port, started), name="qgpu-view-server", daemon=True)
        self.thread.start()
        started.wait()
        if self.failure is not None:
            raise self.failure

    def view_of(self, name: str | None, names: list[str]) -> ViewState:
        """A fresh view of acquisition ``name`` (URL-quoted), or of ``names`` as one series (none: every
        acquisition held)."""
        if name:
            return ViewState(self.service[unquote(name)], self.optics)
        held = [self.service[n] for n in names] if names else self.service.acquisitions()
        if not held:
            raise ValueError("the service holds no acquisition yet: load one, then reload this page")
        if not names and len(by_shape(held)) > 1:
            raise ValueError("the acquisitions held differ in shape: open a series of one shape from the listing")
        return ViewState(Series(self.service, held), self.optics)

    def admits(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self.token.encode())

    def run(self, port: int, started: threading.Event) -> None:
        async def serve():
            try:
                args = {"app": self}
                app = tornado.web.Application([
                    (r"/", Listing, args),
                    (r"/acq/([^/]+)/", Page, args),
                    (r"/series/", Page, args),
                    (r"(.*)/viewer\.js", Script, args),
                    (r"/acq/([^/]+)/ws", Socket, args),
                    (r"/series/ws", Socket, args),
                ], websocket_max_message_size=1 << 20)
                self.http = tornado.httpserver.HTTPServer(app)
                sockets = tornado.netutil.bind_sockets(port, self.host)
                self.http.add_sockets(sockets)
                self.port = sockets[0].getsockname()[1]
                self.loop = asyncio.get_running_loop()
                self.stop = asyncio.Event()
            except BaseException as err:
                self.failure = err
                started.set()
                return
            started.set()
            await self.stop.wait()
            self.http.stop()
            for page in list(self.sockets):  # their sessions' threads end; the pages see the connection closed
                page.close(1001, "the viewer server stopped")
                page.on_close()

        asyncio.run(serve())

    @property
    def url(self) -> str:
        """The listing's address, with the token."""
        return self.address("")

    def address(self, path: str, scheme: str = "http") -> str:
        """The address of ``path`` on this server (``acq/<name>/``, ``series/?names=a,b``, ``acq/<name>/ws`` with
        scheme ws), with the token."""
        host = self.host if ":" not in self.host else f"[{self.host}]"
        path, _, query = path.lstrip("/").partition("?")
        return f"{scheme}://{host}:{self.port}/{path}?token={quote(self.token)}" + (f"&{query}" if query else "")

    def close(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stop.set)
            self.thread.join(10)

    def __enter__(self) -> "ViewServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
