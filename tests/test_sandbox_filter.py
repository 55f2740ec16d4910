"""The system-call filter (issue 39, findings 1, 5, 6 and 7), as root and as an ordinary user.

Each attack worked on the code before the filter:
1. runs shared answers through the host's page cache: written with ``posix_fadvise(DONTNEED)`` (or
   readahead hints), read without faulting pages in (``MADV_RANDOM`` + ``/proc/self/pagemap``, ``mincore``,
   ``preadv2(RWF_NOWAIT)``, ``cachestat``);
5. a program made its own user + network namespace, brought loopback up and queued 240 MiB of TCP
   buffers with ``memory_mb=64``;
6. as an ordinary user (no cgroup) a program mounted its own 1 GiB tmpfs in its own user namespace;
7. as an ordinary user a run read ``/proc/keys``, the trainer's readable keys and wrote its user keyring.
Here every primitive is tried from inside a run (started, forked by a zygote, an input of a batch) and
must fail; a call through the 32-bit or x32 interface kills the program.
"""

from __future__ import annotations

import asyncio
import json
import platform
import secrets

import pytest

from agentboost.sandbox import Sandbox, SandboxConfig, policy, seccomp
from agentboost.sandbox.batch import BatchInput, run_batch
from tests.sandbox_users import IS_ROOT, as_ordinary_user

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the probes use x86_64 call numbers")

LIMITS = {"wall_s": 30, "cpu_s": 20, "memory_mb": 256, "max_processes": 16}

# Every primitive of the four findings, tried in the run; prints which worked (True) as JSON.
PROBES = r'''
import ctypes, errno, json, mmap, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
worked = {}
def attempt(name, call, fine=()):
    """True when the call did its work (or answered a probe: an error in ``fine``)."""
    try:
        result = call()
        if isinstance(result, bool):
            ok = result
        else:
            ok = result is None or result >= 0 or ctypes.get_errno() in fine
    except OSError as exc:
        ok = exc.errno in fine
    worked[name] = bool(ok)
def in_child(call):
    """Run ``call`` in a fork (it may change the process); True when it returned True there."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if call() else 1)
        except BaseException:
            os._exit(1)
    return os.waitpid(pid, 0)[1] == 0
library = os.open(os.__file__, os.O_RDONLY)  # a read-only file every run shares
size = os.fstat(library).st_size
libc.mmap.restype = ctypes.c_void_p
region = libc.mmap(None, ctypes.c_size_t(size), 1, 2, library, ctypes.c_long(0))  # PROT_READ, MAP_PRIVATE
# -- finding 1: write and read the page cache
attempt("fadvise_dontneed", lambda: os.posix_fadvise(library, 0, 0, os.POSIX_FADV_DONTNEED))
attempt("fadvise_willneed", lambda: os.posix_fadvise(library, 0, 0, os.POSIX_FADV_WILLNEED))
attempt("readahead", lambda: libc.syscall(187, library, ctypes.c_long(0), ctypes.c_long(4096)))
for advice in ("MADV_RANDOM", "MADV_SEQUENTIAL", "MADV_WILLNEED", "MADV_COLD", "MADV_PAGEOUT"):
    number = getattr(mmap, advice, {"MADV_COLD": 20, "MADV_PAGEOUT": 21}.get(advice))
    attempt(advice.lower(), lambda: libc.madvise(ctypes.c_void_p(region), ctypes.c_size_t(4096), number))
vector = (ctypes.c_ubyte * ((size + 4095) // 4096))()
attempt("mincore", lambda: libc.mincore(ctypes.c_void_p(region), ctypes.c_size_t(size), vector))
ranges, stat = (ctypes.c_uint64 * 2)(0, 4096), (ctypes.c_uint64 * 5)()
attempt("cachestat", lambda: libc.syscall(451, library, ranges, stat, 0))
attempt("preadv2_nowait", lambda: os.preadv(library, [bytearray(4096)], 0, os.RWF_NOWAIT), fine=(errno.EAGAIN,))
attempt("pagemap", lambda: len(open("/proc/self/pagemap", "rb").read(8)) == 8)
attempt("pagemap_thread", lambda: len(open("/proc/thread-self/pagemap", "rb").read(8)) == 8)
attempt("pagemap_fork", lambda: in_child(lambda: len(open("/proc/self/pagemap", "rb").read(8)) == 8))
attempt("mem", lambda: len(open("/proc/self/mem", "rb").read(0)) == 0)
attempt("dumpable_again", lambda: libc.prctl(4, 1, 0, 0, 0) == 0 and len(open("/proc/self/pagemap", "rb").read(8)) == 8)
attempt("dumpable_high_bits", lambda: libc.syscall(157, ctypes.c_long(4 | (1 << 32)), 1, 0, 0, 0))
attempt("exec", lambda: in_child(lambda: os.execv(sys.executable, [sys.executable, "-c", "1"])))
attempt("flock", lambda: __import__("fcntl").flock(library, 2 | 4))
attempt("inotify", lambda: libc.inotify_init1(0))
attempt("io_uring", lambda: libc.syscall(425, 4, (ctypes.c_ubyte * 120)()))
attempt("aio", lambda: libc.syscall(206, 4, ctypes.byref(ctypes.c_ulong(0))))
attempt("userfaultfd", lambda: libc.syscall(323, 0))
attempt("memfd", lambda: os.memfd_create("x"))
attempt("ptrace", lambda: in_child(lambda: libc.syscall(101, 0, 0, 0, 0) == 0))
attempt("perf_event_open", lambda: libc.syscall(298, (ctypes.c_ubyte * 128)(), 0, -1, -1, 0))
attempt("personality", lambda: libc.personality(0x0040000) >= 0 and libc.personality(0xFFFFFFFF) & 0x0040000)
# -- findings 5 and 6: new namespaces, a tmpfs of its own
attempt("unshare_user", lambda: in_child(lambda: libc.unshare(0x10000000) == 0))
attempt("unshare_user_net", lambda: in_child(lambda: libc.unshare(0x10000000 | 0x40000000) == 0))
attempt("unshare_net", lambda: in_child(lambda: libc.unshare(0x40000000) == 0))
def raw_clone(flags):
    pid = libc.syscall(56, ctypes.c_long(flags | 17), 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    return pid > 0 and os.waitpid(pid, 0)[1] == 0
attempt("clone_user", lambda: raw_clone(0x10000000))
attempt("clone_user_high_bits", lambda: raw_clone(0x10000000 | (1 << 40)))
args = (ctypes.c_uint64 * 11)(0x10000000, 0, 0, 0, 17)
def clone3():
    pid = libc.syscall(435, args, 88)
    if pid == 0:
        os._exit(0)
    return pid > 0
attempt("clone3_user", clone3)
attempt("mount_tmpfs", lambda: in_child(lambda: libc.unshare(0x10000000 | 0x20000) == 0
                                          and libc.mount(b"none", b"/tmp", b"tmpfs", 0, b"size=1g") == 0))
attempt("setns", lambda: libc.setns(os.open("/proc/self/ns/net", os.O_RDONLY), 0))
# -- finding 7: kernel keyrings
attempt("proc_keys", lambda: len(open("/proc/keys").read()) >= 0)
attempt("keyctl_user_keyring", lambda: libc.syscall(250, 0, ctypes.c_long(-4), 0))
attempt("add_key_user_keyring", lambda: libc.syscall(248, b"user", b"probe", b"x", 1, ctypes.c_long(-4)))
attempt("request_key", lambda: libc.syscall(249, b"user", b"agentboost-planted", None, 0))
print(json.dumps(worked))
'''

# A call through the 32-bit interface (int 0x80: getpid is 20 there) from a mapping the program writes.
INT80 = r"""
import ctypes, mmap
code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])  # mov eax, 20; int 0x80; ret
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
address = ctypes.addressof(ctypes.c_char.from_buffer(page))
print("32-bit getpid:", ctypes.CFUNCTYPE(ctypes.c_int)(address)(), flush=True)
"""
X32 = "import ctypes\nprint('x32 getpid:', ctypes.CDLL(None).syscall(0x40000000 | 39), flush=True)"
SIGSYS = 31


def _worked(stdout: str) -> dict[str, bool]:
    return json.loads(stdout.strip().splitlines()[-1])


def _check_probes(result, where: str) -> None:
    assert result.exit_code == 0, (where, result)
    worked = _worked(result.stdout)
    assert len(worked) > 30, worked
    assert not [k for k, v in worked.items() if v], (where, worked)


@pytest.fixture(scope="module")
def box():
    if seccomp.available()[0] is None:
        pytest.skip(f"no filter here: {seccomp.available()[1]}")
    sandbox = Sandbox(SandboxConfig(**LIMITS))
    if not sandbox.isolation()["seccomp"]:
        pytest.skip(f"the filter does not install here: {sandbox.isolation()['notes']}")
    yield sandbox
    sandbox.close()


def test_every_primitive_of_the_four_findings_fails_in_a_run(box: Sandbox) -> None:
    """Zygote run, started run, and two inputs of a batch: the same probes, nothing works."""
    _check_probes(box.run_sync(PROBES), "zygote")
    cold = Sandbox(SandboxConfig(zygote=False, **LIMITS))
    try:
        _check_probes(cold.run_sync(PROBES), "started")
    finally:
        cold.close()

    async def alone(i: int):
        raise AssertionError(f"input {i} was not reported")

    results = asyncio.run(run_batch(box, PROBES, [BatchInput(""), BatchInput("")], timeout_s=30.0,
                                    stdout_cap=10_000, single=alone))  # fmt: skip
    for result in results:
        _check_probes(result, "batch")


def test_a_call_through_another_architectures_interface_kills_the_program(box: Sandbox) -> None:
    for program in (INT80, X32):
        result = box.run_sync(program)
        assert result.signal == SIGSYS and "getpid" not in result.stdout, result


def test_python_programs_still_run_under_the_filter(box: Sandbox) -> None:
    """What stdlib programs do: threads, fork-based multiprocessing, sockets, asyncio, ctypes callbacks,
    sqlite in memory, SysV shared memory, temporary files, signals and timers, hashing, compression."""
    program = r"""
import asyncio, concurrent.futures, ctypes, hashlib, json, mmap, multiprocessing, os, queue, select, signal, socket
import sqlite3, subprocess, sys, tempfile, threading, time, zlib
out = {}
with multiprocessing.Pool(2) as pool:
    out["pool"] = pool.map(abs, [-1, -2, -3])
with concurrent.futures.ThreadPoolExecutor(2) as ex:
    out["threads"] = sorted(ex.map(lambda x: x * 2, [1, 2]))
a, b = socket.socketpair(); a.sendall(b"ping"); out["socketpair"] = b.recv(4).decode()
async def main():
    await asyncio.sleep(0.01)
    return 5
out["asyncio"] = asyncio.run(main())
callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x + 1)
out["ctypes_callback"] = callback(41)
out["sqlite"] = sqlite3.connect(":memory:").execute("select 6 * 7").fetchone()[0]
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "f"); open(path, "w").write("hi"); os.rename(path, path + "2")
    out["tmpfile"] = open(path + "2").read()
signal.signal(signal.SIGALRM, lambda *a: out.setdefault("alarm", True)); signal.setitimer(signal.ITIMER_REAL, 0.01)
time.sleep(0.1)
out["hash"] = hashlib.sha256(zlib.compress(b"x")).hexdigest()[:4] != ""
out["cpus"] = os.cpu_count() is not None and len(os.sched_getaffinity(0)) > 0
out["isatty"] = sys.stdin.isatty()
r, w = os.pipe(); os.write(w, b"z"); out["select"] = select.select([r], [], [], 1)[0] == [r]
print(json.dumps(out))
"""
    result = box.run_sync(program)
    assert result.ok, result
    assert json.loads(result.stdout) == {
        "pool": [1, 2, 3], "threads": [2, 4], "socketpair": "ping", "asyncio": 5, "ctypes_callback": 42,
        "sqlite": 42, "tmpfile": "hi", "alarm": True, "hash": True, "cpus": True, "isatty": False,
        "select": True,
    }  # fmt: skip


def test_the_policy_reads_as_one_list_and_compiles() -> None:
    allowed = {rule.name for rule in policy.ALLOWED}
    assert not allowed & set(policy.DENIED)
    for name in ("unshare", "setns", "mount", "keyctl", "add_key", "request_key", "fadvise64", "readahead",
                 "mincore", "cachestat", "bpf", "perf_event_open", "ptrace", "process_vm_readv", "userfaultfd",
                 "io_uring_setup", "kexec_load", "init_module", "execve", "clone3", "process_madvise"):  # fmt: skip
        assert name not in allowed, name
    clone = [rule for rule in policy.ALLOWED if rule.name == "clone"]
    assert clone and all(rule.when and rule.when[0][1] & policy.CLONE_NEWUSER for rule in clone)
    if seccomp.available()[0] is None:
        pytest.skip(seccomp.available()[1])
    filters = seccomp.filters()
    assert len(filters.program) % 8 == 0 and filters.program != filters.setup


@pytest.mark.skipif(not IS_ROOT, reason="the planted key is the ordinary user's; planted from root's child")
def test_as_an_ordinary_user_the_same_probes_fail_and_the_trainers_keys_stay_out_of_reach() -> None:
    """Findings 6 and 7 as the user they were found as: no cgroup here, the run keeps this uid; its keys
    (a token planted in the user keyring the way a credential helper would) are neither listed nor read."""
    token = "tok-" + secrets.token_hex(8)
    script = f"""
import ctypes, json, logging, os
logging.basicConfig(level=logging.WARNING)
from agentboost.sandbox import Sandbox, SandboxConfig
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
planted = libc.syscall(248, b"user", b"agentboost-planted", {token.encode()!r}, {len(token)}, ctypes.c_long(-4))
libc.syscall(250, 5, ctypes.c_long(planted), ctypes.c_long(0x3F3F0000))  # KEYCTL_SETPERM: user may read
box = Sandbox(SandboxConfig(**{LIMITS!r}))
iso = box.isolation()
probes = box.run_sync({PROBES!r})
reader = box.run_sync("import ctypes\\nlibc = ctypes.CDLL(None)\\nbuf = ctypes.create_string_buffer(64)\\n"
                      "n = libc.syscall(250, 11, ctypes.c_long(%d), buf, 64)\\nprint(buf.raw[:max(n, 0)])" % planted
                      + "\\nprint(open('/proc/keys').read())")
box.close()
libc.syscall(250, 21, ctypes.c_long(planted), ctypes.c_long(-4))  # KEYCTL_UNLINK
print(json.dumps({{"planted": planted, "iso": {{k: v for k, v in iso.items() if isinstance(v, bool)}},
                  "probes": [probes.exit_code, probes.stdout, probes.stderr[-500:]],
                  "reader": [reader.exit_code, reader.stdout, reader.stderr[-300:]]}}))
"""
    report = as_ordinary_user(script)
    assert report["planted"] > 0, report
    if not report["iso"].get("seccomp"):
        pytest.skip(f"no filter for this user: {report['_stderr']}")
    code, stdout, stderr = report["probes"]
    assert code == 0, report
    worked = _worked(stdout)
    assert not [k for k, v in worked.items() if v], worked
    assert token not in report["reader"][1] and token not in report["_stderr"], report
    if not report["iso"]["cgroup"] and not report["iso"]["unprivileged_uid"]:  # (no cgroup for this user here)
        assert "NEITHER a cgroup NOR a uid of their own" in report["_stderr"], report["_stderr"]


_FILLS_TCP = """
import socket
socks, sent = [], 0
for _ in range(56):
    s = socket.create_connection(("127.0.0.1", {port}), timeout=5)
    s.setblocking(False)
    socks.append(s)
for s in socks:
    while True:
        try:
            sent += s.send(b"x" * 65536)
        except OSError:
            break
print(sent >> 20)
"""


def test_tcp_buffers_count_against_the_runs_memory() -> None:
    """Finding 5 where a run has the network (``isolate_network=False``): its TCP buffers are charged to its
    cgroup (v1: ``memory.kmem.tcp.limit_in_bytes``; v2 charges them anyway), not queued without limit (208
    MiB with ``memory_mb=64`` before, over 56 connections to a listener that never reads)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    box = Sandbox(SandboxConfig(isolate_network=False, memory_mb=64, max_open_files=64, wall_s=60))
    try:
        if not box.isolation()["cgroup"]:
            pytest.skip("no cgroup for runs here: nothing charges their buffers")
        result = box.run_sync(_FILLS_TCP.format(port=listener.getsockname()[1]))
    finally:
        box.close()
        listener.close()
        for conn in held:
            conn.close()
    assert result.exit_code == 0, result
    assert int(result.stdout) < 2 * 64, result  # the run's own 64 MiB (and what the listener holds)
