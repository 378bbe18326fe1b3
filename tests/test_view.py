"""The viewer's Python half over a real cluster: the web server's WebSocket answers (exact images and
patterns, errors that change nothing, latest asks first, tokens), the notebook widget's properties, and that a
view never changes a resident. The browser half is tested in test_view_browser.py."""

from __future__ import annotations

import asyncio
import re
import threading
import urllib.error
import urllib.request
from urllib.parse import quote, unquote

import numpy as np
import pytest
import tornado.httpclient
import tornado.websocket

import qgpu_dask as qd
from qgpu_dask.detector import masks
from qgpu_dask.view.protocol import GRID_SIDE, frame, unframe
from qgpu_dask.view.server import ViewServer
from qgpu_dask.view.state import ViewState, narrowed
from view_pages import Page, talk, ws

DETECTORS = [
    {"kind": "disk", "center": [15.5, 16.0], "radius": 5},
    {"kind": "annulus", "center": [16, 16], "inner": 4, "outer": 11},
    {"kind": "sector", "center": [16, 16], "inner": 2, "outer": 12, "start_deg": 300, "stop_deg": 40},
    {"kind": "rectangle", "top": 3, "left": 5, "bottom": 20.5, "right": 9},
    {"kind": "polygon", "vertices": [[2, 2], [4, 28], [29, 20], [18, 6]]},
]


def pattern_series(rng, n: int = 2, scan=(12, 10), det=(32, 32)) -> list[np.ndarray]:
    """Counts with a bright-field disk, different per acquisition."""
    rows, cols = np.indices(det)
    disk = np.hypot(rows - 15.5, cols - 16.0) <= 6
    return [(rng.poisson(0.4, (*scan, *det)) + disk * rng.poisson(30, (*scan, 1, 1))).astype(np.uint16) for _ in range(n)]


@pytest.fixture(scope="module")
def viewed(svc):
    """Two acquisitions with a bright-field disk, and a web server over the service."""
    rng = np.random.default_rng(25)
    counts = pattern_series(rng)
    acqs = [svc.put(c, name=f"view-{k}") for k, c in enumerate(counts)]
    with ViewServer(svc) as server:
        yield server, acqs, counts
    for a in acqs:
        a.release()


def test_a_page_gets_state_image_and_pattern_then_exact_images_of_every_detector(viewed):
    server, (acq, _), counts = viewed

    async def script(page):
        await page.ask(type="hello")
        state, _ = await page.answer("state")
        assert state["acquisitions"] == [acq.name] and state["shape"] == list(acq.shape) and state["dtype"] == "uint16"
        assert state["calibration"]["bf_radius"] == pytest.approx(6, abs=1)  # the disk the counts hold
        assert state["detector"]["kind"] == "disk" and state["live"] is None
        image, (first,) = await page.answer("image")
        assert (first == acq.virtual_image(masks.from_detector(acq.det_shape, state["detector"]))).all()
        _, (pattern,) = await page.answer("pattern")
        assert (pattern == counts[0][6, 5]).all() and pattern.dtype == np.uint16  # the scan's centre
        for seq, det in enumerate(DETECTORS, 1):
            await page.ask(type="detector", seq=seq, detector=det)
            header, (image,) = await page.answer("image", seq)
            want = (counts[0] * masks.from_detector((32, 32), det)).sum(axis=(2, 3))
            assert header["detector"] == det and (image == want).all(), det["kind"]
            assert (header["min"], header["max"]) == (want.min(), want.max())
        await page.ask(type="cursor", seq=10, row=3, col=7)
        _, (at,) = await page.answer("pattern", 10)
        assert (at == counts[0][3, 7]).all()
        for seq, op in enumerate(("sum", "mean", "max"), 11):
            await page.ask(type="region", seq=seq, rect=[2, 1, 5, 9], op=op)
            header, (reduced,) = await page.answer("pattern", seq)
            roi = np.zeros(acq.shape[:2], bool)
            roi[2:5, 1:9] = True
            assert header["source"] == {"rect": [2, 1, 5, 9], "op": op}
            assert (reduced == acq.reduce(roi, op)).all() and reduced.dtype == acq.reduce(roi, op).dtype

    talk(ws(server, f"/acq/{acq.name}/ws"), script)


def test_bad_asks_are_answered_with_errors_and_change_nothing(viewed, svc):
    server, (acq, _), counts = viewed
    before = acq.checksum()

    async def script(page):
        await page.ask(type="hello")
        state, _ = await page.answer("state")
        await page.answer("image")
        bad = [
            ({"type": "detector", "seq": 1, "detector": {"kind": "disk", "center": [100, 100], "radius": 3}}, "covers no pixel"),
            ({"type": "detector", "seq": 2, "detector": {"kind": "blob"}}, "is not one of"),
            ({"type": "detector", "seq": 3, "detector": {"kind": "annulus", "center": [3, 3]}}, "missing inner, outer"),
            ({"type": "region", "seq": 4, "rect": [40, 40, 50, 50], "op": "sum"}, "holds no scan position"),
            ({"type": "region", "seq": 5, "rect": [0, 0, 2, 2], "op": "median"}, "one of sum, mean, max"),
            ({"type": "cursor", "seq": 6, "row": 12, "col": 0}, "scan row 12 is out of range: rows are 0 to 11"),
            ({"type": "index", "seq": 7, "index": 1}, "outside 0..0"),
            ({"type": "mode", "seq": 8, "mode": "ssb"}, "needs Optics"),
            ({"type": "delete", "seq": 9}, "whose type is one of"),
            ({"type": "region", "seq": 10, "rect": [-1, 0, 2, 2], "op": "sum"}, "scan region top -1 is out of range: rows are 0 to 11"),
            ({"type": "region", "seq": 11, "rect": [0, -3, 2, 2], "op": "sum"}, "scan region left -3 is out of range: cols are 0 to 9"),
            ({"type": "cursor", "seq": 12, "row": 0, "col": -1}, "scan col -1 is out of range: cols are 0 to 9"),
        ]
        for ask, says in bad:
            await page.ask(**ask)
            header, _ = await page.answer("error")
            assert says in header["message"], (ask, header)
        await page.ws.write_message("not json")
        header, _ = await page.answer("error")
        assert "JSON object" in header["message"]
        await page.ask(type="detector", seq=20, detector=DETECTORS[1])  # still usable, the detector as asked
        header, (image,) = await page.answer("image", 20)
        assert (image == acq.virtual_image(masks.from_detector(acq.det_shape, DETECTORS[1]))).all()

    talk(ws(server, f"/acq/{acq.name}/ws"), script)
    assert acq.checksum() == before and acq.name in svc


def test_a_drag_is_answered_latest_first(viewed):
    """Fifty detector asks sent at once: the last is answered, with the last detector, and far fewer images."""
    server, (acq, _), counts = viewed

    async def script(page):
        await page.ask(type="hello")
        await page.answer("image")
        for seq in range(1, 51):
            await page.ask(type="detector", seq=seq, detector={"kind": "disk", "center": [10 + seq / 5, 16], "radius": 4})
        seen = []
        while True:
            header, (image,) = await page.answer("image")
            seen.append(header["seq"])
            if header["seq"] == 50:
                break
        assert seen == sorted(seen) and len(seen) < 50
        assert (image == acq.virtual_image(masks.disk(acq.det_shape, (20, 16), 4))).all()

    talk(ws(server, f"/acq/{acq.name}/ws"), script)


def test_the_series_page_steps_through_acquisitions_and_answers_a_grid(viewed, svc):
    server, acqs, counts = viewed
    series = qd.Series(svc, acqs)

    async def script(page):
        await page.ask(type="hello")
        state, _ = await page.answer("state")
        names = state["acquisitions"]
        assert names == [a.name for a in acqs]
        k = 1
        await page.ask(type="detector", seq=1, detector=DETECTORS[1])
        await page.answer("image", 1)
        await page.ask(type="index", seq=2, index=k)
        state, _ = await page.answer("state")
        header, (image,) = await page.answer("image", 2)
        assert state["index"] == k and header["detector"] == DETECTORS[1]  # the detector is kept
        assert (image == acqs[1].virtual_image(masks.from_detector((32, 32), DETECTORS[1]))).all()
        await page.ask(type="grid", seq=3)
        header, (grid,) = await page.answer("grid", 3)
        assert header["names"] == names and grid.shape[0] == len(names)
        want = series.virtual_images(masks.from_detector((32, 32), DETECTORS[1]))
        assert (grid == want).all()  # 12 x 10 fits a tile: not binned

    talk(ws(server, f"/series/ws?names={acqs[0].name},{acqs[1].name}"), script)


def test_a_large_scan_is_binned_on_the_owners_to_fit_a_grid_tile(svc, names):
    counts = np.random.default_rng(4).poisson(2.0, (2 * GRID_SIDE + 1, 5, 6, 6)).astype(np.uint16)
    series = qd.Series(svc, [svc.put(counts, name=names()), svc.put(counts[::-1].copy(), name=names())])
    state = ViewState(series, detector={"kind": "disk", "center": [2.5, 2.5], "radius": 2})
    grid = state.grid()
    images = series.virtual_images(masks.from_detector((6, 6), state.shown.detector))  # factor 3; 1 column of 5 // 3
    want = images[:, :255, :3].reshape(2, 85, 3, 1, 3).sum(axis=(2, 4))
    assert grid.dtype == np.uint32 and grid.shape == (2, 85, 1) and (grid == want).all()


def test_grid_sums_travel_as_32_bit_integers_where_they_fit():
    sums = np.random.default_rng(1).integers(0, 2**32, (3, 100, 85), dtype=np.uint64)
    assert narrowed(sums).dtype == np.uint32 and (narrowed(sums) == sums).all()
    big = sums.copy()
    big[2, 99, 84] = 2**32  # one sum past 32 bits: all stay 64-bit
    assert narrowed(big) is big
    signed = -sums.astype(np.int64) // 2
    assert narrowed(signed).dtype == np.int32 and (narrowed(signed) == signed).all()
    floats = sums.astype(np.float64)
    assert narrowed(floats) is floats


def test_the_listing_page_script_and_tokens(svc, viewed):
    """Every server asks for its token (loopback too: any user of a shared node reaches it), and its WebSocket
    opens only for a page of its own origin."""
    server, acqs, _ = viewed
    listing = urllib.request.urlopen(server.url, timeout=30).read().decode()
    assert all(a.name in listing for a in acqs) and "/series/" in listing
    page = urllib.request.urlopen(server.address(f"acq/{acqs[0].name}/"), timeout=30).read().decode()
    assert "viewer.js" in page and "{{" not in page
    script = urllib.request.urlopen(server.address(f"acq/{acqs[0].name}/viewer.js"), timeout=30)
    assert script.headers["Content-Type"].startswith("text/javascript") and b"export" in script.read()
    assert len(server.token) >= 24
    for bare in (server.url.split("?")[0], server.url.split("?")[0] + "?token=guess"):
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(bare, timeout=30)

    async def opened_from(origin: str):
        ask = tornado.httpclient.HTTPRequest(ws(server, f"/acq/{acqs[0].name}/ws"), headers={"Origin": origin})
        conn = await tornado.websocket.websocket_connect(ask)
        await conn.write_message('{"type": "hello"}')
        return await conn.read_message()

    with pytest.raises(tornado.httpclient.HTTPClientError, match="403"):
        asyncio.run(opened_from("http://elsewhere.example"))  # a page of another site the user opened
    own = server.url.split("/?")[0]
    assert asyncio.run(opened_from(own)) is not None  # the viewer's own page
    with pytest.raises(ValueError, match="non-empty string"):
        ViewServer(svc, token="")
    with ViewServer(svc, token="sesame") as guarded:
        assert guarded.url.endswith("?token=sesame")
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(guarded.url.split("?")[0], timeout=30)
        assert acqs[0].name in urllib.request.urlopen(guarded.url, timeout=30).read().decode()

        async def refused():
            ws_url = guarded.address(f"acq/{acqs[0].name}/ws", scheme="ws").split("?")[0]
            conn = await tornado.websocket.websocket_connect(ws_url)
            return await conn.read_message()

        assert asyncio.run(refused()) is None  # closed without an answer

    async def unknown():
        async with Page(ws(server, "/acq/no-such-scan/ws")) as page:
            return await page.answer("error")

    header, _ = asyncio.run(unknown())
    assert "no acquisition named 'no-such-scan'" in header["message"]


def test_series_are_offered_and_opened_only_of_one_shape(svc, viewed, names):
    """Two acquisitions of another detector shape beside the fixture's two: the listing offers each shape's pair
    as a series, never all four; a page or widget of mixed shapes is refused, saying why."""
    server, acqs, _ = viewed
    smaller = [svc.put(c, name=names()) for c in pattern_series(np.random.default_rng(3), det=(24, 24))]
    try:
        listing = urllib.request.urlopen(server.url, timeout=30).read().decode()
        offered = sorted(unquote(n) for n in re.findall(r'href="/series/\?names=([^"&]*)', listing))
        assert offered == sorted(",".join(a.name for a in group) for group in (acqs, smaller)), listing
        assert "12×10 × 24×24" in listing and 'href="/series/"' not in listing

        async def refused(path):
            async with Page(ws(server, path)) as page:
                return (await page.answer("error"))[0]["message"]

        assert "differ in shape" in asyncio.run(refused("/series/ws"))
        message = asyncio.run(refused(f"/series/ws?names={quote(acqs[0].name)},{quote(smaller[0].name)}"))
        assert "one detector shape" in message and "(24, 24), (32, 32)" in message
        with pytest.raises(ValueError, match="one detector shape"):
            ViewState(qd.Series(svc, [acqs[1], smaller[1]]))
    finally:
        for a in smaller:
            a.release()
    single = urllib.request.urlopen(server.url, timeout=30).read().decode()
    assert "of shape 12×10 × 32×32 as one series" in single


def test_frames_round_trip_aligned():
    header, buffers = {"type": "image", "seq": 3, "dtype": "uint64", "shape": [3, 5]}, [np.arange(15, dtype=np.uint64).tobytes()]
    data = frame(header, buffers)
    length = int.from_bytes(data[:4], "little")
    assert (4 + length) % 8 == 0
    back, (array,) = unframe(data)
    assert back["seq"] == 3 and (array == np.arange(15).reshape(3, 5)).all()


def test_the_widget_answers_from_python(viewed, svc):
    pytest.importorskip("anywidget", reason="anywidget (a dependency) is not installed here")
    _, (acq, other), counts = viewed
    v = qd.view(qd.Series(svc, [acq, other]))
    try:
        assert v.detector["kind"] == "disk"
        v.detector = DETECTORS[2]
        assert v.detector == DETECTORS[2]
        assert (v.image == (counts[0] * masks.from_detector((32, 32), DETECTORS[2])).sum(axis=(2, 3))).all()
        assert (v.pattern == counts[0][6, 5]).all()
        v.index = 1
        assert (v.image == (counts[1] * masks.from_detector((32, 32), DETECTORS[2])).sum(axis=(2, 3))).all()
        with pytest.raises(ValueError, match="covers no pixel"):
            v.detector = {"kind": "disk", "center": [-50, -50], "radius": 2}
        assert v.detector == DETECTORS[2]  # a refused detector leaves the shown one
        with pytest.raises(ValueError, match="outside 0..1"):
            v.index = 2
        with pytest.raises(ValueError, match="an Acquisition or a Series"):
            qd.view("scan")
    finally:
        v.close()


def test_stopping_the_server_closes_its_pages_and_their_sessions_quietly(svc, viewed):
    _, (acq, _), _ = viewed
    failures = []
    hook, threading.excepthook = threading.excepthook, lambda args: failures.append(args.exc_value)
    try:
        with ViewServer(svc) as server:
            async def script(page):
                await page.ask(type="hello", seq=1)
                await page.answer("image")
                await page.ask(type="grid", seq=2, detector=DETECTORS[0])  # answered while the server stops, or not at all
                return [t for t in threading.enumerate() if t.name.startswith("qgpu-view-") and t.name != "qgpu-view-server"]

            async def run():
                async with Page(ws(server, f"/acq/{acq.name}/ws")) as page:
                    threads = await script(page)
                    (socket,) = server.sockets
                    server.close()
                    closed = await asyncio.wait_for(page.ws.read_message(), 30)
                    while closed is not None:  # answers sent before the close, then the close
                        closed = await asyncio.wait_for(page.ws.read_message(), 30)
                    return threads, socket

            threads, socket = asyncio.run(run())
        assert not server.sockets
        socket.send({"type": "state"}, [])  # an answer finished after the server's loop closed: dropped, no error
        for t in threads:
            t.join(30)
        assert threads and not [t.name for t in threads if t.is_alive()]  # the page's session ended with the server
        assert not failures, failures
    finally:
        threading.excepthook = hook
