"""Functions the isolated-runner tests send to its child processes (importable there, nothing heavy)."""

from __future__ import annotations

import os


def die_hard() -> None:
    """Ends the process without a Python exception (as a crash in native code would)."""
    os._exit(3)


def slow_square(x: int | str) -> int:
    if isinstance(x, str):
        raise ZeroDivisionError(x)
    return x * x
