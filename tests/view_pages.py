"""A viewer page's side of the WebSocket, for the tests of the viewer's Python half."""

from __future__ import annotations

import asyncio
import json

import tornado.websocket

from qgpu_dask.view.protocol import unframe
from qgpu_dask.view.server import ViewServer


class Page:
    """A page's side of the WebSocket: asks sent as JSON, answers read as (header, arrays)."""

    def __init__(self, url: str):
        self.url = url
        self.held: list[tuple[dict, list]] = []  # answers read while looking for another

    async def __aenter__(self):
        self.ws = await tornado.websocket.websocket_connect(self.url)
        return self

    async def __aexit__(self, *exc):
        self.ws.close()

    async def ask(self, **ask):
        await self.ws.write_message(json.dumps(ask))

    async def answer(self, kind: str | None = None, seq=...):
        """The next answer (of ``kind`` and ``seq`` where given); others read meanwhile are held for later asks
        (images and patterns come on threads of their own, in either order)."""
        def wanted(header):
            return (kind is None or header["type"] == kind) and (seq is ... or header.get("seq") == seq)

        for k, (header, arrays) in enumerate(self.held):
            if wanted(header):
                return self.held.pop(k)
        while True:
            data = await asyncio.wait_for(self.ws.read_message(), 60)
            assert data is not None, "the server closed the socket"
            header, arrays = unframe(data)
            if wanted(header):
                return header, arrays
            self.held.append((header, arrays))


def talk(url: str, script):
    async def run():
        async with Page(url) as page:
            return await script(page)

    return asyncio.run(run())


def ws(server: ViewServer, path: str) -> str:
    return server.address(path, scheme="ws")
