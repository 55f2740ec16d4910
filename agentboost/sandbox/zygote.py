"""Host side of the sandbox zygote (:mod:`agentboost.sandbox._zygote`): start it, hand it runs, watch them.

One zygote per :class:`~agentboost.sandbox.Sandbox`, started on the program's interpreter with the
program's flags and environment, so a forked child starts from the state a fresh interpreter has. A run
is one ``sendmsg`` on the control socket (the launch configuration plus a status socket and the stdio
pipes); the zygote answers on the status socket with the child's pid and a pidfd, then its wait status.

The zygote lives as long as its control socket: closing :class:`Zygote` (or this process dying) ends it
and its runs. A child process of this one (``os.fork`` without ``exec``) drops its inherited copy of the
control socket and never uses this process's zygote. Anything unexpected (the zygote gone, a malformed
answer) is a :class:`ZygoteError`: the sandbox then runs the program the cold way and starts a new
zygote for later runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import marshal
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_DIR = str(Path(__file__).parent)
_BOOT = (
    "import sys;b=(frozenset(sys.modules),tuple(sys.path),frozenset(sys.path_importer_cache));"
    f"sys.path.append({_DIR!r});import _zygote as z;z.run(z.serve(int(sys.argv[1])),b)"
)
"""Captures the interpreter's start-up state before importing anything (restored for every program)."""
_START_TIMEOUT_S = 30.0
_SEND_TIMEOUT_S = 10.0
_live: weakref.WeakSet[Zygote] = weakref.WeakSet()


class ZygoteError(RuntimeError):
    """The zygote cannot start, is gone or answered nonsense (the run goes the cold way)."""


class ZygoteRun:
    """One program forked by the zygote: kill it through its pidfd, await its exit status."""

    def __init__(self, status: socket.socket, pid: int, pidfd: int, early: bytes | None = None) -> None:
        self._status = status
        self.pid = pid
        self._pidfd = pidfd
        self.returncode: int | None = None
        if early is not None:  # PID 1's report can overtake the zygote's pid message
            self._set_returncode(early)

    def kill(self) -> None:
        """SIGKILL the run's first process; its PID namespace (and everything in it) dies with it."""
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def wait(self) -> int:
        """The exit status as asyncio reports it (``-N``: killed by signal N): the program's, as PID 1 of
        its namespace reported it (``X``), or the forked child's (``S``) when it was killed before that."""
        if self.returncode is None:
            data, fd = await _receive(self._status)
            if fd is not None:
                os.close(fd)
            self._set_returncode(data)
        assert self.returncode is not None
        return self.returncode

    def _set_returncode(self, data: bytes) -> None:
        if len(data) != 5 or data[:1] not in (b"X", b"S"):
            raise ZygoteError(f"zygote gave no exit status for pid {self.pid} ({data[:40]!r})")
        status = int.from_bytes(data[1:], sys.byteorder, signed=True)
        if data[:1] == b"X":
            self.returncode = status
        else:
            self.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        self._status.close()


class Zygote:
    """A warm interpreter that forks sandbox runs (module doc). Thread-safe."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        """``argv``: the program's interpreter and flags (``[python, "-I", "-B", "-S"]``); ``env``: the
        run environment (each run brings its own; the zygote's only shapes the interpreter's start)."""
        self._owner = os.getpid()
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control = ours
        try:
            # An empty context: a worker pool marks subprocesses started inside an episode as that
            # episode's (and kills them when it ends); the zygote belongs to the process, not an episode.
            self._proc = contextvars.Context().run(
                subprocess.Popen,
                [*argv, "-c", _BOOT, str(theirs.fileno())],
                pass_fds=[theirs.fileno()], env=env, cwd="/", start_new_session=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
        finally:
            theirs.close()
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.close()  # its stdio are pipes (as a program's are): stdin at end of file,
        self._proc.stdout.close()  # stdout unread (it never writes there); stderr kept for diagnostics
        ours.settimeout(_START_TIMEOUT_S)
        try:
            hello = ours.recv(16)
        except OSError as exc:
            self.close()
            raise ZygoteError(f"zygote did not start: {exc}") from None
        if hello != b"ready":
            self.close()
            raise ZygoteError(f"zygote did not start: {self.diagnostics() or 'no output'}")
        ours.settimeout(_SEND_TIMEOUT_S)
        _live.add(self)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def usable(self) -> bool:
        """Alive, and this process's own (not one inherited through ``fork``)."""
        return self._owner == os.getpid() and self._control.fileno() >= 0 and self._proc.poll() is None

    async def spawn(self, config: dict[str, Any], stdin: int, stdout: int, stderr: int) -> ZygoteRun:
        """Fork a run with these (child-side) pipe ends; they are closed here either way."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            fds = [theirs.fileno(), stdin, stdout, stderr]
            payload = marshal.dumps(config)
            with self._lock:
                if not self.usable:
                    raise ZygoteError("zygote is not running")
                try:
                    self._control.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _pack(fds))])
                except OSError as exc:
                    raise ZygoteError(f"zygote refused the run: {exc}") from None
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            for fd in (stdin, stdout, stderr):
                os.close(fd)
        early = None
        try:
            while True:
                data, pidfd = await _receive(ours)
                if data[:1] == b"X" and early is None and pidfd is None:
                    early = data  # PID 1's report went out before the zygote's pid message
                    continue
                if data[:1] != b"P" or len(data) != 9 or pidfd is None:
                    if pidfd is not None:
                        os.close(pidfd)
                    raise ZygoteError(f"zygote could not fork: {data[1:200].decode(errors='replace') or 'gone'}")
                break
        except BaseException:
            ours.close()
            raise
        return ZygoteRun(ours, int.from_bytes(data[1:], sys.byteorder), pidfd, early)

    def diagnostics(self) -> str:
        """What the zygote wrote on stderr (its traceback if it died), without waiting for more."""
        stream = self._proc.stderr
        if stream is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(stream.fileno(), False)
            data = stream.read(16384) or b""
            return data.decode("utf-8", errors="replace").strip()[-2000:]
        return ""

    def close(self) -> None:
        """End the zygote (and every run it still has) and release its descriptors."""
        with self._lock:
            self._control.close()  # end of file: the zygote kills its runs and exits
            if self._owner != os.getpid():
                return  # an inherited copy: the zygote is the parent's
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stderr is not None:
            self._proc.stderr.close()


def _pack(fds: list[int]) -> bytes:
    return b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)


async def _receive(sock: socket.socket) -> tuple[bytes, int | None]:
    """The next message on ``sock`` (``b""`` at end of file) and the descriptor passed with it, if any."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    done: asyncio.Future[tuple[bytes, int | None]] = loop.create_future()

    def ready() -> None:
        try:
            data, ancillary, _, _ = sock.recvmsg(256, socket.CMSG_SPACE(4))
        except BlockingIOError:
            return
        except OSError:
            data, ancillary = b"", []
        fd = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS and len(payload) >= 4:
                fd = int.from_bytes(payload[:4], sys.byteorder, signed=True)
        if not done.done():
            done.set_result((data, fd))
        elif fd is not None:
            os.close(fd)
        loop.remove_reader(sock.fileno())

    loop.add_reader(sock.fileno(), ready)
    try:
        return await done
    finally:
        loop.remove_reader(sock.fileno())


def _after_fork_in_child() -> None:
    """A forked child drops its copies of every zygote's control socket (never taking a lock: another
    thread may have held it at the fork); the zygotes stay their parent's."""
    for zygote in list(_live):
        zygote._lock = threading.Lock()
        with contextlib.suppress(OSError):
            zygote._control.close()


os.register_at_fork(after_in_child=_after_fork_in_child)
