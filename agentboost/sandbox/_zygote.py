"""The sandbox zygote: a warm interpreter that forks one child per run (host side: ``zygote.py``).

Started once per :class:`~agentboost.sandbox.Sandbox` as
``<program interpreter> -I -B [-S] -c <boot> <control fd>`` with the run environment, stdio pipes and
``/`` as working directory, it imports the launcher (:func:`_launcher.prepare`) and the runner, says
``ready`` and waits on its control socket (a ``SOCK_SEQPACKET`` socket pair with the host). Stdlib only,
single-threaded (it forks), and it never sees a run's data: a request is the launch configuration (paths,
uid, limits) plus four descriptors passed with ``SCM_RIGHTS``: a status socket and the program's stdin,
stdout and stderr pipes. The program's code is read from its working directory by the child, after
every isolation layer is in place; its input and output flow through pipes between the child and the
host. So nothing one run gives the sandbox can be found in another run's (inherited) memory.

Per request the zygote forks; as root, into a new PID namespace (the child is its PID 1: one process
per run fewer than a child that unshares the namespace and forks again), and in a mount namespace of
its own it builds the read-only part of the runs' root once (:func:`_launcher.build_template`), which each
run's mount namespace copies. The child takes a new session,
puts the pipes on 0/1/2 and the status socket on 3, closes every other descriptor and returns to the boot
code, which runs
:func:`_launcher.prepare` (namespaces, fresh root, rlimits, uid, no capabilities, ``no_new_privs``; the
program ends up as PID 2 of its own PID namespace, without descriptor 3) and then the program in that
process (:mod:`_runner`, without ``exec``: that is the interpreter start saved). The zygote sends the
child's pid and a pidfd on the status socket (the host kills through the pidfd: no pid reuse race). PID 1
of the run's namespace reports the program's wait status there (``X``) once the program exited and what
it left is killed, before the namespaces are torn down; the zygote sends the child's own wait status
(``S``) when it exits (what the host goes by when it killed the run first) and closes the socket.

When the control socket reaches end of file (the host closed it or died) the zygote kills its children
and exits; the children also die with it (``PDEATHSIG``, set by ``prepare``).
"""

import _socket
import gc
import marshal
import os
import select
import sys

import _launcher
import _runner

_MAX_REQUEST = 1 << 20
_FDS_PER_REQUEST = 4  # status, stdin, stdout, stderr (and, optionally, the run's files)
_FILES_FD = 4
_REPORT_FD = 3


def _fds(ancillary):
    fds = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds += [int.from_bytes(data[i : i + 4], sys.byteorder, signed=True) for i in range(0, usable, 4)]
    return fds


def _send(fd, payload, pass_fd=None):
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, fd)
    try:
        if pass_fd is None:
            sock.send(payload)
        else:
            sock.sendmsg([payload], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, pass_fd.to_bytes(4, sys.byteorder))])
    except OSError:
        pass  # the host gave up on this run (cancelled): nothing to tell
    finally:
        sock.detach()


def serve(control_fd, template="", subids=""):
    """Serve run requests until the host goes away. Returns only in a forked child: its configuration.
    ``template``: hex of the template root's key (as root), ``subids``: hex of the subordinate ids' launch
    spec (an ordinary user granted them: the zygote enters their user namespace once, before serving, and
    its children set their runs up from there); "" for none."""
    control = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, control_fd)
    _launcher._new_session_keyring()  # not the trainer's (each run joins a new one of its own anyway)
    if subids:
        try:
            _launcher._enter_subordinate_ids(marshal.loads(bytes.fromhex(subids)))
        except OSError as exc:
            sys.stderr.write(f"zygote: no subordinate ids: {exc}\n")
            os._exit(1)
    own_pid_ns = _own_pid_namespace()
    parent = _template(bytes.fromhex(template)) if template and (own_pid_ns is not None or subids) else None
    _launcher.warm()
    _runner.sealer()
    gc.freeze()  # what is here now is never collected: a child's collections (and exit) skip it
    control.send(b"ready template" if parent else b"ready")
    poller = select.poll()
    poller.register(control_fd, select.POLLIN)
    children = {}  # pidfd -> (pid, status fd)
    while True:
        for fd, _ in poller.poll():
            if fd != control_fd:
                pid, status_fd = children.pop(fd)
                poller.unregister(fd)
                _, status = os.waitpid(pid, 0)
                _send(status_fd, b"S" + status.to_bytes(4, "little", signed=True))
                os.close(status_fd)
                os.close(fd)
                continue
            message, ancillary, _, _ = control.recvmsg(_MAX_REQUEST, _socket.CMSG_SPACE(4 * (_FDS_PER_REQUEST + 1)))
            fds = _fds(ancillary)
            if not message:  # end of file: the host is gone
                for pid, _ in children.values():
                    os.kill(pid, 9)  # not reaped yet: the pid is still this child's
                os._exit(0)
            if len(fds) not in (_FDS_PER_REQUEST, _FDS_PER_REQUEST + 1):
                for extra in fds:
                    os.close(extra)
                continue
            status_fd, stdio = fds[0], fds[1:]  # (stdio: with the files' descriptor, if sent, last)
            try:
                cfg = marshal.loads(message)
                cfg["template"] = bool(parent and cfg.get("fs") and cfg.get("mount") and
                                       cfg["workdir"].rpartition("/")[0] == parent)  # fmt: skip
                cfg["subids_entered"] = bool(subids)
                if "files" in cfg and not cfg["template"]:  # (the host sends files only to a templated zygote)
                    raise ValueError("run files sent for a run without the template root")
                pid, born_pid1 = _fork(cfg, own_pid_ns)
            except (OSError, ValueError, EOFError, TypeError) as exc:
                _send(status_fd, b"E" + str(exc).encode())
                for extra in fds:
                    os.close(extra)
                continue
            if pid == 0:
                control.detach()  # closed below with everything else; the object must not close it later
                return _child(cfg, status_fd, stdio, born_pid1)
            for extra in stdio:
                os.close(extra)
            pidfd = os.pidfd_open(pid)
            _send(status_fd, b"P" + pid.to_bytes(8, sys.byteorder), pidfd)
            children[pidfd] = (pid, status_fd)
            poller.register(pidfd, select.POLLIN)


def _own_pid_namespace():
    """As root: a descriptor of this process's PID namespace, to come back to after forking a run into a
    new one (see :func:`_fork`); else None."""
    if os.geteuid() != 0:
        return None
    try:
        return os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _template(key):
    """As root (or in the subordinate ids' namespace), before serving: build the runs' template root
    (:func:`_launcher.build_template`) in a mount namespace of this zygote's own. Returns the working
    directories' parent it serves, or None (the runs then build the whole root each)."""
    try:
        _launcher._unshare(_launcher.CLONE_NEWNS)
        _launcher._mount(None, "/", None, _launcher.MS_REC | _launcher.MS_PRIVATE, None)
        if _launcher.build_template(key):
            return marshal.loads(key)[2]
    except (OSError, ValueError, EOFError, TypeError, IndexError):
        pass
    return None


def _fork(cfg, own_pid_ns):
    """Fork the run's first process. As root, with a PID namespace wanted, it is born PID 1 of a new one
    (``unshare(CLONE_NEWPID)`` here, then back to this process's own for later forks): one process per
    run fewer than unsharing in the child, which must fork again to get into the namespace. Returns the
    pid (0 in the child) and whether the child is PID 1 of its own namespace."""
    fresh = own_pid_ns is not None and bool(cfg.get("pid")) and _launcher._libc.unshare(_launcher.CLONE_NEWPID) == 0
    try:
        pid = os.fork()
    except OSError:
        if fresh:
            _back_to(own_pid_ns)
        raise
    if pid and fresh:
        _back_to(own_pid_ns)
    return pid, fresh


def _back_to(own_pid_ns):
    if _launcher._libc.setns(own_pid_ns, _launcher.CLONE_NEWPID) != 0:
        # Later children would be born into the namespace of the run just forked: this zygote ends (its
        # runs die with it and go the cold way; the host starts another zygote).
        os._exit(70)


def _child(cfg, status_fd, stdio, born_pid1):
    """In the forked child: a session of its own, the run's pipes on 0/1/2, the status socket on 3 (for
    PID 1 to report the program's exit; the program itself never has it), the run's files on 4 where the
    host sent them (read and closed by the launcher) and no other descriptor."""
    os.setsid()
    for target, fd in enumerate(stdio[:3]):
        os.dup2(fd, target)
    files = stdio[3] if len(stdio) > 3 else None
    if files == _REPORT_FD:  # (taken by the status socket next)
        files = os.dup(files)
    os.dup2(status_fd, _REPORT_FD)
    if files is not None:
        if files != _FILES_FD:
            os.dup2(files, _FILES_FD)
        cfg["files_fd"] = _FILES_FD
    os.closerange(_FILES_FD + (files is not None), os.sysconf("SC_OPEN_MAX"))
    cfg["report_fd"] = _REPORT_FD
    cfg["born_pid1"] = born_pid1
    return cfg


def run(cfg, baseline):
    """Apply every isolation layer, then run the program in this process as a fresh interpreter would."""
    _launcher.prepare(cfg)
    _runner.seal(cfg.get("seccomp"))
    script = os.path.join(cfg["workdir"], cfg["argv"][-1])
    main, shared = _runner.enter(baseline, script, cfg["argv"][-1:], cfg["argv"], cfg["env"])
    _runner.finish(_runner.run(main), shared)
