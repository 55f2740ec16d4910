"""Host side of the sandbox zygote (:mod:`agentboost.sandbox._zygote`): start it, hand it runs, watch them.

Zygotes are started on the program's interpreter with the program's flags and environment, so a forked
child starts from the state a fresh interpreter has; each forks at most a few runs (:class:`ZygotePool`),
so runs share a hash seed only with the few other runs of their zygote. A run
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
import queue
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .status import ExitStatus

logger = logging.getLogger(__name__)

_DIR = str(Path(__file__).parent)
_BOOT = (
    "import sys;b=(frozenset(sys.modules),tuple(sys.path),frozenset(sys.path_importer_cache));"
    f"sys.path.append({_DIR!r});import _zygote as z;z.run(z.serve(int(sys.argv[1]),*sys.argv[2:]),b)"
)
"""Captures the interpreter's start-up state before importing anything (restored for every program)."""
_START_TIMEOUT_S = 30.0
_AHEAD = 16
"""A zygote starts once its predecessors have room for fewer than this many runs (or than one zygote's
runs, if fewer): a start takes as long as several runs, more on a busy host, and a run must not wait for
one (with 4, one run in 9 waited at 2 concurrent runs on a loaded 2-core host)."""
_SEND_TIMEOUT_S = 10.0
_live: weakref.WeakSet[Zygote] = weakref.WeakSet()
_pools: weakref.WeakSet[ZygotePool] = weakref.WeakSet()


class _Background:
    """A few daemon threads that start and close zygotes for the pools. Handing them work never waits: a
    thread of its own per start made the event loop wait for the thread to start (milliseconds on a busy
    host, with a pool lock held); threads are added only while every one is busy, up to ``most``."""

    def __init__(self, most: int = 8) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._most = most

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            new = not self._idle and self._threads < self._most
            if new:
                self._threads += 1
            elif self._idle:
                self._idle -= 1  # that one takes it
        self._queue.put(fn)
        if new:
            threading.Thread(target=self._work, name="agentboost-zygote", daemon=True).start()

    def _work(self) -> None:
        while True:
            fn = self._queue.get()
            try:
                fn()
            except Exception:  # a bug: logged, the thread goes on
                logger.exception("sandbox zygote start or close failed")
            with self._lock:
                self._idle += 1


_background = _Background()


class ZygoteError(RuntimeError):
    """The zygote cannot start, is gone or answered nonsense (the run goes the cold way)."""


class ZygoteRun:
    """One program forked by the zygote: kill it through its pidfd, await how it ended."""

    def __init__(self, status: socket.socket, pid: int, pidfd: int, early: bytes | None = None,
                 on_close: Callable[[], None] | None = None) -> None:  # fmt: skip
        self._status = status
        self.pid = pid
        self._pidfd = pidfd
        self._on_close = on_close
        self.status: ExitStatus | None = None
        if early is not None:  # PID 1's report can overtake the zygote's pid message
            self._set_status(early)

    def kill(self) -> None:
        """SIGKILL the run's first process; its PID namespace (and everything in it) dies with it."""
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def wait(self) -> ExitStatus:
        """How the program ended, as PID 1 of its namespace reported it (``X``), or the forked child's own
        wait status (``S``) when it was killed before that."""
        if self.status is None:
            data, fd = await _receive(self._status)
            if fd is not None:
                os.close(fd)
            self._set_status(data)
        assert self.status is not None
        return self.status

    def _set_status(self, data: bytes) -> None:
        if len(data) != 5 or data[:1] not in (b"X", b"S"):
            raise ZygoteError(f"zygote gave no exit status for pid {self.pid} ({data[:40]!r})")
        self.status = ExitStatus.from_wait_status(int.from_bytes(data[1:], "little", signed=True))

    def close(self) -> None:
        """Release the pidfd and the status socket (idempotent, never raises)."""
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = -1
        with contextlib.suppress(OSError):
            self._status.close()
        if self._on_close is not None:
            done, self._on_close = self._on_close, None
            done()


class Zygote:
    """A warm interpreter that forks sandbox runs (module doc). Thread-safe."""

    def __init__(self, argv: list[str], env: dict[str, str], template: bytes | None = None,
                 subids: dict[str, Any] | None = None) -> None:  # fmt: skip
        """``argv``: the program's interpreter and flags (``[python, "-I", "-B", "-S"]``); ``env``: the
        run environment (each run brings its own; the zygote's only shapes the interpreter's start);
        ``template``: what the read-only part of the runs' root is built from, once, in the zygote (as
        root; see ``_launcher.build_template``); ``subids``: the subordinate ids' launch spec (an ordinary
        user's runs get uids of their own: ``SubordinateIds.launch_spec``)."""
        self._owner = os.getpid()
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control = ours
        try:
            # An empty context: a worker pool marks subprocesses started inside an episode as that
            # episode's (and kills them when it ends); the zygote belongs to the process, not an episode.
            self._proc = contextvars.Context().run(
                subprocess.Popen,
                [*argv, "-c", _BOOT, str(theirs.fileno()), template.hex() if template else "",
                 marshal.dumps(subids).hex() if subids else ""],
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
        if hello not in (b"ready", b"ready template"):
            self.close()
            raise ZygoteError(f"zygote did not start: {self.diagnostics() or 'no output'}")
        self.templated = hello == b"ready template"
        """It built the template root: its runs can take their files from a memory file (``spawn(files=...)``)."""
        ours.settimeout(_SEND_TIMEOUT_S)
        self.forked = 0
        """Runs handed to it so far."""
        self._in_flight = 0
        self._retired = False
        self._limit: int | None = None
        _live.add(self)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def usable(self) -> bool:
        """Alive, and this process's own (not one inherited through ``fork``)."""
        return self._owner == os.getpid() and self._control.fileno() >= 0 and self._proc.poll() is None

    async def spawn(
        self, config: dict[str, Any], stdin: int, stdout: int, stderr: int, files: int | None = None
    ) -> ZygoteRun:
        """Fork a run with these (child-side) pipe ends; they are closed here either way. ``files``: a
        descriptor the child reads the run's files from (the zygote passes it on unread; left open here)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            fds = [theirs.fileno(), stdin, stdout, stderr, *([] if files is None else [files])]
            payload = marshal.dumps(config)
            with self._lock:
                if not self.usable or self._retired:
                    raise ZygoteError("zygote is not running")
                try:
                    self._control.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _pack(fds))])
                except OSError as exc:
                    raise ZygoteError(f"zygote refused the run: {exc}") from None
                self.forked += 1
                self._in_flight += 1
                if self._limit is not None and self.forked >= self._limit:
                    self._retired = True
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
            self._run_done()
            raise
        return ZygoteRun(ours, int.from_bytes(data[1:], sys.byteorder), pidfd, early, self._run_done)

    def _run_done(self) -> None:
        with self._lock:
            self._in_flight -= 1
            close = self._retired and self._in_flight == 0
        if close:
            self._close_later()

    def _close_later(self) -> None:
        """Close on another thread (waiting for the zygote to exit must not hold an event loop)."""
        _background.submit(self.close)

    @property
    def retired(self) -> bool:
        return self._retired

    def retire_after(self, runs: int | None) -> None:
        """Retire once it has forked ``runs`` runs (None: not)."""
        with self._lock:
            self._limit = runs
            retire = runs is not None and self.forked >= runs
        if retire:
            self.retire()

    def retire(self) -> None:
        """Hand it no more runs; it ends once its runs in flight are done."""
        with self._lock:
            self._retired = True
            close = self._in_flight == 0
        if close:
            self._close_later()

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
    thread may have held it at the fork); the zygotes stay their parent's, and its pools start afresh."""
    global _background
    _background = _Background()  # (the parent's threads are not in this process)
    for zygote in list(_live):
        zygote._lock = threading.Lock()
        with contextlib.suppress(OSError):
            zygote._control.close()
    for pool in list(_pools):
        pool._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


def precompile(python: str) -> None:
    """Have ``python`` write the bytecode of the zygote's modules where it can (next to them): a zygote
    starts with ``-B`` (as the program does) and would otherwise compile them at every start."""
    code = (
        "import os, py_compile, sys\n"
        "for name in ('_launcher', '_runner', '_zygote'):\n"
        "    path = os.path.join(sys.argv[1], name + '.py')\n"
        "    try:\n        py_compile.compile(path, doraise=True)\n"
        "    except (OSError, py_compile.PyCompileError):\n        pass\n"
    )
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([python, "-I", "-S", "-c", code, _DIR], capture_output=True, timeout=60, check=False)


class ZygotePool:
    """Zygotes that each fork at most ``runs_each`` runs, then retire; the next one is started ahead of time
    on a thread of its own, so a run rarely waits for one. Every zygote draws its own hash seed and address
    layout when it starts: forked runs share them only with the other runs of their zygote (at most
    ``runs_each``, never a long-lived one's).

    ``start`` makes a zygote (it may raise :class:`ZygoteError`); after ``max_failures`` failed starts or
    failed runs in a row the pool turns itself off (:attr:`off` says why) and runs start cold."""

    def __init__(self, start: Callable[[], Zygote], runs_each: int, *, spares: int = 1, max_failures: int = 3) -> None:
        self._start = start
        self.runs_each = max(1, runs_each)
        self._spares = max(1, spares)
        self._max_failures = max_failures
        self._lock = threading.Lock()
        self._ready: list[Zygote] = []
        """Zygotes with room for more runs, oldest first."""
        self._reserved: dict[Zygote, int] = {}
        self._starting = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Zygote | None]]] = []
        self._failures = 0
        self.off: str | None = None
        self._closed = False
        self._owner = os.getpid()
        self.started = 0
        _pools.add(self)

    def _forget(self) -> None:
        """In a forked child: the zygotes are the parent's; this process starts its own when it needs one."""
        self._lock = threading.Lock()
        self._ready, self._reserved, self._waiters, self._starting = [], {}, [], 0
        self._owner = os.getpid()

    def adopt(self, zygote: Zygote) -> None:
        """Serve from ``zygote`` first (the one the probe checked)."""
        with self._lock:
            self._ready.insert(0, zygote)
            self._reserved[zygote] = 0
            self.started += 1

    async def take(self) -> Zygote | None:
        """A zygote with room for one more run (reserved for the caller), or None: run cold."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.off is not None or self._closed or self._owner != os.getpid():
                return None
            zygote = self._reserve()
            if zygote is None and self.off is not None:  # turned off just now (it found its zygote dead)
                return None
            future: asyncio.Future[Zygote | None] | None = None
            if zygote is None:
                future = loop.create_future()
                self._waiters.append((loop, future))
            self._top_up()
        if future is None:
            return zygote
        try:
            return await future
        except asyncio.CancelledError:
            with self._lock, contextlib.suppress(ValueError):
                self._waiters.remove((loop, future))
            if future.done() and not future.cancelled() and future.result() is not None:
                self.give_back(future.result())
            raise

    def _reserve(self) -> Zygote | None:
        """(lock held) One more run of the oldest zygote with room; the used-up ones retire."""
        while self._ready:
            zygote = self._ready[0]
            if not zygote.usable:
                self._ready.pop(0)
                self._reserved.pop(zygote, None)
                if not zygote.retired and zygote._owner == os.getpid():
                    logger.warning("sandbox zygote (pid %d) died: %s", zygote.pid, zygote.diagnostics() or "no output")
                    self._failed()
                zygote.retire()
                continue
            count = self._reserved.get(zygote, 0) + 1
            self._reserved[zygote] = count
            if count >= self.runs_each:
                self._ready.pop(0)
                zygote.retire_after(count)
            return zygote
        return None

    def give_back(self, zygote: Zygote) -> None:
        """A reservation not used (its run was cancelled before it was sent)."""
        with self._lock:
            count = self._reserved.get(zygote, 0) - 1
            if count < 0 or self._closed:
                return
            self._reserved[zygote] = count
            zygote.retire_after(None)
            if zygote not in self._ready:
                self._ready.insert(0, zygote)
            self._serve_waiters()

    def _top_up(self) -> None:
        """(lock held) Start zygotes until there is a spare beyond what the waiters will take."""
        room = sum(self.runs_each - self._reserved.get(z, 0) for z in self._ready)
        need = len(self._waiters) + min(self.runs_each, _AHEAD)  # the waiters, then a few runs ahead
        starting_room = self._starting * self.runs_each
        while room + starting_room < need or (not self._ready and self._starting < self._spares):
            if self.off is not None or self._closed:
                return
            self._starting += 1
            starting_room += self.runs_each
            _background.submit(self._start_one)

    def _start_one(self) -> None:
        try:
            zygote = contextvars.Context().run(self._start)
        except ZygoteError as exc:
            with self._lock:
                self._starting -= 1
                self._failed(str(exc))
                if self.off is None and self._waiters:
                    self._top_up()
            return
        with self._lock:
            self._starting -= 1
            self.started += 1
            self._failures = 0
            if self._closed or self._owner != os.getpid():
                zygote.close()
                return
            self._ready.append(zygote)
            self._reserved[zygote] = 0
            self._serve_waiters()

    def _serve_waiters(self) -> None:
        """(lock held) Hand reserved runs to the waiters, oldest first."""
        while self._waiters:
            zygote = self._reserve()
            if zygote is None:
                self._top_up()
                return
            loop, future = self._waiters.pop(0)
            try:
                loop.call_soon_threadsafe(_hand, future, zygote, self.give_back)
            except RuntimeError:  # that loop is closed: the reservation goes back
                count = self._reserved[zygote] - 1
                self._reserved[zygote] = count
                zygote.retire_after(None)
                if zygote not in self._ready:
                    self._ready.insert(0, zygote)

    def _failed(self, why: str = "") -> None:
        """(lock held)"""
        self._failures += 1
        if self._failures > self._max_failures and self.off is None:
            self.off = why or f"the zygote failed {self._failures} times"
            logger.warning("sandbox zygote disabled (%s): every run starts its interpreters", self.off)
            for loop, future in self._waiters:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_hand, future, None, None)
            self._waiters.clear()

    @property
    def failures(self) -> int:
        """Failed starts, deaths and failed runs since the last good start."""
        return self._failures

    def failed(self, zygote: Zygote) -> None:
        """A run could not go through ``zygote`` (it died or answered nonsense): no more runs for it."""
        with self._lock:
            if zygote in self._ready:
                self._ready.remove(zygote)
            self._reserved.pop(zygote, None)
            self._failed()
        zygote.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            zygotes = list(self._reserved)
            self._ready, self._reserved = [], {}
            for loop, future in self._waiters:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_hand, future, None, None)
            self._waiters.clear()
        for zygote in zygotes:
            zygote.close()


def _hand(future: asyncio.Future[Zygote | None], zygote: Zygote | None,
          give_back: Callable[[Zygote], None] | None) -> None:  # fmt: skip
    if not future.done():
        future.set_result(zygote)
    elif zygote is not None and give_back is not None:
        give_back(zygote)
