"""Moved to :mod:`agentboost.pool.worker` (the pool is not an agent); kept so old imports work."""

from ..pool.threads import ToolThreadPool as CountingExecutor
from ..pool.worker import worker_main

__all__ = ["CountingExecutor", "worker_main"]
