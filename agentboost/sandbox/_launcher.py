"""Sandbox launcher: runs as ``python -I -S -c <import this module; main()> <hex(marshal(config))>`` in a
fresh session (imported, not run as a script, so its bytecode is cached).

Stdlib only and cheap to start (``marshal``, not ``json``: importing ``json`` alone costs more than the
rest of the launcher). It runs before anything untrusted and must not import agentboost. All setup is in
:func:`prepare`, which also works in a freshly forked child (a pre-forked zygote). In order:

0. into the run's own cgroups (``cgroup``: it writes ``0`` to each file listed there, the v1 ``tasks``
   file or the v2 ``cgroup.procs``; it is single-threaded, so either moves all of it), so every process of
   the run counts against the run's memory, process and CPU limits; a new session keyring of its own (the
   trainer's, with its tokens, is out of reach from here on); as an ordinary user granted subordinate ids
   (``subids``), a user namespace mapping this uid and gid and the pool of subordinate ids, each to
   itself (:func:`_enter_subordinate_ids`; a zygote enters it once and its children start there,
   ``subids_entered``), where the setup goes on as root's does;
1. new network, mount, PID, IPC and UTS namespaces, in one ``unshare``: directly as root (or in the
   subordinate ids' namespace), else inside a new user namespace (unprivileged user namespaces), where this
   uid is mapped to itself; the hostname becomes ``sandbox``;
2. PID namespace: the launcher forks; the child is PID 1 of the namespace (when it exits, the kernel
   kills everything left in it). Exit statuses are passed up unchanged. A zygote child forked as root is
   born PID 1 of a new PID namespace (``born_pid1``: the zygote unshares it around the fork), so this
   fork is skipped;
3. mount namespace, deny-by-default (``fs``): an empty tmpfs becomes the root (``pivot_root``); into it
   go the plan's read-only binds (interpreter, standard library, shared libraries; see
   :mod:`agentboost.sandbox.rootfs`), ``/dev/{null,zero,full,random,urandom}``, a private ``/tmp`` and
   ``/dev/shm``, a private ``/proc`` (with the PID namespace) and the working directory: a tmpfs of its
   own (size- and inode-limited like ``/tmp``) into which the staged files are copied (``/proc`` shows the
   namespace's processes only, ``subset=pid``: no host-wide file such as ``keys``); then the root is
   made read-only. A zygote as root builds the part every run shares (stage, binds, devices, mount
   points) once, in a mount namespace of its own, read-only (:func:`build_template`); its runs copy that
   namespace and add only their own ``/tmp``, ``/dev/shm``, working directory (in a private tmpfs over its
   parent) and ``/proc`` (:func:`_from_template`). A read-only bind remount keeps the source's nosuid/nodev/noexec
   (read with ``statvfs``): inside a user namespace the kernel refuses to clear those locked flags.
   Without ``fs``, or if building it fails: the host's tree with private tmpfs over ``/tmp``,
   ``/var/tmp``, ``/dev/shm``, the working directory (its files copied in) and an empty read-only tmpfs
   over each ``hidden`` directory (deny-list);
4. PID namespace: PID 1 forks the program as PID 2 (PID 1 ignores default-action signals such as the
   CPU limit's SIGXCPU, so the program must not be PID 1) and reaps every orphan until the program exits;
   with a ``report_fd`` it then kills what is left and reports the program's wait status there
   (``b"X"`` + 4 bytes: an exit status and a death by signal stay apart, unlike ``128 + N``);
5. resource limits (CPU seconds, address space, file size, open files, processes, no core dumps);
6. as root or with subordinate ids: drop to the run's own uid and gid (``uid``, ``gid``: no supplementary
   group), then enter a user namespace of its own where that uid is mapped to itself, so its user keyrings
   are the namespace's (new, gone with the run: nothing another run of that uid left; where the kernel
   refuses, or there is no ``/proc`` to write the maps in, they are cleared instead); always: clear every
   capability (a zygote child has no ``execve`` to do it; in a user namespace it holds them all) and
   ``no_new_privs``;
7. the seal (``_runner.seal``): the process non-dumpable, then the system-call filter
   (:mod:`agentboost.sandbox.policy`), the last step before the program's first instruction: in a zygote
   child the program then runs in the prepared process (:mod:`agentboost.sandbox._zygote`); a started run
   execs the interpreter on the runner (:func:`main`), which seals and runs it the same way (no
   ``exec`` after the filter; without a filter, the interpreter on the program in the working directory).

Every process of the chain asks the kernel to SIGKILL it when its parent dies (``PDEATHSIG``), so
killing the worker that started a sandbox takes the whole sandbox down with it. Each layer that cannot
be set up is reported on stderr with the marker below and the run continues with what could be set up,
so the caller can report which isolation is active.
"""

# ruff: noqa: SIM105 - no contextlib here: the launcher imports as little as it can

import _ctypes
import marshal
import os
import resource
import sys

MARK = "agentboost-sandbox:"
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 4096, 8192, 16384, 1 << 18
MNT_DETACH = 2
EINVAL = 22
S_IFREG = 0o100000
MOUNT_SETATTR = 442  # the same number on every architecture (syscalls added since Linux 5.1 share one table)
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 1, 2, 4
PR_SET_PDEATHSIG = 1
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
PR_SET_NO_NEW_PRIVS = 38
SIGINT, SIGKILL = 2, 9
SIG_DFL, SIG_IGN = 0, 1
DEVICES = ("null", "zero", "full", "random", "urandom")
DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
             ("stderr", "/proc/self/fd/2"))  # fmt: skip
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217}
NAMESPACES = ((CLONE_NEWNET, "net"), (CLONE_NEWNS, "mount"), (CLONE_NEWPID, "pid"), (CLONE_NEWIPC, "ipc"),
              (CLONE_NEWUTS, "uts"))  # fmt: skip
KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "ppc64": 271, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR = 1, 7
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -4, -5
HOSTNAME = b"sandbox"
PRIVATE_DIRS = ("/tmp/", "/dev/shm/")
"""Host paths under these lie inside the fresh root's private tmpfs mounts (workdir, a venv in /tmp)."""


# The C types and calls used here, straight from ``_ctypes`` (what ``ctypes`` is built on): importing the
# ``ctypes`` package itself costs about 3 ms of CPU, a quarter of a zygote's start.
class _CInt(_ctypes._SimpleCData):
    _type_ = "i"


class _CLong(_ctypes._SimpleCData):
    _type_ = "l"


class _CULong(_ctypes._SimpleCData):
    _type_ = "L"


class _CUInt32(_ctypes._SimpleCData):
    _type_ = "I"


class _CUInt64(_ctypes._SimpleCData):
    _type_ = "Q"


class _CVoidP(_ctypes._SimpleCData):
    _type_ = "P"


class _CFunction(_ctypes.CFuncPtr):
    """A C library function: ``int f(...)``, arguments converted as ``ctypes`` does, ``errno`` kept."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _CInt


class _Library:
    """The functions of this process's C library (``ctypes.CDLL(None, use_errno=True)``)."""

    def __init__(self):
        self._handle = _ctypes.dlopen(None, 0)

    def __getattr__(self, name):
        function = _CFunction((name, self))
        setattr(self, name, function)
        return function


_libc = _Library()


class _CapHeader(_ctypes.Structure):
    _fields_ = (("version", _CUInt32), ("pid", _CInt))


class _CapData(_ctypes.Structure):
    _fields_ = (("effective", _CUInt32), ("permitted", _CUInt32), ("inheritable", _CUInt32))


class _MountAttr(_ctypes.Structure):
    _fields_ = (("attr_set", _CUInt64), ("attr_clr", _CUInt64), ("propagation", _CUInt64), ("userns_fd", _CUInt64))


_libc.signal.argtypes, _libc.signal.restype = [_CInt, _CVoidP], _CVoidP
_libc.syscall.restype = _CLong


def warm():
    """Call each C function a run's set-up uses, once and to no effect, in a process that forks runs (the
    zygote, the batch harness): a forked child's first call of one costs up to 0.2 ms and 90 page faults
    (ctypes and the dynamic linker reading pages the fork left unmapped), after one call in the parent
    almost nothing. Every call here fails or changes nothing (no pointer, length or flag)."""
    if os.uname().machine in KEYCTL:  # keyctl(2) with an operation that does not exist: EOPNOTSUPP
        _libc.syscall(_CLong(KEYCTL[os.uname().machine]), _CLong(0x7FFF))  # (keyctl, pivot_root: syscall)
    _libc.unshare(0)
    _libc.mount(None, None, None, _CULong(0), None)  # EFAULT
    _libc.umount2(None, 0)  # EFAULT
    _libc.capset(None, None)  # EFAULT
    _libc.sethostname(None, -1)  # EINVAL
    _libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    _libc.signal(0, None)  # EINVAL


def _note(what):
    sys.stderr.write(f"{MARK} {what}\n")


def _check(result, what):
    if result != 0:
        errno = _ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _unshare(flags):
    _check(_libc.unshare(flags), "unshare")


def _mount(source, target, fstype, flags, data):
    enc = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], _CULong(flags), enc[3]), f"mount {target}")


def _write(path, text):
    """Write ``text`` to an existing file in one ``write`` (no file object: fewer pages of the zygote touched)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)  # as open(path, "w")
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _user_namespace(flags):
    uid, gid = os.geteuid(), os.getegid()
    _unshare(CLONE_NEWUSER | flags)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _enter_subordinate_ids(ids):
    """An ordinary user granted subordinate ids: a new user namespace where this process's uid and gid and
    the pool of subordinate ids are each mapped to themselves (``ids``: the tools and both maps, from the
    host's ``SubordinateIds.launch_spec``). Only a process outside the namespace may map ids other than its
    own, with the host's setuid ``newuidmap`` / ``newgidmap``: a helper forked first runs them once this
    process has unshared. In the namespace this process holds every capability over what it creates next
    and may become any id of the pool: from here on a run is set up as root sets it up (its namespaces,
    then the drop to its own uid and gid). OSError (naming the tool and its complaint) where it fails."""
    target = str(os.getpid())
    go_r, go_w = os.pipe()
    err_r, err_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        status = 1
        try:
            os.close(go_w)
            os.close(err_r)
            if os.read(go_r, 1) == b"u":  # (end of file: the unshare failed, nothing to map)
                status = 0
                for tool, mapping in ((ids["newuidmap"], ids["uid_map"]), (ids["newgidmap"], ids["gid_map"])):
                    argv = [tool, target, *(str(n) for n in mapping)]
                    pid = os.posix_spawn(tool, argv, {}, file_actions=[(os.POSIX_SPAWN_DUP2, err_w, 1),
                                                                       (os.POSIX_SPAWN_DUP2, err_w, 2)])  # fmt: skip
                    if os.waitpid(pid, 0)[1] != 0:
                        status = 1
                        break
        finally:
            os._exit(status)
    os.close(go_r)
    os.close(err_w)
    try:
        try:
            _unshare(CLONE_NEWUSER)
        except OSError:
            os.close(go_w)
            go_w = -1
            raise
        os.write(go_w, b"u")
    finally:
        if go_w >= 0:
            os.close(go_w)
        _, status = os.waitpid(helper, 0)
        complaint = os.read(err_r, 1024).decode(errors="replace").strip()
        os.close(err_r)
    if status != 0:
        raise OSError(1, f"{ids['newuidmap']} / {ids['newgidmap']} failed: {complaint or 'no message'}")


def _keyctl(*args):
    number = KEYCTL.get(os.uname().machine)
    if number is None:
        raise OSError(38, "keyctl: unknown system call number on this architecture")
    result = _libc.syscall(_CLong(number), *(_CLong(a) for a in args))
    if result < 0:
        errno = _ctypes.get_errno()
        raise OSError(errno, f"keyctl: {os.strerror(errno)}")
    return result


def _new_session_keyring():
    """A new, empty, anonymous session keyring (``keyctl join``): the one inherited is out of reach."""
    try:
        _keyctl(KEYCTL_JOIN_SESSION_KEYRING, 0)
    except OSError as exc:
        if exc.errno != 38:  # no keyrings in this kernel: nothing to share either
            _note(f"no-session-keyring {exc}")


def _own_user_keyrings(uid):
    """After dropping to the run's uid (as root, or from the subordinate ids' namespace): a user namespace
    of its own, so the user keyrings the program finds are new (another run of this uid, earlier or later,
    never sees them); else clear them. Not without a ``/proc`` to write its maps in (a fresh root without
    a PID namespace): unmapped, the program would see itself as the overflow uid."""
    try:
        if not os.path.exists("/proc/self/uid_map"):
            raise OSError(2, "no /proc to map the run's uid in")
        _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # its /proc files are its own again (credentials changed)
        _user_namespace(0)
        return
    except OSError as exc:
        _note(f"no-user-keyring-namespace {exc}")
    for keyring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        try:
            _keyctl(KEYCTL_CLEAR, keyring)
        except OSError:
            pass


def _join_cgroups(files):
    """Move this process into the run's cgroups (before anything else: every process it starts follows)."""
    for path in files:
        try:
            _write(path, "0")
        except OSError as exc:
            _note(f"no-cgroup {path}: {exc}")
            return


def _enter_namespaces(cfg, root):
    """Unshare the requested namespaces; returns the CLONE_ flags obtained and notes the others."""
    wanted = 0
    for flag, name in NAMESPACES:
        if cfg.get(name):
            wanted |= flag
    if not wanted:
        return 0
    attempts = [_unshare, _user_namespace] if root else [_user_namespace]
    for attempt in attempts:
        try:
            attempt(wanted)
            return wanted
        except OSError:
            continue
    got, privileged = 0, root  # one at a time: keep whatever the kernel allows
    for flag, name in NAMESPACES:
        if not wanted & flag:
            continue
        try:
            _unshare(flag) if privileged else _user_namespace(flag)
            got, privileged = got | flag, True
        except OSError as exc:
            if root:
                try:
                    _user_namespace(flag)
                    got, privileged = got | flag, True
                    continue
                except OSError:
                    pass
            _note(f"no-{name}-namespace {exc}")
    return got


def _wait_and_exit(child):
    _, status = os.waitpid(child, 0)
    _exit_like(status)


def _close_stdio():
    """A process that only waits lets go of the program's pipes: the host sees their end as soon as the
    program (and what it left) is gone, not when the namespace is torn down."""
    for fd in (0, 1, 2):
        os.close(fd)


def _reap_until(program, report):
    """PID 1: reap every process re-parented to it (orphans of the program) until the program exits; then
    kill whatever it left (only this PID namespace's processes: PID 1 is never signalled by kill(-1)) and,
    given a ``report`` socket, send the exit status there at once (the namespace's teardown is slower).
    Not dumpable: its ``/proc`` entries (descriptors, the report channel) are out of the program's reach,
    whichever uid it runs as."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    while True:
        pid, status = os.wait()
        if pid == program:
            break
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    if report is not None:
        try:
            os.kill(-1, SIGKILL)
        except OSError:
            pass  # nothing left
        try:
            os.write(report, b"X" + status.to_bytes(4, "little", signed=True))
        except OSError:
            pass  # the host stopped listening (it killed the run)
    os._exit(code)


def _exit_like(status):
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


def _die_with_parent():
    _libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)


def _bind(source, target, flags):
    """Bind ``source`` at the existing ``target`` and remount it with ``flags`` plus its locked flags."""
    _mount(source, target, None, MS_BIND, None)
    _remount(source, target, flags)


def _remount(source, target, flags):
    """Remount the bind at ``target`` with ``flags`` plus the flags of ``source``'s mount that a user
    namespace cannot clear (read-only, nosuid, nodev, noexec)."""
    locked = os.statvfs(source).f_flag
    for st_flag, ms_flag in ((os.ST_RDONLY, MS_RDONLY), (os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV),
                             (os.ST_NOEXEC, MS_NOEXEC)):  # fmt: skip
        if locked & st_flag:
            flags |= ms_flag
    _mount(None, target, None, MS_BIND | MS_REMOUNT | flags, None)


def _pivot(new_root):
    """Make ``new_root`` the root and drop the host's tree from this mount namespace."""
    os.chdir(new_root)
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is not None and _libc.syscall(_CLong(number), b".", b".") == 0:
        _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    else:  # unknown architecture, or the current root is not a mount point: move + chroot
        _mount(new_root, "/", None, MS_MOVE, None)
        os.chroot(".")
    os.chdir("/")


class _Skeleton:
    """Directories and files created in the fresh stage, tracked here: nothing there needs a ``stat``."""

    def __init__(self, stage):
        self.made = {stage}

    def dir(self, path, mode=0o755):
        if path not in self.made:
            self.dir(os.path.dirname(path))
            os.mkdir(path, mode)
            self.made.add(path)

    def file(self, path):
        self.dir(os.path.dirname(path))
        os.mknod(path, S_IFREG | 0o644)


def _read_only_tree(path):
    """Make every mount at and below ``path`` read-only, nosuid and nodev in one call (``mount_setattr``,
    Linux 5.12); False where the kernel cannot (the caller then remounts each bind)."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    done = _libc.syscall(_CLong(MOUNT_SETATTR), AT_FDCWD, path.encode(), AT_RECURSIVE, _ctypes.byref(attr),
                         _CULong(_ctypes.sizeof(attr)))  # fmt: skip
    return done == 0


def _lay_out(stage, skeleton, ops, mirror):
    """Make the plan's links and the mount points of its binds in the stage; returns what to bind, as
    (source, target) pairs, and the stage paths to hide. A bind's source is the host path, below
    ``mirror`` where the host copied the plan's files into memory (:mod:`agentboost.sandbox.mirror`)."""
    binds, hides = [], []
    for op in ops:
        kind, path = op[0], op[1]
        if kind == "link":
            skeleton.dir(os.path.dirname(stage + path))
            os.symlink(op[2], stage + path)
        elif kind == "ro":
            skeleton.dir(stage + path) if op[2] else skeleton.file(stage + path)
            binds.append((mirror + path, stage + path))
        elif kind == "hide":
            hides.append(stage + path)
    return binds, hides


def _bind_and_hide(binds, hides):
    """Bind each source at its place in the stage (not yet read-only), then cover the hidden ones."""
    for source, target in binds:
        try:
            _mount(source, target, None, MS_BIND, None)
        except OSError as exc:
            if exc.errno != EINVAL:  # EINVAL: locked mounts below it (user namespace); take them along
                raise
            _mount(source, target, None, MS_BIND | MS_REC, None)
    for target in hides:
        _mount("tmpfs", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555")


def _tmpfs_options(fs, mode):
    return f"size={fs['tmp_mb']}m,nr_inodes={fs.get('max_files', 4096)},mode={mode}"


def _sent_files(cfg):
    """The run's files from the descriptor the host sent them in (the zygote passed it on unread: no run's
    code ever is in a zygote's memory), as (name, bytes, mode); closes it. None where none was sent."""
    fd = cfg.pop("files_fd", None)
    if fd is None:
        return None
    try:
        files, offset = [], 0
        for name, size, mode in cfg["files"]:
            data = b""
            while len(data) < size:
                chunk = os.pread(fd, size - len(data), offset + len(data))
                if not chunk:
                    raise OSError(5, f"the run's files end early ({name})")
                data += chunk
            files.append((name, data, mode))
            offset += size
        return files
    finally:
        os.close(fd)


def _close_sent_files(cfg):
    """In a process that never reads them (PID 1, a launcher waiting for its child)."""
    if cfg.get("files_fd") is not None:
        os.close(cfg.pop("files_fd"))


def _staged(workdir):
    """The staged files of the working directory: (name, bytes, mode), read before it is covered."""
    files = []
    for name in os.listdir(workdir):
        path = workdir + "/" + name
        with open(path, "rb") as fh:
            files.append((name, fh.read(), os.fstat(fh.fileno()).st_mode & 0o777))
    return files


def _private_workdir(target, files, fs, owner):
    """A size- and inode-limited tmpfs at ``target`` holding ``files`` (owned by the run's ``(uid, gid)``
    where it has its own)."""
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, _tmpfs_options(fs, "700"))
    _write_files(target, files, owner)


def _write_files(target, files, owner):
    """``files`` ((name, bytes, mode) each) written into the directory ``target`` (owned by the run's
    ``(uid, gid)`` where it has its own)."""
    for name, data, mode in files:
        fd = os.open(target + "/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if owner is not None:
                os.fchown(fd, *owner)
        finally:
            os.close(fd)
    if owner is not None:
        os.chown(target, *owner)


def _fresh_root(fs, workdir, proc, owner):
    """Build the deny-by-default root (see the module doc, step 3) and switch into it. The stage is new
    and empty, so its skeleton (mount points, links) is made without looking; the read-only binds go in
    first and are made read-only together, then what stays writable (devices, /tmp, /dev/shm, workdir).
    What the plan puts under /tmp or /dev/shm (an interpreter or venv there, as in a CI checkout) goes in
    after their private tmpfs is mounted, else that tmpfs would cover it."""
    stage = fs["stage"]
    _mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=755")
    skeleton = _Skeleton(stage)
    private = [op for op in fs["ops"] if op[1].startswith(PRIVATE_DIRS)]
    mirror = fs.get("mirror", "")
    binds, hides = _lay_out(stage, skeleton, [op for op in fs["ops"] if not op[1].startswith(PRIVATE_DIRS)], mirror)
    for name in DEVICES:
        skeleton.file(stage + "/dev/" + name)
    for name, target in DEV_LINKS:
        os.symlink(target, stage + "/dev/" + name)
    for directory in ("/tmp", "/dev/shm"):
        skeleton.dir(stage + directory)
    in_tmp = workdir.startswith(PRIVATE_DIRS)
    if not in_tmp:
        skeleton.dir(stage + workdir)
    if proc:
        skeleton.dir(stage + "/proc", 0o555)
    _bind_and_hide(binds, hides)
    read_only = _read_only_tree(stage)
    if not read_only:
        for source, target in binds:
            _remount(source, target, MS_RDONLY | MS_NOSUID | MS_NODEV)
    for directory in ("/tmp", "/dev/shm"):
        _mount("tmpfs", stage + directory, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, _tmpfs_options(fs, "1777"))
    if private:  # inside the private tmpfs just mounted; each bind made read-only on its own
        _private_binds(stage, skeleton, private, mirror)
    for name in DEVICES:
        _bind("/dev/" + name, stage + "/dev/" + name, MS_NOSUID | MS_NOEXEC)
    if in_tmp:
        skeleton.dir(stage + workdir)  # inside the private /tmp just mounted
    _private_workdir(stage + workdir, _staged(workdir), fs, owner)
    if proc:
        _mount_proc(stage + "/proc")
    _pivot(stage)
    if not read_only:
        try:
            _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        except OSError as exc:
            _note(f"no-read-only-root {exc}")


def _private_binds(stage, skeleton, ops, mirror):
    """The plan's binds under a private ``/tmp`` or ``/dev/shm`` (mounted just before), each made
    read-only on its own."""
    binds, hides = _lay_out(stage, skeleton, ops, mirror)
    _bind_and_hide(binds, hides)
    for source, target in binds:
        if not _read_only_tree(target):
            _remount(source, target, MS_RDONLY | MS_NOSUID | MS_NODEV)


def build_template(key):
    """In a zygote's own mount namespace (as root): the part of the fresh root that is the same for every
    run, built once: the stage tmpfs with the plan's read-only binds and hidden directories, the devices,
    the mount points of ``/tmp``, ``/dev/shm``, ``/proc`` and of the working directories' parent, all of
    it read-only (the stage's files are shared by the zygote's runs: no run can write there). A run's
    child unshares its mount namespace (a copy of this one) and adds only what is its own
    (:func:`_from_template`). ``key``: ``marshal`` of (stage, plan ops, the working directories' parent,
    the plan's files' copy in memory or ""), from the host (``Sandbox._template``). False where it cannot
    be built (the runs build it all)."""
    stage, ops, parent, mirror = marshal.loads(key)
    _mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=755")
    skeleton = _Skeleton(stage)
    binds, hides = _lay_out(stage, skeleton, [op for op in ops if not op[1].startswith(PRIVATE_DIRS)], mirror)
    for name in DEVICES:
        skeleton.file(stage + "/dev/" + name)
    for name, target in DEV_LINKS:
        os.symlink(target, stage + "/dev/" + name)
    for directory in ("/tmp", "/dev/shm", parent):
        skeleton.dir(stage + directory)
    skeleton.dir(stage + "/proc", 0o555)
    _bind_and_hide(binds, hides)
    if not _read_only_tree(stage):
        return False
    for name in DEVICES:
        _bind("/dev/" + name, stage + "/dev/" + name, MS_NOSUID | MS_NOEXEC)
    return True


def _from_template(fs, workdir, files, proc, owner):
    """A run's fresh root on its copy of the zygote's template (:func:`build_template`): private ``/tmp``,
    ``/dev/shm``, what the plan puts there, the working directory (in a private tmpfs over its parent,
    holding ``files``: sent with the request, or staged on the host), ``/proc``; then ``pivot_root``."""
    stage = fs["stage"]
    files = files or _staged(workdir)
    skeleton = _Skeleton(stage)
    for directory in ("/tmp", "/dev/shm"):
        _mount("tmpfs", stage + directory, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, _tmpfs_options(fs, "1777"))
        skeleton.made.add(stage + directory)
    skeleton.made.add(stage + "/dev")
    private = [op for op in fs["ops"] if op[1].startswith(PRIVATE_DIRS)]
    if private:
        _private_binds(stage, skeleton, private, fs.get("mirror", ""))
    parent = stage + os.path.dirname(workdir)
    os.makedirs(parent, 0o755, exist_ok=True)  # (in the private /tmp or /dev/shm just mounted, if it lies there)
    _mount("tmpfs", parent, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=8,mode=755")
    os.mkdir(stage + workdir, 0o700)
    _mount(None, parent, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    _private_workdir(stage + workdir, files, fs, owner)
    if proc:
        _mount_proc(stage + "/proc")
    _pivot(stage)


def _deny_list(cfg, proc, files, owner):
    """The host's tree with private temporary directories, a private working directory and the ``hidden``
    directories covered."""
    limits = {"tmp_mb": cfg.get("tmp_mb", 64), "max_files": cfg.get("max_files", 4096)}
    workdir = cfg["workdir"]
    files = files or _staged(workdir)
    for target in cfg.get("private_dirs", []):
        if os.path.isdir(target):
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, _tmpfs_options(limits, "1777"))
    try:
        if not os.path.isdir(workdir):  # under a private /tmp just mounted (non-root): made again there
            os.makedirs(workdir, 0o700)
        _private_workdir(workdir, files, limits, owner)
    except OSError as exc:
        _note(f"no-workdir-tmpfs {exc}")
    for target in cfg.get("hidden", []):
        try:
            if os.path.isdir(target):
                _mount("tmpfs", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555")
        except OSError as exc:
            _note(f"no-hide {exc}")
    if proc:
        _mount_proc("/proc")


def _mount_proc(target):
    """The PID namespace's own ``/proc``, with its processes only (``subset=pid``, Linux 5.8): none of the
    host-wide files (``keys`` lists the keys this uid may view; ``meminfo``, ``vmstat``, ``stat``, ``locks``
    count what other runs do; ``sys``). Without ``subset``, the whole of it, noted."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    try:
        _mount("proc", target, "proc", flags, "subset=pid")
        return
    except OSError as exc:
        if exc.errno != EINVAL:
            _note(f"no-private-proc {exc}")
            return
        _note(f"no-proc-subset {exc}")
    try:
        _mount("proc", target, "proc", flags, None)
    except OSError as exc:
        _note(f"no-private-proc {exc}")


def _drop_capabilities():
    """Clear every capability (effective, permitted, inheritable; ambient with them): a zygote child runs
    the program without an ``execve`` to do it, and in a user namespace it would otherwise keep the
    namespace's full capabilities. (The program's dumpability is the seal's: ``_runner.seal``.)"""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    _check(_libc.capset(_ctypes.byref(header), (_CapData * 2)()), "capset")


def prepare(cfg):
    """Set up every layer; returns in the program's process, ready to ``exec`` (see :func:`main`).
    Works in a process started for the purpose or freshly forked: it relies on no launcher state."""
    privileged = os.geteuid() == 0  # (root, or holding every capability over the subordinate ids' namespace)
    os.umask(0o022)
    _die_with_parent()
    _join_cgroups(cfg.get("cgroup", ()))
    _new_session_keyring()
    if cfg.get("subids") is not None:
        privileged = bool(cfg.get("subids_entered"))  # (a zygote's child: the zygote entered it)
        if not privileged:
            try:
                _enter_subordinate_ids(cfg["subids"])
                privileged = True
            except OSError as exc:
                _note(f"no-subordinate-ids {exc}")
    born_pid1 = bool(cfg.get("born_pid1") and cfg.get("pid"))  # forked into a new PID namespace (zygote)
    got = _enter_namespaces({**cfg, "pid": False} if born_pid1 else cfg, privileged)
    if born_pid1:
        got |= CLONE_NEWPID
    _die_with_parent()  # again: changing credentials (a user namespace) may clear it
    if got & CLONE_NEWUTS:
        try:
            _check(_libc.sethostname(HOSTNAME, len(HOSTNAME)), "sethostname")
        except OSError as exc:
            _note(f"no-hostname {exc}")
    if got & CLONE_NEWPID and not born_pid1:
        child = os.fork()
        if child:
            _close_stdio()
            _close_sent_files(cfg)
            _wait_and_exit(child)
        _die_with_parent()
    report = cfg.get("report_fd")
    if got & CLONE_NEWPID:
        # The program's process is forked at once and sets up the rest itself: PID 1 runs as little as
        # it can (every page a forked process writes is copied, and copied again in a child forked later).
        # PID 1 stays a reaper the program cannot stop: from inside, the kernel drops every signal PID 1
        # has no handler for, and Python's one handler (SIGINT) is ignored; the program gets it back.
        _libc.signal(SIGINT, SIG_IGN)  # (not the signal module: importing it costs milliseconds)
        program = os.fork()
        if program:
            _close_stdio()
            _close_sent_files(cfg)
            _reap_until(program, report)
        _libc.signal(SIGINT, SIG_DFL)
        _die_with_parent()
    uid = cfg.get("uid") if privileged else None
    if uid is not None and cfg.get("subids") is not None and not got & CLONE_NEWNS:
        _note("no-separate-uid no mount namespace: the run's files are the trainer's, unreadable to another uid")
        uid = None
    owner = (uid, cfg.get("gid", uid)) if uid is not None else None
    files = _sent_files(cfg)  # (sent only for a template root; a run that falls back writes them itself)
    if got & CLONE_NEWNS:
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
        except OSError as exc:
            _note(f"no-mount-namespace {exc}")
        else:
            built = False
            if cfg.get("fs"):
                try:
                    if cfg.get("template"):  # the zygote built the rest once (its mount namespace, copied)
                        _from_template(cfg["fs"], cfg["workdir"], files, bool(got & CLONE_NEWPID), owner)
                    else:
                        _fresh_root(cfg["fs"], cfg["workdir"], bool(got & CLONE_NEWPID), owner)
                    built = True
                except OSError as exc:
                    _note(f"no-fresh-root {exc}")
            if not built:
                _deny_list(cfg, bool(got & CLONE_NEWPID), files, owner)
    else:
        _note("no-workdir-tmpfs no mount namespace")
        if files:
            # Sent for a template root this run could not have: in the host's directory after all (it stays
            # there, empty, until the next sandbox of this root sweeps it: the host staged nothing to remove).
            os.makedirs(cfg["workdir"], 0o700, exist_ok=True)
            _write_files(cfg["workdir"], files, owner)
    if report is not None:
        os.close(report)  # the program never holds the status channel

    for name, value in cfg.get("rlimits", {}).items():
        soft, hard = (value, value) if not isinstance(value, list) else value
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError) as exc:
            _note(f"no-{name} {exc}")

    if owner is not None:
        try:
            os.setgroups([])
            os.setgid(owner[1])
            os.setuid(uid)
        except OSError as exc:
            _note(f"no-uid-drop {exc}")
        else:
            _own_user_keyrings(uid)
    _die_with_parent()  # again: changing credentials clears it
    if not cfg.get("keep_capabilities"):  # (the batch harness keeps those of its own user namespace)
        _drop_capabilities()
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.umask(0o077)
    os.chdir(cfg["workdir"])


def main():
    """A started run: set up, then ``exec`` the program's interpreter: on the script, or, with a system-call
    filter to install, on ``cfg["boot"]`` (``_runner``'s source: :func:`_runner.cold` seals the process and
    runs the program as a zygote's child does, with no ``exec`` after the filter)."""
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    prepare(cfg)
    argv = cfg["argv"]
    if cfg.get("seccomp") is None:
        os.execve(argv[0], argv, cfg["env"])
    run = {"seccomp": cfg["seccomp"], "script": cfg["workdir"] + "/" + argv[-1], "argv": argv, "env": cfg["env"]}
    os.execve(argv[0], [*argv[:-1], "-c", cfg["boot"], marshal.dumps(run).hex()], cfg["env"])


if __name__ == "__main__":
    main()
