"""Working directories on the host and the clean-up of what runs leave behind.

A run's files are staged in a directory of the sandbox root (:func:`make_workdir`); the launcher copies
them into the run's own size- and inode-limited tmpfs, which the program gets as its working directory
(the staging directory is not visible to it). Without a mount namespace the program works in the staging
directory itself.

Clean-up cannot fail or leak: the common case (the staged files, nothing else) is a few system calls done
at once (:func:`remove_fast`); anything else (a tree a program left: thousands of levels deep, directories
with mode 0) and every run's cgroup goes to the :class:`Janitor`, a thread that removes it iteratively
(:func:`._remove.remove_tree`) and retries what is still busy. Nothing here raises into a run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._remove import remove_tree
from .cgroups import Cgroups, RunCgroup

logger = logging.getLogger(__name__)

_RETRY_S = 0.02
_GIVE_UP_S = 30.0


def make_root(configured: str | None, is_root: bool, traversable: bool = False) -> Path:
    """The directory of working directories: private to this uid (traversable by sandbox uids as root, or
    ``traversable``: runs of subordinate uids). Working directories a process that died left there are
    removed (by the janitor)."""
    if configured:
        root = Path(configured)
        root.mkdir(parents=True, exist_ok=True)
    elif is_root and os.path.isdir("/run"):
        root = Path("/run/agentboost-sandbox")
        root.mkdir(exist_ok=True)
    else:
        root = Path(tempfile.gettempdir()) / f"agentboost-sandbox-{os.geteuid()}"
        with contextlib.suppress(FileExistsError):
            root.mkdir(mode=0o700)
        info = os.lstat(root)
        if not root.is_dir() or root.is_symlink() or info.st_uid != os.geteuid():
            root = Path(tempfile.mkdtemp(prefix="agentboost-sandbox-"))  # someone else's: not ours to use
    os.chmod(root, 0o711 if is_root or traversable else 0o700)
    _sweep_dead(root)
    return root


def _sweep_dead(root: Path) -> None:
    """Queue for removal the working directories (``run-<pid>-<token>``) of processes that are gone."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            parts = entry.name.split("-")
            if len(parts) == 3 and parts[0] == "run" and parts[1].isdigit() and not _alive(int(parts[1])):
                janitor().remove_tree(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def workdir_path(root: Path) -> Path:
    """A new run's working directory (its name only: nothing is made)."""
    return root / f"run-{os.getpid()}-{secrets.token_hex(6)}"


def file_bytes(text: str) -> bytes:
    """A run's file as UTF-8, lone surrogates passed through as their (invalid) bytes: a program holding one
    (a model's tool arguments are JSON, where ``"\\ud800"`` decodes to one) is one no file can hold, and the
    interpreter judges those bytes (in a string literal: a SyntaxError, the program's runtime error) instead
    of the encoding raising out of the run (the tool failed; a reward would be masked)."""
    return text.encode("utf-8", "surrogatepass")


def make_workdir(root: Path, files: dict[str, str], uid: int | None, workdir: Path | None = None) -> Path:
    """A new staging directory (``workdir``, default a new one of ``root``) holding ``files`` (owned by
    ``uid`` when given)."""
    workdir = workdir or workdir_path(root)
    workdir.mkdir(mode=0o700)
    try:
        for name, text in files.items():
            (workdir / name).write_bytes(file_bytes(text))
        if uid is not None:
            for path in (workdir, *(workdir / name for name in files)):
                os.chown(path, uid, uid)
    except BaseException:
        janitor().remove_tree(workdir)
        raise
    return workdir


def remove_fast(workdir: Path, files: Any) -> bool:
    """Remove ``workdir`` if it holds exactly ``files`` (the common case); False otherwise."""
    try:
        for name in files:
            os.unlink(workdir / name)
        os.rmdir(workdir)
    except FileNotFoundError:
        return not os.path.lexists(workdir)
    except OSError:
        return False
    return True


def dispose_workdir(workdir: Path, files: Any, *, staged: bool = True) -> None:
    """Remove a run's staging directory, on the janitor's thread: at once if it is as it was written, else
    as a tree. (Not on the caller's event loop: where the host's disk is mounted with ``discard``, an
    ``rmdir`` waits for the device, 0.2 ms a run here, and every run of the loop waited with it.)
    ``staged`` False: nothing to remove (the run got its files with its request)."""
    if not staged:
        return
    names = tuple(files)

    def dispose() -> None:
        if not remove_fast(workdir, names):
            remove_tree(workdir)

    janitor().call(dispose, f"directory {workdir}")


class Janitor:
    """A thread removing trees and cgroups runs left, retrying what is still busy. Never raises."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[], bool], str, float] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending = 0
        self._idle = threading.Condition(self._lock)

    def remove_tree(self, path: Path | str) -> None:
        self._put(lambda: remove_tree(path), f"directory {path}")

    def remove_cgroup(self, group: RunCgroup) -> None:
        """(On the janitor's thread: removing a cgroup takes the kernel a while, an event loop must not wait.)"""
        started = time.monotonic()

        def attempt() -> bool:
            return group.remove(kill=time.monotonic() - started > 1.0)

        self._put(attempt, f"cgroup {group.name}")

    def release_cgroup(self, group: RunCgroup, owner: Cgroups) -> None:
        """Give a run's group back to ``owner`` once the run's processes are gone; one still busy after a
        second is never reused: what is left in it is killed and the group removed."""
        started = time.monotonic()

        def attempt() -> bool:  # (given back whenever it is empty, also when this thread came to it late)
            if owner.give_back(group):
                return True
            return time.monotonic() - started > 1.0 and group.remove(kill=True)

        self._put(attempt, f"cgroup {group.name}")

    def call(self, fn: Callable[[], Any], what: str) -> None:
        """Run ``fn`` on the janitor's thread (once; its errors are logged)."""

        def once() -> bool:
            fn()
            return True

        self._put(once, what)

    def _put(self, attempt: Callable[[], bool], what: str) -> None:
        with self._lock:
            self._pending += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="agentboost-sandbox-janitor", daemon=True)
                self._thread.start()
        self._queue.put((attempt, what, time.monotonic()))

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            attempt, what, since = item
            try:
                done = attempt()
            except Exception:  # a bug: logged, never retried
                logger.exception("sandbox clean-up of %s failed", what)
                done = True
            if not done:
                if time.monotonic() - since < _GIVE_UP_S:
                    time.sleep(_RETRY_S if self._queue.empty() else 0)
                    self._queue.put(item)
                    continue
                logger.warning("sandbox clean-up gave up on %s after %.0fs: it is left behind", what, _GIVE_UP_S)
            with self._lock:
                self._pending -= 1
                if not self._pending:
                    self._idle.notify_all()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far is done (or given up); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True


_janitor: Janitor | None = None
_janitor_lock = threading.Lock()


def janitor() -> Janitor:
    """The process's janitor (a forked child gets a new one)."""
    global _janitor
    with _janitor_lock:
        if _janitor is None:
            _janitor = Janitor()
        return _janitor


def _after_fork_in_child() -> None:
    global _janitor, _janitor_lock
    _janitor, _janitor_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
