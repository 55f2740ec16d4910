"""The batch harness: one sandboxed process runs one program on many inputs (host side: ``batch.py``).

It is the sandbox's program (``.harness.py`` in the working directory, the launcher and the runner inlined
by the host: stdlib only), so it has every isolation layer of a run, and it must be PID 2 of the run's own
PID namespace (it refuses otherwise). It makes itself non-dumpable, deletes its own file, compiles
``main.py`` (the program, as in a single run) once, then for each input the host sends gives the program
a sandbox of its own inside its own, built the way the launcher builds a run's:

* a child in new user, mount, PID, IPC, UTS and network namespaces (the user namespace maps the run's uid
  to itself and is what allows the rest without privileges). Its PID 1 mounts a fresh size- and
  inode-limited tmpfs on the working directory (with ``main.py`` written into it from the harness's
  memory), on ``/tmp`` and ``/dev/shm`` (or the deny-list's private directories) and a new ``/proc``, then
  forks the program as PID 2, reaps and reports its wait status. So each input runs in a fresh working
  directory, fresh temporary directories, a fresh PID, IPC and network namespace and fresh keyrings, as a
  single run does: nothing a program does to its files (contents, modes, times, extended attributes,
  inode numbers), its processes, System V IPC or network state reaches the next input by construction;
* the program (PID 2) drops every capability, joins a new session keyring, makes the interpreter look
  freshly started on ``main.py`` (:func:`_runner.enter`), runs and finishes like an interpreter;
* the harness feeds the input, keeps ``stdout_cap`` bytes of stdout and ``stderr_cap`` of stderr (killing
  the program as soon as either goes past its cap), kills it at the wall-clock limit (its namespaces die
  with its PID 1);
* reports the outcome: the program's wait status, timed out, truncations, wall time, the kept output.

Frames, both ways, are a 4-byte little-endian length and a payload. Host to harness (trusted): marshal,
first the setup, then one input per frame; end of file ends the harness. Harness to host (the host must
treat it as untrusted, the program could have tampered with its parent): fixed little-endian fields
(index u32, wait status i32, flags u8, wall µs u32, stdout length u32 + bytes, stderr length u32 + bytes).
An input carries its stdin, its index and nothing derived from its expected output (the host compares).
Not reproduced: the hash seed and the address layout are the harness's, shared by its inputs (as forked
runs share the zygote's); the program's PID 1 is a fork of the harness; its cgroup is the session's.
Where the kernel refuses the namespaces (no unprivileged user namespaces), an input reports a setup
failure and the host runs every input in a sandbox of its own.
"""

# ruff: noqa: E402 - imports after the start-up state is captured; nothing beyond the stdlib's core

import sys

sys.path_importer_cache.pop(__file__, None)  # the interpreter's entry for this script, not the program's
_BASELINE = (frozenset(sys.modules), tuple(sys.path), frozenset(sys.path_importer_cache))

import ctypes
import marshal
import os
import select
import time

from _launcher import (  # inlined here by the host
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    SIG_DFL,
    SIG_IGN,
    SIGINT,
    _close_stdio,
    _die_with_parent,
    _drop_capabilities,
    _libc,
    _mount,
    _new_session_keyring,
    _private_workdir,
    _reap_until,
    _tmpfs_options,
    _user_namespace,
    _wait_and_exit,
)
from _runner import enter, finish, run  # inlined here by the host

_MAX_FRAME = 1 << 30
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38
_prctl = ctypes.CDLL(None, use_errno=True).prctl
TIMED_OUT, OUT_CUT, ERR_CUT, SETUP_FAILED = 1, 2, 4, 8
_SETUP_STATUS = 71
PIDFD_SEND_SIGNAL = 424  # the same number on every architecture


class _Harness:
    def __init__(self):
        self.buffer = b""

    # -- frames -------------------------------------------------------------------------
    def read_frame(self):
        header = self._read_exact(4)
        if header is None:
            return None
        size = int.from_bytes(header, "little")
        if size > _MAX_FRAME:
            raise ValueError("frame too large")
        return self._read_exact(size)

    def _read_exact(self, n):
        while len(self.buffer) < n:
            chunk = os.read(0, max(65536, n - len(self.buffer)))
            if not chunk:
                return None
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def write_frame(self, payload):
        data = len(payload).to_bytes(4, "little") + payload
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]

    # -- one input ----------------------------------------------------------------------
    def one(self, setup, code, json, test):
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st_r, st_w = os.pipe()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:  # the child never returns into the harness, whatever happens
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.dup2(st_w, 3)
                os.closerange(4, os.sysconf("SC_OPEN_MAX"))
                _sandbox(setup, code, json)
            finally:
                os._exit(70)
        for fd in (in_r, out_w, err_w, st_w):
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        data = memoryview(test["stdin"])
        caps = {out_r: setup["stdout_cap"], err_r: setup["stderr_cap"]}
        kept = {out_r: bytearray(), err_r: bytearray()}
        cut = {out_r: False, err_r: False}
        poller = select.poll()
        for fd in (out_r, err_r, pidfd):
            poller.register(fd, select.POLLIN)
        if data:
            os.set_blocking(in_w, False)
            poller.register(in_w, select.POLLOUT)
        else:
            os.close(in_w)
            in_w = -1
        deadline = started + setup["timeout"]
        raw = None
        timed_out = killed = False
        open_pipes = {out_r, err_r}
        drain_until = None
        while raw is None or (open_pipes and time.monotonic() < drain_until):
            now = time.monotonic()
            if raw is None and now >= deadline and not killed:
                timed_out = killed = True
                self._kill(pidfd)
            wait_s = (deadline - now) if raw is None and not killed else 0.05
            for fd, _ in poller.poll(max(0.0, wait_s) * 1000 + 1):
                if fd == in_w:
                    try:
                        data = data[os.write(in_w, data[:65536]) :]
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = data[:0]
                    if not data:
                        poller.unregister(in_w)
                        os.close(in_w)
                        in_w = -1
                elif fd == pidfd:
                    poller.unregister(pidfd)
                    _, raw = os.waitpid(pid, 0)
                    drain_until = time.monotonic() + 2.0  # its namespace is gone: the pipes end now
                elif fd in open_pipes:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        poller.unregister(fd)
                        open_pipes.discard(fd)
                        continue
                    room = caps[fd] - len(kept[fd])
                    kept[fd] += chunk[: max(room, 0)]
                    if len(chunk) > room:  # past the cap: the run ends, this pipe is read no more
                        cut[fd] = True
                        poller.unregister(fd)
                        open_pipes.discard(fd)
                        if not killed:
                            killed = True
                            self._kill(pidfd)
        wall = time.monotonic() - started
        os.close(pidfd)
        for fd in (in_w, out_r, err_r):
            if fd >= 0:
                os.close(fd)
        status, setup_failed = self._status(st_r, raw)
        os.close(st_r)
        flags = (TIMED_OUT if timed_out else 0) | (OUT_CUT if cut[out_r] else 0) | (ERR_CUT if cut[err_r] else 0)
        flags |= SETUP_FAILED if setup_failed else 0
        out, err = bytes(kept[out_r]), bytes(kept[err_r])
        return b"".join((
            test["i"].to_bytes(4, "little"), status.to_bytes(4, "little", signed=True), bytes([flags]),
            min(int(wall * 1e6), 2**32 - 1).to_bytes(4, "little"),
            len(out).to_bytes(4, "little"), out, len(err).to_bytes(4, "little"), err,
        ))  # fmt: skip

    @staticmethod
    def _status(st_r, raw):
        """The program's wait status as its PID 1 reported it; else (killed first) the child's own."""
        try:
            os.set_blocking(st_r, False)
            report = os.read(st_r, 16)
        except OSError:
            report = b""
        if len(report) == 5 and report[:1] == b"X":
            return int.from_bytes(report[1:], "little", signed=True), False
        setup_failed = os.WIFEXITED(raw) and os.WEXITSTATUS(raw) == _SETUP_STATUS
        return (raw if raw is not None else 9), setup_failed

    @staticmethod
    def _kill(pidfd):
        """SIGKILL the input's first process: its PID 1 dies with it, and its namespace with everything in it."""
        _libc.syscall(ctypes.c_long(PIDFD_SEND_SIGNAL), ctypes.c_long(pidfd), ctypes.c_long(9), None, ctypes.c_long(0))


def _sandbox(setup, code, json):
    """In the forked child: the input's namespaces, its PID 1 (fresh mounts, reaper), then the program."""
    try:
        _die_with_parent()
        _prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # its /proc files its own (the harness is not dumpable)
        _user_namespace(setup["namespaces"])  # the namespaces the run itself has
        _die_with_parent()
    except OSError as exc:
        os.write(2, f"batch harness: no namespaces for this input: {exc}\n".encode())
        os._exit(_SETUP_STATUS)
    child = os.fork()  # PID 1 of the new PID namespace
    if child:
        _close_stdio()
        os.close(3)
        _wait_and_exit(child)
    _die_with_parent()
    try:
        limits = {"tmp_mb": setup["tmp_mb"], "max_files": setup["max_files"]}
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        os.umask(0o022)
        for directory in setup["private_dirs"]:
            _mount("tmpfs", directory, "tmpfs", flags, _tmpfs_options(limits, "1777"))
        _way_to(setup["workdir"])  # under a private /tmp just mounted (as non-root): made again, as the launcher does
        _private_workdir(setup["workdir"], [("main.py", setup["source"], setup["script_mode"])], limits, None)
        _mount("proc", "/proc", "proc", flags, None)
    except OSError as exc:
        os.write(2, f"batch harness: cannot prepare this input: {exc}\n".encode())
        os._exit(_SETUP_STATUS)
    _libc.signal(SIGINT, SIG_IGN)
    program = os.fork()
    if program:
        _close_stdio()
        _reap_until(program, 3)
    os.close(3)
    _libc.signal(SIGINT, SIG_DFL)
    _die_with_parent()
    _new_session_keyring()
    _drop_capabilities()
    _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.umask(0o077)
    os.chdir(setup["workdir"])
    main, shared = enter(_BASELINE, setup["script"], ["main.py"], setup["orig_argv"], setup["env"])
    if json is not None:
        sys.modules["json"] = json  # imported once by the harness: the driver's import finds it
    finish(run(main, code), shared)


def _way_to(path):
    """Make the directories leading to ``path`` (and ``path``) that are missing, mode 0755."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        os.mkdir(directory, 0o755)


def _serve():
    harness = _Harness()
    setup_frame = harness.read_frame()
    if setup_frame is None:
        os._exit(2)
    setup = marshal.loads(setup_frame)
    if os.getpid() != 2 or os.getppid() != 1:
        sys.stderr.write("batch harness: not PID 2 of a PID namespace of its own; refusing to run\n")
        os._exit(3)
    if _prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:  # its /proc entries (report channel, memory) out of
        sys.stderr.write("batch harness: cannot protect itself; refusing to run\n")  # its children's reach
        os._exit(3)
    os.unlink(setup["harness"])
    with open(setup["script"], "rb") as fh:
        source = fh.read()
    setup["source"], setup["script_mode"] = source, os.lstat(setup["script"]).st_mode & 0o777
    os.unlink(setup["script"])  # each input gets its own copy in its own working directory
    try:
        code = compile(source, setup["script"], "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        code = None  # each child compiles it again and reports the error as a single run does
    json = None
    if setup.get("preload_json"):
        import json  # once here: importing it in every child would cost more than the rest of a test
    while (frame := harness.read_frame()) is not None:
        harness.write_frame(harness.one(setup, code, json, marshal.loads(frame)))
    os._exit(0)


if __name__ == "__main__":
    _serve()
