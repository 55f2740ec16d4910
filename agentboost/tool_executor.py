"""Synchronous tools get their own bounded threads, and their timeout starts when they start.

Strands runs a synchronous ``@tool`` with ``asyncio.to_thread``: on the event loop's default executor,
which in a long-lived process that runs many episodes at once (verl's ``AgentLoopWorker`` actors) is one
small pool (``min(32, cpus + 4)`` threads) shared with ``env.reset``, agent construction and every other
``to_thread``. Two ways that goes wrong, both measured on a 2-core machine:

* **starvation**: 24 concurrent episodes with a 2 s tool and a 3 s tool timeout; the pool runs 6 at a
  time, the others wait in its queue while their timeout runs, and 18 of 24 calls "time out" (trained on
  as the policy's failures);
* **poisoning**: a timed-out synchronous tool cannot be interrupted; its thread stays busy. 6 hung tools
  fill the pool and the next episodes' ``env.reset`` waits behind them until they end ``infra_error``.

This module fixes both without touching Strands:

* :class:`RoutingExecutor`, installed as the loop's default executor (:func:`install`), sends work
  submitted from inside a tool call (a context variable set by the tool-timeout middleware,
  :func:`agentboost.model.tool_limits_middleware`) to a :class:`SyncToolPool` and everything else to a
  separate general pool: tools cannot starve the loop's own work, nor the other way round;
* :class:`ToolClock` is the per-call timeout: it runs while an async tool runs, is held while a sync
  tool's job waits in the pool's queue, and restarts from the moment a thread picks the job up;
* :class:`SyncToolPool` keeps at most ``max_threads`` threads working for live calls. A job whose call
  timed out is *abandoned*: its thread no longer counts (a new one may start in its place), it is
  counted as hung, and it exits when the tool finally returns. Past ``max_hung`` hung threads new tool
  calls fail at once with :class:`~agentboost.errors.ToolFatalError` (an ``infra_error``, masked: the
  process leaks threads, not the policy's doing) and a warning names what is stuck; the process pool of
  the rLLM route recycles a worker process in that state instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .errors import ToolFatalError

logger = logging.getLogger(__name__)

DEFAULT_TOOL_THREADS = 64
DEFAULT_MAX_HUNG = 256
_CURRENT: contextvars.ContextVar[ToolClock | None] = contextvars.ContextVar("agentboost_tool_clock", default=None)


class ToolClock:
    """The timeout of one tool call (monotonic seconds), started when the tool starts.

    Await each step of the tool inside :meth:`step`: it raises ``TimeoutError`` once the call's time is
    up (the step is cancelled). When a synchronous job of the call has to wait for a :class:`SyncToolPool`
    thread (every thread busy), the clock is held, and restarts with the full timeout when a thread picks
    the job up: the queue wait is not the tool's time. A job that a thread takes at once keeps the clock
    running (no cross-thread wake-up per call)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = float(timeout_s)
        self.deadline: float | None = time.monotonic() + self.timeout_s
        self.queued_s = 0.0
        self.job: _Job | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._fired = False
        self._queued_at: float | None = None

    # -- the awaiting side ---------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def step(self) -> AsyncIterator[None]:
        if self.deadline is not None and self.deadline <= time.monotonic():
            raise TimeoutError
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._fired = False
        token = _CURRENT.set(self)
        self._arm()
        try:
            yield
        except asyncio.CancelledError:
            if self._fired:
                uncancel = getattr(self._task, "uncancel", None)
                if callable(uncancel):
                    uncancel()
                raise TimeoutError from None
            raise
        finally:
            _CURRENT.reset(token)
            self._disarm()
            self._task = None

    def _arm(self) -> None:
        self._disarm()
        if self.deadline is None or self._loop is None or self._task is None:
            return
        self._handle = self._loop.call_later(max(0.0, self.deadline - time.monotonic()), self._fire)

    def _disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        if self._task is not None and not self._task.done():
            self._fired = True
            self._task.cancel()

    # -- the pool's side -----------------------------------------------------------------------------
    def job_queued(self, job: _Job) -> None:
        """A synchronous job of this call waits for a thread (called on the loop's thread)."""
        self.deadline = None
        self._queued_at = time.monotonic()
        self._disarm()

    def job_started(self, at: float) -> None:
        """A thread picked the job up at ``at`` (called from that thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._started, at)

    def _started(self, at: float) -> None:
        if self._queued_at is not None:
            self.queued_s += max(0.0, at - self._queued_at)
            self._queued_at = None
        self.deadline = at + self.timeout_s
        self._arm()

    def abandon(self) -> None:
        """The call timed out: its job (if any) no longer holds a pool thread's place."""
        job = self.job
        if job is not None and job.pool is not None:
            job.pool.abandon(job)


@dataclass
class _Job:
    future: concurrent.futures.Future[Any]
    context: contextvars.Context
    fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    clock: ToolClock | None
    pool: SyncToolPool | None = None
    started: float | None = None
    finished: bool = False
    abandoned: bool = False
    name: str = field(default="")


class SyncToolPool:
    """Daemon threads for synchronous tool jobs: at most ``max_threads`` working for live calls; abandoned
    (timed-out) jobs' threads are replaced, counted in :attr:`hung` until they return, and bounded by
    ``max_hung``."""

    def __init__(self, max_threads: int = DEFAULT_TOOL_THREADS, max_hung: int = DEFAULT_MAX_HUNG) -> None:
        if max_threads < 1 or max_hung < 0:
            raise ValueError("max_threads must be >= 1 and max_hung >= 0")
        self.max_threads = max_threads
        self.max_hung = max_hung
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = threading.Semaphore(0)
        self._live = 0
        self._hung: dict[int, _Job] = {}
        self.abandoned_total = 0
        self.rejected_total = 0
        self.threads_started = 0
        self._closed = False

    @property
    def hung(self) -> int:
        return len(self._hung)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"threads": self._live, "hung": len(self._hung), "abandoned_total": self.abandoned_total,
                    "rejected_total": self.rejected_total, "threads_started": self.threads_started}  # fmt: skip

    def submit(self, clock: ToolClock | None, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        job = _Job(future, contextvars.copy_context(), fn, args, kwargs, clock, pool=self, name=_name(fn))
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if len(self._hung) >= self.max_hung:
                self.rejected_total += 1
                stuck = sorted(j.name for j in self._hung.values())
                names = ", ".join(stuck[:5]) + ("..." if len(stuck) > 5 else "")
                message = f"{len(stuck)} timed-out tool calls still hold their threads in this process ({names})"
                future.set_exception(ToolFatalError(f"{message}; not starting more", caused_by_policy=False))
                return future
            self._jobs.put(job)
            waits = False
            if not self._idle.acquire(blocking=False):
                if self._live < self.max_threads:
                    self._live += 1
                    self.threads_started += 1
                    name = f"agentboost-tool-{self.threads_started}"
                    threading.Thread(target=self._work, name=name, daemon=True).start()
                else:
                    waits = True  # every thread is busy: the job queues
            if not waits:
                job.clock = None  # a thread takes it now: the call's clock just keeps running (no wake-up)
        if clock is not None:
            clock.job = job  # for abandon()
            if waits:
                clock.job_queued(job)
        return future

    def abandon(self, job: _Job) -> None:
        with self._lock:
            if job.abandoned or job.finished:
                return
            job.abandoned = True
            self.abandoned_total += 1
            if job.started is None:  # never started: it will be skipped, nothing holds a thread
                job.future.cancel()
                return
            self._hung[id(job)] = job
            self._live -= 1  # its thread no longer counts: another may start in its place
            hung = len(self._hung)
        if hung in (1, self.max_hung // 2, self.max_hung) or hung % 64 == 0:
            logger.warning("%d timed-out synchronous tool call(s) still running in this process (latest: %s)",
                           hung, job.name)  # fmt: skip

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.future.set_running_or_notify_cancel():
                job.started = time.monotonic()
                if job.clock is not None:
                    job.clock.job_started(job.started)
                try:
                    result = job.context.run(job.fn, *job.args, **job.kwargs)
                except BaseException as exc:  # a tool may raise anything; the awaiting side decides
                    job.future.set_exception(exc)
                else:
                    job.future.set_result(result)
            with self._lock:
                job.finished = True
                abandoned = job.abandoned and self._hung.pop(id(job), None) is not None
            del job
            if abandoned:
                return  # replaced while it hung: this thread is surplus
            self._idle.release()

    def shutdown(self, wait: bool = False) -> None:
        with self._lock:
            self._closed = True
            live = self._live
        for _ in range(live):
            self._jobs.put(None)


class RoutingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor: jobs submitted from inside a tool call (under a :class:`ToolClock`) run
    on :attr:`tools`, everything else on :attr:`general`. (A ``ThreadPoolExecutor`` subclass because asyncio
    requires one as default executor; none of its parent's thread machinery is used.)"""

    def __init__(self, tools: SyncToolPool, general: concurrent.futures.ThreadPoolExecutor) -> None:
        super().__init__(max_workers=1, thread_name_prefix="agentboost-routing")
        self.tools = tools
        self.general = general

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        clock = _CURRENT.get()
        if clock is not None:
            return self.tools.submit(clock, fn, *args, **kwargs)
        return self.general.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.tools.shutdown()
        self.general.shutdown(wait=wait, cancel_futures=cancel_futures)


def _name(fn: Any) -> str:
    from .pool.threads import _describe

    return _describe(fn)


def install(
    loop: asyncio.AbstractEventLoop | None = None,
    *,
    max_tool_threads: int = DEFAULT_TOOL_THREADS,
    max_hung: int = DEFAULT_MAX_HUNG,
    general_threads: int | None = None,
) -> RoutingExecutor:
    """Make ``loop``'s default executor a :class:`RoutingExecutor` (idempotent: the installed one is kept)."""
    from .pool.threads import ToolThreadPool  # (the pool package imports the model, which imports this module)

    loop = loop or asyncio.get_running_loop()
    current = getattr(loop, "_default_executor", None)
    if isinstance(current, RoutingExecutor):
        return current
    general = ToolThreadPool(general_threads or min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="agentboost-io")
    executor = RoutingExecutor(SyncToolPool(max_tool_threads, max_hung), general)
    loop.set_default_executor(executor)
    return executor


def installed(loop: asyncio.AbstractEventLoop | None = None) -> RoutingExecutor | None:
    loop = loop or asyncio.get_running_loop()
    current = getattr(loop, "_default_executor", None)
    return current if isinstance(current, RoutingExecutor) else None
