"""qgpu-dask: 4D-STEM acquisitions resident on Dask (GPU) workers, answering exact queries.

    import qgpu_dask as qd
    svc = qd.Service.local()
    acq = svc.load("scan.h5", dataset="/data")
    bf = acq.virtual_image(qd.masks.disk(acq.det_shape, (32, 32), 8))
"""

from . import jit

jit.use_user_cache()  # before any kernel is defined: each caches where this says

from . import device, ptycho, queries, samples
from .detector import masks
from .formats.png import save_png
from .io.load import inspect_file as inspect
from .io.detectors.dectris import DectrisSource
from .io.detectors.merlin import MerlinSource
from .io.detectors.timepix import TimepixSource
from .io.stream import TcpSource
from .service import Acquisition, Cancelled, errors, QueryFuture, Series, Service, ServiceInfo
from .service.peer_objects import from_hyperspy, from_py4dstem
from .phase.direct import DirectResult
from .phase.optics import Optics
from .queries.base import Query, register
from .queries.udf import run_udf
from .view import view

__all__ = ["Acquisition", "Cancelled", "DectrisSource", "DirectResult", "MerlinSource", "Optics", "Query", "QueryFuture", "Series", "Service", "ServiceInfo", "TcpSource", "TimepixSource", "device",
           "errors", "from_hyperspy", "from_py4dstem", "inspect", "masks", "ptycho", "queries", "register", "run_udf", "samples", "save_png", "view"]
__version__ = "0.1.0"
