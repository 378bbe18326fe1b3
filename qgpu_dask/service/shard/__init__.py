"""The shard: the Dask actor on each worker (``actor.py``) and the parts it is made of."""

from .actor import Shard, shard_key

__all__ = ["Shard", "shard_key"]
