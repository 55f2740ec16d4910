"""The batch harness: one sandboxed process runs one program on many inputs (host side: ``batch.py``).

It is the sandbox's program (``.harness.py`` in the working directory, the launcher and the runner inlined
by the host: stdlib only), so it has every isolation layer of a run, and it must be PID 2 of the run's own
PID namespace (it refuses otherwise: its clean-up signals every process there). It keeps the capabilities
of its own user namespace (the launcher leaves them to it; they reach nothing outside the run) to give
each input fresh mounts, and makes itself non-dumpable (its ``/proc`` entries, among them the report
channel and its memory, then belong to root, and it cannot be traced: the programs it forks, same uid and
no capabilities, cannot reach it that way). It takes a mount namespace of its own, deletes its own file,
compiles ``main.py`` (the program, as in a single run) once, then for each input the host sends:

* forks a child in a process group of its own, with fresh pipes on 0/1/2 and no other descriptor. The
  child enters a new IPC namespace, mounts a new size- and inode-limited tmpfs on the working directory
  (``main.py`` written into it from the harness's memory), on ``/tmp`` and ``/dev/shm`` (or the
  deny-list's private directories), joins a new session keyring and clears its user keyrings, drops every
  capability, makes the interpreter look freshly started on ``main.py`` (:func:`_runner.enter`), runs the
  program and finishes like an interpreter (:func:`_runner.finish`). So each input sees a fresh program in
  fresh files: module state, ``sys``, environment and signal handlers as the first one saw them, and a
  working directory, temporary directories and System V IPC where nothing an earlier input did (files,
  modes, times, extended attributes, inode numbers, shared memory) can be found. Call-based programs carry
  the single-run driver, which imports ``json``: with ``preload_json`` the harness imports it once and each
  child starts with it in ``sys.modules``;
* feeds the input, keeps ``stdout_cap`` bytes of stdout and ``stderr_cap`` bytes of stderr (killing the
  child as soon as it writes more on either: that pipe is read no more), kills the child's process group at
  the wall-clock limit (an exit seen only after the limit is a timeout too: the program, of the harness's uid,
  can stop the harness with SIGSTOP and have a helper wake it up once it is done);
* once the child has exited: SIGKILL to every other process of the namespace (``kill(-1)`` spares only
  PID 1 and the harness: whatever the program left behind dies before the next input). An input whose
  mounts hold nothing more than its child found after setting them up (free blocks and inodes, counted by
  the child before the program and by the harness after it: a file or directory left, a byte written to
  ``main.py``, an extended attribute count) keeps them, covered by the next input's fresh mounts, until
  the session ends (an unmount waits for an RCU grace period, as long as a short test). Others have them
  taken off at once;
* reports the outcome: the program's wait status as such (an exit status stays apart from a death by a
  signal), timed out, truncations, wall time, the kept output.

Frames, both ways, are a 4-byte little-endian length and a payload. Host to harness (trusted): marshal, first
the setup, then one input per frame (its index and stdin: nothing derived from its expected output, the host
compares; the host sends the next input while this one runs, and the harness reads a frame's exact bytes: the
next one stays in the pipe, never in the memory a child inherits); end of file ends the harness. Harness to
host (the host must treat it as untrusted, the program could have tampered with its parent): fixed
little-endian fields (index u32, wait status i32, flags u8, wall µs u32, stdout length u32 + bytes, stderr
length u32 + bytes). Not cleaned: the harness's own memory, which each child inherits: remnants of this
program's earlier inputs and outputs (stderr too) may lie in freed heap (never another program's, never an
expected output or anything derived from one). Not forwarded: isolation notes (the host has them from its
probe). Differences from a single run: the program's parent is the harness (PID 2), not PID 1, and its own pid
is the session's next one (an earlier input that forked moved it); its network and UTS namespaces, cgroup,
hash seed and address layout are the session's; ``/proc/self/mountinfo`` lists the earlier inputs' covered,
empty mounts. Where an input cannot be given its fresh mounts (no capabilities: the kernel refused the run a
user namespace of its own), it reports a setup failure and the host runs every input in a sandbox of its own.
"""

# ruff: noqa: E402, SIM105 - imports after the start-up state is captured; nothing beyond the stdlib's core

import sys

sys.path_importer_cache.pop(__file__, None)  # the interpreter's entry for this script, not the program's
_BASELINE = (frozenset(sys.modules), tuple(sys.path), frozenset(sys.path_importer_cache))

import marshal
import os
import select
import time

from _launcher import (  # inlined here by the host
    CLONE_NEWIPC,
    CLONE_NEWNS,
    KEY_SPEC_USER_KEYRING,
    KEY_SPEC_USER_SESSION_KEYRING,
    KEYCTL_CLEAR,
    MNT_DETACH,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    _drop_capabilities,
    _keyctl,
    _libc,
    _mount,
    _new_session_keyring,
    _private_workdir,
    _tmpfs_options,
    _unshare,
    warm,
)
from _runner import enter, finish, run, seal, sealer  # inlined here by the host

_MAX_FRAME = 1 << 30
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38
_prctl = _libc.prctl
TIMED_OUT, OUT_CUT, ERR_CUT, SETUP_FAILED = 1, 2, 4, 8
_SETUP_STATUS = 71


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
            chunk = os.read(0, n - len(self.buffer))  # never past this frame: the host sends the next one
            # ahead, and what the harness holds in memory when it forks a child is the child's to read
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
        ready_r, ready_w = os.pipe()
        places = _mounted(setup)
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:  # the child never returns into the harness, whatever happens
                os.setpgid(0, 0)
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.dup2(ready_w, 3)
                os.closerange(4, os.sysconf("SC_OPEN_MAX"))
                _program(setup, code, json)
            finally:
                os._exit(70)
        for fd in (in_r, out_w, err_w, ready_w):
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
        raw = exited = None
        timed_out = killed = False
        open_pipes = {out_r, err_r}
        drain_until = None
        while raw is None or (open_pipes and time.monotonic() < drain_until):
            now = time.monotonic()
            if raw is None and now >= deadline and not killed:
                timed_out = killed = True
                self._kill(pid)
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
                    exited = time.monotonic()
                    self._sweep()  # strays die now: the pipes they hold reach their end
                    drain_until = time.monotonic() + 2.0
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
                            self._kill(pid)
        wall = (exited if exited is not None else time.monotonic()) - started
        if wall > setup["timeout"]:  # (an exit seen late: the program stopped the harness, SIGSTOP, meanwhile)
            timed_out = True
        os.close(pidfd)
        for fd in (in_w, out_r, err_r):
            if fd >= 0:
                os.close(fd)
        self._sweep()
        fresh = None
        try:
            os.set_blocking(ready_r, False)
            ready = os.read(ready_r, 4096)
            if ready[:1] == b"R":
                fresh = marshal.loads(ready[1:])
        except (OSError, ValueError, EOFError, TypeError):
            pass
        os.close(ready_r)
        setup_failed = fresh is None
        if setup_failed or fresh != _usage(path for path, _ in places):
            _unmount(places)  # this input's mounts hold something (or are half made): off now
        flags = (TIMED_OUT if timed_out else 0) | (OUT_CUT if cut[out_r] else 0) | (ERR_CUT if cut[err_r] else 0)
        flags |= SETUP_FAILED if setup_failed and not killed else 0
        out, err = bytes(kept[out_r]), bytes(kept[err_r])
        return b"".join((
            test["i"].to_bytes(4, "little"), raw.to_bytes(4, "little", signed=True), bytes([flags]),
            min(int(wall * 1e6), 2**32 - 1).to_bytes(4, "little"),
            len(out).to_bytes(4, "little"), out, len(err).to_bytes(4, "little"), err,
        ))  # fmt: skip

    def _kill(self, pid):
        try:
            os.killpg(pid, 9)
        except OSError:
            pass
        self._sweep()

    @staticmethod
    def _sweep():
        """SIGKILL every process of this PID namespace but PID 1 and the harness."""
        try:
            os.kill(-1, 9)
        except OSError:
            pass  # none left


def _program(setup, code, json):
    """In the forked child: a fresh IPC namespace, working directory, /tmp and /dev/shm (new tmpfs mounts in
    the harness's mount namespace), new keyrings, no capabilities; then the program. Tells the harness
    it is ready with what its mounts hold before the program runs (free blocks and inodes of each)."""
    try:
        if setup["ipc"]:
            _unshare(CLONE_NEWIPC)
        limits = {"tmp_mb": setup["tmp_mb"], "max_files": setup["max_files"]}
        os.umask(0o022)
        for directory in setup["private_dirs"]:
            _mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, _tmpfs_options(limits, "1777"))
        _way_to(setup["workdir"])  # under a private /tmp just mounted (as non-root): made again, as the launcher does
        _private_workdir(setup["workdir"], [("main.py", setup["source"], setup["script_mode"])], limits, None)
        _new_session_keyring()
        for keyring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):  # (the session's user namespace)
            _keyctl(KEYCTL_CLEAR, keyring)
    except OSError as exc:
        os.write(2, f"batch harness: cannot prepare this input: {exc}\n".encode())
        os._exit(_SETUP_STATUS)
    _drop_capabilities()
    _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.umask(0o077)
    os.chdir(setup["workdir"])
    os.write(3, b"R" + marshal.dumps(_usage(_places(setup))))
    os.close(3)
    seal(setup["seccomp"])  # the program's filter, on top of the harness's own
    main, shared = enter(_BASELINE, setup["script"], ["main.py"], setup["orig_argv"], setup["env"])
    if json is not None:
        sys.modules["json"] = json  # imported once by the harness: the driver's import finds it
    finish(run(main, code), shared)


def _places(setup):
    """The places an input mounts over, in mounting order."""
    return (*setup["private_dirs"], setup["workdir"])


def _mounted(setup):
    """The places an input mounts over, each with the device it shows before."""
    return [(p, os.stat(p).st_dev) for p in _places(setup)]


def _usage(paths):
    """Free blocks and inodes (space for inodes and extended attributes) of each path's filesystem."""
    try:
        return [(v.f_bfree, v.f_ffree) for v in map(os.statvfs, paths)]
    except OSError:
        return None


def _unmount(places):
    """Take the input's mounts off again (the harness's mount namespace is back as before it)."""
    for path, device in reversed(places):
        for _ in range(8):
            try:
                if os.stat(path).st_dev == device:
                    break
            except OSError:
                pass
            if _libc.umount2(path.encode(), MNT_DETACH) != 0:
                break


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
    try:  # a mount namespace of its own, where each input's fresh mounts go (private: they propagate nowhere)
        _unshare(CLONE_NEWNS)
        _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    except OSError as exc:
        sys.stderr.write(f"batch harness: no mount namespace of its own ({exc}): every input will fail\n")
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
    import gc

    warm()
    sealer()
    gc.collect()
    gc.freeze()  # what is here now is never collected: each input's collections (and exit) skip it
    try:  # the heap the compile of this harness left behind, back to the system: fewer pages for each fork
        _libc.malloc_trim(0)  # to copy (page tables) and each exit to unmap (about 2 MB here)
    except AttributeError:
        pass  # (not glibc)
    while (frame := harness.read_frame()) is not None:
        harness.write_frame(harness.one(setup, code, json, marshal.loads(frame)))
    os._exit(0)


if __name__ == "__main__":
    _serve()
