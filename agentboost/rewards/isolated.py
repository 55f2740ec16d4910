"""Run CPU-bound, possibly non-terminating checks (symbolic math on model output) in a child process
that is killed when it overruns.

Symbolic equivalence checks can hang on hostile input (``\\boxed{10^{10^{10}}}``), and the timeouts
of libraries such as math-verify rely on ``signal.alarm``, which only works on the main thread;
rewards here run on event-loop threads. A small pool of ``spawn`` workers evaluates the check; on
timeout the pool is torn down (its processes killed) and rebuilt, and the caller gets ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class IsolatedRunner:
    def __init__(self, max_workers: int = 2) -> None:
        self.max_workers = max_workers
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._retired: list[concurrent.futures.ProcessPoolExecutor] = []
        self.timeouts = 0

    def _get_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=self.max_workers, mp_context=multiprocessing.get_context("spawn")
                )
            return self._pool

    def _reset(self, pool: concurrent.futures.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is not pool:
                return
            self._pool = None
            self._retired.append(pool)
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        """``fn(*args)`` in a child process; raises ``TimeoutError`` past ``timeout_s``."""
        pool = self._get_pool()
        future = pool.submit(fn, *args)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            self.timeouts += 1
            logger.warning("isolated check %s timed out after %.1fs; restarting its workers", fn.__name__, timeout_s)
            self._reset(pool)
            raise TimeoutError(f"{fn.__name__} did not finish in {timeout_s}s") from None
        except concurrent.futures.process.BrokenProcessPool:
            self._reset(pool)
            raise

    async def arun(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        return await asyncio.to_thread(self.run, fn, *args, timeout_s=timeout_s)

    def close(self, *, wait: bool = False) -> None:
        with self._lock:
            pools = [p for p in (self._pool, *self._retired) if p is not None]
            self._pool, self._retired = None, []
        for pool in pools:
            pool.shutdown(wait=wait, cancel_futures=True)


_default: IsolatedRunner | None = None
_default_lock = threading.Lock()


def default_runner() -> IsolatedRunner:
    global _default
    with _default_lock:
        if _default is None:
            _default = IsolatedRunner()
            # Join the executor threads before interpreter teardown (else they log spurious errors).
            atexit.register(_default.close, wait=True)
        return _default
