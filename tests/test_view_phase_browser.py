"""The viewer's phase panel in a real browser (headless chromium): the C10 slider dragged with the mouse draws
the API's own image at the C10 it shows (SSB, direct phase, direct complex with its amplitude), a burst of slider
events computes a handful of images and draws the newest, the fit button sets the sliders to the fit, a series
steps and grids with the panel open, a live acquisition's phase image refreshes as rows arrive, and bad input
is said in the page, which stays usable. The simulated acquisitions are test_view_phase.py's. Screenshots go
to the test's folder. Skips, saying why, where no browser is installed.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from browser import STATUS, VIEWER, drag, needs_browser, wait_for
from qgpu_dask import samples
from qgpu_dask.view import phase
from qgpu_dask.view.server import ViewServer
from test_view_phase import SCAN, expected, phased  # noqa: F401 (phased: the same module fixture, here too)

pytestmark = needs_browser


def settled(ask: str = "phase") -> str:
    """The phase image drawn last answers the newest ask of that type, and its pixels are on screen (its timing
    taken)."""
    return (f"{VIEWER} && {VIEWER}.lastPhase && {VIEWER}.lastPhase.seq === {VIEWER}.asked.{ask} && "
            f"{VIEWER}.phaseTimings.at(-1)?.seq === {VIEWER}.lastPhase.seq")


PHASE_SETTLED = settled()
# Run before the page's own scripts: whether the phase panel's loading indicator shows before its first image.
LOADING_WATCH = """
window.phaseLoadingSeen = false;
new MutationObserver(() => {
  const viewer = (window.qgpuViewers || [])[0], loading = document.querySelector('[data-role=phase-loading]');
  if (loading && !loading.hidden && loading.offsetHeight > 0 && !(viewer && viewer.drawn.phase > 0)) window.phaseLoadingSeen = true;
}).observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
"""


def page_url(server, path: str) -> str:
    return server.address(path)


def open_page(browser, url: str) -> None:
    """Open a viewer page; return once its first phase image is drawn."""
    browser.get(url)
    wait_for(browser, f"{VIEWER} && {VIEWER}.drawn.phase > 0", what="the first phase image")


def element(browser, role: str):
    found = browser.find_element("css selector", f"[data-role={role}]")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", found)
    return found


def shown(browser, timeout: float = 60) -> dict:
    """The phase image drawn last once the page has drawn its newest ask."""
    wait_for(browser, PHASE_SETTLED, timeout, what="the newest phase ask drawn")
    return browser.execute_script(f"return {VIEWER}.lastPhase;")


def image_of(record: dict, key: str = "values") -> np.ndarray:
    return np.array(record[key], dtype=np.float32).reshape(record["shape"])


def steering_of(record: dict) -> phase.Steering:
    return phase.Steering(**{**record["steering"], "spectrum": False})


def test_dragging_c10_draws_the_apis_image_for_each_method(phased, browser, tmp_path):
    from selenium.webdriver.support.select import Select

    server, (acq, _), optics, _ = phased
    watch = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": LOADING_WATCH})
    try:
        open_page(browser, page_url(server, f"/acq/{acq.name}/"))
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", watch)
    assert browser.execute_script("return window.phaseLoadingSeen;")
    first = shown(browser)
    assert first["layers"] == ["phase"] and first["shape"] == list(SCAN) and first["steering"]["c10_A"] == 0.0
    assert (image_of(first) == expected(acq, optics, steering_of(first))).all()
    assert not element(browser, "phase-loading").is_displayed()
    low, high = first["ranges"][0]
    assert element(browser, "phase-colourbar-label").text == "phase (rad)"
    assert element(browser, "phase-colourbar-min").text == f"{float(f'{low:.4g}'):g}"
    assert element(browser, "phase-colourbar-max").text == f"{float(f'{high:.4g}'):g}"
    assert element(browser, "phase-axis-unit").text == "Å"
    assert element(browser, "phase-overlay").text == "2 Å"  # the scale bar: a fifth of the 10 Å field
    assert [t.text for t in browser.find_elements("css selector", "[data-role=phase-axis-cols] .qv-tick")] == ["0", "2", "4", "6", "8"]
    # the image and pattern panels' axes and colour bars: Å along the scan (the optics give its step), detector
    # pixels along the pattern (they give no angle a pixel), the pattern's colour bar over its counts' range
    assert element(browser, "image-axis-unit").text == "Å" and element(browser, "pattern-axis-unit").text == "px"
    assert element(browser, "image-colourbar-label").text == "counts"
    pattern = wait_for(browser, f"{VIEWER}.lastPattern")
    assert element(browser, "pattern-colourbar-label").text == "counts (log scale)"
    assert element(browser, "pattern-colourbar-min").text == str(min(pattern["values"]))
    assert element(browser, "pattern-colourbar-max").text == str(max(pattern["values"]))
    browser.save_screenshot(str(tmp_path / "phase-first.png"))

    # the hover readout: the phase under the pointer (pixel row 3, column 5 of the 20 x 20 image)
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = element(browser, "phase")
    width, height = canvas.size["width"], canvas.size["height"]
    ActionChains(browser).move_to_element_with_offset(canvas, int((5.5 / 20 - 0.5) * width), int((3.5 / 20 - 0.5) * height)).perform()
    hover = wait_for(browser, "document.querySelector('[data-role=phase-hover]').textContent")
    assert hover.startswith("3, 5 (1.5, 2.5 Å): phase ") and hover.endswith(" rad"), hover
    assert np.float32(hover.split("phase ")[1].split()[0]) == image_of(first)[3, 5]

    for method in ("ssb", "direct-phase", "direct-complex"):
        if method != "ssb":
            Select(element(browser, "phase-method")).select_by_value(method)
        before = browser.execute_script(f"return {VIEWER}.drawn.phase;")
        slider = element(browser, "phase-c10_A")
        drag(browser, slider, (-0.3, 0), (0.3, 0), steps=20)  # 20 positions, each an input event
        record = shown(browser)
        steering = steering_of(record)
        assert steering.method == method and record["steering"]["c10_A"] == float(slider.get_attribute("value"))
        assert browser.execute_script(f"return {VIEWER}.drawn.phase;") > before
        want = expected(acq, optics, steering)
        if method == "direct-complex":
            assert record["layers"] == ["phase", "amplitude"]
            assert (image_of(record) == want[0]).all() and (image_of(record, "amplitude") == want[1]).all()
            assert element(browser, "phase-amplitude").is_displayed()
        else:
            assert (image_of(record) == want).all(), method
    browser.save_screenshot(str(tmp_path / "phase-complex.png"))

    Select(element(browser, "phase-method")).select_by_value("parallax")
    element(browser, "phase-spectrum").click()  # the power spectrum too, drawn small
    record = wait_for(browser, f"{PHASE_SETTLED} && {VIEWER}.lastPhase.layers.includes('spectrum') && {VIEWER}.lastPhase")
    assert record["layers"] == ["phase", "spectrum"] and record["steering"]["method"] == "parallax" and record["upsampling"] == 2
    assert (image_of(record) == expected(acq, optics, steering_of(record))).all()
    assert element(browser, "phase-spectrum-image").is_displayed() and not element(browser, "phase-amplitude").is_displayed()


def test_a_burst_of_slider_events_draws_the_newest(phased, browser):
    """A hundred input events on the C10 slider at once: a handful of images computed, the last one at the last
    position; keyboard nudges step the slider (Shift: ten steps)."""
    from selenium.webdriver.common.keys import Keys

    server, (acq, _), optics, _ = phased
    open_page(browser, page_url(server, f"/acq/{acq.name}/"))
    shown(browser)
    before = browser.execute_script(f"return {VIEWER}.drawn.phase;")
    browser.execute_script("""
      const slider = document.querySelector('[data-role=phase-c10_A]');
      for (let k = 1; k <= 100; k++) {
        slider.value = -100 + k;
        slider.dispatchEvent(new Event('input', {bubbles: true}));
      }""")
    record = shown(browser)
    drawn = browser.execute_script(f"return {VIEWER}.drawn.phase;") - before
    assert 1 <= drawn <= 3, drawn  # the first event's image, then the newest (the 98 between never asked)
    assert record["steering"]["c10_A"] == 0.0
    assert (image_of(record) == expected(acq, optics, steering_of(record))).all()

    slider = element(browser, "phase-c10_A")
    slider.send_keys(Keys.ARROW_LEFT * 3 + Keys.SHIFT + Keys.ARROW_RIGHT + Keys.NULL)  # 3 steps down, 10 up
    step = float(slider.get_attribute("step"))
    record = wait_for(browser, f"{PHASE_SETTLED} && {VIEWER}.lastPhase.steering.c10_A !== 0 && {VIEWER}.lastPhase")
    assert record["steering"]["c10_A"] == 7 * step == float(slider.get_attribute("value"))
    assert browser.execute_script(f"return {VIEWER}.phaseControls.c10_A;") == 7 * step


def test_the_fit_button_sets_the_sliders_to_the_fit(phased, browser):
    server, (acq, _), optics, _ = phased
    fitted = phase.sliders_of(acq.fit_aberrations(acq.calibrate(optics)))
    open_page(browser, page_url(server, f"/acq/{acq.name}/"))
    shown(browser)
    element(browser, "phase-fit").click()
    seen, start = set(), time.monotonic()  # the status lines shown until the image at the fit is drawn
    while not browser.execute_script(f"return {settled('fit')};"):
        seen.add(browser.execute_script(STATUS))
        assert time.monotonic() - start < 60, f"no image at the fit in 60 s; status lines seen: {seen}"
        time.sleep(0.05)
    record = browser.execute_script(f"return {VIEWER}.lastPhase;")
    fitting = sorted(line for line in seen if line.startswith(f"fitting the aberrations of {acq.name} …"))
    assert fitting, seen
    if time.monotonic() - start > 2:  # the seconds tick while it fits
        assert any(re.fullmatch(rf"fitting the aberrations of {acq.name} … \d+ s", line) for line in fitting), fitting
    assert {k: record["steering"][k] for k in fitted} == fitted
    assert browser.execute_script(f"const c = {VIEWER}.phaseControls; return {{c10_A: c.c10_A, c12_A: c.c12_A, phi12_deg: c.phi12_deg}};") == fitted
    for key, value in fitted.items():  # the entries show them to 0.01, the sliders at their nearest step
        assert float(element(browser, f"phase-{key}-entry").get_attribute("value")) == pytest.approx(value, abs=0.005)
        slider = element(browser, f"phase-{key}")
        assert float(slider.get_attribute("value")) == pytest.approx(value, abs=float(slider.get_attribute("step")) / 2 + 1e-9)
    assert -90 < fitted["phi12_deg"] <= 90
    assert "fit: C10" in element(browser, "phase-start").text
    assert "fitting" not in browser.execute_script(STATUS)

    browser.execute_script(f"{VIEWER}.setPhase({{c10_A: 0}});")
    shown(browser)
    element(browser, "phase-reset").click()
    record = wait_for(browser, f"{settled('reset')} && {VIEWER}.lastPhase", what="the phase image at the fit again")
    assert record["steering"]["c10_A"] == fitted["c10_A"] == browser.execute_script(f"return {VIEWER}.phaseControls.c10_A;")


def test_a_series_steps_and_grids_with_the_panel_open(phased, browser, tmp_path):
    server, acqs, optics, _ = phased
    open_page(browser, page_url(server, f"/series/?names={','.join(a.name for a in acqs)}"))
    browser.execute_script(f"{VIEWER}.setPhase({{c10_A: -60}});")
    first = shown(browser)
    assert first["index"] == 0 and first["steering"]["c10_A"] == -60.0
    index = element(browser, "index")  # the series slider, one step on
    browser.execute_script("arguments[0].value = 1; arguments[0].dispatchEvent(new Event('input', {bubbles: true}));", index)
    record = wait_for(browser, f"{VIEWER}.lastPhase.index === 1 && {VIEWER}.lastPhase")
    assert record["seq"] == browser.execute_script(f"return {VIEWER}.asked.index;")
    assert (image_of(record) == expected(acqs[1], optics, steering_of(record))).all()

    element(browser, "phase-grid").click()
    grid = wait_for(browser, f"{VIEWER}.lastPhaseGrid && {VIEWER}.lastPhaseGrid.seq === {VIEWER}.asked.phase_grid && {VIEWER}.lastPhaseGrid")
    tiles = np.array(grid["values"], dtype=np.float32).reshape(grid["shape"])
    assert grid["shape"] == [2, *SCAN] and (tiles[1] == image_of(record)).all()  # a 20 x 20 image fits a tile as it is
    assert len(browser.find_elements("css selector", "[data-role=phase-grid-tile]")) == 2
    assert not element(browser, "phase").is_displayed()
    browser.save_screenshot(str(tmp_path / "phase-grid.png"))
    browser.execute_script(f"{VIEWER}.setPhase({{c10_A: -40}});")  # the grid follows the sliders
    grid = wait_for(browser, f"{VIEWER}.lastPhaseGrid.seq === {VIEWER}.asked.phase_grid && {VIEWER}.lastPhaseGrid")
    tiles = np.array(grid["values"], dtype=np.float32).reshape(grid["shape"])
    assert grid["steering"]["c10_A"] == -40.0
    assert (tiles[0] == expected(acqs[0], optics, phase.Steering(c10_A=-40.0))).all()
    browser.find_elements("css selector", "[data-role=phase-grid-tile]")[0].click()  # a tile shows its acquisition
    wait_for(browser, f"{VIEWER}.lastPhase.index === 0 && {VIEWER}.lastImage.index === 0")


def test_a_live_acquisitions_phase_refreshes_as_rows_arrive(phased, svc, names, browser):
    server, _, optics, counts = phased
    flat = counts[0].reshape(-1, *samples.PHASE_DET)
    live = svc.create(names("live"), SCAN, samples.PHASE_DET, "uint16")
    live.append(flat[: SCAN[1] * 10])
    open_page(browser, page_url(server, f"/acq/{live.name}/"))
    browser.execute_script(f"{VIEWER}.setPhase({{c10_A: -60}});")
    shown(browser, timeout=180)  # the whole test takes 40-54 s with both cores busy; in the full suite this wait once passed 60 s
    live.append(flat[SCAN[1] * 10 :])
    want = expected(live, optics, phase.Steering(c10_A=-60.0))
    while True:  # pushed images until one shows every row (one pushed meanwhile may show fewer)
        drawn, record = browser.execute_script(f"return [{VIEWER}.drawn.phase, {VIEWER}.lastPhase];")
        if (image_of(record) == want).all():
            break
        wait_for(browser, f"{VIEWER}.drawn.phase > {drawn}", what="the live acquisition's phase image pushed again")
    assert record["name"] == live.name and record["seq"] is None


def test_bad_input_is_said_and_the_page_stays_usable(phased, browser, svc, monkeypatch):
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.select import Select

    server, (acq, _), optics, _ = phased
    limit = phase.limit_A(optics, SCAN)
    open_page(browser, page_url(server, f"/acq/{acq.name}/"))
    browser.execute_script(f"{VIEWER}.setPhase({{c10_A: -40}});")
    shown(browser)
    entry = element(browser, "phase-c10_A-entry")
    entry.send_keys(Keys.CONTROL + "a" + Keys.NULL, f"{limit * 1.5:g}", Keys.ENTER)  # typed over what it shows
    wait_for(browser, f"{VIEWER}.errors.length > 0", what="the refusal")
    assert f"C10 = {limit * 1.5:g} A is outside" in browser.execute_script(STATUS)
    assert entry.get_attribute("value") == "-40" and browser.execute_script(f"return {VIEWER}.phaseControls.c10_A;") == -40
    slider = element(browser, "phase-c10_A")
    browser.execute_script("arguments[0].value = -30; arguments[0].dispatchEvent(new Event('input', {bubbles: true}));", slider)
    record = shown(browser)
    assert record["steering"]["c10_A"] == -30.0 and "outside" not in browser.execute_script(STATUS)

    if svc.backend == "cpu":  # a slow CPU preparation waits for the user's word
        monkeypatch.setitem(phase.CPU_RATE_S, "direct-complex", 1.0)
        Select(element(browser, "phase-method")).select_by_value("direct-complex")
        wait_for(browser, "document.querySelector('[data-role=phase-go-on]').offsetHeight > 0", what="the go-on button")
        assert "press 'go on'" in browser.execute_script(STATUS)
        element(browser, "phase-go-on").click()
        record = wait_for(browser, f"{VIEWER}.lastPhase.steering.method === 'direct-complex' && {VIEWER}.lastPhase")
        assert record["layers"] == ["phase", "amplitude"]

        monkeypatch.setitem(phase.CPU_RATE_S, "ssb", 1.0)  # a page whose first image is slow to prepare
        browser.get(page_url(server, f"/acq/{acq.name}/"))
        wait_for(browser, "document.querySelector('[data-role=phase-go-on]').offsetHeight > 0", what="the go-on button")
        assert element(browser, "phase-loading").text == "not computed: 'go on' below computes it"
        element(browser, "phase-go-on").click()
        wait_for(browser, f"{VIEWER}.drawn.phase > 0", what="the first phase image once let go on")
        assert not element(browser, "phase-loading").is_displayed()


def test_without_optics_the_panel_says_how_to_give_them(phased, svc, browser):
    _, (acq, _), _, _ = phased
    with ViewServer(svc) as bare:
        browser.get(page_url(bare, f"/acq/{acq.name}/"))
        wait_for(browser, f"{VIEWER} && {VIEWER}.drawn.image > 0", what="the first image")
        message = wait_for(browser, "(m => m && !m.hidden && m.textContent)(document.querySelector('[data-role=phase-message]'))",
                           what="the phase panel's message")
        assert "qd.view(acq, optics=qd.Optics(" in message and "--optics" in message
        assert not element(browser, "phase-controls").is_displayed()
        assert browser.execute_script(f"return {VIEWER}.errors;") == []
