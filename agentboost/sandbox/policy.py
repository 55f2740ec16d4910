"""What a sandboxed program may ask the kernel for: the system-call filter's policy, in one place.

Deny by default. :data:`ALLOWED` is the whole list of what a program may call (each entry, or group of
entries, says why); a call with conditions is allowed only when one of its entries' conditions all hold
(``(argument & mask) == value``; an ``int`` argument is compared on its low 32 bits, the bits the kernel
reads, so a value with high bits set cannot pass as another). Everything else fails: the calls of
:data:`DENIED` with ``EPERM`` (named, with why, so the list reads as a policy), any other with ``ENOSYS``,
as on a kernel without it: the C library then falls back to an older call where there is one (``clone3``,
whose flags lie in memory a filter cannot read, falls back to ``clone``, whose flags it checks). A call of
another architecture's interface (32-bit ``int 0x80``, x32) kills the process: only the native table is
allowed.

:data:`SETUP` is what the sandbox's own code still does after the filter is in place: the batch harness
gives each input fresh mounts, an IPC namespace and keyrings (:mod:`._harness`); the program never runs
under that filter alone (each input installs the program's filter before its first instruction).

The filter is compiled once per process with libseccomp (:mod:`.seccomp`) and installed by the launcher
after every other layer is set up, right before the program starts, on every path (started runs, zygote
runs, each input of a batch). The launcher also makes the program's processes non-dumpable (their
``/proc/<pid>/{mem,pagemap,environ}`` belong to root: unreadable) and the filter keeps them so (no
``PR_SET_DUMPABLE``, no ``execve``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Flag values the conditions test (Linux UAPI; the same on every architecture this runs on).
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x10000000, 0x20000000, 0x40000000, 0x00000080
NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
)
RWF_NOWAIT = 0x00000008
INT = 0xFFFFFFFF
"""Mask of an ``int`` argument: the kernel reads its low 32 bits only."""
LONG = 0xFFFFFFFFFFFFFFFF
"""Mask of an ``unsigned long`` argument (every bit counts)."""
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, NETLINK_ROUTE = 1, 2, 10, 16, 0
PERSONALITY_QUERY = 0xFFFFFFFF


@dataclass(frozen=True)
class Rule:
    """``name`` is allowed when every ``(argument, mask, value)`` of ``when`` holds (none: always)."""

    name: str
    when: tuple[tuple[int, int, int], ...] = ()


def _always(names: str) -> list[Rule]:
    """Each of the space-separated ``names``, allowed whatever its arguments."""
    return [Rule(name) for name in names.split()]


def _deny(names: str, why: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), why)


def _when(name: str, arg: int, values: tuple[int, ...], mask: int = INT) -> list[Rule]:
    """``name`` allowed when argument ``arg`` (masked) is one of ``values``."""
    return [Rule(name, ((arg, mask, value),)) for value in values]


# clone(2)'s flags are its first argument, except on s390 (its stack comes first).
_CLONE_FLAGS_ARG = 1 if os.uname().machine.startswith("s390") else 0

# prctl options a program may use: its own thread names, parent-death signal, child reaping, timer
# slack, no_new_privs (already set), naming its anonymous mappings (the C library does), and reading
# what it is (dumpable, seccomp, capabilities, speculation control).
_PRCTL = (1, 2, 3, 15, 16, 21, 23, 29, 30, 36, 37, 38, 39, 42, 52, 0x53564D41)

# madvise advice a program may give about its own memory (what allocators use: free, huge pages, fork
# and dump behaviour). Not: MADV_RANDOM / SEQUENTIAL / WILLNEED / POPULATE_* (they decide which pages of
# a file are read into the page cache every run shares: a page read alone is a bit written there), COLD /
# PAGEOUT (evict pages of that cache: a bit cleared), MERGEABLE (KSM merges identical pages across
# processes: timing reveals another run's memory), COLLAPSE, HWPOISON / SOFT_OFFLINE.
_MADVISE = (0, 4, 8, 9, 10, 11, 14, 15, 16, 17, 18, 19)

# fcntl commands: descriptors (dup, close-on-exec, status flags, owner and signal for async I/O), pipe
# size read, seals. Not: record and open-file-description locks (F_GETLK 5, F_SETLK 6, F_SETLKW 7,
# F_OFD_* 36-38: a lock on a read-only library file every run sees is visible to every other run: a live
# channel), leases and F_NOTIFY (1024-1026: notice when another run opens or reads a shared file),
# F_SETPIPE_SZ (1031: pipe buffers of up to 1 MiB, kernel memory no cgroup may charge).
_FCNTL = (0, 1, 2, 3, 4, 8, 9, 10, 11, 15, 16, 1030, 1032, 1033, 1034)

# ioctl requests: terminal queries and modes (isatty, window size, the C library's and Python's terminal
# handling), FIONREAD / FIONBIO / FIOCLEX / FIONCLEX / FIOASYNC. Not TIOCSTI (0x5412: types into a
# terminal) nor any device's own requests.
_IOCTL = (0x5401, 0x5402, 0x5403, 0x5404, 0x5405, 0x5406, 0x5407, 0x540B, 0x540F, 0x5410, 0x5413, 0x5414,
          0x541B, 0x5421, 0x5450, 0x5451, 0x5452)  # fmt: skip

ALLOWED: tuple[Rule, ...] = (
    # -- the process itself: identity (read only), limits, exit ----------------------------------------
    *_always(
        "exit exit_group getpid getppid gettid getuid geteuid getgid getegid getresuid getresgid"
        " getgroups getpgid getpgrp getsid uname umask"
    ),
    *_always("getrlimit setrlimit prlimit64 getrusage times getcpu"),  # (raising stops at
    # the hard limits the launcher set; other processes: only its own, in its PID namespace)
    *_always("setpgid setsid"),  # process groups and sessions inside its PID namespace (subprocess-like)
    *_always("sysinfo"),  # the C library's qsort sizes its buffer from it
    *_when("personality", 0, (PERSONALITY_QUERY,)),  # read only: no READ_IMPLIES_EXEC, no fixed layout
    *_when("prctl", 0, _PRCTL),
    *_always("arch_prctl"),  # thread-local storage (x86)
    *_always("set_tid_address set_robust_list rseq restart_syscall"),  # thread start, the C library
    # -- processes and threads: no new namespace (clone3: ENOSYS, see the module doc) -------------------
    Rule("clone", ((_CLONE_FLAGS_ARG, NAMESPACE_FLAGS, 0),)),
    *_always("fork vfork wait4 waitid"),
    *_always(
        "kill tkill tgkill rt_sigqueueinfo rt_tgsigqueueinfo pidfd_open pidfd_send_signal"
    ),  # reach only processes of its own PID namespace and uid
    # -- signals, timers, clocks, scheduling of its own threads -----------------------------------------
    *_always(
        "rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigsuspend rt_sigtimedwait"
        " sigaltstack pause signalfd signalfd4"
    ),
    *_always(
        "alarm getitimer setitimer timer_create timer_settime timer_gettime timer_getoverrun"
        " timer_delete timerfd_create timerfd_settime timerfd_gettime"
    ),
    *_always("clock_gettime clock_getres clock_nanosleep nanosleep gettimeofday time"),
    *_always(
        "sched_yield sched_getaffinity sched_setaffinity sched_getparam sched_getscheduler"
        " sched_get_priority_max sched_get_priority_min sched_rr_get_interval sched_getattr"
        " getpriority setpriority"
    ),  # (nice only upwards without privilege)
    *_always("futex futex_waitv futex_wait futex_wake futex_requeue"),
    # -- memory: its own mappings ---------------------------------------------------------------------
    *_always("brk mmap munmap mremap mprotect msync map_shadow_stack"),
    *_when("madvise", 2, _MADVISE),
    # -- files: in its own root (read-only binds, private tmpfs) ----------------------------------------
    *_always("read write readv writev pread64 pwrite64 preadv pwritev"),
    # preadv2 / pwritev2 without RWF_NOWAIT (which fails instead of reading a page not in the page
    # cache: a probe of what other runs read, that reads nothing)
    Rule("preadv2", ((5, RWF_NOWAIT, 0),)),
    Rule("pwritev2", ((5, RWF_NOWAIT, 0),)),
    *_always("open openat creat close close_range dup dup2 dup3 lseek"),
    *_when("fcntl", 1, _FCNTL),
    *_when("ioctl", 1, _IOCTL),
    *_always(
        "stat fstat lstat newfstatat statx statfs fstatfs access faccessat faccessat2 readlink"
        " readlinkat getdents getdents64 getcwd chdir fchdir"
    ),
    *_always(
        "mkdir mkdirat rmdir unlink unlinkat rename renameat renameat2 link linkat symlink"
        " symlinkat chmod fchmod fchmodat fchmodat2 chown fchown lchown fchownat truncate"
        " ftruncate fallocate utime utimes utimensat futimesat mknod mknodat"
    ),  # (FIFOs; device nodes: no privilege, nodev mounts)
    *_always("fsync fdatasync sync_file_range"),  # its own files (not sync / syncfs: every filesystem)
    *_always("sendfile copy_file_range"),  # read through the page cache as read() does
    *_always(
        "getxattr lgetxattr fgetxattr listxattr llistxattr flistxattr setxattr lsetxattr"
        " fsetxattr removexattr lremovexattr fremovexattr"
    ),  # (shutil copies them)
    *_always("pipe pipe2 eventfd eventfd2 getrandom"),
    *_always("poll ppoll select pselect6 epoll_create epoll_create1 epoll_ctl epoll_wait epoll_pwait epoll_pwait2"),
    # -- sockets: its own network namespace (no interface up), local sockets, route queries -------------
    *_when("socket", 0, (AF_UNIX, AF_INET, AF_INET6)),
    Rule("socket", ((0, INT, AF_NETLINK), (2, INT, NETLINK_ROUTE))),  # getaddrinfo, if_nameindex
    *_when("socketpair", 0, (AF_UNIX,)),
    *_always(
        "bind listen accept accept4 connect getsockname getpeername sendto recvfrom sendmsg"
        " recvmsg sendmmsg recvmmsg shutdown setsockopt getsockopt"
    ),
    # -- System V and POSIX IPC: the run's own IPC namespace, gone with it --------------------------------
    *_always(
        "shmget shmat shmdt shmctl semget semop semtimedop semctl msgget msgsnd msgrcv msgctl"
        " mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr"
    ),
)
"""Everything a program may call (module doc). Nothing else."""

DENIED: dict[str, str] = {
    # new namespaces and mounts: a user namespace hands the program every capability over what it then
    # creates (a network namespace whose TCP buffers no limit charges, a tmpfs outside every size limit)
    **_deny("unshare setns", "namespaces are set up before the program starts"),
    **_deny(
        "mount umount2 pivot_root chroot mount_setattr open_tree move_mount fsopen fsconfig fsmount fspick",
        "its filesystem is built before it starts",
    ),
    **_deny(
        "execve execveat",
        "one interpreter per run: an exec would make the process "
        "dumpable again (its /proc/<pid>/pagemap and mem readable)",
    ),
    # kernel keyrings: the trainer's keys and user keyring (as an ordinary user) are reachable through them
    **_deny("keyctl add_key request_key", "kernel keyrings: secrets and a cross-run channel"),
    # probes and control of the page cache every run shares (issue 39, finding 1)
    **_deny("fadvise64 readahead mincore cachestat", "probe or control the shared page cache"),
    **_deny(
        "inotify_init inotify_init1 inotify_add_watch fanotify_init fanotify_mark",
        "watch shared files for other runs' accesses",
    ),
    "flock": "locks on shared read-only files are seen by every run",
    # other processes' memory and the kernel's debugging and tracing interfaces
    **_deny(
        "ptrace process_vm_readv process_vm_writev process_madvise process_mrelease pidfd_getfd kcmp get_robust_list",
        "other processes' memory and descriptors",
    ),
    **_deny(
        "bpf perf_event_open userfaultfd io_uring_setup io_uring_enter io_uring_register"
        " io_setup io_submit io_getevents io_pgetevents io_cancel io_destroy",
        "kernel interfaces beyond this filter's reach, or with a history of exploits",
    ),
    **_deny("memfd_create memfd_secret", "files outside every tmpfs size limit"),
    **_deny(
        "mlock mlock2 mlockall munlock munlockall remap_file_pages mbind set_mempolicy"
        " migrate_pages move_pages membarrier",
        "pinned or moved memory, interrupts to every CPU",
    ),
    **_deny("splice tee vmsplice", "page references moved between files and pipes"),
    **_deny("name_to_handle_at open_by_handle_at", "files by handle, around the mount tree"),
    # the machine: time, modules, reboot, swap, accounting, kernel log, I/O ports, quotas
    **_deny(
        "kexec_load kexec_file_load init_module finit_module delete_module reboot swapon"
        " swapoff acct syslog settimeofday clock_settime clock_adjtime adjtimex sethostname"
        " setdomainname iopl ioperm modify_ldt quotactl quotactl_fd sync syncfs vhangup"
        " ioprio_set lookup_dcookie uselib ustat sysfs _sysctl",
        "the machine's, not a program's",
    ),
    # identity and privileges: nothing to switch to, nothing to gain
    **_deny(
        "setuid setgid setreuid setregid setresuid setresgid setfsuid setfsgid setgroups capset seccomp",
        "no other identity or privilege",
    ),
}
"""Calls denied with ``EPERM``, and why (every call not in :data:`ALLOWED` is denied; these are named)."""

SETUP: tuple[Rule, ...] = (
    # The batch harness, before each input's program: a mount namespace of its own, then per input an IPC
    # namespace, fresh tmpfs mounts (and their removal), a new session keyring with the user keyrings
    # cleared, its capabilities dropped, the program's dumpability, and the program's filter on top.
    *_when("unshare", 0, (CLONE_NEWNS, CLONE_NEWIPC), mask=LONG),
    *_always("mount umount2 capset"),
    *_when("keyctl", 0, (1, 7)),  # KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR
    *_when("prctl", 0, (4, 22)),  # PR_SET_DUMPABLE, PR_SET_SECCOMP
)
"""Allowed on top of :data:`ALLOWED` for the sandbox's own code after the filter (module doc)."""
