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

from .rootfs import RootPlan, RootPlanError, plan_for
from .uids import UidLease, kill_uid, lock_dir, try_lease

logger = logging.getLogger(__name__)

LAUNCHER = str(Path(__file__).with_name("_launcher.py"))
_BOOT = f"import sys; sys.path.append({str(Path(__file__).parent)!r}); import _launcher; _launcher.main()"
"""Runs the launcher as a module, not a script: its bytecode is cached (a script is compiled on every run)."""
_MARK = "agentboost-sandbox:"
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
        shows, read-only; None without one) and ``notes``. Logged once per process."""
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
                                       kill_on_overflow=kill_on_overflow)  # fmt: skip
            finally:
                if lease is not None:
                    lease.release()
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
    def _launch_config(self, workdir: Path, uid: int | None, python: str) -> dict[str, Any]:
        c = self.config
        plan = self._plan if c.deny_by_default and c.private_tmp else None
        argv = [plan.executable if plan else python, "-I", "-B"]
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

    def _make_workdir(self, code: str, uid: int | None) -> Path:
        if uid is not None and not self._contained_by_pid_namespace():
            kill_uid(uid)  # strays of a holder of this uid that died (we hold the lease now)
        workdir = self._root / f"run-{secrets.token_hex(8)}"
        workdir.mkdir(mode=0o700)
        (workdir / "main.py").write_text(code, encoding="utf-8")
        if uid is not None:
            for path in (workdir, workdir / "main.py"):
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
    ) -> SandboxResult:
        started = time.monotonic()
        uid = lease.uid if lease is not None else None
        workdir = await asyncio.to_thread(self._make_workdir, code, uid)
        config = self._launch_config(workdir, uid, python)
        proc = None
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", "-c", _BOOT, marshal.dumps(config).hex(),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=config["env"], cwd=str(workdir), start_new_session=True,
            )  # fmt: skip
            pid = proc.pid
            overflow = (lambda: self._kill(pid, uid)) if kill_on_overflow else None
            out_task = asyncio.ensure_future(_read_capped(proc.stdout, stdout_cap or self.config.stdout_cap, overflow))
            err_task = asyncio.ensure_future(_read_capped(proc.stderr, self.config.stderr_cap))
            feed = asyncio.ensure_future(_feed(proc.stdin, stdin.encode("utf-8", errors="replace")))
            timed_out = False
            try:
                await asyncio.wait_for(proc.wait(), timeout=timeout_s)
            except (TimeoutError, asyncio.TimeoutError):
                timed_out = True
            self._kill(proc.pid, uid)
            if timed_out:
                await proc.wait()
            (stdout, out_cut), (stderr, err_cut) = await asyncio.gather(out_task, err_task)
            feed.cancel()
            status = proc.returncode
            # The launcher reports a program killed by signal N as exit status 128 + N.
            sig = -status if status is not None and status < 0 else (status - 128 if status and status > 128 else None)
            notes, stderr_text = _split_notes(stderr.decode("utf-8", errors="replace"))
            if uid is not None and any(n.startswith("no-pid-namespace") for n in notes):
                await asyncio.to_thread(kill_uid, uid)  # this run had no PID namespace to take its strays down
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
                uid=uid,
            )
        finally:
            if proc is not None and proc.returncode is None:
                self._kill(proc.pid, uid)
                with contextlib.suppress(ProcessLookupError):
                    await proc.wait()
            await asyncio.to_thread(shutil.rmtree, workdir, True)

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
                    return self._layers(python, result, plan_notes)
                last_error = f"{python}: exit {result.exit_code}: {result.stderr[-300:]}"
        finally:
            canary.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                marker.unlink()
        raise RuntimeError(f"no interpreter can run inside the sandbox ({last_error})")

    async def _probe_run(self, python: str, canary: Path, marker: Path) -> SandboxResult:
        allowed: dict[str, list[str]] = {}  # what a hidden directory may show: the way to the interpreter
        visible = self._plan.visible if self._plan else ()
        for hidden in self._hide:
            allowed[hidden] = sorted({v[len(hidden) :].strip("/").split("/")[0] for v in visible if _inside(v, hidden)})
        probe = (
            "import json, os, socket\n"
            "r = {'uid': os.getuid(), 'pid': os.getpid()}\n"
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
            return await self._run(probe, "", 20.0, lease, python)
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
        if not fresh:
            self._plan = None  # runs go straight to the deny-list instead of failing to build the root each time
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
            "visible_paths": list(self._plan.visible) if self._plan is not None else None,
            "seccomp": False,
            "notes": notes,
        }


def _log_isolation(iso: dict[str, Any]) -> None:
    """WARNING (once per process and situation) naming each missing layer and what it means; INFO when
    every layer this sandbox provides is active."""
    missing = [k for k in LAYERS if iso.get(k) is False]
    exposed = list(iso.get("exposed_paths", ()))
    key = (tuple(missing), tuple(exposed), iso.get("python"), iso.get("namespaces"))
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    never = "; ".join(f"{k}: {why}" for k, why in NOT_PROVIDED.items())
    if missing or exposed:
        lines = [f"  {k}: {LAYERS[k]}" for k in missing]
        if exposed:
            lines.append(f"  exposed_paths: the program can read {', '.join(exposed)}")
        logger.warning(
            "sandbox isolation INCOMPLETE (namespaces: %s, interpreter %s); missing layers:\n%s\n(not provided: %s)",
            iso.get("namespaces"), iso.get("python"), "\n".join(lines), never,
        )  # fmt: skip
    else:
        logger.info(
            "sandbox isolation: all layers active (%s; namespaces: %s, interpreter %s); not provided: %s",
            ", ".join(LAYERS), iso.get("namespaces"), iso.get("python"), never,
        )  # fmt: skip


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
