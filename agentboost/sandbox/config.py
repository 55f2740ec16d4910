"""What a sandbox is asked for (:class:`SandboxConfig`) and what one run gave (:class:`SandboxResult`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


class SandboxUnavailable(RuntimeError):
    """No run identity could be had (every sandbox uid of the host-wide range is held by live runs)."""


@dataclass(frozen=True)
class SandboxConfig:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    """Memory of the whole run: every process, its files in the private ``/tmp``, ``/dev/shm`` and working
    directory, shared memory and page cache (a cgroup of its own, where one can be made: see
    ``isolation()["cgroup"]``); each process's address space is also capped at this (``RLIMIT_AS``)."""
    file_size_mb: int = 16
    max_open_files: int = 64
    max_processes: int = 32
    """Processes of the whole run (the cgroup's ``pids.max``) and of each uid (``RLIMIT_NPROC``)."""
    cpus: float | None = 1.0
    """CPU time per wall-clock second the whole run may use (the cgroup's quota; None: no quota). Every run
    also gets an equal CPU weight, so a run with many busy processes cannot starve its neighbours."""
    stdout_cap: int = 64 * 1024
    stderr_cap: int = 16 * 1024
    """Bytes kept of each stream; a program writing more than its cap is killed (``*_truncated``)."""
    isolate_network: bool = True
    private_tmp: bool = True
    """New mount namespace (private ``/tmp`` and working directory, deny-by-default root or hidden paths);
    False: none."""
    pid_namespace: bool = True
    drop_privileges: bool = True
    uid_base: int = 62000
    uid_count: int = 1000
    """As root, each running program gets a uid of ``uid_base .. uid_base + uid_count - 1`` no other live
    run on the host holds (leased with a lock file, so worker processes never share one) and no account of
    the host has (uids and gids of the host's accounts are skipped). As an ordinary user the host grants
    subordinate ids (``newuidmap``/``newgidmap`` installed, an ``/etc/subuid`` and ``/etc/subgid`` entry),
    each gets a uid and gid of the last ``uid_count`` of its range the same way (``uid_base`` unused):
    ``isolation()["uid_setup"]`` says which, or what is missing."""
    require_separate_uid: bool = False
    """Refuse to run (:class:`SandboxUnavailable`, from the constructor or the first run) where programs
    would keep this process's uid: as an ordinary user the host grants no subordinate ids (the message
    names what is missing), with ``drop_privileges=False``, or where the probe run did not get one. False:
    runs go on, with a WARNING naming what is missing."""
    uid_wait_s: float = 60.0
    """How long a run waits for a free uid before :class:`SandboxUnavailable`."""
    slots: int = 16
    """Concurrent executions of this Sandbox, shared fairly between their owners (see :mod:`.slots`)."""
    python: str | None = None
    """Interpreter for the program (default: this one, or a system one when this one lives in a hidden path)."""
    site_packages: bool = False
    """Let the program import the interpreter's installed packages (default: standard library only)."""
    root: str | None = None
    """Where working directories are staged (default: /run/agentboost-sandbox as root, else a directory
    of this uid in the temp dir). The program's working directory is a tmpfs of its own at that path."""
    deny_by_default: bool = True
    """Build the program's root from nothing (workdir, interpreter, libraries, minimal /dev, private /tmp
    and /proc). False, or where it cannot be built: the host's tree with ``hidden_paths`` covered."""
    tmp_mb: int = 64
    """Size of the private ``/tmp``, ``/dev/shm`` and working directory (each a tmpfs)."""
    max_files: int = 4096
    """Files and directories each of those tmpfs may hold."""
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
    """Fork runs from a warm interpreter where that isolates them as well as starting one does (module doc
    of :mod:`.sandbox`)."""
    runs_per_zygote: int = 8
    """Runs one zygote forks before it retires (a new one, started ahead of time, takes over): forked runs
    share a hash seed and address layout only with this many (1: none; each zygote start costs about as
    much CPU as an interpreter start)."""
    syscall_filter: bool = True
    """Run every program under the system-call filter of :mod:`.policy` (compiled with libseccomp; where
    that is missing, runs go on without one and a WARNING says so). False: no filter."""
    root_in_memory: bool = True
    """Bind the deny-by-default root's files from a copy in memory (a tmpfs, made once per host,
    :mod:`.mirror`) rather than from the host's disk, whose caches every run shares: a lookup of a missing
    name there leaves a trace a later run can time. False, or where no copy can be made: the host's files
    (and ``keep_cached``)."""
    keep_cached: bool = True
    """Where the root's files are the host's (not :attr:`root_in_memory`), keep them in the page cache
    (read ahead when the sandbox is probed, again at most every minute): a run finds no page there it could
    bring in for a later run to time (:mod:`.pagecache`). False: not."""
    cgroup: str | None = None
    """A cgroup v2 directory delegated to this process, under which each run gets a cgroup of its own
    (default: ``$AGENTBOOST_SANDBOX_CGROUP``, else found from this process's own cgroup; see
    :mod:`.cgroups`). ``"none"``: no cgroups (per-process limits only)."""

    def cgroup_base(self) -> str | None:
        return self.cgroup if self.cgroup is not None else os.environ.get("AGENTBOOST_SANDBOX_CGROUP") or None


@dataclass
class SandboxResult:
    """Outcome of one execution. ``exit_code`` is the program's exit status when it exited, None when it
    was killed: by a signal (``signal`` names it, e.g. 24 = SIGXCPU for the CPU limit), the wall clock
    (``timed_out``) or an output cap (``stdout_truncated`` / ``stderr_truncated``)."""

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
    """The uid leased for the program (its own: as root, or a subordinate id), else None."""
    stdout_size: int | None = None
    """Bytes the program wrote to stdout, read up to the cap (``stdout`` may keep fewer: a run's
    ``stdout_keep``); None where not counted (``stdout`` is all of it)."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_limited

    @property
    def output_limited(self) -> bool:
        """Killed for writing past an output cap."""
        return self.stdout_truncated or self.stderr_truncated
