"""Mark, find and kill the processes a worker and its episodes spawned (Linux ``/proc``).

Tools may start processes that leave the worker's process group: ``start_new_session=True``,
``setsid``, double forks. Three mechanisms keep every one of them reachable:

* the worker is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): orphans of its descendants are
  re-parented to the worker, not to init, so while the worker lives its descendants are exactly
  its ``/proc`` parent tree;
* every process a worker starts inherits ``AGENTBOOST_POOL_WORKER=<pool>-<worker>`` (set in the
  worker's environment, and added to explicit ``env=`` of ``subprocess``), so the pool can still
  find a *dead* worker's leftovers, which init adopted;
* subprocesses started while an episode's code runs (its tools, in their threads: the marker is a
  context variable, and ``asyncio.to_thread`` carries the context) also get
  ``AGENTBOOST_EPISODE=<token>``, so a worker kills one episode's processes at its end without
  touching those of the episodes still running. A plain ``os.fork`` child (no exec, so its
  ``/proc`` environment is the worker's) reports ``pid token`` over a pipe from an at-fork hook.

Killing freezes first: every target gets ``SIGSTOP`` and the tree is scanned again until no new
process appears, then everything gets ``SIGKILL``; a process cannot fork away between the scan and
the kill. Scans happen at episode end (only when the worker has children at all), at worker
replacement and at close, never per model call. Out of reach: processes that escaped a worker's
session *and* carry no worker marker (a hand-written environment, or a plain fork), once that
worker died on its own (while it lives, its tree holds them; when the pool kills it, it freezes the
tree first). A descendant without an episode marker is killed with its worker, not at episode end.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

logger = logging.getLogger(__name__)

WORKER_VAR = "AGENTBOOST_POOL_WORKER"
EPISODE_VAR = "AGENTBOOST_EPISODE"
PR_SET_CHILD_SUBREAPER = 36
_FREEZE_ROUNDS = 20
_DEATH_WAIT_S = 2.0
ZOMBIE_GRACE_S = 10.0
"""Adopted zombies nobody reaped for this long are reaped by the worker (nobody else can)."""

episode_marker: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentboost_episode", default=None)


# -- the process table ------------------------------------------------------------------------
def process_table() -> dict[int, tuple[int, str]]:
    """``pid -> (ppid, state)`` of every process visible in ``/proc``."""
    table: dict[int, tuple[int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may hold spaces and ')'
            table[int(name)] = (int(fields[1]), fields[0].decode("ascii", "replace"))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return table


def descendants(roots: Iterable[int], table: dict[int, tuple[int, str]]) -> set[int]:
    """Every process below ``roots`` in ``table`` (``roots`` themselves excluded)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def environ_value(pid: int, name: str) -> str | None:
    """The value of ``name`` in the environment ``pid`` was started with (``None``: absent/unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    key = name.encode() + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key) :].decode("utf-8", "replace")
    return None


def has_children() -> bool:
    """Whether this process has any child (one system call; nothing is reaped)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    except OSError:
        return True
    return True


# -- killing ----------------------------------------------------------------------------------
def freeze_and_kill(select: Callable[[dict[int, tuple[int, str]]], set[int]]) -> set[int]:
    """Stop every process ``select(table)`` names, rescanning until nothing new appears, then kill
    them all. Returns the killed pids. Never touches this process or init."""
    protected = {os.getpid(), 1, 0}
    stopped: set[int] = set()
    for _ in range(_FREEZE_ROUNDS):
        table = process_table()
        new = {pid for pid in select(table) if pid not in stopped and pid not in protected}
        new = {pid for pid in new if table.get(pid, (0, "Z"))[1] not in ("Z", "X")}
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _DEATH_WAIT_S
    waiting = set(stopped)
    while waiting and time.monotonic() < deadline:  # SIGKILL is asynchronous: return once they are dead
        waiting = {pid for pid in waiting if _state(pid) not in ("Z", "X", None)}
        if waiting:
            time.sleep(0.005)
    return stopped


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return stat[stat.rindex(b")") + 2 :].split()[0].decode("ascii", "replace")
    except (OSError, ValueError, IndexError):
        return None


def kill_worker_processes(pids: Iterable[int], markers: Iterable[str], *, prefix: bool = False) -> set[int]:
    """Kill worker processes ``pids``, everything below them and every process whose environment
    carries one of ``markers`` in :data:`WORKER_VAR` (``prefix``: starting with one), wherever it is.
    Used by the pool when a worker is replaced and at close."""
    roots = {p for p in pids if p}
    wanted = tuple(markers)
    checked: dict[int, bool] = {}

    def marked(pid: int) -> bool:
        if not wanted:
            return False
        if pid not in checked:
            value = environ_value(pid, WORKER_VAR)
            checked[pid] = value is not None and (value.startswith(wanted) if prefix else value in wanted)
        return checked[pid]

    def select(table: dict[int, tuple[int, str]]) -> set[int]:
        hits = {pid for pid in table if pid in roots or marked(pid)}
        return hits | descendants(hits | roots, table)

    return freeze_and_kill(select)


# -- inside the worker ------------------------------------------------------------------------
def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux >= 3.4); ``False`` where unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_POPEN_CHILDREN: weakref.WeakValueDictionary[int, subprocess.Popen[Any]] = weakref.WeakValueDictionary()
_installed = False
_forks: tuple[int, int] | None = None  # (read, write) ends of the fork registry pipe


def install_markers(worker_marker: str) -> None:
    """In a worker: mark every process it starts from now on (see the module docstring)."""
    global _installed, _forks
    os.environ[WORKER_VAR] = worker_marker
    if _installed:
        return
    _installed = True
    _forks = os.pipe()
    os.set_blocking(_forks[0], False)
    os.set_blocking(_forks[1], False)
    original = subprocess.Popen.__init__

    def marked_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        if len(args) > 10:  # env passed positionally (args, bufsize, ..., cwd, env)
            args = (*args[:10], _with_markers(args[10]), *args[11:])
        else:
            kwargs["env"] = _with_markers(kwargs.get("env"))
        original(self, *args, **kwargs)
        if self.pid:
            _POPEN_CHILDREN[self.pid] = self

    subprocess.Popen.__init__ = marked_init  # type: ignore[method-assign]

    def child_after_fork() -> None:  # os.fork in a tool: register, and a later exec carries the marker
        token = episode_marker.get()
        if token:
            os.environ[EPISODE_VAR] = token
            if _forks is not None:
                with contextlib.suppress(OSError):  # a full pipe: the fork stays unattributed
                    os.write(_forks[1], f"{os.getpid()} {token}\n".encode())

    os.register_at_fork(after_in_child=child_after_fork)


def _with_markers(env: Any) -> Any:
    token = episode_marker.get()
    if env is None:
        if not token:
            return None  # inherits os.environ, which holds the worker marker
        env = os.environ
    try:
        updated = dict(env)
        if any(isinstance(k, bytes) for k in updated):
            updated[WORKER_VAR.encode()] = os.environ.get(WORKER_VAR, "").encode()
            if token:
                updated[EPISODE_VAR.encode()] = token.encode()
        else:
            updated[WORKER_VAR] = os.environ.get(WORKER_VAR, "")
            if token:
                updated[EPISODE_VAR] = token
        return updated
    except Exception:  # a strange mapping: let subprocess report it as it would have
        return env


class EpisodeReaper:
    """In a worker: kill the processes of episodes that have ended; reap adopted zombies."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._zombies_seen: dict[int, float] = {}
        self._forked: dict[int, str] = {}
        self._partial = b""

    def _read_forks(self) -> None:
        if _forks is None:
            return
        with contextlib.suppress(OSError):
            while chunk := os.read(_forks[0], 65536):
                self._partial += chunk
        lines = self._partial.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            with contextlib.suppress(ValueError):
                pid, token = line.decode().split()
                self._forked[int(pid)] = token

    def sweep(self, live_tokens: set[str], *, everything: bool = False) -> set[int]:
        """Kill descendants marked with an episode token not in ``live_tokens`` (``everything``:
        all descendants). Cheap when the worker has no child process."""
        self._read_forks()
        if not has_children():
            self._zombies_seen.clear()
            self._forked.clear()
            return set()
        me = self._pid
        checked: dict[int, bool] = {}

        def dead(pid: int) -> bool:
            if pid not in checked:
                token = environ_value(pid, EPISODE_VAR) or self._forked.get(pid)
                checked[pid] = token is not None and token not in live_tokens
            return checked[pid]

        def select(table: dict[int, tuple[int, str]]) -> set[int]:
            tree = descendants([me], table)
            if everything:
                return tree
            hits = {pid for pid in tree if dead(pid)}
            return hits | descendants(hits, table)

        killed = freeze_and_kill(select)
        self._reap(killed)
        if self._forked:
            alive = process_table()
            self._forked = {pid: t for pid, t in self._forked.items() if pid in alive and pid not in killed}
        return killed

    def _reap(self, killed: set[int]) -> None:
        """Reap killed children (after a moment) and adopted zombies nobody waited for; never a
        child a live ``subprocess.Popen`` object still owns."""
        deadline = time.monotonic() + 0.5
        pending = {pid for pid in killed if pid not in _POPEN_CHILDREN}
        now = time.monotonic()
        zombies = {
            pid
            for pid, (ppid, state) in process_table().items()
            if ppid == self._pid and state == "Z" and pid not in _POPEN_CHILDREN
        }
        self._zombies_seen = {pid: self._zombies_seen.get(pid, now) for pid in zombies}
        pending |= {pid for pid, first in self._zombies_seen.items() if now - first >= ZOMBIE_GRACE_S}
        while pending:
            for pid in list(pending):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid  # not ours (or already reaped)
                if done:
                    pending.discard(pid)
                    self._zombies_seen.pop(pid, None)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.01)
