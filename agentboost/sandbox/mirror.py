"""The runs' read-only files, copied once into memory, so that no run leaves a trace in them for a later one.

A run's root binds the interpreter, the standard library and the shared libraries. Bound from the host's
disk, their filesystem's caches are shared by every run, and a run can write to them without any
privilege: looking up a name that does not exist (``stat("/usr/lib/python3.11/.x17")``) leaves a negative
dentry, so a later run times the same lookup (about 6 µs the first time, 1.7 µs once cached: 20,000 bits
in 0.1 s between two runs, 0.2% wrong) and reads what the first one wrote, any number of bits, any number of
times; the first access by another uid caches an inode's ACL; a page read stays cached (:mod:`.pagecache`).
None of this happens on a tmpfs: a lookup of a missing name leaves nothing behind, an inode is made with no
ACL to cache and every page is in memory. So the plan's bound files are copied once per host into a
directory of a tmpfs (``/dev/shm``: it must allow executables, the interpreter and the libraries are
mapped from there), named by the owner's uid and a digest of what was copied (paths, types, sizes, modes,
times: a changed host file gives a new copy), and runs bind them from there at their host paths
(``RootPlan.ops`` unchanged; the launcher's ``fs["mirror"]``). The copy is never written once made
(read-only binds; built aside, by one process of the uid at a time, and renamed into place), is owned by
this uid and not writable by others (a directory of that name that is not is never used: this process
keeps a copy of its own, which another user cannot turn off), and is shared by every sandbox of this uid
on the host (about 75 MB for Debian's CPython 3.11 and the libraries it loads). Each process using a copy
holds a shared lock on its lock file until it ends; a copy no process holds, made over an hour ago (an
interpreter or a venv that is gone), is removed by the next sandbox that makes or finds its own. A file or
directory this uid may not read is left out (a run could not read it either).

Where no copy can be made (no such tmpfs, it is mounted ``noexec``, the plan binds more than
:data:`MAX_BYTES`, as with ``site_packages=True``), :func:`mirror_for` says why, runs bind the host's files
and the page cache is kept warm instead (:mod:`.pagecache`); lookups then still leave their trace (the
isolation notes say ``no-memory-root``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator

from .rootfs import RootPlan

logger = logging.getLogger(__name__)

BASE = "/dev/shm"
MAX_BYTES = 256 * 1024 * 1024
"""A plan binding more than this (``site_packages=True``: whole library directories) is not copied."""
LOCK_WAIT_S = 120.0
"""How long a process waits for another one of its uid copying the same files."""
SWEEP_AGE_S = 3600.0
"""A copy no process holds is removed once it is this old (a younger one may be about to be held)."""
_PREFIX = "agentboost-root-"


class _TooLarge(Exception):
    pass


def mirror_for(plan: RootPlan, base: str = BASE) -> tuple[str | None, str]:
    """The directory holding a copy of every file ``plan`` binds, at its host path below it (made now if
    this host has none yet; held by this process from now on), and ``"memory"``; or None and why there is
    none. Copies of this uid no process holds, made over :data:`SWEEP_AGE_S` ago, are removed."""
    why = _unusable(base)
    if why is not None:
        return None, why
    try:
        listing = list(_entries(plan))
    except _TooLarge:
        return None, f"the root binds more than {MAX_BYTES >> 20} MiB"
    except OSError as exc:
        return None, f"cannot list the root's files: {exc}"
    digest = hashlib.sha256(repr((plan.ops, listing)).encode()).hexdigest()[:24]
    final = os.path.join(base, f"{_PREFIX}{os.geteuid()}-{digest}")
    for _ in range(3):  # (a copy swept between its making and its holding is made again)
        if _hold(final):
            _sweep(base)
            return final, "memory"
        with _locked(final, fcntl.LOCK_EX) as fd:  # one process of this uid copies, the others wait for it
            if _ours(final):
                continue
            try:
                building = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.geteuid()}-", suffix=".building", dir=base)
            except OSError as exc:
                return None, f"cannot make a directory in {base}: {exc}"
            try:
                _copy(listing, building)
                os.chmod(building, 0o755)
                if fd is not None:  # (no lock of this uid to make it under: not shared, see below)
                    with contextlib.suppress(OSError):  # (that name taken: by another user, see below)
                        os.rename(building, final)
            except OSError as exc:
                shutil.rmtree(building, ignore_errors=True)
                return None, f"cannot copy the root's files into {base}: {exc}"
            if fd is None or not _ours(final):  # another user's file or directory has the name (or its
                logger.warning("sandbox root files: %s is not this uid's alone; copied to %s instead", final,
                               building)  # fmt: skip
                _hold(building)  # lock's): this copy keeps one of its own, unshared
                return building, "memory"
            if os.path.lexists(building):  # (another process of this uid made it first)
                shutil.rmtree(building, ignore_errors=True)
            logger.info("sandbox root files copied into memory at %s", final)
    return None, f"{final} was removed as soon as it was made, three times"


_held: dict[str, int] = {}
"""Copies this process uses: the descriptor of each one's lock file, locked shared until the process ends
(its zygotes and runs bind the copy; no sweep removes a copy while a process holds it)."""
_held_lock = threading.Lock()


def _hold(path: str) -> bool:
    """Whether ``path`` is a complete copy of this uid, now held by this process (see :data:`_held`)."""
    with _held_lock:
        if path in _held:
            if _ours(path):
                return True
            os.close(_held.pop(path))  # (changed under this process: no longer this uid's alone)
        with _locked(path, fcntl.LOCK_SH) as fd:
            if fd is None or not _ours(path):
                return False
            _held[path] = os.dup(fd)  # (the lock stays with the open file, duplicated or not)
            return True


@contextlib.contextmanager
def _locked(path: str, how: int) -> Iterator[int | None]:
    """``<path>.lock`` (this uid's, made if missing) locked ``how`` (waiting at most :data:`LOCK_WAIT_S`)
    and still the file at that name once locked (a sweep may remove it meanwhile); its descriptor, or None
    where there is no such lock file (one of another user: never waited on)."""
    name = path + ".lock"
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        yield None
        return
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while os.fstat(fd).st_uid == os.geteuid():
            try:
                fcntl.flock(fd, how | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
                continue
            if _same_file(fd, name):
                yield fd
                return
            os.close(fd)  # (swept meanwhile: lock the one at that name now)
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        yield None
    finally:
        os.close(fd)


def _same_file(fd: int, name: str) -> bool:
    try:
        here, there = os.fstat(fd), os.lstat(name)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _sweep(base: str) -> None:
    """Remove the copies of this uid in ``base`` that no process holds and that were made over
    :data:`SWEEP_AGE_S` ago (a copy made for an interpreter that is gone, a venv in a temporary directory:
    each would stay until the host reboots), and copies left half-made that long ago."""
    prefix = f"{_PREFIX}{os.geteuid()}-"
    now = time.time()
    try:
        names = [n for n in os.listdir(base) if n.startswith(prefix) and not n.endswith(".lock")]
    except OSError:
        return
    for name in names:
        path = os.path.join(base, name)
        with _held_lock:
            if path in _held:
                continue
        try:
            made = os.lstat(path + ".lock").st_mtime
        except FileNotFoundError:  # (a copy left half-made by a process that died: no lock of its own)
            try:
                made = os.lstat(path).st_mtime if name.endswith(".building") else now
            except FileNotFoundError:  # (another sandbox's sweep removed it just now)
                continue
        if now - made < SWEEP_AGE_S or not _ours(path):
            continue
        fd = None
        try:
            fd = os.open(path + ".lock", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            if os.fstat(fd).st_uid != os.geteuid():
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (held by a process: BlockingIOError)
        except FileNotFoundError:
            pass  # (half made, no lock: removed below)
        except OSError:
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            if fd is not None:
                os.unlink(path + ".lock")
            logger.info("sandbox root files: removed %s (no process holds it)", path)
        finally:
            if fd is not None:
                os.close(fd)


def _unusable(base: str) -> str | None:
    """Why ``base`` cannot hold the copy (not a tmpfs, mounted noexec), or None."""
    try:
        real = os.path.realpath(base)
        flags = os.statvfs(real).f_flag
    except OSError as exc:
        return f"no {base}: {exc}"
    if flags & os.ST_NOEXEC:
        return f"{base} is mounted noexec (the interpreter and its libraries are mapped from the copy)"
    if flags & os.ST_RDONLY:
        return f"{base} is read-only"
    fstype = _filesystem(real)
    if fstype != "tmpfs":
        return f"{base} is not a tmpfs ({fstype or 'unknown'}): lookups there leave their trace too"
    return None


def _filesystem(path: str) -> str | None:
    """The type of the filesystem mounted deepest at or above ``path`` (this process's mount table)."""
    best, fstype = "", None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                point = fields[4].replace("\\040", " ")
                rest = fields[fields.index("-") + 1 :]
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best, fstype = point, rest[0] if rest else None
    except (OSError, ValueError, IndexError):
        return None
    return fstype


def _ours(path: str) -> bool:
    """A complete copy: a real directory of this uid that no one else may write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _entries(plan: RootPlan) -> Iterator[tuple[str, str, int, int, int, str]]:
    """Every entry to copy: (host path, kind, size, mode, mtime_ns, link target), parents before children.
    Left out: what hidden directories inside a bound tree hold (their mount point is kept), and a standard
    library's regression tests (``test/``) and static libraries (``config-*/``): nothing a program runs
    needs them, and they are most of its size (CPython 3.11 built by pyenv: 257 MB, 90 without)."""
    hidden = {op[1] for op in plan.ops if op[0] == "hide"}
    total = 0
    for op in plan.ops:
        if op[0] != "ro":
            continue
        stack = [str(op[1])]
        while stack:
            path = stack.pop()
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                yield path, "link", 0, 0, 0, os.readlink(path)
            elif stat.S_ISDIR(info.st_mode):
                yield path, "dir", 0, stat.S_IMODE(info.st_mode), 0, ""
                if path not in hidden:
                    try:
                        names = os.listdir(path)
                    except PermissionError:  # (not this uid's to read: nor a run's)
                        names = []
                    if "os.py" in names:  # a standard library: not its own tests nor its static libraries
                        names = [n for n in names if n != "test" and not n.startswith("config-")]
                    stack.extend(sorted((os.path.join(path, n) for n in names), reverse=True))
            elif stat.S_ISREG(info.st_mode):
                total += info.st_size
                if total > MAX_BYTES:
                    raise _TooLarge
                yield path, "file", info.st_size, stat.S_IMODE(info.st_mode), info.st_mtime_ns, ""
            # (sockets, FIFOs, devices inside a library directory: nothing a program needs)


def _copy(listing: list[tuple[str, str, int, int, int, str]], into: str) -> None:
    """The entries copied below ``into``: modes without set-id bits and without write for group and others,
    files with their modification times (a cached ``.pyc`` names its source's); directories get their modes
    last (one without write for its owner is filled first)."""
    for path, kind, _, mode, mtime_ns, target in listing:
        dest = into + path
        os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
        if kind == "link":
            os.symlink(target, dest)
        elif kind == "dir":
            os.mkdir(dest, 0o755)
        else:
            try:
                src = open(path, "rb")  # noqa: SIM115 - closed below
            except PermissionError:  # (not this uid's to read: nor a run's; it is left out)
                continue
            with src, open(dest, "xb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.chmod(dest, mode & 0o755)
            os.utime(dest, ns=(mtime_ns, mtime_ns))
    for path, kind, _, mode, _, _ in reversed(listing):
        if kind == "dir":
            os.chmod(into + path, mode & 0o755)
