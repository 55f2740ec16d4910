"""A started run seen from the host: its process (forked by the zygote or started cold), its pipes, its
exit status.

Everything here is safe to abandon half-way: :meth:`RunProcess.release` and :meth:`Fd.close` are
synchronous, idempotent and never raise, so a caller cancelled in the middle of waiting still releases
every descriptor (see ``Sandbox._dispose``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .status import ExitStatus
from .zygote import Zygote, ZygoteError, ZygoteRun

T = TypeVar("T")
MARK = "agentboost-sandbox:"
"""Prefix of the launcher's notes on the program's stderr (a layer it could not set up)."""
DRAIN_S = 2.0
FINISH_S = 5.0


class Fd:
    """A descriptor closed exactly once, by whichever side is done with it first."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)


def pipes(count: int = 3) -> list[tuple[int, int]]:
    """``count`` pipes (``(read end, write end)`` each, close-on-exec); all or none."""
    made: list[tuple[int, int]] = []
    try:
        for _ in range(count):
            made.append(os.pipe())
    except OSError:
        for pair in made:
            for fd in pair:
                os.close(fd)
        raise
    return made


class RunProcess:
    """A started run, whichever way it was started."""

    async def wait(self) -> ExitStatus:
        """How the program ended; :class:`ZygoteError` if its zygote vanished."""
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    async def finish(self) -> None:
        """Make sure it is dead and reaped (bounded wait; may be cancelled: :meth:`release` still runs)."""
        raise NotImplementedError

    def release(self) -> None:
        """Release the descriptors this side holds for it (synchronous, idempotent, never raises)."""


class StartedProcess(RunProcess):
    """A cold run: the launcher started as a subprocess of this process, reporting on ``report``."""

    def __init__(self, proc: asyncio.subprocess.Process, kill: Callable[[], None], report: Fd) -> None:
        self._proc = proc
        self._kill = kill
        self._report = report

    async def wait(self) -> ExitStatus:
        returncode = await self._proc.wait()
        reported = None
        if self._report.fd >= 0:
            with contextlib.suppress(OSError):
                os.set_blocking(self._report.fd, False)
                reported = ExitStatus.from_report(os.read(self._report.fd, 64))
        return reported or ExitStatus.from_returncode(returncode)

    def kill(self) -> None:
        self._kill()

    async def finish(self) -> None:
        if self._proc.returncode is None:
            self._kill()
            with contextlib.suppress(ProcessLookupError, TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._proc.wait(), timeout=FINISH_S)

    def release(self) -> None:
        self._report.close()


class ForkedProcess(RunProcess):
    """A warm run: forked by ``zygote``."""

    def __init__(self, run: ZygoteRun, zygote: Zygote) -> None:
        self._run = run
        self.zygote = zygote

    async def wait(self) -> ExitStatus:
        return await self._run.wait()

    def kill(self) -> None:
        self._run.kill()

    async def finish(self) -> None:
        if self._run.status is None:
            self._run.kill()
            with contextlib.suppress(ZygoteError, OSError, TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._run.wait(), timeout=FINISH_S)

    def release(self) -> None:
        self._run.close()


class CappedReader:
    """Reads a pipe to its end on the running loop, keeping the first ``keep`` bytes (default: ``cap``) and
    counting the rest (:attr:`size`). Past ``cap`` it calls ``on_overflow`` once (the caller ends the run)
    and stops reading: a flood costs this process nothing more. The pipe stays open until :meth:`close` (a
    writer about to be killed blocks, it gets no error)."""

    def __init__(
        self, pipe: Fd, cap: int, on_overflow: Callable[[], None] | None = None, *, keep: int | None = None
    ) -> None:
        self._pipe = pipe
        self._fd = pipe.fd
        self._cap = cap
        self._keep = cap if keep is None else min(keep, cap)
        self._kept = bytearray()
        self.size = 0
        self._on_overflow = on_overflow
        self._watching = True
        self.truncated = False
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self._loop.create_future()
        os.set_blocking(self._fd, False)
        self._loop.add_reader(self._fd, self._ready)

    @property
    def data(self) -> bytes:
        return bytes(self._kept)

    def _ready(self) -> None:
        try:
            chunk = os.read(self._fd, 65536)  # one read per wake-up: a flood cannot starve the loop
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._stop()
            return
        room = self._cap - self.size
        self.size += min(len(chunk), max(room, 0))
        if len(self._kept) < self._keep:
            self._kept += chunk[: self._keep - len(self._kept)]
        if len(chunk) > room:
            self.truncated = True
            if self._on_overflow is not None:
                overflow, self._on_overflow = self._on_overflow, None
                overflow()
            self._stop()

    def _stop(self) -> None:
        if self._watching:
            self._watching = False
            self._loop.remove_reader(self._fd)
        if not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        if self._fd >= 0:
            self._stop()
            self._pipe.close()
            self._fd = -1


async def drain(readers: list[CappedReader]) -> None:
    """Wait for the readers to reach end of file: at once when every process of the run is gone; a
    process that left its session and holds the pipe (no PID namespace) costs at most ``DRAIN_S``."""
    if all(r.done.done() for r in readers):
        return  # (the common case: no waiter, no timer)
    await asyncio.wait([r.done for r in readers], timeout=DRAIN_S)


def feed_now(stdin: Fd, data: bytes) -> bytes:
    """Write what the pipe takes of ``data`` at once without blocking; close ``stdin`` (end of file) when
    all of it went. Returns the rest, for :func:`feed` (most inputs fit in a pipe: no task, no wake-up)."""
    view = memoryview(data)
    try:
        os.set_blocking(stdin.fd, False)
        while view:
            view = view[os.write(stdin.fd, view[:65536]) :]
    except BlockingIOError:
        return bytes(view)
    except OSError:  # the program closed its stdin or exited
        pass
    stdin.close()
    return b""


async def wait_within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """``asyncio.wait_for`` without the task it wraps the awaitable in, where the loop has
    ``asyncio.timeout`` (3.11+); raises ``TimeoutError`` either way."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(timeout_s):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout=timeout_s)


async def feed(stdin: Fd, data: bytes) -> None:
    """Write ``data`` to the program's stdin without blocking the loop, then close it (end of file)."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    try:
        os.set_blocking(stdin.fd, False)
        while view and stdin.fd >= 0:
            try:
                view = view[os.write(stdin.fd, view[:65536]) :]
                continue
            except BlockingIOError:
                pass
            except OSError:  # the program closed its stdin or exited
                return
            writable = loop.create_future()
            fd = stdin.fd
            loop.add_writer(fd, writable.set_result, None)
            try:
                await writable
            finally:
                loop.remove_writer(fd)
    finally:
        stdin.close()


def split_notes(stderr: str) -> tuple[list[str], str]:
    """The launcher's notes (lines with :data:`MARK`) and the program's own stderr."""
    notes, kept = [], []
    for line in stderr.splitlines(keepends=True):
        if line.startswith(MARK):
            notes.append(line[len(MARK) :].strip())
        else:
            kept.append(line)
    return notes, "".join(kept)


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
