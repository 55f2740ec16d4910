"""A time budget that is not charged while its holder waits for shared infrastructure.

A reward that runs programs waits for sandbox slots when other episodes hold them; that wait is not the
reward's (nor its program's) doing, so it must not use up the reward's budget. :class:`ChargedClock`
counts wall-clock time except while its holder is waiting for a slot and holds none
(:meth:`waiting` / :meth:`holding`, called by :class:`~agentboost.sandbox.slots.Slots`).

:func:`run_charged` runs an awaitable under a clock (set as the current clock of its task, see
:func:`current_clock`): it fails with :class:`ChargedTimeout` once the charged time passes the budget, or
once the waiting alone passes ``max_wait_s`` (the infrastructure is stuck).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Awaitable, Iterator
from typing import TypeVar

T = TypeVar("T")

_CURRENT: contextvars.ContextVar[ChargedClock | None] = contextvars.ContextVar("agentboost_charged_clock", default=None)


class ChargedTimeout(TimeoutError):
    """The charged time (or the waiting) went past its limit."""


def default_max_wait(budget_s: float) -> float:
    """How long a holder may wait (uncharged) for shared infrastructure before it fails anyway."""
    return max(600.0, 10 * budget_s)


def wall_cap(budget_s: float) -> float:
    """The longest wall time a :class:`ChargedClock` of ``budget_s`` (and the default wait) can take: what
    a supervisor waiting on it (the worker pool's episode deadline) must allow."""
    return budget_s + default_max_wait(budget_s)


class ChargedClock:
    """Wall-clock seconds charged to a budget of ``budget_s``; not charged while the holder only waits.
    Thread-safe."""

    def __init__(self, budget_s: float, *, max_wait_s: float | None = None, parent: ChargedClock | None = None) -> None:
        """``parent``: a clock this one's waiting and holding are also reported to (a suite's budget inside
        a reward's)."""
        self.budget_s = budget_s
        self.parent = parent
        self.max_wait_s = max_wait_s if max_wait_s is not None else default_max_wait(budget_s)
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._waited = 0.0
        self._pause_started: float | None = None
        self._waiting = 0
        self._holding = 0

    def _update(self, waiting: int = 0, holding: int = 0) -> None:
        now = time.monotonic()
        with self._lock:
            was_paused = self._pause_started is not None
            self._waiting += waiting
            self._holding += holding
            paused = self._waiting > 0 and self._holding <= 0
            if paused and not was_paused:
                self._pause_started = now
            elif was_paused and not paused:
                assert self._pause_started is not None
                self._waited += now - self._pause_started
                self._pause_started = None

    def waiting(self, delta: int) -> None:
        """One more (+1) or one fewer (-1) request of the holder waiting for a slot."""
        self._update(waiting=delta)
        if self.parent is not None:
            self.parent.waiting(delta)

    def holding(self, delta: int) -> None:
        """One more (+1) or one fewer (-1) slot held by the holder."""
        self._update(holding=delta)
        if self.parent is not None:
            self.parent.holding(delta)

    def waited(self) -> float:
        """Seconds not charged so far (waiting while holding nothing)."""
        with self._lock:
            extra = time.monotonic() - self._pause_started if self._pause_started is not None else 0.0
            return self._waited + extra

    def charged(self) -> float:
        return time.monotonic() - self._started - self.waited()

    def remaining(self) -> float:
        return self.budget_s - self.charged()


def current_clock() -> ChargedClock | None:
    """The clock of the running task (set by :func:`run_charged` or :func:`use_clock`), if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def use_clock(clock: ChargedClock) -> Iterator[ChargedClock]:
    """Make ``clock`` the current clock for this block (and tasks started in it)."""
    token = _CURRENT.set(clock)
    try:
        yield clock
    finally:
        _CURRENT.reset(token)


async def run_charged(clock: ChargedClock, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` in a task of its own whose current clock is ``clock``; cancel it and raise
    :class:`ChargedTimeout` once ``clock`` has charged its budget or waited ``max_wait_s``."""
    with use_clock(clock):
        task = asyncio.ensure_future(awaitable)
    try:
        while True:
            left = clock.remaining()
            waited = clock.waited()
            if left <= 0:
                extra = f" (and waited {waited:.1f}s for shared resources, not charged)" if waited >= 0.05 else ""
                raise ChargedTimeout(f"used its budget of {clock.budget_s:g}s{extra}")
            if waited > clock.max_wait_s:
                raise ChargedTimeout(f"waited {waited:.0f}s for shared resources (more than {clock.max_wait_s:g}s)")
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved (the caller has its outcome, or gave up on it)
