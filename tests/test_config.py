"""The qgpu settings of dask.config: defaults from qgpu.yaml, set in code or in the environment as Dask's are,
handed to a local cluster's workers, shown by ``svc.info()``; the environment variables of earlier versions
refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask.config
import pytest
import yaml

from qgpu_dask.config import DEFAULTS, RETIRED, setting, settings

PRINT = "import json, qgpu_dask.config as c; print(json.dumps(c.settings()))"


def run(env: dict, code: str = PRINT) -> subprocess.CompletedProcess:
    """``code`` in a new Python with ``env`` over this environment less every DASK_QGPU__ and retired variable."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DASK_QGPU__") and k not in RETIRED}
    return subprocess.run([sys.executable, "-c", code], env=clean | env, capture_output=True, text=True, timeout=120)


def test_every_setting_has_its_default_and_follows_dask_config():
    defaults = yaml.safe_load(DEFAULTS.read_text())["qgpu"]
    assert sorted(settings()) == sorted(defaults) == sorted(RETIRED.values())
    fresh = json.loads(run({}).stdout)
    assert fresh == defaults
    with dask.config.set({"qgpu.lane": False, "qgpu.budget": "3 GiB"}):
        assert setting("lane") is False and setting("budget") == "3 GiB" and settings()["lane"] is False
    assert setting("lane") is True and setting("warm_up") == setting("warm-up")
    with pytest.raises(KeyError, match="no setting qgpu.lanes: the settings are budget, copies, cpu, direct-reads"):
        setting("lanes")


def test_the_environment_sets_them_as_dask_does():
    out = run({"DASK_QGPU__BUDGET": "4 GiB", "DASK_QGPU__WARM_UP": "False", "DASK_QGPU__COPIES": "False",
               "DASK_QGPU__DIRECT_READS": "True"})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["budget"] == "4 GiB" and got["warm-up"] is False and got["copies"] is False and got["direct-reads"] is True
    assert got["cpu"] is False and got["lane"] is True


@pytest.mark.parametrize("name", sorted(RETIRED))
def test_an_earlier_versions_variable_is_refused_by_name(name):
    out = run({name: "1"}, "import qgpu_dask.config as c; c.setting('cpu')")
    key = RETIRED[name]
    assert out.returncode != 0
    assert (f"RuntimeError: qgpu-dask no longer reads {name} (now qgpu.{key}: DASK_QGPU__{key.upper().replace('-', '_')}=..."
            in out.stderr), out.stderr


def test_the_workers_get_the_clients_settings_and_info_shows_them(svc):
    info = svc.info()
    assert info["settings"] == settings()
    for shard in info["shards"]:
        assert shard["settings"]["warm-up"] is False  # set by conftest in this process, handed on by the nannies
        assert shard["settings"]["cpu"] is (svc.backend == "cpu")
    shown = next(line for line in repr(info).splitlines() if line.startswith("settings: "))
    assert all(f"{key}={value!r}" in shown for key, value in settings().items()), shown
