"""Host-wide leases on sandbox uids: one uid per running program, across every process on the host.

Cleanup kills a run's stragglers by uid, so a uid must never be shared by two live runs, even runs of
different worker processes with the same ``SandboxConfig``. A lease is an exclusive ``flock`` on
``<lock dir>/<uid>.lock`` held for the run's lifetime; the kernel drops it when the holder closes it
or dies, so a crashed worker never strands a uid. As root the uids come from ``SandboxConfig.uid_base``;
as an ordinary user from the subordinate ids the host grants it (:func:`subordinate_ids`: ``/etc/subuid``,
``/etc/subgid`` and the setuid ``newuidmap`` / ``newgidmap`` that map them into a run's user namespace),
leased the same way in a lock directory of that user's.

A uid (or gid: a run's gid is its uid) that belongs to an account of the host is never leased
(:func:`host_account`: ``/etc/passwd`` and ``/etc/group`` read directly, and the name service asked with
``getpwuid`` / ``getgrgid``): a run with a real account's uid could use that account's keyrings, files
and processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import grp
import os
import pwd
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LOCK_PARENTS = ("/run/lock", "/run", "/var/lock")
_TOOL_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
"""Where ``newuidmap`` and ``newgidmap`` are looked for (not ``$PATH``: they run setuid root)."""
_SPARED_AT_END = 2
"""Ids at the end of a subordinate range left out of the pool: rootless containers map a user's range from
its start (their root and system users) and put ``nobody`` / ``nogroup`` (65534) near its end."""


def lock_dir() -> Path:
    """The host-global directory of uid lock files (created private to this uid; refused otherwise). An
    ordinary user's is its own (its subordinate ids are its own)."""
    euid = os.geteuid()
    parent = next((p for p in _LOCK_PARENTS if os.path.isdir(p) and os.access(p, os.W_OK | os.X_OK)),
                  tempfile.gettempdir())  # fmt: skip
    directory = Path(parent) / ("agentboost-sandbox-uids" if euid == 0 else f"agentboost-sandbox-uids-{euid}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise RuntimeError(f"{directory} is not a private directory of uid {os.geteuid()}: cannot lease sandbox uids")
    return directory


@dataclass
class UidLease:
    """An exclusive hold on ``uid`` until :meth:`release` (or this process's death)."""

    uid: int
    _fd: int = field(repr=False)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = -1


@functools.cache
def _listed(path: str) -> frozenset[int]:
    """The ids in the third field of a passwd/group file."""
    ids = set()
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            fields = line.split(":")
            if len(fields) > 2 and fields[2].strip().isdigit():
                ids.add(int(fields[2]))
    return frozenset(ids)


@functools.lru_cache(maxsize=4096)
def host_account(uid: int) -> bool:
    """Whether ``uid`` is a user or group id of the host (files and the name service)."""
    if uid in _listed("/etc/passwd") or uid in _listed("/etc/group"):
        return True
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except (KeyError, OverflowError):
            continue
    return False


def try_lease(
    directory: Path, first: int, count: int, start: int = 0, skip: Callable[[int], bool] = host_account
) -> UidLease | None:
    """The first free uid of ``first .. first + count - 1``, trying from ``first + start``, that ``skip``
    allows (default: no host account has it); None if all are held (or taken by the host)."""
    for i in range(count):
        uid = first + (start + i) % count
        if skip(uid):
            continue
        fd = os.open(directory / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return UidLease(uid, fd)
    return None


def kill_uid(uid: int) -> None:
    """SIGKILL every host process owned by ``uid``. Only for a leased uid: they are all the run's own
    (daemons a program left behind, fork bombs), or strays of a dead holder of the same lease."""
    for _ in range(3):
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if process_uid(int(entry.name)) == uid:
                    found = True
                    os.kill(int(entry.name), signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found:
            return
        time.sleep(0.005)


def process_uid(pid: int) -> int | None:
    """The real uid of process ``pid`` (from its ``status``: a program's ``/proc/<pid>`` belongs to root,
    it is not dumpable); None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


@dataclass(frozen=True)
class SubordinateIds:
    """The pool of subordinate ids an ordinary user's runs take their uid and gid from: ``count`` uids from
    ``uid_first`` and as many gids from ``gid_first`` (a run's gid is at its uid's place), mapped into a
    run's user namespace by the host's setuid ``newuidmap`` / ``newgidmap``."""

    user: str
    uid_first: int
    gid_first: int
    count: int
    newuidmap: str
    newgidmap: str

    def gid(self, uid: int) -> int:
        return self.gid_first + uid - self.uid_first

    def taken(self, uid: int) -> bool:
        """Not for a run: the uid or its gid belongs to an account of the host."""
        return host_account(uid) or host_account(self.gid(uid))

    def launch_spec(self) -> dict[str, Any]:
        """What the launcher maps (``_launcher._enter_subordinate_ids``): this process's uid and gid to
        themselves (it sets the run up with its own file access) and the pool to itself (a run's ids read
        the same inside and out)."""
        return {
            "newuidmap": self.newuidmap,
            "newgidmap": self.newgidmap,
            "uid_map": [os.getuid(), os.getuid(), 1, self.uid_first, self.uid_first, self.count],
            "gid_map": [os.getgid(), os.getgid(), 1, self.gid_first, self.gid_first, self.count],
        }

    def describe(self) -> str:
        last = self.count - 1
        return (f"subordinate ids of {self.user}: uids {self.uid_first}-{self.uid_first + last}, gids "
                f"{self.gid_first}-{self.gid_first + last} ({self.newuidmap}, {self.newgidmap})")  # fmt: skip


def _ranges(path: str, user: str, uid: int) -> list[tuple[int, int]]:
    """The (first, count) ranges ``path`` (``/etc/subuid`` format: ``user-or-uid:first:count``) grants."""
    found = []
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            fields = line.strip().split(":")
            if len(fields) == 3 and fields[0] in (user, str(uid)) and fields[1].isdigit() and fields[2].isdigit():
                found.append((int(fields[1]), int(fields[2])))
    return [r for r in found if r[1] > 0]


def _map_tool(name: str, search: str) -> tuple[str | None, str]:
    """``name``'s path where it can map subordinate ids (setuid root, not on a nosuid mount), or why not."""
    path = shutil.which(name, path=search)
    if path is None:
        return None, f"{name} is not installed (Debian and Ubuntu: package uidmap)"
    info = os.stat(path)
    if info.st_uid != 0 or not info.st_mode & stat.S_ISUID:
        return None, f"{path} is not setuid root"
    if os.statvfs(path).f_flag & os.ST_NOSUID:
        return None, f"{path} lies on a nosuid mount"
    return path, ""


def subordinate_ids(
    wanted: int, *, subuid: str = "/etc/subuid", subgid: str = "/etc/subgid", search: str = _TOOL_PATH
) -> tuple[SubordinateIds | None, str]:
    """The pool of at most ``wanted`` subordinate ids this (ordinary) user's runs may take, or why there is
    none, naming what is missing: ``newuidmap`` / ``newgidmap`` (setuid root), an ``/etc/subuid`` or
    ``/etc/subgid`` entry for this user, an account name (``newuidmap`` looks the user up by it) or this
    user's primary group as the real gid (``newgidmap`` insists). The pool is the end of the user's first
    range of each, less its last :data:`_SPARED_AT_END` ids where it is larger."""
    uid, gid = os.getuid(), os.getgid()
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        return None, f"uid {uid} has no account name (newuidmap looks the user up by name)"
    user = account.pw_name
    tools = []
    for name in ("newuidmap", "newgidmap"):
        path, why = _map_tool(name, search)
        if path is None:
            return None, why
        tools.append(path)
    if account.pw_gid != gid:
        return None, f"the real gid {gid} is not {user}'s primary group {account.pw_gid} (newgidmap refuses)"
    ranges = []
    for path, own in ((subuid, uid), (subgid, gid)):
        granted = [r for r in _ranges(path, user, uid) if not r[0] <= own < r[0] + r[1]]
        if not granted:
            return None, f"no {path} entry for {user}"
        ranges.append(granted[0])
    usable = [size - _SPARED_AT_END if size > wanted + _SPARED_AT_END else size for _, size in ranges]
    count = min(wanted, *usable)
    if count < 1:
        return None, f"no subordinate ids wanted (uid_count={wanted})"
    (uid_start, _), (gid_start, _) = ranges
    return SubordinateIds(user, uid_start + usable[0] - count, gid_start + usable[1] - count, count, *tools), ""
