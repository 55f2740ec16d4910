"""Ctrl-C between steps: a long loop that saves its state asks for the interruption to wait for the step in
hand, so what it saves is a whole step (not an optimizer half-way through its update)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def held_interrupts() -> Iterator[Callable[[], bool]]:
    """Within the block, a first Ctrl-C (SIGINT) is held: the returned ``pending()`` says it came, and the
    loop ends its step, saves and raises ``KeyboardInterrupt`` itself. A second Ctrl-C interrupts at once.
    Outside the main thread (where no signal handler can be set) ``pending()`` is always False and Ctrl-C
    works as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    came = threading.Event()

    def hold(signum: int, frame: Any) -> None:
        if came.is_set():
            raise KeyboardInterrupt
        came.set()

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield came.is_set
    finally:
        signal.signal(signal.SIGINT, previous)
