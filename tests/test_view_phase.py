"""The viewer's phase panel, Python half over a real cluster: each phase ask answers the API's own image at the
sliders' optics (SSB, direct phase and complex, parallax), a burst of slider asks is answered latest first, the
fit and reset set the sliders, a series steps and grids with the same optics, a live acquisition's phase is
pushed as rows arrive, bad input is an error that changes nothing, and the widget's optics, phase and saved
files. The browser half is in test_view_phase_browser.py."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
from PIL import Image

import qgpu_dask as qd
from qgpu_dask import samples
from qgpu_dask.phase import simulate
from qgpu_dask.view import phase
from qgpu_dask.view.server import ViewServer
from view_pages import talk, ws

SCAN = (20, 20)


@functools.cache
def phase_counts(seed: int) -> np.ndarray:
    """A simulated acquisition of atomic columns seen with the samples' phase optics (C10 -60 A, C12 20 A);
    simulated once a run (the browser tests view the same ones)."""
    over = samples.PHASE_OVER
    potential = simulate.atoms_potential((SCAN[0] * over, SCAN[1] * over), samples.PHASE_OPTICS.scan_step_A / over, 3.9 + seed / 10)
    counts = simulate.acquisition(samples.PHASE_OPTICS, SCAN, samples.PHASE_DET, potential, over, dose=1e5, seed=seed).astype(np.uint16)
    counts.flags.writeable = False  # shared by every test that asks for it
    return counts


@pytest.fixture(scope="module")
def phased(svc):
    """Two simulated acquisitions and a web server over the service with the optics a user knows (no calibration)."""
    counts = [phase_counts(seed) for seed in (1, 2)]
    acqs = [svc.put(c, name=f"phase-view-{k}") for k, c in enumerate(counts)]
    optics = qd.Optics(300e3, 20.0, samples.PHASE_OPTICS.scan_step_A)
    with ViewServer(svc, optics=optics) as server:
        yield server, acqs, optics, counts
    for a in acqs:
        a.release()


def expected(acq, optics, steering: phase.Steering) -> np.ndarray:
    """What the API gives for the sliders' optics: the image the panel must show."""
    at = phase.steered(acq.calibrate(optics), steering)
    if steering.method == "ssb":
        return acq.ssb(at)
    if steering.method == "parallax":
        return acq.parallax(at, 2)
    result = acq.direct_ptycho(at, steering.method.split("-")[1], steering.upsampling, steering.strength)
    return result.phase if steering.method == "direct-phase" else np.stack([result.phase, result.amplitude])


@pytest.mark.parametrize("method", phase.METHODS)
def test_each_method_answers_the_apis_image_at_the_sliders(phased, method):
    server, (acq, _), optics, _ = phased

    async def script(page):
        await page.ask(type="hello")
        state, _ = await page.answer("state")
        assert state["phase"]["methods"] == list(phase.METHODS) and state["phase"]["limit_A"] == phase.limit_A(optics, SCAN)
        await page.ask(type="phase", seq=1, method=method, c10_A=-55.0, c12_A=18.0, phi12_deg=30.0, spectrum=True)
        header, (layers,) = await page.answer("phase", 1)
        return header, layers

    header, layers = talk(ws(server, f"/acq/{acq.name}/ws"), script)
    steering = phase.Steering(method=method, c10_A=-55.0, c12_A=18.0, phi12_deg=30.0)
    want = expected(acq, optics, steering)
    names = ["phase", "amplitude", "spectrum"] if method == "direct-complex" else ["phase", "spectrum"]
    assert header["layers"] == names and layers.dtype == np.float32
    images = want if want.ndim == 3 else want[None]
    assert (layers[: len(images)] == images).all()  # the API's own bytes
    assert (layers[-1] == phase.power_spectrum(images[0])).all()
    u = header["upsampling"]
    assert layers.shape[1:] == (SCAN[0] * u, SCAN[1] * u) and math.isclose(header["pixel_A"], optics.scan_step_A / u)
    assert header["ranges"][0] == [float(images[0].min()), float(images[0].max())]


def test_a_burst_of_slider_asks_is_answered_latest_first(phased):
    """A hundred C10 asks at once: a handful computed, in order, the last at the last C10."""
    server, (acq, _), optics, _ = phased

    async def script(page):
        await page.ask(type="hello")
        for seq in range(1, 101):
            await page.ask(type="phase", seq=seq, method="ssb", c10_A=-100.0 + seq)
        seen = []
        while True:
            header, (layers,) = await page.answer("phase")
            seen.append(header["seq"])
            if header["seq"] == 100:
                return seen, header, layers

    seen, header, layers = talk(ws(server, f"/acq/{acq.name}/ws"), script)
    assert seen == sorted(seen) and len(seen) <= 10
    assert header["steering"]["c10_A"] == 0.0
    assert (layers[0] == expected(acq, optics, phase.Steering(c10_A=0.0))).all()


def test_the_fit_sets_the_sliders_and_reset_returns_to_it(phased):
    server, (acq, _), optics, _ = phased
    fitted = acq.fit_aberrations(acq.calibrate(optics))

    async def script(page):
        await page.ask(type="hello")
        await page.answer("state")
        await page.ask(type="fit", seq=1)
        progress, _ = await page.answer("progress", 1)
        state, _ = await page.answer("state")
        header, (layers,) = await page.answer("phase", 1)
        await page.ask(type="phase", seq=2, c10_A=0.0)
        await page.answer("phase", 2)
        await page.ask(type="reset", seq=3)
        reset, _ = await page.answer("state")
        again, _ = await page.answer("phase", 3)
        return progress, state, header, layers, reset, again

    progress, state, header, layers, reset, again = talk(ws(server, f"/acq/{acq.name}/ws"), script)
    assert progress["what"] == f"fitting the aberrations of {acq.name}"
    start = phase.sliders_of(fitted)
    assert state["phase"]["fitted"] and state["phase"]["start"] == start
    assert {k: header["steering"][k] for k in start} == start
    assert abs(start["c10_A"] - samples.PHASE_OPTICS.aberrations["C10"]) < 10  # the fit finds the simulated defocus
    assert (layers[0] == acq.ssb(phase.steered(fitted, phase.Steering(**start)))).all()
    assert reset["phase"]["steering"]["c10_A"] == start["c10_A"] and again["steering"]["c10_A"] == start["c10_A"]


def test_a_series_steps_and_grids_with_the_same_optics(phased, svc):
    server, acqs, optics, _ = phased
    names = ",".join(a.name for a in acqs)

    async def script(page):
        await page.ask(type="hello")
        await page.ask(type="phase", seq=1, c10_A=-60.0)
        first, (a,) = await page.answer("phase", 1)
        await page.ask(type="index", seq=2, index=1)
        second, (b,) = await page.answer("phase", 2)
        await page.ask(type="phase_grid", seq=3)
        grid, (tiles,) = await page.answer("grid", 3)
        return first, a, second, b, grid, tiles

    first, a, second, b, grid, tiles = talk(ws(server, f"/series/ws?names={names}"), script)
    steering = phase.Steering(c10_A=-60.0)
    assert first["index"] == 0 and second["index"] == 1
    assert (a[0] == expected(acqs[0], optics, steering)).all() and (b[0] == expected(acqs[1], optics, steering)).all()
    assert grid["of"] == "phase" and tiles.shape == (2, *SCAN)
    assert (tiles[1] == b[0]).all()  # a 20 x 20 image fits a tile as it is


def test_bad_input_is_said_in_the_page_and_changes_nothing(phased, svc, monkeypatch):
    server, (acq, _), optics, _ = phased
    limit = phase.limit_A(optics, SCAN)

    async def script(page):
        await page.ask(type="hello")
        await page.ask(type="phase", seq=1, c10_A=-40.0)
        await page.answer("phase", 1)
        errors = []
        for seq, bad in enumerate([{"c10_A": limit * 1.5}, {"c12_A": -3}, {"method": "magic"}, {"upsampling": 4},
                                   {"strength": 0}, {"c10_A": "deep"}, {"phi12_deg": float("nan")}], start=2):
            await page.ask(type="phase", seq=seq, **bad)
            header, _ = await page.answer("error", seq)
            errors.append(header["message"])
        await page.ask(type="phase", seq=20, method="direct-complex", upsampling=3)  # slow on a CPU worker: asked first
        if svc.backend != "cpu":
            header, _ = await page.answer("phase", 20)
            return errors, None, header
        slow, _ = await page.answer("error", 20)
        await page.ask(type="phase", seq=21, go_on=True)
        header, (layers,) = await page.answer("phase", 21)
        return errors, slow, header

    monkeypatch.setitem(phase.CPU_RATE_S, "direct-complex", 1.0)  # a direct complex preparation counts as slow here
    errors, slow, header = talk(ws(server, f"/acq/{acq.name}/ws"), script)
    assert f"C10 = {limit * 1.5:g} A is outside" in errors[0] and "wider than half the scanned field" in errors[0]
    assert "C12 = -3 A is outside 0" in errors[1]
    assert "phase method 'magic' is not one of ssb" in errors[2]
    assert "upsampling 4 is not one of auto, 1, 2, 3" in errors[3]
    assert "strength is > 0" in errors[4] and "C10 (A) is a number, got 'deep'" in errors[5] and "finite" in errors[6]
    if svc.backend == "cpu":
        assert slow["seconds"] > 0 and "press 'go on'" in slow["message"]
    assert header["steering"]["c10_A"] == -40.0 and header["steering"]["method"] == "direct-complex"  # bad asks changed nothing
    assert header["upsampling"] == 3


def test_without_optics_the_panel_says_how_to_give_them(svc, phased):
    _, (acq, _), _, _ = phased
    with ViewServer(svc) as bare:
        async def script(page):
            await page.ask(type="hello")
            state, _ = await page.answer("state")
            await page.ask(type="phase", seq=1)
            header, _ = await page.answer("error", 1)
            await page.ask(type="detector", seq=2, detector={"kind": "disk", "center": [24, 24], "radius": 5})
            await page.answer("image", 2)  # the page is still usable
            return state, header

        state, header = talk(ws(bare, f"/acq/{acq.name}/ws"), script)
    assert state["phase"] is None
    assert "qd.view(acq, optics=qd.Optics(" in header["message"] and "--optics" in header["message"]


def test_a_live_acquisitions_phase_is_pushed_as_rows_arrive(phased, svc, names):
    server, _, optics, counts = phased
    flat = counts[0].reshape(-1, *samples.PHASE_DET)
    live = svc.create(names("live"), SCAN, samples.PHASE_DET, "uint16")
    live.append(flat[: SCAN[1] * 10])

    async def script(page):
        await page.ask(type="hello")
        await page.ask(type="phase", seq=1, c10_A=-60.0)
        first, _ = await page.answer("phase", 1)
        live.append(flat[SCAN[1] * 10 :])
        want = expected(live, optics, phase.Steering(c10_A=-60.0))
        while True:  # pushed answers until one shows every row (one pushed meanwhile may show fewer)
            header, (layers,) = await page.answer("phase", None)
            if layers.shape[1:] == want.shape and (layers[0] == want).all():
                return first

    first = talk(ws(server, f"/acq/{live.name}/ws"), script)
    assert first["seq"] == 1 and first["name"] == live.name


def test_the_widget_gives_the_sliders_optics_and_saves_the_phase(phased, svc, tmp_path):
    pytest.importorskip("anywidget", reason="anywidget (a dependency) is not installed here")
    _, (acq, _), optics, _ = phased
    v = qd.view(acq, optics=optics)
    try:
        v.session.handle({"type": "phase", "seq": 1, "method": "direct-phase", "c10_A": -50.0, "c12_A": 10.0, "phi12_deg": -20.0})
        assert v.optics.aberrations["C10"] == -50.0 and math.isclose(v.optics.aberrations["phi12"], math.radians(-20.0))
        want = acq.direct_ptycho(v.optics, "phase", "auto", 0.1).phase
        assert (np.asarray(v.phase) == want).all() and v.phase.pixel_A == optics.scan_step_A / v.phase.upsampling
        png = v.save_phase(tmp_path / "phase.png")
        assert Image.open(png).size[0] > 400  # a labelled figure, not the bare pixels
        npy = v.save_phase(tmp_path / "phase.npy")
        assert (np.load(npy) == want).all()
        meta = json.loads(npy.with_suffix(".json").read_text())
        assert meta["method"] == "direct-phase" and meta["optics"]["aberrations"]["C10"] == -50.0
        assert qd.Optics(**meta["optics"]) == v.optics  # the metadata gives the optics back
        tif = v.save_phase(tmp_path / "phase.tif")
        with Image.open(tif) as image:
            assert (np.asarray(image) == want).all()
            assert json.loads(image.tag_v2[270])["pixel_A"] == v.phase.pixel_A
        with pytest.raises(ValueError, match="saved as .png, .npy, .tif"):
            v.save_phase(tmp_path / "phase.jpg")
    finally:
        v.close()


def test_a_kept_job_is_not_replaced_by_newer_ones():
    """A fit waiting on the phase channel runs although slider asks (or an index push) come after it; of
    those only the newest runs, after it."""
    import threading

    from qgpu_dask.view.session import Channel

    channel, ran, release = Channel("test"), [], threading.Event()
    done, busy = threading.Event(), threading.Event()
    channel.give(lambda: (busy.set(), release.wait(30), ran.append("busy")))
    assert busy.wait(30)  # running: what comes now waits
    channel.give(lambda: ran.append("fit"), kept=True)
    for k in range(5):
        channel.give(lambda k=k: ran.append(f"slider {k}"))
    channel.give(lambda: (ran.append("last"), done.set()))
    release.set()
    assert done.wait(30)
    channel.close()
    assert ran == ["busy", "fit", "last"]
