"""Run CPU-bound, possibly non-terminating checks (symbolic math on model output) in child processes
that are killed when they overrun.

Symbolic equivalence checks can hang on hostile input (``\\boxed{10^{10^{10}}}``), and the timeouts
of libraries such as math-verify rely on ``signal.alarm``, which only works on the main thread;
rewards here run on event-loop threads.

:class:`IsolatedRunner` keeps ``max_workers`` long-lived ``spawn`` processes. A call waits for an
idle worker (the wait does not count against its timeout, nor against the reward's budget: the episode
runner's :class:`~agentboost.utils.clock.ChargedClock` is paused meanwhile), sends it the function and
arguments, and waits at most ``timeout_s`` for the answer. A worker that overruns is killed and replaced; one that
dies (a crash in native code, the OOM killer) is replaced. Either way only that call fails
(:class:`TimeoutError` / :class:`WorkerDied`); other calls, queued or running, are not touched.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import queue
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ..utils.clock import current_clock

logger = logging.getLogger(__name__)


class WorkerDied(RuntimeError):
    """The child process died while running the check (it was not a Python exception)."""


_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentboost-check-spawner")
"""Workers are started from this one long-lived thread: Linux delivers the parent-death signal when the
*thread* that started a process exits, and the threads of ``asyncio.to_thread`` come and go."""


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this worker when its parent dies, even in the middle of a check."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request above took effect
        os._exit(0)


def _serve(conn: Connection, parent: int) -> None:
    """Worker loop: ``(fn, args)`` in, ``(ok, value-or-exception)`` out, until the pipe closes."""
    _die_with_parent(parent)
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[bool, Any] = (True, fn(*args))
        except Exception as exc:
            reply = (False, exc)
        try:
            conn.send(reply)
        except Exception:  # an unpicklable result or exception
            conn.send((False, RuntimeError(f"{fn.__name__}: unpicklable reply {reply[1]!r:.200}")))


class _Worker:
    def __init__(self, context: Any) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, os.getpid()), daemon=True, name="agentboost-check")
        self.process.start()
        child.close()

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> tuple[bool, Any]:
        self.conn.send((fn, args))
        if not self.conn.poll(timeout_s):
            raise TimeoutError(f"{fn.__name__} did not finish in {timeout_s}s")
        try:
            return self.conn.recv()  # type: ignore[no-any-return]
        except (EOFError, OSError):
            raise WorkerDied(f"{fn.__name__}: its process died (exit code {self.process.exitcode})") from None

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class IsolatedRunner:
    """At most ``max_workers`` checks at a time, each in its own killable child process."""

    def __init__(self, max_workers: int = 2) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self.max_workers = max_workers
        self._context = multiprocessing.get_context("spawn")
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        for _ in range(max_workers):
            self._idle.put(None)  # a slot whose worker starts on first use
        self._live: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.timeouts = 0
        self.deaths = 0

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        """``fn(*args)`` in a child process. Raises ``TimeoutError`` past ``timeout_s`` (counted from
        when a worker takes the call), :class:`WorkerDied` if the child dies, or ``fn``'s exception."""
        clock = current_clock()  # (the caller's, through asyncio.to_thread's context)
        if clock is not None:
            clock.waiting(+1)
        try:
            worker = self._idle.get()
        finally:
            if clock is not None:
                clock.holding(+1)
                clock.waiting(-1)
        try:
            return self._call(worker, fn, args, timeout_s)
        finally:
            if clock is not None:
                clock.holding(-1)

    def _call(self, worker: _Worker | None, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
        keep: _Worker | None = None
        try:
            if self._closed:
                raise RuntimeError("the isolated runner is closed")
            if worker is None:
                worker = _SPAWNER.submit(_Worker, self._context).result()
                with self._lock:
                    self._live.add(worker)
            try:
                ok, value = worker.call(fn, args, timeout_s)
            except TimeoutError:
                self.timeouts += 1
                logger.warning(
                    "isolated check %s timed out after %.1fs; its worker is replaced", fn.__name__, timeout_s
                )
                raise
            except WorkerDied:
                self.deaths += 1
                logger.warning("isolated check %s: worker died; it is replaced", fn.__name__)
                raise
            keep = worker
        finally:
            if worker is not None and keep is None:
                with self._lock:
                    self._live.discard(worker)
                worker.kill()
            self._idle.put(keep)
        if not ok:
            raise value
        return value

    async def arun(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        return await asyncio.to_thread(self.run, fn, *args, timeout_s=timeout_s)

    def close(self) -> None:
        """Kill every worker; calls made afterwards fail."""
        self._closed = True
        with self._lock:
            workers, self._live = list(self._live), set()
        for worker in workers:
            worker.kill()


_default: IsolatedRunner | None = None
_default_lock = threading.Lock()


def default_runner() -> IsolatedRunner:
    """The process-wide runner (two workers), closed at interpreter exit."""
    global _default
    with _default_lock:
        if _default is None:
            _default = IsolatedRunner()
            atexit.register(_default.close)
        return _default
