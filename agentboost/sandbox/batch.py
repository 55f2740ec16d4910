"""Run one program on many inputs through a few sandboxed batch harnesses (:mod:`._harness`).

Why: a code reward runs the final program on every hidden test, up to hundreds; one sandboxed process per
test pays the sandbox's start-up per test. A harness pays it once per session and forks one child per
input inside the sandbox, which then starts from the state a fresh interpreter has.

What each input gets, as in a single run (see the harness doc): a fresh working directory, ``/tmp`` and
``/dev/shm`` (new tmpfs mounts: nothing an earlier input did to files, their times, modes, extended
attributes or inode numbers can be found), a new IPC namespace and session keyring, a fresh program
(module state, ``sys``, environment, signal handlers; the harness's own imports are out of sight), its
stdin, its own wall-clock limit (from its fork), its CPU-time limit (a child's CPU time starts at 0), the
stdout and stderr caps (the program is killed as soon as it writes more), and its wait status as such.
After each input every other process of the sandbox is killed. Nothing derived from an input's expected
output reaches the harness: the stdout cap is the same for every input. Differences from single runs:
the program's parent is the harness and its pid varies; hash seed, address layout, network namespace and
cgroup are the session's (the cgroup holds the harness too: ``SESSION_MB`` more); call-based programs
start with ``json`` imported (see the harness doc).

Where: only where the sandbox has a PID namespace with a private ``/proc`` and a private ``/tmp``, and the
harness can give each input its fresh mounts (:func:`batch_available`, checked once per sandbox with a
real batch); elsewhere callers run one sandbox per input. Trust: the harness shares the sandbox with the
program, which could tamper with it, so its reports are parsed as untrusted bytes. An input whose report
is missing, malformed or later than its limit plus a margin is run again on its own (``single``) and the
harness is replaced: a program gains nothing by it.

Fairness: a session holds one of the sandbox's slots; between two inputs it gives the slot up when another
owner waits with fewer (:meth:`~agentboost.sandbox.slots.Slots.should_yield`), and its worker queues
again for one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import marshal
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from .config import SandboxResult
from .paths import inside
from .process import CappedReader
from .sandbox import Sandbox, _Run
from .status import ExitStatus

logger = logging.getLogger(__name__)

HARNESS = ".harness.py"
PER_SESSION = 128
"""Inputs per harness session (its own CPU-time limit covers its bookkeeping for this many)."""
_TIMED_OUT, _OUT_CUT, _ERR_CUT, _SETUP_FAILED = 1, 2, 4, 8
_HEADER = 4 + 4 + 1 + 4
_available: weakref.WeakKeyDictionary[Sandbox, bool] = weakref.WeakKeyDictionary()
_available_lock = threading.Lock()


@dataclass(frozen=True)
class BatchInput:
    stdin: str
    stdout_keep: int | None = None
    """Bytes of this input's stdout the host keeps and decodes (the rest is counted, ``stdout_size``);
    None: all. The harness never sees it: every input runs under the same cap."""


class _Anomaly(Exception):
    """The harness did not report an input properly (gone, late, malformed)."""


@functools.cache
def harness_source() -> str:
    """The harness with the launcher and the runner inlined (one stdlib-only file for the sandbox's
    working directory)."""
    here = Path(__file__).parent
    harness = (here / "_harness.py").read_text(encoding="utf-8")
    runner = (here / "_runner.py").read_text(encoding="utf-8")
    launcher = (here / "_launcher.py").read_text(encoding="utf-8")
    launcher = launcher[: launcher.rindex('if __name__ == "__main__":')]
    start = harness.index("from _launcher import (")
    end = harness.index(")\n", start) + 2
    harness = harness[:start] + launcher + "\n" + harness[end:]
    line = next(x for x in harness.splitlines(keepends=True) if x.startswith("from _runner import"))
    return harness.replace(line, runner + "\n", 1)


def batch_available(sandbox: Sandbox) -> bool | None:
    """Whether batches run in ``sandbox`` (None: not checked yet; see :func:`check_batches`)."""
    return _available.get(sandbox)


async def check_batches(sandbox: Sandbox) -> bool:
    """Whether ``sandbox`` can run batches: the isolation it needs, and a real two-input batch that gives
    the outputs single runs give. Checked once per sandbox; a failure is logged once."""
    known = _available.get(sandbox)
    if known is not None:
        return known
    iso = await asyncio.to_thread(sandbox.isolation)
    missing = [k for k in ("pid_namespace", "private_proc", "mount_namespace", "private_tmp") if not iso.get(k)]
    why = f"no {', '.join(missing)}" if missing else None
    if why is None:
        program = "import sys\nprint(sys.stdin.read()[::-1], end='')\nsys.exit(3)"
        inputs = [BatchInput("abc"), BatchInput("xyz")]

        async def alone(i: int) -> SandboxResult:
            raise _Anomaly(f"input {i} was not reported")

        try:
            results = await run_batch(sandbox, program, inputs, timeout_s=20.0, stdout_cap=100, single=alone)
            if [(r.stdout, r.exit_code) for r in results if r is not None] != [("cba", 3), ("zyx", 3)]:
                why = f"a test batch gave {results!r}"
        except _Anomaly as exc:
            why = f"a test batch failed: {exc}"
    with _available_lock:
        if sandbox not in _available:
            _available[sandbox] = why is None
            if why is not None:
                logger.warning("sandbox batches unavailable (%s): every test input runs in a sandbox of its own", why)
    return _available[sandbox]


async def run_batch(
    sandbox: Sandbox,
    program: str,
    inputs: list[BatchInput],
    *,
    timeout_s: float,
    stdout_cap: int,
    single: Callable[[int], Awaitable[SandboxResult]],
    on_result: Callable[[int, SandboxResult], Awaitable[bool]] | None = None,
    preload_json: bool = False,
    workers: int | None = None,
) -> list[SandboxResult | None]:
    """Run ``program`` (as ``main.py``) on every input; one result per input, in order.

    ``stdout_cap``: bytes of stdout read per input, the same for all (a program writing more is killed).
    ``single(i)`` runs input ``i`` on its own (inputs the harness failed to report). ``on_result(i, r)``
    is awaited on every result as it comes, which is then not kept (the list holds None: a suite of large
    outputs holds one at a time); returning True stops the batch.
    ``workers``: harness sessions at once (default: one more than CPU cores, within the sandbox's slots:
    each session also waits, on its children's exits and on the host, while the others run). Cancelled or
    stopped, it releases every session it started before it returns."""
    if not inputs:
        return []
    results: list[SandboxResult | None] = [None] * len(inputs)
    queue = collections.deque(range(len(inputs)))
    stop = asyncio.Event()
    count = workers or (os.cpu_count() or 1) + 1  # one more than cores: each session also waits (its exits)
    count = max(1, min(count, len(inputs), sandbox.config.slots))

    async def record(i: int, result: SandboxResult) -> None:
        if on_result is None:
            results[i] = result
        elif await on_result(i, result):
            stop.set()

    async def worker() -> None:
        while queue and not stop.is_set():
            retry = await _session(sandbox, program, inputs, queue, record=record, stop=stop, timeout_s=timeout_s,
                                   stdout_cap=stdout_cap, preload_json=preload_json)  # fmt: skip
            if retry is not None and not stop.is_set():
                await record(retry, await single(retry))

    tasks = [asyncio.ensure_future(worker()) for _ in range(count)]
    stopper = asyncio.ensure_future(stop.wait())
    try:
        pending: set[asyncio.Future[object]] = set(tasks)
        while pending and not stop.is_set():
            done, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopper)
            for task in done - {stopper}:
                task.result()  # an error in a worker is the caller's
    finally:
        stopper.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return results


async def _session(
    sandbox: Sandbox,
    program: str,
    inputs: list[BatchInput],
    queue: collections.deque[int],
    *,
    record: Callable[[int, SandboxResult], Awaitable[None]],
    stop: asyncio.Event,
    timeout_s: float,
    stdout_cap: int,
    preload_json: bool,
) -> int | None:
    """One harness: inputs from ``queue`` until it is empty, ``PER_SESSION`` are done, ``stop``, or its slot
    is wanted by another owner. Returns the input it failed to report (to run alone), or None."""
    files = {HARNESS: harness_source(), "main.py": program}
    async with sandbox._session(files, script=HARNESS) as run:
        channel = _Channel(run)
        diagnostics = CappedReader(run.stderr, 16 * 1024)
        limit = stdout_cap + sandbox.config.stderr_cap + _HEADER + 8

        def payload(i: int) -> bytes:
            return marshal.dumps({"i": i, "stdin": inputs[i].stdin.encode("utf-8", errors="replace")})

        ahead: int | None = None  # the next input, sent while the harness still runs this one
        try:
            await channel.send(marshal.dumps(_setup(sandbox, run, timeout_s, stdout_cap, preload_json)))
            if not queue or stop.is_set():
                return None
            i = queue.popleft()
            try:
                channel.expect(inputs[i].stdout_keep)
                await channel.send(payload(i))
            except _Anomaly:
                return i
            for n in range(1, PER_SESSION + 1):
                rest = b""
                yielding = run.lease is not None and sandbox.slots.should_yield(run.lease)  # another owner's turn
                if n < PER_SESSION and queue and not stop.is_set() and not yielding:
                    ahead = queue.popleft()
                    channel.expect(inputs[ahead].stdout_keep)
                    rest = channel.send_ahead(payload(ahead))  # (what the pipe did not take: after the report)
                try:
                    frame, dropped = await channel.receive(timeout_s + max(2.0, timeout_s / 2), limit)
                    result = _parse(frame, i, stdout_cap, sandbox.config.stderr_cap, run.uid, timeout_s=timeout_s,
                                    dropped=dropped)  # fmt: skip
                    del frame
                except _Anomaly as exc:
                    tail = diagnostics.data.decode("utf-8", errors="replace")[-500:]
                    logger.warning("sandbox batch harness failed input %d (%s) %s; running it alone", i, exc, tail)
                    return i
                await record(i, result)
                del result
                if ahead is None or stop.is_set():
                    return None
                i, ahead = ahead, None
                if rest:
                    try:
                        await channel.send(rest, framed=False)
                    except _Anomaly:
                        return i
            return None
        finally:
            if ahead is not None:  # sent ahead but never reported: back to the queue's front
                queue.appendleft(ahead)
            channel.close()
            diagnostics.close()


def _setup(sandbox: Sandbox, run: _Run, timeout_s: float, stdout_cap: int, preload_json: bool) -> dict[str, object]:
    workdir = str(run.workdir)
    iso = sandbox.isolation()
    if iso.get("deny_by_default_fs"):
        private = ["/tmp", "/dev/shm"]  # fresh tmpfs mounts in the program's own root
    else:  # the deny-list's private tmpfs mounts (not /tmp where the sandbox root lies there)
        private = [d for d in ("/tmp", "/var/tmp", "/dev/shm") if not inside(str(sandbox._root), d)]
    python = sandbox._python or ""
    return {
        "script": f"{workdir}/main.py",
        "harness": f"{workdir}/{HARNESS}",
        "workdir": workdir,
        "private_dirs": private,
        "ipc": bool(iso.get("ipc_namespace")),
        "tmp_mb": sandbox.config.tmp_mb,
        "max_files": sandbox.config.max_files,
        "orig_argv": sandbox._program_argv(python, "main.py"),
        "env": sandbox._program_env(workdir),
        "timeout": timeout_s,
        "stdout_cap": stdout_cap,
        "stderr_cap": sandbox.config.stderr_cap,
        "preload_json": preload_json,
        "seccomp": sandbox._filters.program if sandbox._filters is not None else None,
    }


def _parse(
    frame: bytes,
    index: int,
    stdout_cap: int,
    stderr_cap: int,
    uid: int | None,
    *,
    timeout_s: float | None = None,
    dropped: int = 0,
) -> SandboxResult:
    """A harness report, checked field by field (it comes from inside the sandbox), less the last
    ``dropped`` bytes of its stdout (:meth:`_Channel.receive`). A program that ran longer than
    ``timeout_s`` timed out, whatever the flags say."""
    if len(frame) < _HEADER + 4:
        raise _Anomaly("short report")
    if int.from_bytes(frame[0:4], "little") != index:
        raise _Anomaly("report for another input")
    status = int.from_bytes(frame[4:8], "little", signed=True)
    flags = frame[8]
    wall_s = int.from_bytes(frame[9:13], "little") / 1e6
    out_len = int.from_bytes(frame[13:17], "little")
    out_end = 17 + out_len - dropped
    if out_len > stdout_cap or dropped > out_len or out_end + 4 > len(frame):
        raise _Anomaly("bad stdout length")
    err_len = int.from_bytes(frame[out_end : out_end + 4], "little")
    if err_len > stderr_cap or out_end + 4 + err_len != len(frame) or flags > 15:
        raise _Anomaly("bad stderr length")
    if flags & _SETUP_FAILED:
        raise _Anomaly(f"no namespaces for the input: {frame[out_end + 4 :][-300:].decode(errors='replace')}")
    timed_out = bool(flags & _TIMED_OUT) or (timeout_s is not None and wall_s > timeout_s)
    ended = ExitStatus.from_wait_status(status)
    return SandboxResult(
        stdout=frame[17:out_end].decode("utf-8", errors="replace"),
        stderr=frame[out_end + 4 :].decode("utf-8", errors="replace"),
        exit_code=None if timed_out else ended.code,
        signal=ended.signal,
        timed_out=timed_out,
        stdout_truncated=bool(flags & _OUT_CUT),
        stderr_truncated=bool(flags & _ERR_CUT),
        wall_s=wall_s,
        uid=uid,
        stdout_size=out_len,
    )


class _Channel:
    """Length-prefixed frames to the harness's stdin and from its stdout, on the running loop. A report's
    stdout past what its input keeps (:meth:`expect`) is dropped as it arrives: a large output is never held."""

    def __init__(self, run: _Run) -> None:
        self._run = run
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._pending: collections.deque[list[int | None]] = collections.deque()
        """Per input sent and not reported yet, in order: [bytes of stdout it keeps (None: all), dropped]."""
        self._eof = False
        self._wakeup: asyncio.Future[None] | None = None
        os.set_blocking(run.stdin.fd, False)
        os.set_blocking(run.stdout.fd, False)
        self._reading = run.stdout.fd
        self._loop.add_reader(self._reading, self._readable)

    def _readable(self) -> None:
        try:
            chunk = os.read(self._reading, 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            self._buffer += chunk
            self._shed()
        else:
            self._eof = True
            self._loop.remove_reader(self._reading)
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def expect(self, keep: int | None) -> None:
        """The next input sent keeps ``keep`` bytes of its stdout (None: all)."""
        self._pending.append([keep, 0])

    def _shed(self) -> None:
        """Drop each report's stdout past what its input keeps, as it arrives (reports follow one another in
        the order their inputs were sent)."""
        buffer, start, fixed = self._buffer, 0, 4 + _HEADER + 4  # (the length, fixed fields, stdout's length)
        for entry in self._pending:
            keep, dropped = entry
            if len(buffer) < start + fixed:
                return
            size = int.from_bytes(buffer[start : start + 4], "little")
            if keep is not None:
                out_len = int.from_bytes(buffer[start + fixed - 4 : start + fixed], "little")
                surplus = min(out_len, size - _HEADER - 4) - keep  # (bytes past keep, within the report)
                cut = start + fixed + keep
                n = min(len(buffer) - cut, surplus - dropped)
                if n > 0:
                    del buffer[cut : cut + n]
                    entry[1] = dropped = dropped + n
            start += 4 + size - dropped
            if len(buffer) <= start:
                return

    async def receive(self, within_s: float, limit: int) -> tuple[bytes, int]:
        """The next report (at most ``limit`` bytes) and how many bytes of its stdout were dropped (the
        report lacks them)."""
        deadline = time.monotonic() + within_s
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                size = int.from_bytes(buffer[:4], "little")
                if size > limit:
                    raise _Anomaly(f"report of {size} bytes")
                self._shed()
                dropped = self._pending[0][1] if self._pending else 0
                if len(buffer) >= 4 + size - dropped:
                    if self._pending:
                        self._pending.popleft()
                    with memoryview(buffer) as view:  # one copy of the report (a slice would be two)
                        frame = bytes(view[4 : 4 + size - dropped])
                    del buffer[: 4 + size - dropped]
                    return frame, dropped
                if len(buffer) > 4 + limit:
                    raise _Anomaly("report too long")
            if self._eof:
                raise _Anomaly("harness ended")
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Anomaly(f"no report within {within_s:g}s")
            self._wakeup = self._loop.create_future()
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup, left)

    def send_ahead(self, payload: bytes) -> bytes:
        """Frame ``payload`` and write what the pipe takes now without waiting (the harness reads it once it
        has reported the input it runs: it reads a frame's exact bytes, never more); returns the rest, for
        :meth:`send` with ``framed=False`` (empty where all of it went; all of it where the harness is gone)."""
        data = len(payload).to_bytes(4, "little") + payload
        view = memoryview(data)
        with contextlib.suppress(OSError):  # full (BlockingIOError), or the harness is gone: send() says so
            while view and self._run.stdin.fd >= 0:
                view = view[os.write(self._run.stdin.fd, view[: 1 << 20]) :]
        return bytes(view)

    async def send(self, payload: bytes, *, framed: bool = True) -> None:
        view = memoryview(len(payload).to_bytes(4, "little") + payload if framed else payload)
        stdin = self._run.stdin
        while view:
            if stdin.fd < 0:
                raise _Anomaly("harness stdin closed")
            try:
                view = view[os.write(stdin.fd, view[: 1 << 20]) :]
                continue
            except BlockingIOError:
                pass
            except OSError as exc:
                raise _Anomaly(f"harness gone ({exc.strerror})") from None
            writable = self._loop.create_future()
            fd = stdin.fd
            self._loop.add_writer(fd, writable.set_result, None)
            try:
                await asyncio.wait_for(writable, 30.0)
            except (TimeoutError, asyncio.TimeoutError):
                raise _Anomaly("harness does not read its input") from None
            finally:
                self._loop.remove_writer(fd)

    def close(self) -> None:
        if not self._eof:
            self._loop.remove_reader(self._reading)
            self._eof = True
