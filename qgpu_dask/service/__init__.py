"""The service: client API, shard actors, catalog and placement."""

from .acquisition import Acquisition, Series
from .calls import QueryFuture
from .service import Service, ServiceInfo
from .stops import Cancelled

__all__ = ["Acquisition", "Cancelled", "QueryFuture", "Series", "Service", "ServiceInfo"]
