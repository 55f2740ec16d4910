"""How a sandboxed program ended, as the launcher's PID 1 reports it (never the ambiguous ``128 + N``)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

REPORT_SIZE = 5
"""``b"X"`` + the program's wait status (4 bytes, little-endian): what PID 1 of a run reports."""


def report(status: int) -> bytes:
    return b"X" + status.to_bytes(4, "little", signed=True)


@dataclass(frozen=True)
class ExitStatus:
    """How a program ended: its exit code, or the signal that killed it (never both)."""

    code: int | None
    signal: int | None

    @classmethod
    def from_wait_status(cls, status: int) -> ExitStatus:
        if os.WIFSIGNALED(status):
            return cls(None, os.WTERMSIG(status))
        if os.WIFEXITED(status):
            return cls(os.WEXITSTATUS(status), None)
        return cls(None, signal.SIGKILL)

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        """From asyncio's convention (``-N``: killed by signal N)."""
        return cls(None, -returncode) if returncode < 0 else cls(returncode, None)

    @classmethod
    def from_report(cls, data: bytes) -> ExitStatus | None:
        if len(data) != REPORT_SIZE or data[:1] != b"X":
            return None
        return cls.from_wait_status(int.from_bytes(data[1:], "little", signed=True))
