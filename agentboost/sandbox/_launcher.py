"""Sandbox launcher: runs as ``python -I -S _launcher.py <hex(marshal(config))>`` in a fresh session.

Stdlib only and cheap to start (``marshal``, not ``json``: importing ``json`` alone costs more than the
rest of the launcher). It runs before anything untrusted and must not import agentboost. In order:

1. new network namespace (no interfaces but a down loopback) when ``net`` is requested;
2. new mount namespace with private tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm`` when ``mount``,
   and an empty read-only tmpfs over each ``hidden`` host directory;
3. new PID namespace when ``pid``: the launcher forks; the child is PID 1 of the namespace, mounts a
   private ``/proc`` and forks the program as PID 2 (PID 1 ignores default-action signals such as
   the CPU limit's SIGXCPU, so the program must not be PID 1). When PID 1 exits, the kernel kills
   everything left in the namespace. Exit statuses are passed up unchanged;
4. resource limits (CPU seconds, address space, file size, open files, processes, no core dumps);
5. drop to an unprivileged uid/gid (``uid``) and ``no_new_privs``;

Every process of the chain asks the kernel to SIGKILL it when its parent dies (``PDEATHSIG``), so
killing the worker that started a sandbox takes the whole sandbox down with it.
6. ``exec`` the target interpreter on the program in the working directory.

Namespaces and the uid switch need root (or unprivileged user namespaces, tried as a fallback for
``net``/``pid``); each failure is reported on stderr with the marker below and the run continues
with what could be set up, so the caller can report which isolation is active.
"""

import ctypes
import marshal
import os
import resource
import sys

MARK = "agentboost-sandbox:"
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
SIGKILL = 9

_libc = ctypes.CDLL(None, use_errno=True)


def _note(what):
    sys.stderr.write(f"{MARK} {what}\n")


def _unshare(flags):
    if _libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def _mount(source, target, fstype, flags, data):
    enc = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    if _libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target}: {os.strerror(ctypes.get_errno())}")


def _write(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def _user_namespace(flags):
    uid, gid = os.getuid(), os.getgid()
    _unshare(CLONE_NEWUSER | flags)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _wait_and_exit(child):
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


def _die_with_parent():
    _libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)


def main():
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    root = os.geteuid() == 0
    _die_with_parent()
    if cfg.get("net"):
        try:
            _unshare(CLONE_NEWNET) if root else _user_namespace(CLONE_NEWNET)
        except OSError as exc:
            _note(f"no-net-namespace {exc}")
    if cfg.get("mount") and root:
        try:
            _unshare(CLONE_NEWNS)
            _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
            for target in cfg.get("private_dirs", []):
                if os.path.isdir(target):
                    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg.get('tmpfs_mb', 64)}m,mode=1777")
        except OSError as exc:
            _note(f"no-mount-namespace {exc}")
        else:
            for target in cfg.get("hidden", []):
                try:
                    if os.path.isdir(target):
                        _mount(
                            "tmpfs", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555"
                        )
                except OSError as exc:
                    _note(f"no-hide {exc}")
    if cfg.get("pid"):
        try:
            _unshare(CLONE_NEWPID) if root else _user_namespace(CLONE_NEWPID)
        except OSError as exc:
            _note(f"no-pid-namespace {exc}")
        else:
            child = os.fork()
            if child:
                _wait_and_exit(child)
            _die_with_parent()
            if cfg.get("mount") and root:
                try:
                    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
                except OSError as exc:
                    _note(f"no-private-proc {exc}")
            program = os.fork()  # PID 1 stays a root reaper the program cannot signal
            if program:
                _wait_and_exit(program)

    limits = cfg.get("rlimits", {})
    for name, value in limits.items():
        which = getattr(resource, name)
        soft, hard = (value, value) if not isinstance(value, list) else value
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError) as exc:
            _note(f"no-{name} {exc}")

    uid = cfg.get("uid")
    if uid is not None and root:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        except OSError as exc:
            _note(f"no-uid-drop {exc}")
    _die_with_parent()  # again: changing credentials clears it
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.umask(0o077)
    os.chdir(cfg["workdir"])
    argv = cfg["argv"]
    os.execve(argv[0], argv, cfg["env"])


if __name__ == "__main__":
    main()
