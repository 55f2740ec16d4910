"""Fair shares of a sandbox's concurrent executions (its *slots*) between their owners.

An owner is whoever a run is for: each test suite (``run_test_cases``) is one owner, each other run its
own (:func:`owner_scope` sets the owner of a block). A released slot goes to the waiting request whose
owner holds the fewest slots (the oldest of those first), so a newcomer never queues behind a suite that
already holds several; batch sessions ask :meth:`Slots.should_yield` between tests and give their slot up
when another owner waits with at least two fewer, or with fewer for over :data:`QUANTUM_S`, so a slow
suite cannot keep the others out for longer than one of its tests.

Waiting holds no thread: requests queue up on their event loops (any number of loops, in any threads), and
a released slot is handed to its waiter on the waiter's loop. The wait is not charged to the requester's
:class:`~agentboost.utils.clock.ChargedClock` (a reward's budget) while it holds no slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..utils.clock import ChargedClock, current_clock

_OWNER: contextvars.ContextVar[object | None] = contextvars.ContextVar("agentboost_slot_owner", default=None)


@contextlib.contextmanager
def owner_scope(owner: object | None = None) -> Iterator[object]:
    """Runs started in this block (and tasks started in it) share one owner (a new one by default)."""
    owner = owner if owner is not None else object()
    token = _OWNER.set(owner)
    try:
        yield owner
    finally:
        _OWNER.reset(token)


def current_owner() -> object:
    """The block's owner, or a new one (a run on its own)."""
    owner = _OWNER.get()
    return owner if owner is not None else object()


@dataclass(eq=False)
class SlotLease:
    slot: int
    owner: object
    clock: ChargedClock | None = field(default=None, repr=False)


@dataclass(eq=False)
class _Waiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[SlotLease]
    owner: object
    order: int
    since: float = field(default_factory=time.monotonic)


QUANTUM_S = 1.0
"""A request that waited this long, from an owner holding fewer slots, takes a slot at the holder's next
test boundary (so single-slot suites take turns instead of queueing for whole suites)."""


class Slots:
    """``count`` slots, handed out fairly between owners (module doc). Thread-safe."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._free = list(range(count))
        self._held: dict[object, int] = {}
        self._waiters: list[_Waiter] = []
        self._lock = threading.Lock()
        self._order = itertools.count()

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)

    def held(self, owner: object) -> int:
        with self._lock:
            return self._held.get(owner, 0)

    async def acquire(self, owner: object | None = None) -> SlotLease:
        owner = owner if owner is not None else current_owner()
        clock = current_clock()
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free and not self._waiters:
                return self._grant(self._free.pop(), owner, clock)
            waiter = _Waiter(loop, loop.create_future(), owner, next(self._order))
            self._waiters.append(waiter)
            self._dispatch()
        if clock is not None:
            clock.waiting(+1)
        try:
            lease = await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            if waiter.future.done() and not waiter.future.cancelled():  # handed a slot, then cancelled
                self.release(waiter.future.result())
            raise
        finally:
            if clock is not None:
                clock.waiting(-1)
        lease.clock = clock
        if clock is not None:
            clock.holding(+1)
        return lease

    def _grant(self, slot: int, owner: object, clock: ChargedClock | None) -> SlotLease:
        """(lock held) ``slot`` is ``owner``'s now."""
        self._held[owner] = self._held.get(owner, 0) + 1
        if clock is not None:
            clock.holding(+1)
        return SlotLease(slot, owner, clock)

    def release(self, lease: SlotLease) -> None:
        if lease.slot < 0:
            return
        slot, lease.slot = lease.slot, -1
        if lease.clock is not None:
            lease.clock.holding(-1)
        with self._lock:
            held = self._held.get(lease.owner, 0) - 1
            if held > 0:
                self._held[lease.owner] = held
            else:
                self._held.pop(lease.owner, None)
            self._free.append(slot)
            self._dispatch()

    def _dispatch(self) -> None:
        """(lock held) Hand free slots to the fairest waiters: fewest slots held by their owner, oldest first."""
        while self._free and self._waiters:
            waiter = min(self._waiters, key=lambda w: (self._held.get(w.owner, 0), w.order))
            self._waiters.remove(waiter)
            if waiter.future.done():
                continue
            slot = self._free.pop()
            self._held[waiter.owner] = self._held.get(waiter.owner, 0) + 1
            lease = SlotLease(slot, waiter.owner)
            try:
                waiter.loop.call_soon_threadsafe(self._hand_over, waiter, lease)
            except RuntimeError:  # that loop is closed: the slot goes back
                self._held[waiter.owner] -= 1
                if not self._held[waiter.owner]:
                    del self._held[waiter.owner]
                self._free.append(slot)

    def _hand_over(self, waiter: _Waiter, lease: SlotLease) -> None:
        """On the waiter's loop: give it the slot, or give the slot back if it stopped waiting."""
        if waiter.future.done():
            self.release(lease)
        else:
            waiter.future.set_result(lease)

    def should_yield(self, lease: SlotLease) -> bool:
        """Whether ``lease``'s owner should give this slot up now (between two tests): another owner waits
        holding at least two fewer slots, or fewer slots for longer than :data:`QUANTUM_S`."""
        now = time.monotonic()
        with self._lock:
            mine = self._held.get(lease.owner, 0)
            for w in self._waiters:
                theirs = self._held.get(w.owner, 0)
                if w.owner is not lease.owner and (theirs + 2 <= mine or (theirs < mine and now - w.since > QUANTUM_S)):
                    return True
            return False
