"""Run untrusted (model-written) Python in an isolated, resource-limited process.

Every execution gets:

* a separate session / process group, killed as a whole (plus every process of its uid) at the end;
* a scrubbed environment (no tokens, keys, cloud credentials: only PATH, HOME, LANG, TMPDIR);
* a private working directory (mode 0700) that is removed afterwards;
* rlimits: CPU seconds, address space, file size, open files, processes, no core dumps;
* a wall-clock timeout, and caps on the stdout/stderr kept;
* when the OS allows it (root, or unprivileged user namespaces): its own unprivileged uid (one per
  concurrent slot, so sandboxes cannot signal each other or the host), a new network namespace (no
  network), a new mount namespace with private ``/tmp`` ``/var/tmp`` ``/dev/shm``, and a new PID
  namespace with a private ``/proc`` (it cannot see or kill its parent; when it exits, everything it
  spawned dies).

Which layers are active on this machine is probed once (:meth:`Sandbox.isolation`) and logged at
first use; a layer that cannot be set up is reported, never silently assumed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import marshal
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LAUNCHER = str(Path(__file__).with_name("_launcher.py"))
_MARK = "agentboost-sandbox:"
_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
_SYSTEM_DIRS = frozenset({"/", "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/var", "/tmp", "/run",
                          "/opt", "/srv", "/home", "/boot", "/mnt", "/media", "/proc", "/sys", "/dev"})  # fmt: skip


def _rllm_data_dirs() -> list[str]:
    """Where rLLM's ``DatasetRegistry`` keeps registered datasets (found without importing rLLM)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("rllm")
    except (ImportError, ValueError):
        return []
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return [str(Path(loc) / "data") for loc in locations if (Path(loc) / "data").is_dir()]


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


@dataclass(frozen=True)
class SandboxConfig:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    file_size_mb: int = 16
    max_open_files: int = 64
    max_processes: int = 32
    stdout_cap: int = 64 * 1024
    stderr_cap: int = 16 * 1024
    isolate_network: bool = True
    private_tmp: bool = True
    pid_namespace: bool = True
    drop_privileges: bool = True
    uid_base: int = 62000
    slots: int = 16
    """Concurrent executions (each gets its own uid when privileges can be dropped)."""
    python: str | None = None
    """Interpreter for the program (default: this one if the sandbox uid can run it, else /usr/bin/python3)."""
    site_packages: bool = False
    """Let the program import installed packages (default: standard library only)."""
    root: str | None = None
    """Where working directories are created (default: /run/agentboost-sandbox as root, else the temp dir)."""
    hidden_paths: tuple[str, ...] | None = None
    """Host directories the program must not read (prepared datasets hold gold answers): each is covered
    by an empty read-only tmpfs in the program's mount namespace. Default: this process's working
    directory, its home directory (datasets, caches) and rLLM's dataset registry directory. Never
    hidden: ``/``, system directories, and a directory holding the interpreter or the sandbox root
    (a stdlib-only sandbox prefers a system interpreter outside them). Needs the mount namespace;
    ``isolation()["hidden_paths"]`` lists those the program cannot see into (covered, absent inside,
    e.g. under the private ``/tmp``, or unreadable)."""


@dataclass
class SandboxResult:
    """Outcome of one execution. ``exit_code`` is None when the program was killed (timeout, a
    limit's signal); ``signal`` then names the signal (e.g. 24 = SIGXCPU for the CPU limit)."""

    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None = None
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_s: float = 0.0
    isolation_notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Sandbox:
    """Isolated execution of Python programs. Thread-safe; usable from any event loop."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._is_root = os.geteuid() == 0
        self._free_slots = list(range(self.config.slots))
        self._slot_lock = threading.Lock()
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[int]]] = collections.deque()
        self._probe_lock = threading.Lock()
        self._isolation: dict[str, Any] | None = None
        self._python: str | None = None
        root = self.config.root or ("/run/agentboost-sandbox" if self._is_root and os.path.isdir("/run") else None)
        self._root = Path(root) if root else Path(tempfile.gettempdir()) / "agentboost-sandbox"
        self._root.mkdir(parents=True, exist_ok=True)
        os.chmod(self._root, 0o711)
        self._hide = self._hide_candidates()
        self.executions = 0

    # -- public API ---------------------------------------------------------------------
    def isolation(self) -> dict[str, Any]:
        """Which isolation layers are active (probed once with a real execution)."""
        if self._isolation is None:
            with self._probe_lock:
                if self._isolation is None:
                    self._isolation = self._probe()
                    active = [k for k, v in self._isolation.items() if v is True]
                    inactive = [k for k, v in self._isolation.items() if v is False]
                    logger.info(
                        "sandbox isolation active: %s; NOT active: %s; interpreter %s",
                        ", ".join(active) or "none", ", ".join(inactive) or "none", self._isolation["python"],
                    )  # fmt: skip
        return self._isolation

    async def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float | None = None,
        stdout_cap: int | None = None,
        kill_on_overflow: bool = False,
    ) -> SandboxResult:
        """Run ``code`` as ``main.py`` with ``stdin``; never raises for anything the program does.
        ``stdout_cap``: keep this many bytes of stdout for this run (default ``config.stdout_cap``);
        ``kill_on_overflow``: kill the program as soon as its stdout goes past the cap (a judge needs
        nothing more from it)."""
        if self._isolation is None:
            await asyncio.to_thread(self.isolation)
        slot = await self._acquire()
        try:
            return await self._run(code, stdin, timeout_s or self.config.wall_s, slot, self._python or sys.executable,
                                   stdout_cap=stdout_cap, kill_on_overflow=kill_on_overflow)  # fmt: skip
        finally:
            self._release(slot)

    def run_sync(self, code: str, *, stdin: str = "", timeout_s: float | None = None) -> SandboxResult:
        return asyncio.run(self.run(code, stdin=stdin, timeout_s=timeout_s))

    # -- slots -------------------------------------------------------------------------
    # Waiting for a slot must not hold a thread: runs queue up on their event loops (any number of
    # loops, in any threads), and a released slot is handed to the oldest live waiter on its loop.
    async def _acquire(self) -> int:
        loop = asyncio.get_running_loop()
        with self._slot_lock:
            if self._free_slots:
                return self._free_slots.pop()
            waiter: asyncio.Future[int] = loop.create_future()
            self._waiters.append((loop, waiter))
        try:
            return await waiter
        except asyncio.CancelledError:
            with self._slot_lock, contextlib.suppress(ValueError):
                self._waiters.remove((loop, waiter))
            if waiter.done() and not waiter.cancelled():  # handed a slot, then cancelled: give it back
                self._release(waiter.result())
            raise

    def _release(self, slot: int) -> None:
        with self._slot_lock:
            while self._waiters:
                loop, waiter = self._waiters.popleft()
                if waiter.done():
                    continue
                try:
                    loop.call_soon_threadsafe(self._hand_over, waiter, slot)
                    return
                except RuntimeError:  # that loop is closed
                    continue
            self._free_slots.append(slot)

    def _hand_over(self, waiter: asyncio.Future[int], slot: int) -> None:
        """On the waiter's loop: give it the slot, or pass the slot on if it was cancelled meanwhile."""
        if waiter.done():
            self._release(slot)
        else:
            waiter.set_result(slot)

    def _uid(self, slot: int) -> int | None:
        return self.config.uid_base + slot if (self._is_root and self.config.drop_privileges) else None

    # -- execution ---------------------------------------------------------------------
    def _launch_config(self, workdir: Path, slot: int, python: str) -> dict[str, Any]:
        c = self.config
        argv = [python, "-I", "-B"]
        if not c.site_packages:
            argv.append("-S")
        argv.append("main.py")
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(workdir),
            "TMPDIR": str(workdir),
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        private_dirs = [d for d in ("/tmp", "/var/tmp", "/dev/shm") if not str(self._root).startswith(d)]
        return {
            "workdir": str(workdir),
            "argv": argv,
            "env": env,
            "uid": self._uid(slot),
            "net": c.isolate_network,
            "mount": c.private_tmp,
            "pid": c.pid_namespace,
            "private_dirs": private_dirs,
            "hidden": self._hidden_for(python) if c.private_tmp else [],
            "rlimits": {
                "RLIMIT_CPU": [c.cpu_s, c.cpu_s + 1],
                "RLIMIT_AS": c.memory_mb * 1024 * 1024,
                "RLIMIT_FSIZE": c.file_size_mb * 1024 * 1024,
                "RLIMIT_NOFILE": c.max_open_files,
                "RLIMIT_NPROC": c.max_processes,
                "RLIMIT_CORE": 0,
            },
        }

    def _make_workdir(self, slot: int, code: str) -> Path:
        workdir = self._root / f"run-{slot}-{secrets.token_hex(6)}"
        workdir.mkdir(mode=0o700)
        (workdir / "main.py").write_text(code, encoding="utf-8")
        uid = self._uid(slot)
        if uid is not None:
            for path in (workdir, workdir / "main.py"):
                os.chown(path, uid, uid)
        return workdir

    async def _run(
        self,
        code: str,
        stdin: str,
        timeout_s: float,
        slot: int,
        python: str,
        *,
        stdout_cap: int | None = None,
        kill_on_overflow: bool = False,
    ) -> SandboxResult:
        started = time.monotonic()
        workdir = await asyncio.to_thread(self._make_workdir, slot, code)
        config = self._launch_config(workdir, slot, python)
        proc = None
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", LAUNCHER, marshal.dumps(config).hex(),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=config["env"], cwd=str(workdir), start_new_session=True,
            )  # fmt: skip
            pid = proc.pid
            overflow = (lambda: self._kill(pid, slot)) if kill_on_overflow else None
            out_task = asyncio.ensure_future(_read_capped(proc.stdout, stdout_cap or self.config.stdout_cap, overflow))
            err_task = asyncio.ensure_future(_read_capped(proc.stderr, self.config.stderr_cap))
            feed = asyncio.ensure_future(_feed(proc.stdin, stdin.encode("utf-8", errors="replace")))
            timed_out = False
            try:
                await asyncio.wait_for(proc.wait(), timeout=timeout_s)
            except (TimeoutError, asyncio.TimeoutError):
                timed_out = True
            self._kill(proc.pid, slot)
            if timed_out:
                await proc.wait()
            (stdout, out_cut), (stderr, err_cut) = await asyncio.gather(out_task, err_task)
            feed.cancel()
            status = proc.returncode
            # The launcher reports a program killed by signal N as exit status 128 + N.
            sig = -status if status is not None and status < 0 else (status - 128 if status and status > 128 else None)
            notes, stderr_text = _split_notes(stderr.decode("utf-8", errors="replace"))
            self.executions += 1
            return SandboxResult(
                stdout=stdout.decode("utf-8", errors="replace"),
                stderr=stderr_text,
                exit_code=None if timed_out or sig is not None else status,
                signal=sig,
                timed_out=timed_out,
                stdout_truncated=out_cut,
                stderr_truncated=err_cut,
                wall_s=time.monotonic() - started,
                isolation_notes=notes,
            )
        finally:
            if proc is not None and proc.returncode is None:
                self._kill(proc.pid, slot)
                with contextlib.suppress(ProcessLookupError):
                    await proc.wait()
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    def _kill(self, pgid: int, slot: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        uid = self._uid(slot)
        if uid is not None:
            _kill_uid(uid)

    # -- hidden host directories -------------------------------------------------------
    def _hide_candidates(self) -> list[str]:
        wanted = self.config.hidden_paths
        if wanted is None:
            wanted = (os.getcwd(), os.path.expanduser("~"), *_rllm_data_dirs())
        root = os.path.realpath(self._root)
        out: list[str] = []
        for path in wanted:
            real = os.path.realpath(path)
            if real in _SYSTEM_DIRS or any(_inside(real, d) for d in ("/proc", "/sys", "/dev")) or _inside(root, real):
                continue
            out.append(real)
        return list(dict.fromkeys(out))

    def _hidden_for(self, python: str) -> list[str]:
        """The hidden directories that leave ``python`` (and its installation) reachable."""
        keep = {os.path.abspath(python), os.path.realpath(python)}
        if os.path.realpath(python) == os.path.realpath(sys.executable):
            keep |= {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
        return [d for d in self._hide if not any(_inside(k, d) for k in keep)]

    # -- probe -------------------------------------------------------------------------
    def _probe(self) -> dict[str, Any]:
        if self.config.python:
            candidates = [self.config.python]
        elif not self.config.site_packages and len(self._hidden_for(sys.executable)) < len(self._hide):
            candidates = [*_SYSTEM_PYTHONS, sys.executable]  # this interpreter lives in a directory to hide
        else:
            candidates = [sys.executable, *_SYSTEM_PYTHONS]
        last_error = ""
        for python in dict.fromkeys(c for c in candidates if c and os.path.exists(c)):
            probe = (
                "import os, socket, sys\n"
                "r = {'uid': os.getuid(), 'pid': os.getpid(), 'ppid': os.getppid()}\n"
                "s = socket.socket(); s.settimeout(0.5)\n"
                "try:\n    s.connect(('127.0.0.1', 9)); r['net'] = 'open'\n"
                "except OSError as e:\n    r['net'] = e.errno\n"
                "r['tmp_entries'] = len(os.listdir('/tmp'))\n"
                "def _unseen(p):\n"
                "    try:\n        return not os.listdir(p)\n"
                "    except OSError:\n        return True\n"
                f"r['hidden'] = [p for p in {self._hidden_for(python)!r} if _unseen(p)]\n"
                "print(__import__('json').dumps(r))\n"
            )
            result = asyncio.run(self._run(probe, "", 20.0, 0, python))
            if result.exit_code == 0:
                self._python = python
                data = json.loads(result.stdout.strip().splitlines()[-1])
                notes = " ".join(result.isolation_notes)
                return {
                    "python": python,
                    "separate_process_group": True,
                    "scrubbed_environment": True,
                    "private_workdir": True,
                    "rlimits": "no-RLIMIT" not in notes,
                    "unprivileged_uid": self._uid(0) is not None and data["uid"] == self._uid(0),
                    "network_namespace": self.config.isolate_network and "no-net-namespace" not in notes,
                    "private_tmp": self.config.private_tmp and self._is_root and "no-mount-namespace" not in notes,
                    "pid_namespace": self.config.pid_namespace and data["pid"] == 2,
                    "hidden_paths": data["hidden"],
                    "seccomp": False,
                    "notes": result.isolation_notes,
                }
            last_error = f"{python}: exit {result.exit_code}: {result.stderr[-300:]}"
        raise RuntimeError(f"no interpreter can run inside the sandbox ({last_error})")


async def _read_capped(
    stream: asyncio.StreamReader | None, cap: int, on_overflow: Callable[[], None] | None = None
) -> tuple[bytes, bool]:
    """Keep the first ``cap`` bytes; drain (and drop) the rest so the child never blocks on a full pipe.
    ``on_overflow`` is called once when the output first goes past ``cap``."""
    if stream is None:
        return b"", False
    kept = bytearray()
    truncated = False
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return bytes(kept), truncated
        room = cap - len(kept)
        if room > 0:
            kept.extend(chunk[:room])
        if len(chunk) > max(room, 0):
            if not truncated and on_overflow is not None:
                on_overflow()
            truncated = True


async def _feed(writer: asyncio.StreamWriter | None, data: bytes) -> None:
    if writer is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            writer.write(data)
            await writer.drain()
        writer.close()


def _split_notes(stderr: str) -> tuple[list[str], str]:
    notes, kept = [], []
    for line in stderr.splitlines(keepends=True):
        if line.startswith(_MARK):
            notes.append(line[len(_MARK) :].strip())
        else:
            kept.append(line)
    return notes, "".join(kept)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process owned by ``uid`` (daemons a program left behind, fork bombs)."""
    for _ in range(3):
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat().st_uid == uid:
                    found = True
                    os.kill(int(entry.name), signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found:
            return
        time.sleep(0.005)
