"""The batch harness: one sandboxed process runs one program on many inputs (host side: ``batch.py``).

It is the sandbox's program (``.harness.py`` in the working directory, the runner inlined by the host:
stdlib only), so it has every isolation layer of a run, and it must be PID 2 of the run's own PID
namespace (it refuses otherwise: its clean-up signals every process there). It makes itself non-dumpable
(its ``/proc`` entries, among them the report channel and its memory, then belong to root, and it cannot
be traced: the programs it forks, same uid, cannot reach it that way), deletes its own file, compiles
``main.py`` (the program, as in a single run) once, then for each input the host sends:

* forks a child in a process group of its own, with fresh pipes on 0/1/2 and no other descriptor; the
  child makes the interpreter look freshly started on ``main.py`` (:func:`_runner.enter`), runs the
  program and finishes like an interpreter (:func:`_runner.finish`). So each input sees a fresh program:
  module state, ``sys``, environment and signal handlers as the first one saw them. Call-based programs
  carry the single-run driver, which imports ``json``: with ``preload_json`` the harness imports it once
  and each child starts with it in ``sys.modules`` (the one difference from a fresh interpreter);
* feeds the input, keeps ``stdout_cap`` bytes of stdout (killing the child as soon as it writes more) and
  ``stderr_cap`` bytes of stderr, kills the child's process group at the wall-clock limit;
* once the child has exited: SIGKILL to every other process of the namespace (``kill(-1)`` spares only
  PID 1 and the harness; whatever the program left behind dies before the next input), then removes
  whatever the program left in its working directory and in the private ``/tmp`` and ``/dev/shm``,
  puts the program's file back if it was changed and every directory's mode back; if anything cannot
  be put back, the harness ends after this report (the host starts a fresh one);
* reports the outcome: exit status as the launcher reports it (``128 + N`` for signal N), timed out,
  truncations, wall time, the kept output.

Frames, both ways, are a 4-byte little-endian length and a payload. Host to harness (trusted): marshal,
first the setup, then one input per frame; end of file ends the harness. Harness to host (the host must
treat it as untrusted, the program could have tampered with its parent): fixed little-endian fields
(index u32, status i32, flags u8, wall µs u32, stdout length u32 + bytes, stderr length u32 + bytes).
Not cleaned: the harness's own memory, which each child inherits: remnants of this program's earlier
inputs and outputs may lie in freed heap (never another program's, and never an expected output: those
stay on the host). Not forwarded: isolation notes (the host has them from its probe). The program's parent
is the harness (PID 2), not PID 1, and its own pid varies; its CPU-time limit is its own, as in a single run.
"""

# ruff: noqa: E402, SIM105 - imports after the start-up state is captured; nothing beyond the stdlib's core

import sys

sys.path_importer_cache.pop(__file__, None)  # the interpreter's entry for this script, not the program's
_BASELINE = (frozenset(sys.modules), tuple(sys.path), frozenset(sys.path_importer_cache))

import ctypes
import marshal
import os
import select
import time

from _runner import enter, finish, run  # inlined here by the host

_MAX_FRAME = 1 << 30
PR_SET_DUMPABLE = 4
_prctl = ctypes.CDLL(None, use_errno=True).prctl
TIMED_OUT, OUT_CUT, ERR_CUT = 1, 2, 4


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
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:  # the child never returns into the harness, whatever happens
                _prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # as a freshly started program is
                os.setpgid(0, 0)
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.closerange(3, os.sysconf("SC_OPEN_MAX"))
                main, shared = enter(_BASELINE, setup["script"], ["main.py"], setup["orig_argv"], setup["env"])
                if json is not None:
                    sys.modules["json"] = json  # imported once by the harness: the driver's import finds it
                finish(run(main, code), shared)
            finally:
                os._exit(70)
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        data = memoryview(test["stdin"])
        caps = {out_r: test["cap"], err_r: setup["stderr_cap"]}
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
        status = None
        timed_out = killed = False
        open_pipes = {out_r, err_r}
        drain_until = None
        while status is None or (open_pipes and time.monotonic() < drain_until):
            now = time.monotonic()
            if status is None and now >= deadline and not killed:
                timed_out = killed = True
                self._kill(pid)
            wait_s = (deadline - now) if status is None and not killed else 0.05
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
                    os.close(pidfd)
                    _, raw = os.waitpid(pid, 0)
                    status = 128 + os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)
                    self._sweep()  # strays die now: the pipes they hold reach their end
                    drain_until = time.monotonic() + 2.0
                else:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        poller.unregister(fd)
                        open_pipes.discard(fd)
                        continue
                    room = caps[fd] - len(kept[fd])
                    if room > 0:
                        kept[fd] += chunk[:room]
                    if len(chunk) > max(room, 0):
                        cut[fd] = True
                        if fd == out_r and not killed:
                            killed = True
                            self._kill(pid)
        wall = time.monotonic() - started
        for fd in (in_w, out_r, err_r):
            if fd >= 0:
                os.close(fd)
        self._sweep()
        clean = self._clean(setup)
        flags = (TIMED_OUT if timed_out else 0) | (OUT_CUT if cut[out_r] else 0) | (ERR_CUT if cut[err_r] else 0)
        out, err = bytes(kept[out_r]), bytes(kept[err_r])
        report = b"".join((
            test["i"].to_bytes(4, "little"), status.to_bytes(4, "little", signed=True), bytes([flags]),
            min(int(wall * 1e6), 2**32 - 1).to_bytes(4, "little"),
            len(out).to_bytes(4, "little"), out, len(err).to_bytes(4, "little"), err,
        ))  # fmt: skip
        return report, clean

    def _kill(self, pid):
        try:
            os.killpg(pid, 9)
        except OSError:
            pass
        self._sweep()

    def _sweep(self):
        """SIGKILL every process of this PID namespace but PID 1 and the harness."""
        try:
            os.kill(-1, 9)
        except OSError:
            pass  # none left

    def _clean(self, setup):
        """Put the working directory, /tmp and /dev/shm back as the program found them: the program's file
        as it was (it may have rewritten it), nothing else, every directory on the way with its mode.
        False if something could not be put back (the harness then ends after this report: a new one
        starts from a fresh sandbox)."""
        ok = True
        for path, mode in setup["modes"].items():
            try:
                if os.lstat(path).st_mode != mode:
                    os.chmod(path, mode & 0o7777)
            except OSError:
                ok = False
        workdir = setup["workdir"]
        for directory in setup["clean"]:
            ok = self._empty(directory, workdir) and ok
        if not self._pristine(setup):
            ok = self._empty(workdir, workdir) and ok
            try:
                fd = os.open(setup["script"], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                try:
                    os.write(fd, setup["source"])
                    os.fchmod(fd, setup["script_mode"] & 0o7777)
                finally:
                    os.close(fd)
            except OSError:
                ok = False
        else:
            ok = self._empty(workdir, workdir, keep=setup["script"]) and ok
        return ok

    def _pristine(self, setup):
        """Whether the program's file is still the one it was given (a regular file, same mode and bytes)."""
        try:
            st = os.lstat(setup["script"])
            if st.st_mode != setup["script_mode"] or st.st_size != len(setup["source"]):
                return False
            with open(setup["script"], "rb") as fh:
                return fh.read() == setup["source"]
        except OSError:
            return False

    def _empty(self, directory, workdir, keep=None):
        """Remove everything in ``directory`` but ``keep`` and the working directory; on the way to the
        working directory (it lies under /tmp as non-root) only the step toward it stays."""
        try:
            entries = os.listdir(directory)
        except OSError:
            return False
        ok = True
        for name in entries:
            path = directory + "/" + name
            if path in (workdir, keep):
                continue
            if workdir.startswith(path + "/"):
                ok = self._empty(path, workdir) and ok
                continue
            ok = self._remove(path) and ok
        return ok

    def _remove(self, path):
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
                for name in os.listdir(path):
                    self._remove(path + "/" + name)
                os.rmdir(path)
            else:
                os.unlink(path)
        except OSError:
            return False
        return True


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
    setup["source"], setup["script_mode"] = source, os.lstat(setup["script"]).st_mode
    setup["modes"] = {}  # every directory the program can write to or on the way to one, as it is now
    for directory in (setup["workdir"], *setup["clean"]):
        path = directory
        while path not in ("/", "") and path not in setup["modes"]:
            try:
                setup["modes"][path] = os.lstat(path).st_mode
            except OSError:
                pass
            path = os.path.dirname(path)
    try:
        code = compile(source, setup["script"], "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        code = None  # each child compiles it again and reports the error as a single run does
    json = None
    if setup.get("preload_json"):
        import json  # once here: importing it in every child would cost more than the rest of a test
    while (frame := harness.read_frame()) is not None:
        report, clean = harness.one(setup, code, json, marshal.loads(frame))
        harness.write_frame(report)
        if not clean:
            sys.stderr.write("batch harness: could not put the sandbox back as it was; ending\n")
            os._exit(4)
    os._exit(0)


if __name__ == "__main__":
    _serve()
