"""Host-wide leases on sandbox uids: one uid per running program, across every process on the host.

Cleanup kills a run's stragglers by uid, so a uid must never be shared by two live runs, even runs of
different worker processes with the same ``SandboxConfig``. A lease is an exclusive ``flock`` on
``<lock dir>/<uid>.lock`` held for the run's lifetime; the kernel drops it when the holder closes it
or dies, so a crashed worker never strands a uid. Root only (only root can switch uids).

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
import signal
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

_LOCK_PARENTS = ("/run/lock", "/run", "/var/lock")


def lock_dir() -> Path:
    """The host-global directory of uid lock files (created private to this uid; refused otherwise)."""
    parent = next((p for p in _LOCK_PARENTS if os.path.isdir(p)), tempfile.gettempdir())
    directory = Path(parent) / "agentboost-sandbox-uids"
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


def try_lease(directory: Path, first: int, count: int, start: int = 0) -> UidLease | None:
    """The first free uid of ``first .. first + count - 1``, trying from ``first + start``, that no host
    account has; None if all are held (or taken by the host)."""
    for i in range(count):
        uid = first + (start + i) % count
        if host_account(uid):
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
