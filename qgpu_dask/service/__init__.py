"""The service: client API, shard actors, catalog and placement."""

from .acquisition import Acquisition, Series
from .calls import QueryFuture
from .service import Service, ServiceInfo

__all__ = ["Acquisition", "QueryFuture", "Series", "Service", "ServiceInfo"]
