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
keeps a copy of its own, which another user cannot turn off), and stays for later sandboxes of this host
(it is not removed: others may be using it; about 75 MB for Debian's CPython 3.11 and the libraries it
loads). A file or directory this uid may not read is left out (a run could not read it either).

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
import time
from collections.abc import Iterator

from .rootfs import RootPlan

logger = logging.getLogger(__name__)

BASE = "/dev/shm"
MAX_BYTES = 256 * 1024 * 1024
"""A plan binding more than this (``site_packages=True``: whole library directories) is not copied."""
LOCK_WAIT_S = 120.0
"""How long a process waits for another one of its uid copying the same files."""
_PREFIX = "agentboost-root-"


class _TooLarge(Exception):
    pass


def mirror_for(plan: RootPlan, base: str = BASE) -> tuple[str | None, str]:
    """The directory holding a copy of every file ``plan`` binds, at its host path below it (made now if
    this host has none yet), and ``"memory"``; or None and why there is none."""
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
    if _ours(final):
        return final, "memory"
    with _building(final):  # (one process of this uid copies; the others wait and find its copy)
        if _ours(final):
            return final, "memory"
        try:
            building = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.geteuid()}-", suffix=".building", dir=base)
        except OSError as exc:
            return None, f"cannot make a directory in {base}: {exc}"
        try:
            _copy(listing, building)
            os.chmod(building, 0o755)
            with contextlib.suppress(OSError):  # (that name taken: by another user, see below)
                os.rename(building, final)
        except OSError as exc:
            shutil.rmtree(building, ignore_errors=True)
            return None, f"cannot copy the root's files into {base}: {exc}"
        if not _ours(final):  # another user's directory has the name: this copy keeps its own, unshared
            logger.warning("sandbox root files: %s is not this uid's alone; copied to %s instead", final, building)
            return building, "memory"
        if os.path.lexists(building):  # (another process of this uid made it first)
            shutil.rmtree(building, ignore_errors=True)
    logger.info("sandbox root files copied into memory at %s", final)
    return final, "memory"


@contextlib.contextmanager
def _building(final: str) -> Iterator[None]:
    """Hold ``<final>.lock`` (this uid's) while copying, so that workers starting together make one copy,
    not one each. Waits at most :data:`LOCK_WAIT_S`, then copies anyway; a lock file that is not this
    uid's is not used (another user cannot make a sandbox wait)."""
    try:
        fd = os.open(final + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        yield
        return
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # (releases the lock)


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
