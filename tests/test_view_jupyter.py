"""The viewer as a notebook widget in a real JupyterLab: `qd.view(acq)` run in a kernel, drawn by headless chromium.

JupyterLab is started as its own process (loopback only, a free port, a fixed token, its root the test's folder,
a kernel spec of this Python written for it, its Jupyter config, data and runtime folders in the test's folder)
and stopped by its PID. A notebook connects to the test's cluster by its scheduler file and shows the viewer;
the page runs all cells (the JupyterLab command, through `window.jupyterapp`), the detector is dragged on the
pattern with the mouse, and the image the widget drew must equal the API's own image for the detector it shows;
given optics, the widget's phase panel draws the API's own SSB image.
Screenshots go to the test's folder. Skips, saying why, without chromium, chromedriver or JupyterLab.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import qgpu_dask as qd
from browser import SETTLED, VIEWER, drag, needs_browser, wait_for
from processes import stop
from qgpu_dask.detector import masks
from qgpu_dask.view import phase
from test_view_phase import expected

pytestmark = needs_browser

TOKEN = "qgpu-dask-jupyter-test"
KERNEL = "qgpu-dask-test-python"
NAME = "jupyter-view"
OPTICS = {"energy_eV": 300e3, "semiangle_mrad": 20.0, "scan_step_A": 0.5}  # the widget's phase panel computes with them
# the notebook panel JupyterLab shows (the one widget of the main area)
PANEL = "window.jupyterapp && window.jupyterapp.shell.currentWidget"
KERNEL_IDLE = f"{PANEL} && {PANEL}.sessionContext && {PANEL}.sessionContext.session?.kernel?.status === 'idle'"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_notebook(path, scheduler_file) -> None:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "qgpu-dask test", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in (
        f"import qgpu_dask as qd\nsvc = qd.Service.connect(scheduler_file={str(scheduler_file)!r})",
        f"acq = svc[{NAME!r}]",
        f"v = qd.view(acq, optics=qd.Optics(**{OPTICS!r}))",
        "v",
    )]
    nbformat.write(nb, path)


def log_tail(path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab on a free loopback port, as its own process; its base URL."""
    pytest.importorskip("jupyterlab", reason="needs JupyterLab (pip install jupyterlab)")
    pytest.importorskip("ipykernel", reason="needs ipykernel (installed with jupyterlab)")
    home = tmp_path / "jupyter"
    spec = home / "data" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "qgpu-dask test", "language": "python"}))
    # no "Jupyter news?" toast over the page
    notification = home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"), "IPYTHONDIR": str(home / "ipython")}
    port = free_port()
    log = tmp_path / "jupyterlab.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={tmp_path}",
             "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             *(["--allow-root"] if os.geteuid() == 0 else [])],  # CI containers run as root
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}api/status?token={TOKEN}", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if process.poll() is not None:
                pytest.fail(f"JupyterLab stopped (exit {process.returncode}): {log_tail(log)}")
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer /api/status in 60 s: {log_tail(log)}")
            time.sleep(0.1)
        yield url
    finally:
        try:  # its kernels first (each holds a client of the cluster), then the server
            with urllib.request.urlopen(f"{url}api/kernels?token={TOKEN}", timeout=5) as answer:
                kernels = json.load(answer)
            for k in kernels:
                request = urllib.request.Request(f"{url}api/kernels/{k['id']}?token={TOKEN}", method="DELETE")
                urllib.request.urlopen(request, timeout=30).close()
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            pass
        stop(process)


def test_the_notebook_widget_draws_and_drags_like_the_api(svc, scheduler_file, tmp_path, jupyterlab, browser):
    rng = np.random.default_rng(11)
    rows, cols = np.indices((40, 40))
    disk = np.hypot(rows - 18, cols - 22) <= 6
    counts = (rng.poisson(0.3, (12, 14, 40, 40)) + disk * rng.poisson(40, (12, 14, 1, 1))).astype(np.uint16)
    acq = svc.put(counts, name=NAME)
    try:
        write_notebook(tmp_path / "viewer.ipynb", scheduler_file)
        browser.get(f"{jupyterlab}lab/tree/viewer.ipynb?token={TOKEN}")
        wait_for(browser, KERNEL_IDLE, timeout=120, what="the notebook open with its kernel idle")
        browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
        wait_for(browser, f"{VIEWER} && {VIEWER}.drawn.image > 0 && {VIEWER}.drawn.pattern > 0", timeout=120,
                 what="the viewer's first image and pattern")
        first = browser.execute_script(f"return {VIEWER}.lastImage;")
        assert first["detector"]["kind"] == "disk" and first["shape"] == [12, 14]
        assert first["detector"]["center"] == pytest.approx([18, 22], abs=1)  # on the calibrated bright-field disk
        image = np.array(first["values"], dtype=np.int64).reshape(first["shape"])
        assert (image == acq.virtual_image(masks.from_detector(acq.det_shape, first["detector"]))).all(), first["detector"]
        before = browser.execute_script(f"return {VIEWER}.canvasHash('image');")

        pattern = browser.find_element("css selector", "[data-role=pattern]")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", pattern)
        assert pattern.is_displayed() and pattern.size["width"] > 40
        browser.save_screenshot(str(tmp_path / "jupyter-before.png"))
        # from the disk's centre (row 18, col 22 of 40) a quarter of the pattern to the upper left
        drag(browser, pattern, (22.5 / 40 - 0.5, 18.5 / 40 - 0.5), (12.5 / 40 - 0.5, 8.5 / 40 - 0.5))
        # the image drawn last is the one of the detector the page shows (no ask of a later one still on its way)
        shown = wait_for(browser, f"{SETTLED} && {VIEWER}.lastImage.detector.center[0] < 13 && {VIEWER}.lastImage",
                         what="the image of the dragged detector")
        assert shown["detector"]["center"][1] < 17, shown["detector"]
        image = np.array(shown["values"], dtype=np.int64).reshape(shown["shape"])
        want = acq.virtual_image(masks.from_detector(acq.det_shape, shown["detector"]))
        assert (image == want).all(), shown["detector"]
        assert browser.execute_script(f"return {VIEWER}.canvasHash('image');") != before
        assert browser.execute_script(f"return {VIEWER}.detector;") == shown["detector"]
        browser.save_screenshot(str(tmp_path / "jupyter-after.png"))

        # the phase panel, given optics: its first image is the API's SSB at the optics given
        shown = wait_for(browser, f"{VIEWER}.drawn.phase > 0 && {VIEWER}.lastPhase", what="the first phase image")
        image = np.array(shown["values"], dtype=np.float32).reshape(shown["shape"])
        assert shown["layers"] == ["phase"] and (image == expected(acq, qd.Optics(**OPTICS), phase.Steering())).all()
        assert browser.find_element("css selector", "[data-role=phase]").is_displayed()
        assert not browser.execute_script(f"return {VIEWER}.errors;")
    finally:
        acq.release()
