"""The service: client API, shard actors, catalog and placement."""

from .acquisition import Acquisition, Series
from .calls import QueryFuture
from .info import ServiceInfo
from .service import Service
from . import errors
from .errors import Cancelled

__all__ = ["Acquisition", "Cancelled", "errors", "QueryFuture", "Series", "Service", "ServiceInfo"]
