"""Run untrusted (model-written) Python in an isolated, resource-limited process.

Every execution gets:

* a separate session / process group, killed as a whole at the end;
* a scrubbed environment (no tokens, keys, cloud credentials: only PATH, HOME, LANG, TMPDIR);
* a new session keyring of its own (the trainer's keys are out of reach);
* a private working directory: a size- and inode-limited tmpfs of its own, removed with the run;
* limits for the whole run where the host allows a cgroup of its own (:mod:`.cgroups`: memory counting its
  processes, files, shared memory and page cache; processes; an equal CPU weight and a CPU quota), and
  per-process rlimits always (CPU seconds, address space, file size, open files, processes, no cores);
* a wall-clock timeout, and caps on stdout and stderr: a program writing past either is killed;
* where the kernel allows namespaces (as root, or as any user with unprivileged user namespaces): a new
  network namespace (no network), PID namespace with a private ``/proc`` (it cannot see or signal
  anything outside; when it exits, everything it spawned dies), IPC namespace (its System V shared memory,
  queues and semaphores are its own and die with it), UTS namespace (hostname ``sandbox``), and mount
  namespace whose root is built from nothing (deny-by-default, :mod:`agentboost.sandbox.rootfs`): its
  working directory, the interpreter, standard library and shared libraries (read-only), a minimal
  ``/dev`` and a private ``/tmp``; no other host file (datasets with gold answers, caches, home);
* its own uid and gid, leased host-wide for the run (:mod:`agentboost.sandbox.uids`; never a host
  account's), in a user namespace of its own (so its user keyrings are new), so runs cannot signal each
  other or this process, cannot read this process's files by owner permission, and cleanup by uid only
  ever kills the run's own processes: as root from ``SandboxConfig.uid_base``; as an ordinary user from
  the subordinate ids the host grants it (``/etc/subuid``, ``/etc/subgid``, the setuid ``newuidmap`` and
  ``newgidmap``). Without them the program keeps this process's uid (in a user namespace of the run's):
  the PID namespace is what stops it signalling other processes, the filter and the private ``/proc``
  what keep it from this uid's keys, and ``isolation()["uid_setup"]`` says what is missing
  (``SandboxConfig(require_separate_uid=True)`` refuses to run then).

Which layers are active on this machine is probed once with a real execution (:meth:`Sandbox.isolation`)
and logged: WARNING naming every missing layer and what it means, INFO when all are active
(:mod:`.report`). A layer that cannot be set up is reported, never silently assumed.

Runs are forked from warm interpreters, zygotes (:mod:`agentboost.sandbox.zygote`), where the PID
namespace and a private ``/proc`` keep them out of every run's sight and reach: each child goes through the
same setup (:func:`_launcher.prepare`) and then runs the program in place of starting an interpreter (that
start is most of a run's cost). Each zygote forks at most ``SandboxConfig.runs_per_zygote`` runs (its
successor is started ahead of time), so runs share a hash seed and address layout only with those few.
Zygotes are used only after the same probe, run through one, shows the same layers; otherwise, with
``SandboxConfig(zygote=False)``, and for a run whose zygote failed, each run starts the launcher and the
interpreter. ``isolation()["zygote"]`` says which.

Nothing a run leaves can leak: its descriptors are released and its working directory and cgroup removed
even when the caller is cancelled half-way (:meth:`Sandbox._dispose`, :mod:`.workdir`), and slots are
shared fairly between their owners (:mod:`.slots`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import marshal
import os
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cgroups import CgroupError, Cgroups, RunCgroup, RunLimits, find
from .config import SandboxConfig, SandboxResult, SandboxUnavailable
from .pagecache import Warmer
from .paths import hidden_for, hide_candidates, inside
from .probe import probe
from .process import (
    CappedReader,
    Fd,
    ForkedProcess,
    RunProcess,
    StartedProcess,
    drain,
    feed,
    feed_now,
    kill_group,
    pipes,
    split_notes,
    wait_within,
)
from .report import LAYERS, log_isolation, uid_missing
from .rootfs import RootPlan
from .seccomp import Filters
from .seccomp import available as seccomp_filters
from .slots import SlotLease, Slots
from .uids import SubordinateIds, UidLease, host_account, kill_uid, lock_dir, subordinate_ids, try_lease
from .workdir import dispose_workdir, file_bytes, janitor, make_root, make_workdir, workdir_path
from .zygote import Zygote, ZygoteError, ZygotePool

__all__ = ["LAYERS", "Sandbox", "SandboxConfig", "SandboxResult", "SandboxUnavailable"]

logger = logging.getLogger(__name__)

LAUNCHER = str(Path(__file__).with_name("_launcher.py"))
_BOOT = f"import sys; sys.path.append({str(Path(__file__).parent)!r}); import _launcher; _launcher.main()"
"""Runs the launcher as a module, not a script: its bytecode is cached (a script is compiled on every run)."""
_INLINE_BYTES = 256 * 1024
_SENT_BYTES = 64 * 1024
"""Files up to this size go to a templated zygote's run in a memory file: no staging directory on the host."""
SESSION_MB = 64
"""Memory a batch session's cgroup has beyond ``memory_mb``: the harness itself."""
_CHILDREN = 4
"""Processes of a run beyond the program's own (the launcher, PID 1 and, in a batch session, the harness)."""


@functools.cache
def _cold_boot() -> str:
    """What a started run's interpreter runs after the launcher's ``exec`` (``-c``): the runner, its
    start-up state captured before the runner's own imports (:func:`_runner.cold`)."""
    path = Path(__file__).with_name("_runner.py")  # (its frames named as in a zygote's child)
    capture = "import sys\n_B = (frozenset(sys.modules), tuple(sys.path), frozenset(sys.path_importer_cache))\n"
    return f"{capture}exec(compile({path.read_text(encoding='utf-8')!r}, {str(path)!r}, 'exec'))\ncold(_B)\n"


def _memory_file(files: dict[str, str]) -> tuple[int, list[tuple[str, int, int]]] | None:
    """``files`` written one after another into a new memory file: its descriptor and what it holds
    ((name, size, mode) each); None where memory files cannot be made (the run's files are then staged)."""
    try:
        fd = os.memfd_create("agentboost-run-files", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None
    try:
        index = []
        for name, text in files.items():
            data = file_bytes(text)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            index.append((name, len(data), 0o644))
    except OSError:
        os.close(fd)
        return None
    return fd, index


@dataclass
class _Run:
    """A started program: its working directory, run uid, process, this side's pipe ends and cgroup."""

    workdir: Path
    uid: int | None
    proc: RunProcess
    stdin: Fd
    stdout: Fd
    stderr: Fd
    files: tuple[str, ...]
    cgroup: RunCgroup | None = None
    lease: SlotLease | None = None
    staged: bool = True
    """Its files were staged in ``workdir`` on the host (else sent to the run in a memory file)."""


class Sandbox:
    """Isolated execution of Python programs. Thread-safe; usable from any event loop."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._is_root = os.geteuid() == 0
        self.slots = Slots(self.config.slots)
        self._probe_lock = threading.Lock()
        self._isolation: dict[str, Any] | None = None
        self._python: str | None = None
        self._plan: RootPlan | None = None
        self._mirror: str | None = None
        """Where the plan's files were copied into memory (:mod:`.mirror`; set by the probe), or None."""
        self._template_cached: tuple[bytes | None] | None = None
        self._subids, self._uid_setup = self._run_identities()
        self._subid_spec = self._subids.launch_spec() if self._subids is not None else None
        self._root = make_root(self.config.root, self._is_root, traversable=self._subids is not None)
        self._stage = self._root / ".stage"
        self._stage.mkdir(mode=0o755, exist_ok=True)
        self._lock_dir = lock_dir() if self._uses_uids else None
        if self.config.require_separate_uid and not self._uses_uids:
            raise SandboxUnavailable(self._refusal(self._uid_setup))
        self._hide = hide_candidates(self.config.hidden_paths, self._root)
        self._hidden: dict[str, list[str]] = {}
        self._zygotes: ZygotePool | None = None
        self._cgroups: Cgroups | None = None
        self._cgroups_closed = False
        self._cgroup_why = "not probed"
        self.executions = 0
        self._warmer: Warmer | None = None
        """Keeps the files of the runs' root in the page cache (set by the probe, with a fresh root)."""
        self._filters: Filters | None = None
        self._filter_why = "SandboxConfig(syscall_filter=False)"
        if self.config.syscall_filter:
            self._filters, self._filter_why = seccomp_filters()

    @property
    def _uses_uids(self) -> bool:
        return self.config.drop_privileges and (self._is_root or self._subids is not None)

    def _run_identities(self) -> tuple[SubordinateIds | None, str]:
        """Where runs' uids come from (the subordinate ids, as an ordinary user granted them) and the line
        ``isolation()["uid_setup"]`` gives: which, or what is missing."""
        c = self.config
        if not c.drop_privileges:
            return None, "none: SandboxConfig(drop_privileges=False)"
        if self._is_root:
            return None, f"root: uids {c.uid_base}-{c.uid_base + c.uid_count - 1}"
        if not c.private_tmp:
            return None, "none: SandboxConfig(private_tmp=False) (a run's files would be this uid's only)"
        ids, why = subordinate_ids(c.uid_count)
        return (ids, ids.describe()) if ids is not None else (None, f"none: {why}")

    def _refusal(self, why: str) -> str:
        return (f"runs would keep this process's uid {os.geteuid()} ({why.removeprefix('none: ')}), and "
                "SandboxConfig(require_separate_uid=True) asks for a uid of their own")  # fmt: skip

    # -- public API ---------------------------------------------------------------------
    def isolation(self) -> dict[str, Any]:
        """Which isolation layers are active (probed once with a real execution): every layer of
        :data:`LAYERS` as True/False, plus ``python``, ``namespaces``,
        ``hidden_paths``, ``exposed_paths``, ``visible_paths`` (the host paths a deny-by-default root
        shows, read-only; None without one), ``cgroup_setup`` (where runs' cgroups are made, or why none
        can be), ``uid_setup`` (where runs' uids come from: root's range, the subordinate ids, or
        ``none: <what is missing>``), ``zygote`` (runs fork from warm interpreters; when False a
        ``no-zygote`` note says why), ``locale`` (the program's ``LC_CTYPE`` and UTF-8 mode at start) and
        ``notes``. Logged once per process."""
        if self._isolation is None:
            with self._probe_lock:
                if self._isolation is None:
                    self._isolation = probe(self)
                    log_isolation(self._isolation)
        return self._isolation

    async def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float | None = None,
        stdout_cap: int | None = None,
        kill_on_overflow: bool = True,
        stdout_keep: int | None = None,
    ) -> SandboxResult:
        """Run ``code`` as ``main.py`` with ``stdin``; never raises for anything the program does.
        ``stdout_cap``: keep this many bytes of stdout for this run (default ``config.stdout_cap``); a
        program writing past the stdout or the stderr cap is killed (``kill_on_overflow`` is kept for
        callers of earlier versions: it is always so). ``stdout_keep``: keep (and decode) only this many
        of them, counting the rest (``stdout_size``): the program still runs under ``stdout_cap``. The time
        waiting for a slot is not the program's: its wall clock starts when it does. Raises
        :class:`SandboxUnavailable` when no run uid frees up in time."""
        del kill_on_overflow
        if self._isolation is None:
            await asyncio.to_thread(self.isolation)
        self._check_identity()
        lease = await self.slots.acquire()
        try:
            uid = await self._lease_uid(lease.slot)
            try:
                return await self._run(code, stdin, timeout_s or self.config.wall_s, uid,
                                       self._python or sys.executable, stdout_cap=stdout_cap,
                                       stdout_keep=stdout_keep)  # fmt: skip
            finally:
                if uid is not None:
                    uid.release()
        finally:
            self.slots.release(lease)

    def run_sync(self, code: str, *, stdin: str = "", timeout_s: float | None = None) -> SandboxResult:
        return asyncio.run(self.run(code, stdin=stdin, timeout_s=timeout_s))

    def close(self) -> None:
        """Stop the zygotes (runs in flight are killed), wait for the clean-up of its runs and remove this
        sandbox's cgroups; later runs start new zygotes and make new cgroups."""
        with self._probe_lock:
            pool, cgroups = self._zygotes, self._cgroups
            if pool is not None and self._isolation is not None:
                self._zygotes = self._new_pool(self._python or sys.executable, self._isolation["locale"])
            self._cgroups = None
            self._cgroups_closed = cgroups is not None
        if pool is not None:
            pool.close()
        janitor().flush()
        if cgroups is not None:
            cgroups.close()

    # -- zygotes -------------------------------------------------------------------------
    def _new_zygote(self, python: str, locale: list[Any]) -> Zygote:
        """A zygote whose interpreter starts as the program's does, in the locale its root gives it (a
        fresh root has no locale data: there the C locale and Python's UTF-8 mode)."""
        env = self._program_env("/")
        if locale[0] == "C":
            env["LC_ALL"] = "C"  # the C locale, as in the program's root (a run's environment is its own)
        return Zygote(self._program_argv(python)[:-1], env, self._template_key(), self._subid_spec)

    def _template_key(self) -> bytes | None:
        """:meth:`_template`, computed once the root plan is known (by the isolation probe)."""
        if self._template_cached is None and self._plan is not None:
            self._template_cached = (self._template(),)
        return self._template_cached[0] if self._template_cached else None

    def _template(self) -> bytes | None:
        """What a zygote (as root, or in the subordinate ids' namespace) builds the read-only part of its
        runs' root from, once (stage, the plan's operations, the working directories' parent;
        ``_launcher.build_template``); None where runs build it all: an ordinary user without subordinate
        ids, no deny-by-default root, or working directories in ``/tmp`` or ``/dev/shm`` themselves or
        among what the plan binds."""
        c = self.config
        own_uids = self._is_root or self._subids is not None
        if not (own_uids and self._plan is not None and c.deny_by_default and c.private_tmp):
            return None
        parent = str(self._root)
        ops = list(self._plan.ops)
        if parent in ("/tmp", "/dev/shm"):
            return None
        if any(parent == op[1] or inside(parent, op[1]) or inside(op[1], parent) for op in ops):
            return None
        return marshal.dumps((str(self._stage), ops, parent, self._mirror or ""))

    def _new_pool(self, python: str, locale: list[Any]) -> ZygotePool:
        return ZygotePool(lambda: self._new_zygote(python, locale), self.config.runs_per_zygote)

    @property
    def _zygote(self) -> Zygote | None:
        """The zygote the next run would fork from (None: runs start cold)."""
        pool = self._zygotes
        if pool is None or pool.off is not None:
            return None
        with pool._lock:
            return pool._ready[0] if pool._ready else None

    @property
    def _zygote_off(self) -> str | None:
        pool = self._zygotes
        return pool.off if pool is not None else None

    # -- run identities ------------------------------------------------------------------
    async def _lease_uid(self, slot: int) -> UidLease | None:
        """A uid no other live run on this host holds and no host account has (as root, or from the
        subordinate ids); tried from the pool's first + ``slot``."""
        if self._lock_dir is None:
            return None
        c = self.config
        ids = self._subids
        first, count = (c.uid_base, c.uid_count) if ids is None else (ids.uid_first, ids.count)
        skip = host_account if ids is None else ids.taken
        deadline = time.monotonic() + c.uid_wait_s
        while (lease := try_lease(self._lock_dir, first, count, slot, skip)) is None:
            if time.monotonic() > deadline:
                raise SandboxUnavailable(f"all {count} sandbox uids from {first} held for {c.uid_wait_s}s")
            await asyncio.sleep(0.05)
        return lease

    def _stager(self, uid: int | None) -> int | None:
        """Who owns a run's staged files on the host: its uid as root; else this process (the launcher
        reads them before it drops to the run's subordinate uid, and writes them into the run's tmpfs)."""
        return uid if self._is_root else None

    def _check_identity(self) -> None:
        """``require_separate_uid``: refuse where the probe found runs keeping this process's uid."""
        iso = self._isolation
        if self.config.require_separate_uid and iso is not None and not iso["unprivileged_uid"]:
            raise SandboxUnavailable(self._refusal(uid_missing(iso)))

    def _contained_by_pid_namespace(self) -> bool:
        """Every process of a run lives in its PID namespace (dies with it): no sweep by uid needed."""
        return bool(self._isolation and self._isolation.get("pid_namespace"))

    # -- cgroups ---------------------------------------------------------------------------
    def _limits(self, extra_mb: int = 0) -> RunLimits:
        c = self.config
        return RunLimits((c.memory_mb + extra_mb) * 1024 * 1024, c.max_processes + _CHILDREN, c.cpus)

    def _find_cgroups(self) -> tuple[Cgroups | None, str]:
        hierarchy, why = find(self.config.cgroup_base(), weight=self.config.slots)
        if hierarchy is None:
            return None, why
        cgroups = Cgroups(hierarchy, self._limits())
        weakref.finalize(self, cgroups.close)  # at the latest when this process exits
        return cgroups, hierarchy.describe()

    def _release_cgroup(self, group: RunCgroup) -> None:
        """After a run: its group back to this sandbox's free groups (or removed, once this sandbox closed)."""
        cgroups = self._cgroups
        if cgroups is None:
            janitor().remove_cgroup(group)
        else:
            janitor().release_cgroup(group, cgroups)

    def _take_cgroup(self, extra_mb: int = 0) -> RunCgroup | None:
        cgroups = self._cgroups
        if cgroups is None and self._cgroups_closed:  # closed, and used again
            with self._probe_lock:
                if self._cgroups is None and self._cgroups_closed:
                    self._cgroups, self._cgroups_closed = self._find_cgroups()[0], False
            cgroups = self._cgroups
        if cgroups is None:
            return None
        try:
            group = cgroups.take(self._limits(extra_mb) if extra_mb else None)
        except CgroupError as exc:
            logger.warning("sandbox run without a cgroup of its own: %s", exc)
            return None
        return group

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

    def _private_dirs(self) -> list[str]:
        """The deny-list's private temporary directories (not the one holding the sandbox root)."""
        return [d for d in ("/tmp", "/var/tmp", "/dev/shm") if not inside(str(self._root), d)]

    def _hidden_for(self, python: str) -> list[str]:
        """:func:`hidden_for`, once per interpreter (it resolves paths: 0.2 ms a run on the event loop)."""
        hidden = self._hidden.get(python)
        if hidden is None:
            hidden = self._hidden[python] = hidden_for(self._hide, python)
        return hidden

    def _launch_config(self, workdir: Path, uid: int | None, python: str, *, script: str = "main.py",
                       cgroup: RunCgroup | None = None) -> dict[str, Any]:  # fmt: skip
        c = self.config
        plan = self._plan if c.deny_by_default and c.private_tmp else None
        fs = (
            {
                "stage": str(self._stage),
                "ops": list(plan.ops),
                "mirror": self._mirror or "",
                "tmp_mb": c.tmp_mb,
                "max_files": c.max_files,
            }
            if plan
            else None
        )
        return {
            "workdir": str(workdir),
            "argv": self._program_argv(python, script),
            "env": self._program_env(str(workdir)),
            "uid": uid,
            "gid": self._subids.gid(uid) if self._subids is not None and uid is not None else uid,
            "subids": self._subid_spec if uid is not None else None,
            "net": c.isolate_network,
            "mount": c.private_tmp,
            "pid": c.pid_namespace,
            "ipc": True,
            "uts": True,
            "fs": fs,
            "private_dirs": self._private_dirs(),
            "tmp_mb": c.tmp_mb,
            "max_files": c.max_files,
            "hidden": self._hidden_for(python) if c.private_tmp else [],
            "cgroup": cgroup.procs if cgroup is not None else [],
            "seccomp": self._filters.program if self._filters is not None else None,
            "rlimits": {
                "RLIMIT_CPU": [c.cpu_s, c.cpu_s + 1],
                "RLIMIT_AS": c.memory_mb * 1024 * 1024,
                "RLIMIT_FSIZE": c.file_size_mb * 1024 * 1024,
                "RLIMIT_NOFILE": c.max_open_files,
                "RLIMIT_NPROC": c.max_processes,
                "RLIMIT_CORE": 0,
            },
        }

    async def _run(
        self,
        code: str,
        stdin: str,
        timeout_s: float,
        uid: UidLease | None,
        python: str,
        *,
        stdout_cap: int | None = None,
        stdout_keep: int | None = None,
        zygotes: bool = True,
        on_launch: Callable[[_Run], None] | None = None,
    ) -> SandboxResult:
        run = await self._launch({"main.py": code}, uid, python, zygotes=zygotes)
        if on_launch is not None:
            on_launch(run)
        started = time.monotonic()
        readers: list[CappedReader] = []
        try:
            proc = run.proc
            out = CappedReader(run.stdout, stdout_cap or self.config.stdout_cap, proc.kill, keep=stdout_keep)
            err = CappedReader(run.stderr, self.config.stderr_cap, proc.kill)
            readers = [out, err]
            rest = feed_now(run.stdin, stdin.encode("utf-8", errors="replace"))
            feeding = asyncio.ensure_future(feed(run.stdin, rest)) if rest else None
            timed_out = False
            try:
                try:
                    status = await wait_within(proc.wait(), timeout_s)
                except (TimeoutError, asyncio.TimeoutError):
                    timed_out = True
                    proc.kill()
                    status = await proc.wait()
            except ZygoteError as exc:  # the zygote died under this run: its outcome is unknown
                if feeding is not None:
                    feeding.cancel()
                assert isinstance(proc, ForkedProcess)
                self._zygote_failed(proc.zygote, exc)
                return await self._run(code, stdin, timeout_s, uid, python, stdout_cap=stdout_cap,
                                       stdout_keep=stdout_keep, zygotes=False, on_launch=on_launch)  # fmt: skip
            await drain(readers)
            if feeding is not None:
                feeding.cancel()
            notes, stderr_text = split_notes(err.data.decode("utf-8", errors="replace"))
            self.executions += 1
            return SandboxResult(
                stdout=out.data.decode("utf-8", errors="replace"),
                stderr=stderr_text,
                exit_code=None if timed_out else status.code,
                signal=status.signal,
                timed_out=timed_out,
                stdout_truncated=out.truncated,
                stderr_truncated=err.truncated,
                wall_s=time.monotonic() - started,
                isolation_notes=notes,
                uid=run.uid,
                stdout_size=out.size,
            )
        finally:
            for reader in readers:
                reader.close()
            await self._dispose(run)

    @contextlib.asynccontextmanager
    async def _session(self, files: dict[str, str], *, script: str) -> AsyncIterator[_Run]:
        """A program that talks with this process while it runs (the batch harness): ``files`` written
        into its working directory, ``script`` started with every isolation layer of a run; killed and
        cleaned up when the block ends. Takes a slot (``run.lease``) and a run identity like :meth:`run`."""
        if self._isolation is None:
            await asyncio.to_thread(self.isolation)
        self._check_identity()
        lease = await self.slots.acquire()
        try:
            uid = await self._lease_uid(lease.slot)
            try:
                run = await self._launch(files, uid, self._python or sys.executable, script=script, session=True)
                run.lease = lease
                try:
                    yield run
                finally:
                    await self._dispose(run)
            finally:
                if uid is not None:
                    uid.release()
        finally:
            self.slots.release(lease)

    async def _launch(
        self,
        files: dict[str, str],
        lease: UidLease | None,
        python: str,
        *,
        script: str = "main.py",
        zygotes: bool = True,
        session: bool = False,
    ) -> _Run:
        """Stage ``files`` and start ``script`` with them in a cgroup of its own (see :meth:`_start`).
        ``session``: the batch harness (``SESSION_MB`` more memory, its capabilities in its own user
        namespace kept: it gives each input namespaces and mounts of its own)."""
        uid = lease.uid if lease is not None else None
        if self._warmer is not None:
            self._warmer.poke()
        if uid is not None and not self._contained_by_pid_namespace():
            await asyncio.to_thread(kill_uid, uid)  # strays of a holder of this uid that died (we hold the lease now)
        size = sum(map(len, files.values()))
        staged = not (zygotes and self._zygotes is not None and self._template_key() and size <= _SENT_BYTES)
        if not staged:  # the zygote's child writes them into the run's own tmpfs: no host files at all
            workdir = workdir_path(self._root)
        elif size <= _INLINE_BYTES:
            # a directory and small files: less than a thread hop
            workdir = make_workdir(self._root, files, self._stager(uid))
        else:
            workdir = await asyncio.to_thread(make_workdir, self._root, files, self._stager(uid))
        group = None
        try:
            group = self._take_cgroup(SESSION_MB if session else 0)
            config = self._launch_config(workdir, uid, python, script=script, cgroup=group)
            config["keep_capabilities"] = session and not (self._is_root and uid is None)  # never root's own
            if session and self._filters is not None:  # the harness mounts for each input, then seals it
                config["seccomp"] = self._filters.setup
            proc, (stdin, stdout, stderr), staged_late = await self._start(
                config, workdir, uid, zygotes, None if staged else files
            )
            staged = staged or staged_late
        except BaseException:
            dispose_workdir(workdir, files, staged=staged or os.path.lexists(workdir))
            if group is not None:
                self._release_cgroup(group)
            raise
        return _Run(workdir, uid, proc, Fd(stdin), Fd(stdout), Fd(stderr), tuple(files), group, staged=staged)

    async def _dispose(self, run: _Run) -> None:
        """Kill what is left of ``run``, release its descriptors, remove its working directory and cgroup.
        Safe against cancellation: whatever happens while waiting for the kill, the rest is done."""
        try:
            for pipe in (run.stdin, run.stdout, run.stderr):
                pipe.close()
            run.proc.kill()
            await run.proc.finish()
        finally:
            run.proc.release()
            for pipe in (run.stdin, run.stdout, run.stderr):
                pipe.close()
            if run.uid is not None and not self._contained_by_pid_namespace() and run.cgroup is None:
                kill_uid(run.uid)  # no PID namespace to take its strays down (before the uid is leased again)
            dispose_workdir(run.workdir, run.files, staged=run.staged)
            if run.cgroup is not None:
                self._release_cgroup(run.cgroup)

    async def _start(
        self, config: dict[str, Any], workdir: Path, uid: int | None, zygotes: bool, files: dict[str, str] | None
    ) -> tuple[RunProcess, tuple[int, int, int], bool]:
        """Start the program (forked by a zygote, else cold); returns it, this side's pipe ends (stdin to
        write, stdout and stderr to read) and whether it staged ``files`` in ``workdir``. ``files``: not
        staged yet: sent to the zygote's child in a memory file where the zygote has a template root, else
        staged here."""
        pool = self._zygotes if zygotes else None
        zygote = await pool.take() if pool is not None else None
        sent = _memory_file(files) if files is not None and zygote is not None and zygote.templated else None
        staged = False
        if files is not None and zygote is not None and sent is None:  # staged on the host after all
            await asyncio.to_thread(make_workdir, self._root, files, self._stager(uid), workdir)
            files, staged = None, True
        if zygote is not None:
            ends = pipes(3)
            try:
                run = await zygote.spawn({**config, "files": sent[1]} if sent else config, ends[0][0], ends[1][1],
                                         ends[2][1], files=sent[0] if sent else None)  # fmt: skip
            except ZygoteError as exc:
                for fd in (ends[0][1], ends[1][0], ends[2][0]):
                    os.close(fd)
                self._zygote_failed(zygote, exc)
            except BaseException:
                for fd in (ends[0][1], ends[1][0], ends[2][0]):
                    os.close(fd)
                raise
            else:
                return ForkedProcess(run, zygote), (ends[0][1], ends[1][0], ends[2][0]), staged
            finally:
                if sent:
                    os.close(sent[0])
        if files is not None:  # not staged for the zygote: a started launcher reads them from the host
            await asyncio.to_thread(make_workdir, self._root, files, self._stager(uid), workdir)
            staged = True
        ends = pipes(4)
        config = {**config, "report_fd": ends[3][1], "boot": _cold_boot()}
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", "-c", _BOOT, marshal.dumps(config).hex(),
                stdin=ends[0][0], stdout=ends[1][1], stderr=ends[2][1], pass_fds=(ends[3][1],),
                env=config["env"], cwd=str(workdir), start_new_session=True,
            )  # fmt: skip
        except BaseException:
            for fd in (ends[0][1], ends[1][0], ends[2][0], ends[3][0]):
                os.close(fd)
            raise
        finally:
            for fd in (ends[0][0], ends[1][1], ends[2][1], ends[3][1]):
                os.close(fd)
        return StartedProcess(proc, lambda: self._kill(proc.pid, uid), Fd(ends[3][0])), (
            ends[0][1], ends[1][0], ends[2][0]), staged  # fmt: skip

    def _zygote_failed(self, zygote: Zygote, exc: ZygoteError) -> None:
        """A run could not go through ``zygote``: it runs cold, and later runs get another zygote."""
        logger.warning("sandbox zygote failed a run (%s); running it cold", exc)
        if self._zygotes is not None:
            self._zygotes.failed(zygote)

    def _kill(self, pgid: int, uid: int | None) -> None:
        """Kill the run's process group, and (own uid, no PID namespace) every process of its leased uid."""
        kill_group(pgid)
        if uid is not None and not self._contained_by_pid_namespace():
            kill_uid(uid)
