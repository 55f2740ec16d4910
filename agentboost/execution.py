"""Run many episode specs: in this process, or through the worker pool. Shared by the CLIs.

``workers=0`` runs episodes on this process's event loop (fine for HTTP backends and tests);
``workers>0`` runs them in :class:`~agentboost.pool.StrandsProcessPool` worker processes, isolated
from each other and from the caller. Either way at most ``concurrency`` episodes are in flight and
``on_done`` sees every episode as it finishes. In this process, synchronous tools run in daemon
threads (:func:`~agentboost.pool.threads.loop_tool_threads`): a tool stuck past its episode's end is
named in a warning and left behind, so neither the caller's ``asyncio.run`` nor interpreter exit
waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from .episode import Episode
from .runs import EpisodeSpec, run_many

logger = logging.getLogger(__name__)

OnDone = Callable[[Episode], Awaitable[None] | None]
_NO_TORCH_BACKENDS = ("http://", "https://", "py:", "strands:")


async def run_specs(
    specs: Sequence[EpisodeSpec],
    *,
    concurrency: int = 16,
    workers: int = 0,
    on_done: OnDone | None = None,
    memory_limit_mb: int | None = None,
) -> list[Episode]:
    """Run ``specs``; returns their episodes in completion order. ``memory_limit_mb`` caps each pool
    worker's RSS (``PoolConfig.memory_limit_mb``; ignored with ``workers=0``)."""
    if not specs:
        return []
    if workers <= 0:
        from .pool.threads import loop_tool_threads

        with loop_tool_threads(asyncio.get_running_loop()):
            return await run_many(specs, concurrency=concurrency, on_done=on_done)
    from .pool import PoolConfig, StrandsProcessPool

    needs_torch = any(not s.model.backend.startswith(_NO_TORCH_BACKENDS) for s in specs)
    config = PoolConfig(
        workers=workers,
        max_in_flight=max(1, concurrency),
        torch_in_workers=needs_torch,
        memory_limit_mb=memory_limit_mb,
    )
    async with StrandsProcessPool(config) as pool:
        episodes = await pool.map(specs, on_done=on_done)
        logger.info("pool stats: %s", pool.stats())
        return episodes
