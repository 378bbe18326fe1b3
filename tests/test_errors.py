"""The service's own exceptions (``qd.errors``): what each is raised for, that each is the built-in type users
catch, and that the service's retries are keyed on them alone."""

from __future__ import annotations

import time

import numpy as np
import pytest

import qgpu_dask as qd
from processes import free_ports
from qgpu_dask.service.calls import call_shard
from qgpu_dask.service.shard import Shard


def own_key_error(resident):
    raise KeyError("the function's own key")


def test_a_functions_own_key_error_comes_back_as_raised(svc, names, rng):
    """Not a NotResident: the router neither asks the catalog nor sends it again; the shard keeps answering."""
    acq = svc.put(rng.integers(0, 9, (4, 4, 6, 6), dtype=np.uint16), name=names())
    start = time.monotonic()
    with pytest.raises(KeyError, match="the function's own key") as raised:
        svc.submit(own_key_error, acq).result()
    assert not isinstance(raised.value, qd.errors.NotResident) and time.monotonic() - start < 5
    assert svc.submit(lambda r: r.n_frames, acq).result() == 16  # still answering


def test_a_shard_that_cannot_be_reached_is_told_from_its_own_errors(svc):
    nowhere = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    start = time.monotonic()
    with pytest.raises(qd.errors.ShardUnreachable, match=f"the shard on {nowhere} could not be reached") as raised:
        svc.client.sync(call_shard, svc.router.pool, nowhere, "nobody", Shard.info)
    assert isinstance(raised.value, OSError) and raised.value.filename is None and time.monotonic() - start < 10


def test_each_is_the_built_in_type_users_catch():
    errors = qd.errors
    for kind, base in ((errors.NotResident, KeyError), (errors.OverBudget, ValueError), (errors.AcquisitionLost, RuntimeError),
                       (errors.HandoffLost, RuntimeError), (errors.ShardUnreachable, OSError), (errors.LaneGone, ConnectionResetError)):
        assert issubclass(kind, base), kind
    assert str(errors.NotResident("acquisition 'a' is not resident")) == "acquisition 'a' is not resident"
    assert qd.Cancelled is errors.Cancelled
