"""Run untrusted (model-written) Python in an isolated, resource-limited process.

Every execution gets:

* a separate session / process group, killed as a whole at the end;
* a scrubbed environment (no tokens, keys, cloud credentials: only PATH, HOME, LANG, TMPDIR);
* a private working directory (mode 0700) that is removed afterwards;
* rlimits: CPU seconds, address space, file size, open files, processes, no core dumps;
* a wall-clock timeout, and caps on the stdout/stderr kept;
* where the kernel allows namespaces (as root, or as any user with unprivileged user namespaces): a new
  network namespace (no network), a new PID namespace with a private ``/proc`` (it cannot see or
  signal anything outside; when it exits, everything it spawned dies), and a new mount namespace whose
  root is built from nothing (deny-by-default, :mod:`agentboost.sandbox.rootfs`): its working directory
  (read-write), the interpreter, standard library and shared libraries (read-only), a minimal ``/dev``
  and a private ``/tmp``; no other host file (datasets with gold answers, caches, home);
* as root only: its own uid, leased host-wide for the run (:mod:`agentboost.sandbox.uids`), so runs
  cannot signal each other and cleanup by uid only ever kills the run's own processes. As non-root the
  program keeps this process's uid; the PID namespace is what stops it signalling other processes.

Which layers are active on this machine is probed once with a real execution (:meth:`Sandbox.isolation`)
and logged: WARNING naming every missing layer and what it means, INFO when all are active. A layer that
cannot be set up is reported, never silently assumed.

Runs are forked from a warm interpreter, the zygote (:mod:`agentboost.sandbox.zygote`), where the PID
namespace and a private ``/proc`` keep it out of every run's sight and reach: each child goes through the
same setup (:func:`_launcher.prepare`) and then runs the program in place of starting an interpreter
(that start is most of a run's cost). The zygote is used only after the same probe, run through it,
shows the same layers; otherwise, with ``SandboxConfig(zygote=False)``, and for a run whose zygote failed,
each run starts the launcher and the interpreter as described above. ``isolation()["zygote"]`` says which.
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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .rootfs import RootPlan, RootPlanError, plan_for
from .uids import UidLease, kill_uid, lock_dir, try_lease
from .zygote import Zygote, ZygoteError, ZygoteRun

logger = logging.getLogger(__name__)

LAUNCHER = str(Path(__file__).with_name("_launcher.py"))
_BOOT = f"import sys; sys.path.append({str(Path(__file__).parent)!r}); import _launcher; _launcher.main()"
"""Runs the launcher as a module, not a script: its bytecode is cached (a script is compiled on every run)."""
_MARK = "agentboost-sandbox:"
_ZYGOTE_RESTARTS = 3
"""A zygote that died this many times (not through a program: it is out of their reach) stays off."""
_DRAIN_S = 2.0
_INLINE_BYTES = 256 * 1024
_FINISH_S = 5.0
_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
_SYSTEM_DIRS = frozenset({"/", "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/var", "/tmp", "/run",
                          "/opt", "/srv", "/home", "/boot", "/mnt", "/media", "/proc", "/sys", "/dev"})  # fmt: skip
LAYERS: dict[str, str] = {
    "rlimits": "no CPU, memory, file-size or process limits: a runaway program can exhaust the host",
    "unprivileged_uid": "the program runs as this process's uid (only root can give it a uid of its own): "
    "it can write what this uid can write wherever it can see it; the PID namespace is what stops it "
    "signalling other processes",
    "network_namespace": "the program has this host's network (it can reach local services and the internet)",
    "mount_namespace": "the program sees this host's whole filesystem: datasets with gold answers, caches and "
    "home directories are readable wherever file permissions allow",
    "deny_by_default_fs": "the program sees this host's filesystem minus the hidden paths: a dataset anywhere "
    "else (--data, --cache-dir) is readable",
    "private_tmp": "the program shares this host's /tmp",
    "pid_namespace": "the program can see host processes and signal those of its uid; processes it leaves "
    "behind are killed only through its process group (or its uid, as root)",
    "private_proc": "the program has no private /proc: it sees host processes there, or has no /proc at all",
}
"""Every isolation layer :meth:`Sandbox.isolation` reports as True/False, and what its absence means."""
NOT_PROVIDED: dict[str, str] = {"seccomp": "no system-call filter: the whole kernel interface is reachable"}
"""Layers this sandbox never provides (reported False, named in the log, not a machine defect)."""

_logged: set[tuple[Any, ...]] = set()
_logged_lock = threading.Lock()


class SandboxUnavailable(RuntimeError):
    """No run identity could be had (every sandbox uid of the host-wide range is held by live runs)."""


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
    """New mount namespace (private ``/tmp``, deny-by-default root or hidden paths); False: none."""
    pid_namespace: bool = True
    drop_privileges: bool = True
    uid_base: int = 62000
    uid_count: int = 1000
    """As root, each running program gets a uid of ``uid_base .. uid_base + uid_count - 1`` no other live
    run on the host holds (leased with a lock file, so worker processes never share one)."""
    uid_wait_s: float = 60.0
    """How long a run waits for a free uid before :class:`SandboxUnavailable`."""
    slots: int = 16
    """Concurrent executions of this Sandbox."""
    python: str | None = None
    """Interpreter for the program (default: this one, or a system one when this one lives in a hidden path)."""
    site_packages: bool = False
    """Let the program import the interpreter's installed packages (default: standard library only)."""
    root: str | None = None
    """Where working directories are created (default: /run/agentboost-sandbox as root, else a directory
    of this uid in the temp dir)."""
    deny_by_default: bool = True
    """Build the program's root from nothing (workdir, interpreter, libraries, minimal /dev, private /tmp
    and /proc). False, or where it cannot be built: the host's tree with ``hidden_paths`` covered."""
    tmp_mb: int = 64
    """Size of the private ``/tmp`` (and ``/dev/shm``)."""
    hidden_paths: tuple[str, ...] | None = None
    """Host directories the program must not read (prepared datasets hold gold answers). Default: this
    process's working directory, its home directory (datasets, caches) and rLLM's dataset registry
    directory. With the deny-by-default root they are absent anyway; those inside a bound tree (rLLM's
    registry inside site-packages) are covered by an empty read-only tmpfs. Without it (deny-list), each
    is covered that way; never covered there: ``/``, system directories, a directory holding the
    interpreter or the sandbox root (a stdlib-only sandbox prefers a system interpreter outside them).
    ``isolation()["hidden_paths"]`` lists those the program cannot see into, ``["exposed_paths"]`` the
    others."""
    zygote: bool = True
    """Fork runs from a warm interpreter where that isolates them as well as starting one does (module doc)."""


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
    uid: int | None = None
    """The uid the program ran as when it had its own (root), else None."""

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
        self._plan: RootPlan | None = None
        self._root = self._make_root()
        self._stage = self._root / ".stage"
        self._stage.mkdir(mode=0o755, exist_ok=True)
        self._lock_dir = lock_dir() if self._uses_uids else None
        self._hide = self._hide_candidates()
        self._zygote: Zygote | None = None
        self._zygote_lock = threading.Lock()
        self._zygote_off: str | None = None
        """Why runs start cold although the zygote was found usable (it kept dying); None: it did not."""
        self._zygote_restarts = 0
        self.executions = 0

    @property
    def _uses_uids(self) -> bool:
        return self._is_root and self.config.drop_privileges

    def _make_root(self) -> Path:
        """The directory of working directories: private to this uid (traversable by sandbox uids as root)."""
        if self.config.root:
            root = Path(self.config.root)
            root.mkdir(parents=True, exist_ok=True)
        elif self._is_root and os.path.isdir("/run"):
            root = Path("/run/agentboost-sandbox")
            root.mkdir(exist_ok=True)
        else:
            root = Path(tempfile.gettempdir()) / f"agentboost-sandbox-{os.geteuid()}"
            with contextlib.suppress(FileExistsError):
                root.mkdir(mode=0o700)
            info = os.lstat(root)
            if not root.is_dir() or root.is_symlink() or info.st_uid != os.geteuid():
                root = Path(tempfile.mkdtemp(prefix="agentboost-sandbox-"))  # someone else's: not ours to use
        os.chmod(root, 0o711 if self._is_root else 0o700)
        return root

    # -- public API ---------------------------------------------------------------------
    def isolation(self) -> dict[str, Any]:
        """Which isolation layers are active (probed once with a real execution): every layer of
        :data:`LAYERS` and :data:`NOT_PROVIDED` as True/False, plus ``python``, ``namespaces``,
        ``hidden_paths``, ``exposed_paths``, ``visible_paths`` (the host paths a deny-by-default root
        shows, read-only; None without one), ``zygote`` (runs fork from a warm interpreter; when False
        a ``no-zygote`` note says why), ``locale`` (the program's ``LC_CTYPE`` and UTF-8 mode at start)
        and ``notes``. Logged once per process."""
        if self._isolation is None:
            with self._probe_lock:
                if self._isolation is None:
                    self._isolation = self._probe()
                    _log_isolation(self._isolation)
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
        nothing more from it). Raises :class:`SandboxUnavailable` when no run uid frees up in time."""
        if self._isolation is None:
            await asyncio.to_thread(self.isolation)
        slot = await self._acquire()
        try:
            lease = await self._lease(slot)
            try:
                return await self._run(code, stdin, timeout_s or self.config.wall_s, lease,
                                       self._python or sys.executable, stdout_cap=stdout_cap,
                                       kill_on_overflow=kill_on_overflow, zygote=await self._warm())  # fmt: skip
            finally:
                if lease is not None:
                    lease.release()
        finally:
            self._release(slot)

    def run_sync(self, code: str, *, stdin: str = "", timeout_s: float | None = None) -> SandboxResult:
        return asyncio.run(self.run(code, stdin=stdin, timeout_s=timeout_s))

    def close(self) -> None:
        """Stop the zygote (runs in flight are killed); later runs start a new one."""
        with self._zygote_lock:
            zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.close()

    # -- the zygote ----------------------------------------------------------------------
    async def _warm(self) -> Zygote | None:
        """The zygote for the next run, restarted if it is gone; None: this run starts cold."""
        zygote = self._zygote
        if zygote is not None and zygote.usable:
            return zygote
        if self._zygote_off is not None or not (self._isolation or {}).get("zygote"):
            return None
        return await asyncio.to_thread(self._replace_zygote, zygote)

    def _replace_zygote(self, old: Zygote | None) -> Zygote | None:
        with self._zygote_lock:
            if self._zygote is not old:  # replaced meanwhile
                return self._zygote
            if old is not None:
                if old.usable:
                    return old
                if old._owner == os.getpid():  # it died (not merely inherited through fork)
                    self._zygote_restarts += 1
                    logger.warning("sandbox zygote (pid %d) died: %s", old.pid, old.diagnostics() or "no output")
                old.close()
                self._zygote = None
            if self._zygote_restarts > _ZYGOTE_RESTARTS:
                self._zygote_off = f"the zygote died {self._zygote_restarts} times"
                logger.warning("sandbox zygote disabled (%s): every run starts its interpreters", self._zygote_off)
                return None
            try:
                locale = (self._isolation or {}).get("locale") or ["", 0]
                self._zygote = self._new_zygote(self._python or sys.executable, locale)
            except ZygoteError as exc:
                self._zygote_off = str(exc)
                logger.warning("sandbox zygote disabled (%s): every run starts its interpreters", exc)
            return self._zygote

    def _new_zygote(self, python: str, locale: list[Any]) -> Zygote:
        """A zygote whose interpreter starts as the program's does, in the locale its root gives it (a
        fresh root has no locale data: there the C locale and Python's UTF-8 mode)."""
        env = self._program_env("/")
        if locale[0] == "C":
            env["LC_ALL"] = "C"  # the C locale, as in the program's root (a run's environment is its own)
        return Zygote(self._program_argv(python)[:-1], env)

    def _zygote_failed(self, zygote: Zygote, exc: ZygoteError) -> None:
        """A run could not go through ``zygote``: it runs cold, and the next run gets a new zygote."""
        logger.warning("sandbox zygote failed a run (%s); running it cold", exc)
        with self._zygote_lock:
            if self._zygote is zygote:
                self._zygote = None
                self._zygote_restarts += 1
        zygote.close()

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

    # -- run identities ------------------------------------------------------------------
    async def _lease(self, slot: int) -> UidLease | None:
        """A uid no other live run on this host holds (root only); tried from ``uid_base + slot``."""
        if self._lock_dir is None:
            return None
        c = self.config
        deadline = time.monotonic() + c.uid_wait_s
        while (lease := try_lease(self._lock_dir, c.uid_base, c.uid_count, slot)) is None:
            if time.monotonic() > deadline:
                raise SandboxUnavailable(f"all {c.uid_count} sandbox uids from {c.uid_base} held for {c.uid_wait_s}s")
            await asyncio.sleep(0.05)
        return lease

    def _contained_by_pid_namespace(self) -> bool:
        """Every process of a run lives in its PID namespace (dies with it): no sweep by uid needed."""
        return bool(self._isolation and self._isolation.get("pid_namespace"))

    # -- execution ---------------------------------------------------------------------
    def _program_argv(self, python: str, script: str = "main.py") -> list[str]:
        c = self.config
        plan = self._plan if c.deny_by_default and c.private_tmp else None
        argv = [plan.executable if plan else python, "-I", "-B"]
        if not c.site_packages:
            argv.append("-S")
        return [*argv, script]

    @staticmethod
    def _program_env(workdir: str) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    def _launch_config(self, workdir: Path, uid: int | None, python: str, *, script: str = "main.py") -> dict[str, Any]:
        c = self.config
        plan = self._plan if c.deny_by_default and c.private_tmp else None
        argv = self._program_argv(python, script)
        env = self._program_env(str(workdir))
        private_dirs = [d for d in ("/tmp", "/var/tmp", "/dev/shm") if not _inside(str(self._root), d)]
        fs = {"stage": str(self._stage), "ops": list(plan.ops), "tmp_mb": c.tmp_mb} if plan else None
        return {
            "workdir": str(workdir),
            "argv": argv,
            "env": env,
            "uid": uid,
            "net": c.isolate_network,
            "mount": c.private_tmp,
            "pid": c.pid_namespace,
            "fs": fs,
            "private_dirs": private_dirs,
            "tmp_mb": c.tmp_mb,
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

    def _make_workdir(self, files: dict[str, str], uid: int | None) -> Path:
        if uid is not None and not self._contained_by_pid_namespace():
            kill_uid(uid)  # strays of a holder of this uid that died (we hold the lease now)
        workdir = self._root / f"run-{secrets.token_hex(8)}"
        workdir.mkdir(mode=0o700)
        for name, text in files.items():
            (workdir / name).write_text(text, encoding="utf-8")
        if uid is not None:
            for path in (workdir, *(workdir / name for name in files)):
                os.chown(path, uid, uid)
        return workdir

    async def _run(
        self,
        code: str,
        stdin: str,
        timeout_s: float,
        lease: UidLease | None,
        python: str,
        *,
        stdout_cap: int | None = None,
        kill_on_overflow: bool = False,
        zygote: Zygote | None = None,
    ) -> SandboxResult:
        started = time.monotonic()
        run = await self._launch({"main.py": code}, lease, python, zygote)
        readers: list[_CappedReader] = []
        try:
            proc = run.proc
            cap = stdout_cap or self.config.stdout_cap
            out = _CappedReader(run.stdout, cap, proc.kill if kill_on_overflow else None)
            err = _CappedReader(run.stderr, self.config.stderr_cap)
            readers = [out, err]
            feed = asyncio.ensure_future(_feed(run.stdin, stdin.encode("utf-8", errors="replace")))
            timed_out = False
            try:
                try:
                    await asyncio.wait_for(proc.wait(), timeout=timeout_s)
                except (TimeoutError, asyncio.TimeoutError):
                    timed_out = True
                proc.kill()
                status = await proc.wait()
            except ZygoteError as exc:  # the zygote died under this run: its outcome is unknown
                feed.cancel()
                assert zygote is not None
                self._zygote_failed(zygote, exc)
                return await self._run(code, stdin, timeout_s, lease, python, stdout_cap=stdout_cap,
                                       kill_on_overflow=kill_on_overflow)  # fmt: skip
            await _drain(readers)
            feed.cancel()
            sig = _signal_of(status)
            notes, stderr_text = _split_notes(err.data.decode("utf-8", errors="replace"))
            if run.uid is not None and any(n.startswith("no-pid-namespace") for n in notes):
                await asyncio.to_thread(kill_uid, run.uid)  # this run had no PID namespace to take its strays down
            self.executions += 1
            return SandboxResult(
                stdout=out.data.decode("utf-8", errors="replace"),
                stderr=stderr_text,
                exit_code=None if timed_out or sig is not None else status,
                signal=sig,
                timed_out=timed_out,
                stdout_truncated=out.truncated,
                stderr_truncated=err.truncated,
                wall_s=time.monotonic() - started,
                isolation_notes=notes,
                uid=run.uid,
            )
        finally:
            for reader in readers:
                reader.close()
            await self._dispose(run)

    @contextlib.asynccontextmanager
    async def _session(self, files: dict[str, str], *, script: str) -> AsyncIterator[_Run]:
        """A program that talks with this process while it runs (the batch harness): ``files`` written
        into its working directory, ``script`` started with every isolation layer of a run; killed and
        cleaned up when the block ends. Takes a slot and a run identity like :meth:`run`."""
        if self._isolation is None:
            await asyncio.to_thread(self.isolation)
        slot = await self._acquire()
        try:
            lease = await self._lease(slot)
            try:
                run = await self._launch(files, lease, self._python or sys.executable, await self._warm(),
                                         script=script)  # fmt: skip
                try:
                    yield run
                finally:
                    await self._dispose(run)
            finally:
                if lease is not None:
                    lease.release()
        finally:
            self._release(slot)

    async def _launch(
        self,
        files: dict[str, str],
        lease: UidLease | None,
        python: str,
        zygote: Zygote | None,
        *,
        script: str = "main.py",
    ) -> _Run:
        """Make the working directory with ``files`` and start ``script`` in it (see :meth:`_start`)."""
        uid = lease.uid if lease is not None else None
        if self._contained_by_pid_namespace() and sum(map(len, files.values())) <= _INLINE_BYTES:
            workdir = self._make_workdir(files, uid)  # a directory and small files: less than a thread hop
        else:
            workdir = await asyncio.to_thread(self._make_workdir, files, uid)
        config = self._launch_config(workdir, uid, python, script=script)
        try:
            proc, (stdin, stdout, stderr) = await self._start(config, workdir, uid, zygote)
        except BaseException:
            await self._remove_workdir(workdir, files)
            raise
        return _Run(workdir, uid, proc, _Fd(stdin), _Fd(stdout), _Fd(stderr), tuple(files))

    async def _dispose(self, run: _Run) -> None:
        """Kill what is left of ``run``, release its descriptors and remove its working directory (whoever
        read or wrote a pipe has stopped watching it by now)."""
        for pipe in (run.stdin, run.stdout, run.stderr):
            pipe.close()
        await run.proc.finish()
        await self._remove_workdir(run.workdir, run.files)

    @staticmethod
    async def _remove_workdir(workdir: Path, files: Any) -> None:
        try:  # the common case, the files as written and nothing else: a few system calls
            for name in files:
                os.unlink(workdir / name)
            os.rmdir(workdir)
        except OSError:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    async def _start(
        self, config: dict[str, Any], workdir: Path, uid: int | None, zygote: Zygote | None
    ) -> tuple[_Process, tuple[int, int, int]]:
        """Start the program (forked by ``zygote``, else cold); returns it and this side's pipe ends
        (stdin to write, stdout and stderr to read)."""
        if zygote is not None:
            pipes = _pipes()
            try:
                run = await zygote.spawn(config, pipes[0][0], pipes[1][1], pipes[2][1])
            except ZygoteError as exc:
                for fd in (pipes[0][1], pipes[1][0], pipes[2][0]):
                    os.close(fd)
                self._zygote_failed(zygote, exc)
            else:
                return _ForkedProcess(run), (pipes[0][1], pipes[1][0], pipes[2][0])
        pipes = _pipes()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", "-c", _BOOT, marshal.dumps(config).hex(),
                stdin=pipes[0][0], stdout=pipes[1][1], stderr=pipes[2][1],
                env=config["env"], cwd=str(workdir), start_new_session=True,
            )  # fmt: skip
        except BaseException:
            for fd in (pipes[0][1], pipes[1][0], pipes[2][0]):
                os.close(fd)
            raise
        finally:
            for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
                os.close(fd)
        return _StartedProcess(proc, lambda: self._kill(proc.pid, uid)), (pipes[0][1], pipes[1][0], pipes[2][0])

    def _kill(self, pgid: int, uid: int | None) -> None:
        """Kill the run's process group, and (own uid, no PID namespace) every process of its leased uid."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        if uid is not None and not self._contained_by_pid_namespace():
            kill_uid(uid)

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
        """The hidden directories that leave ``python`` (and its installation) reachable (deny-list)."""
        keep = {os.path.abspath(python), os.path.realpath(python)}
        if os.path.realpath(python) == os.path.realpath(sys.executable):
            keep |= {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
        return [d for d in self._hide if not any(_inside(k, d) for k in keep)]

    # -- probe -------------------------------------------------------------------------
    def _probe(self) -> dict[str, Any]:
        c = self.config
        if c.python:
            candidates = [c.python]
        elif not c.site_packages and len(self._hidden_for(sys.executable)) < len(self._hide):
            candidates = [*_SYSTEM_PYTHONS, sys.executable]  # this interpreter lives in a directory to hide
        else:
            candidates = [sys.executable, *_SYSTEM_PYTHONS]
        last_error = ""
        canary = self._root / f".canary-{secrets.token_hex(6)}"
        marker = Path("/tmp") / f"agentboost-sandbox-probe-{secrets.token_hex(6)}"
        canary.write_text("host file")
        canary.chmod(0o644)
        with contextlib.suppress(OSError):
            marker.write_text("host /tmp")
        try:
            for python in dict.fromkeys(x for x in candidates if x and os.path.exists(x)):
                plan_notes: list[str] = []
                self._plan = None
                if c.deny_by_default and c.private_tmp:
                    try:
                        self._plan = plan_for(python, site_packages=c.site_packages, hidden=self._hide)
                    except RootPlanError as exc:
                        plan_notes.append(f"no-fresh-root {exc}")
                result = asyncio.run(self._probe_run(python, canary, marker))
                if result.exit_code == 0:
                    self._python = python
                    iso = self._layers(python, result, plan_notes)
                    if not iso["deny_by_default_fs"]:
                        self._plan = None  # runs go straight to the deny-list, not failing to build the root each time
                    iso["zygote"] = self._check_zygote(iso, python, canary, marker, plan_notes)
                    return iso
                last_error = f"{python}: exit {result.exit_code}: {result.stderr[-300:]}"
        finally:
            canary.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                marker.unlink()
        raise RuntimeError(f"no interpreter can run inside the sandbox ({last_error})")

    def _check_zygote(
        self, iso: dict[str, Any], python: str, canary: Path, marker: Path, plan_notes: list[str]
    ) -> bool:
        """Start the zygote and probe again through it: runs fork from it only if it gives the same layers
        (and only where a PID namespace with a private ``/proc`` keeps it out of their reach)."""
        why = None
        if not self.config.zygote:
            why = "SandboxConfig(zygote=False)"
        elif not (iso["pid_namespace"] and iso["private_proc"]):
            why = "no PID namespace with a private /proc: a forked program could reach the zygote"
        if why is not None:
            iso["notes"].append(f"no-zygote {why}")
            return False
        try:
            zygote = self._new_zygote(python, iso["locale"])
        except ZygoteError as exc:
            iso["notes"].append(f"no-zygote {exc}")
            return False
        result = asyncio.run(self._probe_run(python, canary, marker, zygote))
        differ: list[str] = []
        if not zygote.usable:
            why = "it failed its probe run"
        elif result.exit_code != 0:
            why = f"its probe run failed: exit {result.exit_code}: {result.stderr[-300:]}"
        else:
            forked = self._layers(python, result, plan_notes)
            differ = [k for k in (*LAYERS, "hidden_paths", "exposed_paths", "locale") if forked[k] != iso[k]]
            why = f"its runs differ from started ones in {', '.join(differ)}" if differ else None
        self._zygote_restarts = 0
        if why is not None:
            zygote.close()
            iso["notes"].append(f"no-zygote {why}")
            return False
        self._zygote = zygote
        return True

    async def _probe_run(self, python: str, canary: Path, marker: Path, zygote: Zygote | None = None) -> SandboxResult:
        allowed: dict[str, list[str]] = {}  # what a hidden directory may show: the way to the interpreter
        visible = self._plan.visible if self._plan else ()
        for hidden in self._hide:
            allowed[hidden] = sorted({v[len(hidden) :].strip("/").split("/")[0] for v in visible if _inside(v, hidden)})
        probe = (
            "import _locale, json, os, socket, sys\n"
            "r = {'uid': os.getuid(), 'pid': os.getpid()}\n"
            "r['locale'] = [_locale.setlocale(_locale.LC_CTYPE), sys.flags.utf8_mode]\n"
            "try:\n    r['ifaces'] = sorted(n for _, n in socket.if_nameindex())\n"
            "except OSError:\n    r['ifaces'] = None\n"
            "def readable(p):\n"
            "    try:\n        open(p, 'rb').close(); return True\n"
            "    except OSError:\n        return False\n"
            f"r['canary'] = readable({str(canary)!r})\n"
            f"r['tmp_marker'] = os.path.exists({str(marker)!r})\n"
            "try:\n    open('/tmp/probe', 'w').close(); os.unlink('/tmp/probe'); r['tmp_writable'] = True\n"
            "except OSError:\n    r['tmp_writable'] = False\n"
            "try:\n    r['proc'] = sorted(d for d in os.listdir('/proc') if d.isdigit())\n"
            "except OSError:\n    r['proc'] = None\n"
            "def unseen(p, allowed):\n"
            "    try:\n        return set(os.listdir(p)) <= set(allowed)\n"
            "    except OSError:\n        return True\n"
            f"r['hidden'] = [p for p, a in {allowed!r}.items() if unseen(p, a)]\n"
            "print(json.dumps(r))\n"
        )
        lease = await self._lease(0)
        try:
            return await self._run(probe, "", 20.0, lease, python, zygote=zygote)
        finally:
            if lease is not None:
                lease.release()

    def _layers(self, python: str, result: SandboxResult, plan_notes: list[str]) -> dict[str, Any]:
        c = self.config
        data = json.loads(result.stdout.strip().splitlines()[-1])
        notes = [*plan_notes, *result.isolation_notes]
        text = " ".join(notes)
        mount = c.private_tmp and "no-mount-namespace" not in text
        namespaces = [
            c.isolate_network and "no-net-namespace" not in text,
            mount,
            c.pid_namespace and "no-pid-namespace" not in text,
        ]
        hidden = data["hidden"]
        fresh = mount and self._plan is not None and "no-fresh-root" not in text and not data["canary"]
        return {
            "python": python,
            "namespaces": ("root" if self._is_root else "user namespace") if any(namespaces) else "none",
            "separate_process_group": True,
            "scrubbed_environment": True,
            "private_workdir": True,
            "rlimits": "no-RLIMIT" not in text,
            "unprivileged_uid": result.uid is not None and data["uid"] == result.uid,
            "network_namespace": namespaces[0] and set(data["ifaces"] or ()) <= {"lo"},
            "mount_namespace": mount,
            "deny_by_default_fs": fresh,
            "private_tmp": mount and data["tmp_writable"] and not data["tmp_marker"],
            "pid_namespace": namespaces[2] and data["pid"] == 2,
            "private_proc": data["proc"] is not None and set(data["proc"]) <= {"1", "2"},
            "hidden_paths": hidden,
            "exposed_paths": [p for p in self._hide if p not in hidden],
            "visible_paths": list(self._plan.visible) if fresh and self._plan is not None else None,
            "seccomp": False,
            "locale": data["locale"],
            "notes": notes,
        }


def _log_isolation(iso: dict[str, Any]) -> None:
    """WARNING (once per process and situation) naming each missing layer and what it means; INFO when
    every layer this sandbox provides is active."""
    missing = [k for k in LAYERS if iso.get(k) is False]
    exposed = list(iso.get("exposed_paths", ()))
    zygote_off = [n[len("no-zygote ") :] for n in iso.get("notes", ()) if n.startswith("no-zygote ")]
    key = (tuple(missing), tuple(exposed), iso.get("python"), iso.get("namespaces"), tuple(zygote_off))
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    never = "; ".join(f"{k}: {why}" for k, why in NOT_PROVIDED.items())
    start = "runs fork from a warm interpreter (zygote)" if iso.get("zygote") else (
        f"every run starts its interpreters (no zygote: {'; '.join(zygote_off) or 'not probed'})")  # fmt: skip
    if missing or exposed:
        lines = [f"  {k}: {LAYERS[k]}" for k in missing]
        if exposed:
            lines.append(f"  exposed_paths: the program can read {', '.join(exposed)}")
        logger.warning(
            "sandbox isolation INCOMPLETE (namespaces: %s, interpreter %s); missing layers:\n%s\n"
            "(not provided: %s)\n%s",
            iso.get("namespaces"), iso.get("python"), "\n".join(lines), never, start,
        )  # fmt: skip
    else:
        logger.info(
            "sandbox isolation: all layers active (%s; namespaces: %s, interpreter %s); not provided: %s; %s",
            ", ".join(LAYERS), iso.get("namespaces"), iso.get("python"), never, start,
        )  # fmt: skip


def _signal_of(status: int) -> int | None:
    """The signal that ended a program, from its launcher's exit status (``128 + N``) or its own (``-N``)."""
    return -status if status < 0 else (status - 128 if status > 128 else None)


class _Fd:
    """A descriptor closed exactly once, by whichever side is done with it first."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


@dataclass
class _Run:
    """A started program: its working directory, run uid, process and this side's pipe ends."""

    workdir: Path
    uid: int | None
    proc: _Process
    stdin: _Fd
    stdout: _Fd
    stderr: _Fd
    files: tuple[str, ...]


def _pipes() -> list[tuple[int, int]]:
    """stdin, stdout and stderr pipes of a run (``(read end, write end)`` each, close-on-exec)."""
    made: list[tuple[int, int]] = []
    try:
        for _ in range(3):
            made.append(os.pipe())
    except OSError:
        for pair in made:
            for fd in pair:
                os.close(fd)
        raise
    return made


class _Process:
    """A started run, whichever way it was started."""

    async def wait(self) -> int:
        """Exit status (``-N``: killed by signal N); :class:`ZygoteError` if its zygote vanished."""
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    async def finish(self) -> None:
        """Make sure it is dead and reaped, and release what it holds."""
        raise NotImplementedError


class _StartedProcess(_Process):
    """A cold run: the launcher started as a subprocess of this process."""

    def __init__(self, proc: asyncio.subprocess.Process, kill: Callable[[], None]) -> None:
        self._proc = proc
        self._kill = kill

    async def wait(self) -> int:
        return await self._proc.wait()

    def kill(self) -> None:
        self._kill()

    async def finish(self) -> None:
        if self._proc.returncode is None:
            self._kill()
            with contextlib.suppress(ProcessLookupError):
                await self._proc.wait()


class _ForkedProcess(_Process):
    """A warm run: forked by the zygote."""

    def __init__(self, run: ZygoteRun) -> None:
        self._run = run

    async def wait(self) -> int:
        return await self._run.wait()

    def kill(self) -> None:
        self._run.kill()

    async def finish(self) -> None:
        if self._run.returncode is None:
            self._run.kill()
            with contextlib.suppress(ZygoteError, OSError, TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._run.wait(), timeout=_FINISH_S)
        self._run.close()


class _CappedReader:
    """Reads a pipe to its end on the running loop, keeping the first ``cap`` bytes and dropping the rest
    (so the writer never blocks on a full pipe); ``on_overflow`` is called once when it goes past ``cap``."""

    def __init__(self, pipe: _Fd, cap: int, on_overflow: Callable[[], None] | None = None) -> None:
        self._pipe = pipe
        self._fd = pipe.fd
        self._cap = cap
        self._kept = bytearray()
        self._on_overflow = on_overflow
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
            self.close()
            return
        room = self._cap - len(self._kept)
        if room > 0:
            self._kept += chunk[:room]
        if len(chunk) > max(room, 0):
            if not self.truncated and self._on_overflow is not None:
                self._on_overflow()
            self.truncated = True

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            self._pipe.close()
            self._fd = -1
        if not self.done.done():
            self.done.set_result(None)


async def _drain(readers: list[_CappedReader]) -> None:
    """Wait for the readers to reach end of file: at once when every process of the run is gone; a
    process that left its session and holds the pipe (no PID namespace) costs at most ``_DRAIN_S``."""
    await asyncio.wait([r.done for r in readers], timeout=_DRAIN_S)


async def _feed(stdin: _Fd, data: bytes) -> None:
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


def _split_notes(stderr: str) -> tuple[list[str], str]:
    notes, kept = [], []
    for line in stderr.splitlines(keepends=True):
        if line.startswith(_MARK):
            notes.append(line[len(_MARK) :].strip())
        else:
            kept.append(line)
    return notes, "".join(kept)
