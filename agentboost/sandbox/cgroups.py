"""A cgroup per run: memory, process count and CPU limited for the whole run, not per process.

Where (:func:`find`, once per sandbox, from ``/proc/self/mountinfo`` and ``/proc/self/cgroup``):

* cgroup v2 (most training clusters): the unified hierarchy with the ``memory`` and ``pids`` controllers
  (``cpu`` too where available). A directory under which this process may create groups with those
  controllers enabled: ``SandboxConfig.cgroup`` / ``$AGENTBOOST_SANDBOX_CGROUP`` (a delegated subtree);
  else this process's own cgroup where controllers can be enabled in it (the root cgroup); else its parent,
  where that already hands the controllers down and this process may write it (a delegated service
  or user slice whose processes sit in a leaf, the layout systemd's ``Delegate=yes`` asks for). Runs get
  ``memory.max`` (with ``memory.swap.max`` 0: it counts the program's shared memory, its files in tmpfs and
  page cache), ``pids.max``, ``cpu.weight`` (equal for every run) and ``cpu.max``.
* cgroup v1 (this project's machines and CI): the ``memory``, ``pids`` and ``cpu`` hierarchies mounted on
  their own, where this process may create groups below its own (root). Runs get
  ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``), ``memory.kmem.tcp.limit_in_bytes``
  (the same figure: v1 charges TCP buffers only to a group with a TCP limit, and on their own, besides
  ``memory.limit_in_bytes``), ``pids.max``, ``cpu.shares`` (equal for every run) and the CFS quota.

Each sandbox makes one group of its own there (``agentboost-<pid>-<token>``, weighing as much CPU as as many
busy processes as it has slots) and one group per run in it, removed after the run by the janitor (off the
event loop: the kernel takes a while); groups of a process that died are removed the next time a sandbox
starts. The launcher moves
itself into the run's group before anything else (it writes ``0`` to each file of :attr:`RunCgroup.procs` in
the launch configuration), so every process of the run is in it. Where none of this is possible (no such mount, no
delegation, not root) :func:`find` says why and runs keep only their per-process limits (reported as the
``cgroup`` layer).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

REQUIRED = ("memory", "pids")
WANTED = (*REQUIRED, "cpu")
_PERIOD_US = 100_000


class CgroupError(RuntimeError):
    """A run's group could not be made or limited."""


@dataclass(frozen=True)
class RunLimits:
    memory_bytes: int
    pids: int
    cpus: float | None


@dataclass(frozen=True)
class _Mount:
    root: str
    mountpoint: str
    fstype: str
    options: frozenset[str]


def parse_mountinfo(text: str) -> list[_Mount]:
    mounts = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mounts.append(_Mount(_unescape(fields[3]), _unescape(fields[4]), tail[0], frozenset(tail[2].split(","))))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup``: controller -> path (v1), and ``""`` -> path for the unified hierarchy."""
    out = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            out[""] = parts[2]
        for controller in filter(None, parts[1].split(",")):
            out[controller] = parts[2]
    return out


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _inside(mount: _Mount, path: str) -> str:
    rel = os.path.relpath(path, mount.root) if mount.root != "/" else path.lstrip("/")
    return os.path.normpath(os.path.join(mount.mountpoint, "" if rel == "." else rel))


class Hierarchy:
    """Where this sandbox makes its runs' groups: one directory per hierarchy (v2: one for all)."""

    def __init__(self, version: int, parents: dict[str, str], controllers: tuple[str, ...]) -> None:
        self.version = version
        self.parents = parents
        self.controllers = controllers

    def describe(self) -> str:
        where = ", ".join(sorted(set(self.parents.values())))
        return f"cgroup v{self.version} ({', '.join(self.controllers)}) under {where}"

    def make(self, limits: RunLimits) -> RunCgroup:
        name = f"run-{secrets.token_hex(6)}"
        dirs = [os.path.join(parent, name) for parent in dict.fromkeys(self.parents.values())]
        group = RunCgroup(name, dirs, self.version)
        try:
            for directory in dirs:
                os.mkdir(directory, 0o755)
            self._limit(group, limits)
        except OSError as exc:
            group.remove()
            raise CgroupError(f"cannot make a run cgroup: {exc}") from None
        return group

    def _limit(self, group: RunCgroup, limits: RunLimits) -> None:
        quota = "max" if limits.cpus is None else str(max(1000, int(limits.cpus * _PERIOD_US)))
        if self.version == 2:
            d = group.dirs[0]
            _write(f"{d}/memory.max", str(limits.memory_bytes))
            if os.path.exists(f"{d}/memory.swap.max"):
                _write(f"{d}/memory.swap.max", "0")
            _write(f"{d}/pids.max", str(limits.pids))
            if "cpu" in self.controllers:
                _write(f"{d}/cpu.weight", "100")
                _write(f"{d}/cpu.max", f"{quota} {_PERIOD_US}")
            return
        memory = os.path.join(self.parents["memory"], group.name)
        _write(f"{memory}/memory.limit_in_bytes", str(limits.memory_bytes))
        if os.path.exists(f"{memory}/memory.memsw.limit_in_bytes"):
            _write(f"{memory}/memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        if os.path.exists(f"{memory}/memory.kmem.tcp.limit_in_bytes"):
            # v1 charges socket buffers only once a group has a TCP limit (v2 always charges them to
            # memory.max): the run's TCP buffers get a limit of their own, memory_mb (deprecated since
            # Linux 6.x, still enforced on 6.18)
            _write(f"{memory}/memory.kmem.tcp.limit_in_bytes", str(limits.memory_bytes))
        _write(f"{os.path.join(self.parents['pids'], group.name)}/pids.max", str(limits.pids))
        if "cpu" in self.controllers:
            cpu = os.path.join(self.parents["cpu"], group.name)
            _write(f"{cpu}/cpu.shares", "1024")
            _write(f"{cpu}/cpu.cfs_period_us", str(_PERIOD_US))
            _write(f"{cpu}/cpu.cfs_quota_us", "-1" if limits.cpus is None else quota)

    def remove(self) -> bool:
        ok = True
        for parent in dict.fromkeys(self.parents.values()):
            with contextlib.suppress(OSError):
                for name in os.listdir(parent):
                    if name.startswith("run-") and os.path.isdir(os.path.join(parent, name)):
                        ok = RunCgroup(name, [os.path.join(parent, name)], self.version).remove(kill=True) and ok
            ok = _rmdir(parent) and ok
        return ok


class RunCgroup:
    """One run's group (one directory per hierarchy)."""

    def __init__(self, name: str, dirs: list[str], version: int) -> None:
        self.name = name
        self.dirs = dirs
        self.version = version
        self.limits: RunLimits | None = None
        """What it was made with (a group made elsewhere: None, never reused)."""

    @property
    def procs(self) -> list[str]:
        """The files the launcher writes ``0`` to, to move itself in. v1: ``tasks``, which moves the calling
        thread alone (the launcher has no other): the kernel then skips the thread-group lock whose write
        side waits for an RCU grace period (``cgroup.procs``: milliseconds per run on a busy host)."""
        name = "tasks" if self.version == 1 else "cgroup.procs"
        return [f"{d}/{name}" for d in self.dirs]

    def kill(self) -> None:
        """SIGKILL every process left in the group."""
        for directory in self.dirs:
            if os.path.exists(f"{directory}/cgroup.kill"):
                with contextlib.suppress(OSError):
                    _write(f"{directory}/cgroup.kill", "1")
                    continue
            with contextlib.suppress(OSError):
                for pid in _read(f"{directory}/cgroup.procs").split():
                    if pid.isdigit() and int(pid) > 1 and int(pid) != os.getpid():  # (never 0: our own group)
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(int(pid), signal.SIGKILL)

    def empty(self) -> bool:
        """No process in the group (one that cannot be read counts as not empty)."""
        try:
            return not any(_read(f"{d}/cgroup.procs").strip() for d in self.dirs)
        except OSError:
            return False

    def remove(self, kill: bool = False) -> bool:
        """Remove the group; False while processes are still in it (they die with the run's PID
        namespace, or are killed here with ``kill``)."""
        if kill:
            self.kill()
        return all(_rmdir(d) for d in self.dirs)


def _rmdir(directory: str) -> bool:
    """Remove a group's directory; False while it is busy (processes or groups in it: ``EBUSY``). A
    directory that is not a cgroup (``ENOTEMPTY``: files in it) is never retried."""
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno == errno.ENOTEMPTY:
            logger.debug("%s is not a cgroup (it holds files): left", directory)
            return True
        return False
    return True


def find(
    base: str | None = None, *, proc: str = "/proc/self", tag: str | None = None, weight: int = 1
) -> tuple[Hierarchy | None, str]:
    """Where this process can make run groups (see the module doc), or None and why not. ``base``: an
    explicit cgroup v2 directory (``"none"``: no cgroups). ``proc``: where to read ``mountinfo`` and
    ``cgroup`` (a test gives a fake hierarchy). ``weight``: the sandbox's group weighs as much CPU as this
    many busy processes (its runs share that equally), as its runs would without a group."""
    found, why = _find(base, proc, tag)
    if found is not None and "cpu" in found.controllers:
        with contextlib.suppress(OSError):
            if found.version == 2:
                _write(f"{found.parents['unified']}/cpu.weight", str(min(10_000, 100 * max(1, weight))))
            else:
                _write(f"{found.parents['cpu']}/cpu.shares", str(1024 * max(1, weight)))
    return found, why


def _find(base: str | None, proc: str, tag: str | None) -> tuple[Hierarchy | None, str]:
    if base == "none":
        return None, "SandboxConfig(cgroup='none')"
    try:
        mounts = parse_mountinfo(_read(f"{proc}/mountinfo"))
        membership = parse_proc_cgroup(_read(f"{proc}/cgroup"))
    except OSError as exc:
        return None, f"cannot read this process's cgroups: {exc}"
    tag = tag or f"agentboost-{os.getpid()}-{secrets.token_hex(4)}"
    if base is not None:
        return _v2_under(base, tag, explicit=True)
    reasons = []
    v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if v2 is not None and "" in membership:
        found, why = _v2(v2, membership[""], tag)
        if found is not None:
            return found, why
        reasons.append(why)
    found, why = _v1(mounts, membership, tag)
    if found is not None:
        return found, why
    reasons.append(why)
    return None, "; ".join(reasons)


def _v2(mount: _Mount, own_path: str, tag: str) -> tuple[Hierarchy | None, str]:
    ours = _inside(mount, own_path)
    try:
        available = set(_read(f"{ours}/cgroup.controllers").split())
    except OSError as exc:
        return None, f"cgroup v2: {exc}"
    if not set(REQUIRED) <= available:
        return None, f"cgroup v2: controllers {sorted(set(REQUIRED) - available)} not available to {ours}"
    found, why = _v2_under(ours, tag, explicit=False)  # the root cgroup (or one without processes)
    if found is not None:
        return found, why
    parent = os.path.dirname(ours)
    if os.path.normpath(ours) == os.path.normpath(mount.mountpoint) or not os.access(parent, os.W_OK):
        return None, f"cgroup v2: {ours} holds processes and its parent is not delegated to this process"
    return _v2_under(parent, tag, explicit=False, enable_in_base=False)


def _v2_under(base: str, tag: str, *, explicit: bool, enable_in_base: bool = True) -> tuple[Hierarchy | None, str]:
    """Our group ``base/tag`` with the controllers enabled for its runs."""
    try:
        available = set(_read(f"{base}/cgroup.controllers").split())
        controllers = tuple(c for c in WANTED if c in available)
        if not set(REQUIRED) <= set(controllers):
            return None, f"cgroup v2: {base} offers {sorted(available)}, not {list(REQUIRED)}"
        enabled = set(_read(f"{base}/cgroup.subtree_control").split())
        if not set(controllers) <= enabled:
            if not enable_in_base:
                return None, f"cgroup v2: {base} does not hand {sorted(set(controllers) - enabled)} down"
            _write(f"{base}/cgroup.subtree_control", " ".join(f"+{c}" for c in controllers))
        _sweep_dead(base)
        ours = os.path.join(base, tag)
        os.mkdir(ours, 0o755)
        try:
            _write(f"{ours}/cgroup.subtree_control", " ".join(f"+{c}" for c in controllers))
        except OSError:
            os.rmdir(ours)
            raise
    except OSError as exc:
        where = "SandboxConfig.cgroup / $AGENTBOOST_SANDBOX_CGROUP" if explicit else "this process's cgroup"
        return None, f"cgroup v2: cannot make groups under {base} ({where}): {exc.strerror or exc}"
    return Hierarchy(2, {"unified": ours}, controllers), f"cgroup v2 under {base}"


def _v1(mounts: list[_Mount], membership: dict[str, str], tag: str) -> tuple[Hierarchy | None, str]:
    parents: dict[str, str] = {}
    made: list[str] = []
    try:
        for controller in WANTED:
            mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
            if mount is None or controller not in membership:
                if controller in REQUIRED:
                    return None, f"cgroup v1: no {controller} hierarchy"
                continue
            ours = _inside(mount, membership[controller])
            parent = os.path.join(ours, tag)
            if parent not in made:  # (controllers mounted together share one directory)
                _sweep_dead(ours)
                os.mkdir(parent, 0o755)
                made.append(parent)
            parents[controller] = parent
    except OSError as exc:
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        return None, f"cgroup v1: cannot make groups ({exc.strerror or exc}: {exc.filename})"
    controllers = tuple(c for c in WANTED if c in parents)
    return Hierarchy(1, parents, controllers), "cgroup v1"


def _sweep_dead(directory: str) -> None:
    """Remove the groups sandboxes of processes that died left in ``directory``."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            parts = name.split("-")
            if len(parts) == 3 and parts[0] == "agentboost" and parts[1].isdigit() and not _alive(int(parts[1])):
                stale = Hierarchy(0, {"x": os.path.join(directory, name)}, ())
                if not stale.remove():
                    logger.debug("could not remove the stale sandbox cgroup %s", name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Cgroups:
    """A sandbox's run groups, reused: a run takes a group that is empty (a free one, else a new one: a few
    system calls) and gives it back after the run; the janitor puts it back on the free list once no
    process of that run is left in it, or removes it. Making and removing a group per run cost about a
    millisecond of CPU (three hierarchies on v1, and the kernel's work freeing a memory cgroup). A reused
    group holds nothing of its previous run but page cache charged to it (reclaimed under its limit) and
    its cumulative statistics, which nothing here reads."""

    def __init__(self, hierarchy: Hierarchy, limits: RunLimits, keep: int = 32) -> None:
        self.hierarchy = hierarchy
        self.limits = limits
        self._keep = keep
        self._free: list[tuple[RunLimits, RunCgroup]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()

    def take(self, limits: RunLimits | None = None) -> RunCgroup:
        """An empty group for one run (``limits``: other than the default)."""
        limits = limits or self.limits
        if os.getpid() != self._pid:  # a forked copy: the parent hands out the groups it inherited
            self._free, self._lock, self._pid = [], threading.Lock(), os.getpid()
        with self._lock:
            for i, (had, group) in enumerate(self._free):
                if had == limits:
                    del self._free[i]
                    return group
        group = self.hierarchy.make(limits)
        group.limits = limits
        return group

    def give_back(self, group: RunCgroup) -> bool:
        """(The janitor's thread, after the run) True once ``group`` is empty and free again (or removed:
        this sandbox closed, or it keeps enough); False while a process is still in it."""
        if not group.empty():
            return False
        if os.getpid() != self._pid:  # (a forked copy never keeps a group the parent may hand out)
            return group.remove()
        with self._lock:
            if not self._closed and len(self._free) < self._keep and group.limits is not None:
                self._free.append((group.limits, group))
                return True
        return group.remove()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._free.clear()
        deadline = time.monotonic() + 5.0
        while not self.hierarchy.remove() and time.monotonic() < deadline:
            time.sleep(0.05)
