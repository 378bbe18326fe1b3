"""What the viewer's browser tests share: headless chromium through chromedriver, polling the page, mouse drags.

Not a test module: test_view_browser.py and test_view_jupyter.py import it (the ``browser`` fixture is in
conftest.py). The page's viewer is ``window.qgpuViewers[0]`` (its test hooks: viewer.js).
"""

from __future__ import annotations

import shutil
import time

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                   reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")

VIEWER = "(window.qgpuViewers || [])[0]"
STATUS = "const s = document.querySelector('[data-role=status]'); return s ? s.textContent : 'no status line';"
# the detector of the image drawn last is the page's detector (same keys and values, whatever their order)
SAME_DETECTOR = (f"((a, b) => Object.keys(a).length === Object.keys(b).length && Object.keys(a).every((k) => "
                 f"JSON.stringify(a[k]) === JSON.stringify(b[k])))({VIEWER}.detector, {VIEWER}.lastImage.detector)")
# the image drawn last is painted (its timing taken) and is of the detector shown: no later ask on its way
SETTLED = f"{VIEWER} && {VIEWER}.lastImage && {VIEWER}.lastImage.seq === {VIEWER}.timings.at(-1)?.seq && {SAME_DETECTOR}"


def chromium():
    """A headless chromium session (selenium); the caller quits it."""
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_script_timeout(60)
    return driver


def wait_for(driver, script: str, timeout: float = 60, what: str = ""):
    """Poll a JavaScript expression until it is truthy; its value. On timeout the viewer's status line and any
    notebook cell outputs are in the error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(f"try {{ return ({script}); }} catch (e) {{ return null; }}")
        if value:
            return value
        time.sleep(0.05)
    outputs = driver.execute_script("return [...document.querySelectorAll('.jp-OutputArea-output')].map((o) => o.textContent).join('\\n');")
    raise AssertionError(f"the page never satisfied {what or script} in {timeout} s; viewer status: "
                         f"{driver.execute_script(STATUS)!r}; cell outputs: {outputs!r}")


def drag(driver, element, start: tuple[float, float], end: tuple[float, float], steps: int = 12) -> None:
    """A mouse drag over ``element`` between points given in fractions of its size from its centre."""
    from selenium.webdriver.common.action_chains import ActionChains

    width, height = element.size["width"], element.size["height"]
    chain = ActionChains(driver, duration=20).move_to_element_with_offset(element, int(start[0] * width), int(start[1] * height)).click_and_hold()
    for k in range(1, steps + 1):
        x = start[0] + (end[0] - start[0]) * k / steps
        y = start[1] + (end[1] - start[1]) * k / steps
        chain = chain.move_to_element_with_offset(element, int(x * width), int(y * height))
    chain.release().perform()
