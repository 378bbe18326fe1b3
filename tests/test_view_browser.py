"""The viewer in a real browser: Debian's chromium driven headless through chromedriver (selenium).

`qgpu-dask view --scheduler-file` is started as its own process (and stopped by its PID); the page is opened,
the detector dragged with the mouse, and the image the page drew must change and equal the API's own image
for the detector the page shows. Screenshots go to the test's folder. Skips, saying why, where no browser is
installed (.ci/run installs Debian's chromium and chromium-driver).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from browser import SETTLED, STATUS, VIEWER, drag, needs_browser, wait_for
from processes import stop
from qgpu_dask.detector import masks

pytestmark = needs_browser

# Run before the page's own scripts: on every change of the page, note which loading indicators show while no
# image (pattern) has been drawn yet.
LOADING_WATCH = """
window.loadingSeen = {image: false, pattern: false};
new MutationObserver(() => {
  const viewer = (window.qgpuViewers || [])[0];
  for (const kind of ["image", "pattern"]) {
    const loading = document.querySelector(`[data-role=${kind}-loading]`);
    if (loading && !loading.hidden && loading.offsetHeight > 0 && !(viewer && viewer.drawn[kind] > 0)) window.loadingSeen[kind] = true;
  }
}).observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
"""


@pytest.fixture(scope="module")
def view_command(svc, scheduler_file):
    """`qgpu-dask view` on a free loopback port, as its own process; the URL of a path on it, with the token it
    printed."""
    process = subprocess.Popen([sys.executable, "-m", "qgpu_dask.cli", "view", "--scheduler-file", str(scheduler_file), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline, lines = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            lines.append(line)
            found = re.search(r"at (http://127\.0\.0\.1:\d+/)\?token=(\S+)", line)
            if found:
                break
            if process.poll() is not None:
                pytest.fail(f"qgpu-dask view stopped: {''.join(lines)}")
        else:
            pytest.fail(f"qgpu-dask view printed no URL in 60 s: {''.join(lines)}")
        base, token = found.groups()
        yield lambda path: f"{base}{path}?token={token}"
    finally:
        stop(process)


def test_dragging_the_detector_redraws_the_api_image(svc, view_command, browser, tmp_path):
    rng = np.random.default_rng(7)
    rows, cols = np.indices((48, 48))
    disk = np.hypot(rows - 20, cols - 26) <= 7
    counts = (rng.poisson(0.3, (20, 24, 48, 48)) + disk * rng.poisson(40, (20, 24, 1, 1))).astype(np.uint16)
    acq = svc.put(counts, name="browser-view")
    try:
        browser.get(view_command(""))
        assert "browser-view" in browser.page_source  # the listing
        # from its first change on, the page records whether a loading indicator showed before the first image
        watch = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": LOADING_WATCH})
        try:
            browser.get(view_command("acq/browser-view/"))
            wait_for(browser, f"{VIEWER} && {VIEWER}.drawn.image > 0 && {VIEWER}.drawn.pattern > 0")
        finally:
            browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", watch)
        assert browser.execute_script("return window.loadingSeen;") == {"image": True, "pattern": True}
        assert not browser.find_element("css selector", "[data-role=image-loading]").is_displayed()
        assert not browser.find_element("css selector", "[data-role=pattern-loading]").is_displayed()
        assert browser.find_element("css selector", "[data-role=pattern-label]").text == "browser-view: scan position (10, 12)"
        first = browser.execute_script(f"return {VIEWER}.lastImage;")
        assert first["detector"]["kind"] == "disk" and first["shape"] == [20, 24]
        assert first["detector"]["center"] == pytest.approx([20, 26], abs=1)  # on the calibrated bright-field disk
        before = browser.execute_script(f"return {VIEWER}.canvasHash('image');")
        browser.save_screenshot(str(tmp_path / "viewer-before.png"))

        pattern = browser.find_element("css selector", "[data-role=pattern]")
        # from the disk's centre (row 20, col 26 of 48) a quarter of the pattern to the upper left
        drag(browser, pattern, (26.5 / 48 - 0.5, 20.5 / 48 - 0.5), (14.5 / 48 - 0.5, 8.5 / 48 - 0.5))
        wait_for(browser, f"{SETTLED} && {VIEWER}.lastImage.detector.center[0] < 15")
        shown = browser.execute_script(f"return {VIEWER}.lastImage;")
        image = np.array(shown["values"], dtype=np.int64).reshape(shown["shape"])
        want = acq.virtual_image(masks.from_detector(acq.det_shape, shown["detector"]))
        assert (image == want).all(), shown["detector"]
        assert browser.execute_script(f"return {VIEWER}.canvasHash('image');") != before
        browser.save_screenshot(str(tmp_path / "viewer-after.png"))

        # a click on the image moves the scan cursor: the pattern drawn is that frame
        image_canvas = browser.find_element("css selector", "[data-role=image]")
        drag(browser, image_canvas, (-0.5 + 3.5 / 24, -0.5 + 5.5 / 20), (-0.5 + 3.5 / 24, -0.5 + 5.5 / 20), steps=1)
        wait_for(browser, f"{VIEWER}.lastPattern && {VIEWER}.lastPattern.source.cursor && {VIEWER}.lastPattern.source.cursor[0] === 5")
        shown = browser.execute_script(f"return {VIEWER}.lastPattern;")
        row, col = shown["source"]["cursor"]
        assert (np.array(shown["values"]).reshape(48, 48) == counts[row, col]).all() and (row, col) == (5, 3)
        assert browser.find_element("css selector", "[data-role=pattern-label]").text == "browser-view: scan position (5, 3)"

        # a detector off the pattern is refused on the page; the image stays and the viewer answers again
        browser.execute_script(f"{VIEWER}.setDetector({{kind: 'disk', center: [400, 400], radius: 2}});")
        wait_for(browser, f"{VIEWER}.errors.length > 0")
        assert "covers no pixel" in browser.execute_script(STATUS)
        browser.execute_script(f"{VIEWER}.setDetector({{kind: 'annulus', center: [20, 26], inner: 8, outer: 20}});")
        wait_for(browser, f"{SETTLED} && {VIEWER}.lastImage.detector.kind === 'annulus'")
        shown = browser.execute_script(f"return {VIEWER}.lastImage;")
        want = acq.virtual_image(masks.annulus((48, 48), (20, 26), 8, 20))
        assert (np.array(shown["values"]).reshape(20, 24) == want).all()
    finally:
        acq.release()
