"""The service: client API, shard actors, catalog and placement."""

from .acquisition import Acquisition, Series
from .calls import QueryFuture
from .info import ServiceInfo
from .service import Service
from .stops import Cancelled

__all__ = ["Acquisition", "Cancelled", "QueryFuture", "Series", "Service", "ServiceInfo"]
