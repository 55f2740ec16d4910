"""Moved to :mod:`agentboost.pool.pool` (the pool is not an agent); kept so old imports work."""

from ..pool.pool import PoolConfig, StrandsProcessPool

__all__ = ["PoolConfig", "StrandsProcessPool"]
