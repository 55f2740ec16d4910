"""The thread pool synchronous tools run in (Strands runs them through ``asyncio.to_thread``).

A timed-out synchronous tool cannot be interrupted: its thread runs on after its episode ended.
The standard ``ThreadPoolExecutor`` makes such a thread hold the process: ``asyncio.run`` joins the
default executor, and so does interpreter exit. :class:`ToolThreadPool` is a drop-in default
executor whose threads are daemons, that counts (and names) busy threads so the worker pool can
recycle a worker that leaks them, runs each job in the context of its submitter (so context
variables such as the episode's process marker follow the tool into its thread), and whose
shutdown waits a bounded time and names what is still stuck.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)


class ToolThreadPool(concurrent.futures.ThreadPoolExecutor):
    """See the module docstring. A ``ThreadPoolExecutor`` subclass (asyncio requires one as the
    default executor) that uses none of its parent's thread machinery."""

    def __init__(
        self, max_workers: int | None = None, thread_name_prefix: str = "tool", *, join_timeout_s: float = 1.0
    ) -> None:
        max_workers = max_workers or min(32, (os.cpu_count() or 1) + 4)
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = threading.Semaphore(0)
        self._started: list[threading.Thread] = []
        self._running: dict[threading.Thread, str] = {}
        self._closed = False
        self._join_timeout_s = join_timeout_s
        self._prefix = thread_name_prefix

    @property
    def busy(self) -> int:
        return len(self._running)

    def busy_jobs(self) -> list[str]:
        """What the busy threads run (function names)."""
        with self._lock:
            return sorted(self._running.values())

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        context = contextvars.copy_context()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.put((future, context, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._started) < self._max_workers:
                thread = threading.Thread(target=self._work, name=f"{self._prefix}_{len(self._started)}", daemon=True)
                self._started.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, context, fn, args, kwargs = job
            del job
            if future.set_running_or_notify_cancel():
                with self._lock:
                    self._running[me] = _describe(fn)
                try:
                    result = context.run(fn, *args, **kwargs)
                except BaseException as exc:  # a tool may raise anything; the awaiting side decides
                    future.set_exception(exc)
                else:
                    future.set_result(result)
                finally:
                    with self._lock:
                        self._running.pop(me, None)
                del future, context, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting work; ``wait`` joins threads for at most ``join_timeout_s``. Threads still
        busy after that are logged by name and left behind (daemons: they never block exit)."""
        with self._lock:
            first = not self._closed
            self._closed = True
            threads = list(self._started)
        if cancel_futures:
            with contextlib.suppress(queue.Empty):
                while True:
                    job = self._jobs.get_nowait()
                    if job is not None:
                        job[0].cancel()
        if first:
            for _ in threads:
                self._jobs.put(None)
        if wait:
            deadline = time.monotonic() + self._join_timeout_s
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
        stuck = self.busy_jobs()
        if stuck and first:
            logger.warning(
                "%d tool thread(s) still running after their episodes ended (%s); not waiting for them",
                len(stuck),
                ", ".join(stuck),
            )


@contextlib.contextmanager
def loop_tool_threads(loop: Any, max_workers: int | None = None) -> Iterator[ToolThreadPool]:
    """Run ``loop``'s ``to_thread`` work (tools, environment setup) in a :class:`ToolThreadPool`
    while the block runs; afterwards give work still running (an agent being built for an episode a
    failure cancelled) the pool's join timeout to end, leave threads stuck past it behind (named in a
    warning) and give the loop a fresh default executor, so neither ``asyncio.run`` nor interpreter exit
    waits for them."""
    pool = ToolThreadPool(max_workers, thread_name_prefix="agentboost-tool")
    loop.set_default_executor(pool)
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        loop.set_default_executor(ToolThreadPool(max_workers, thread_name_prefix="agentboost-tool"))


def _describe(fn: Any) -> str:
    """The name of the function a job runs, through ``functools.partial`` and ``Context.run``."""
    for _ in range(8):
        if not isinstance(fn, functools.partial):
            break
        owner = getattr(fn.func, "__self__", None)
        fn = fn.args[0] if isinstance(owner, contextvars.Context) and fn.args else fn.func
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__)
