"""What an ordinary user's sandbox runs can do to that user, and how much memory a run holds, as measured.

Why: as an ordinary user a run gets a uid of its own only where the host grants subordinate ids
(``newuidmap``/``newgidmap``, ``/etc/subuid`` and ``/etc/subgid`` entries), and limits for the whole run
only where it may make cgroups. The sandbox docs state the guarantees of each case from this script's
output. Run it as the ordinary user (the host decides which case it measures: ``uid_setup`` and
``cgroup_setup`` in the output say which); it prints one JSON line.

* ``identity``: the run's uid and gid beside the user's, and the uids of four concurrent runs;
* ``uid_alone``: with every other layer that would stop them off (no PID namespace, the host's tree with
  nothing hidden, no system-call filter), whether the program reads a 0600 file of the user's, signals
  the user's process, reads a key the user holds (user-readable, in its user keyring) and adds one there;
* ``default``: the same attempts in the default sandbox (PID namespace, deny-by-default root, filter);
* ``memory_mib``: with ``memory_mb=64`` and ``tmp_mb=64``, the MiB a run held at once, in processes (eight
  touching 12 MiB each: those still alive at the end) and in files (of 1 MiB, written into ``/tmp``,
  ``/dev/shm`` and its working directory until they are full); ``killed`` when its cgroup killed the
  run's first process.

    python benchmarks/sandbox_ordinary_user.py [--secret-dir DIR]

``--secret-dir``: a directory of this user's the runs can see (default: a new one, mode 0755, under
``/run/user/<uid>`` or the temp dir: with nothing hidden the host's tree is visible, ``/tmp`` included).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import tempfile

from agentboost.sandbox import Sandbox, SandboxConfig

ATTEMPTS = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {{}}
def attempt(name, call):
    try:
        result = call()
        out[name] = result is None or result >= 0
    except OSError:
        out[name] = False
attempt("read_0600_file", lambda: len(open({secret!r}).read()))
attempt("signal_the_user", lambda: os.kill({pid}, 0))
attempt("read_the_users_key", lambda: libc.syscall(250, 11, ctypes.c_long({key}), ctypes.create_string_buffer(64), 64))
attempt("add_to_the_users_keyring", lambda: libc.syscall(248, b"user", b"x", b"y", 1, ctypes.c_long({ring})))
print(json.dumps(out))
"""

HOLD = r"""
import os
EACH, COUNT = 12, 8  # (each process's address space is capped at memory_mb too)
hold, _ = os.pipe()  # never written: each child holds its memory until the run ends
children = []
for _ in range(COUNT):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        block = bytearray(EACH << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        os.write(w, b"x")
        os.read(hold, 1)
        os._exit(0)
    os.close(w)
    children.append((pid, r))
for _, r in children:
    os.read(r, 1)
written = 0
for directory in ("/tmp", "/dev/shm", "."):
    try:
        for n in range(10**6):  # files of 1 MiB (each file is capped at file_size_mb)
            with open(os.path.join(directory, f"fill{n}"), "wb") as fh:
                fh.write(b"\1" * (1 << 20))
            written += 1
    except OSError:
        pass
alive = sum(os.waitpid(pid, os.WNOHANG)[0] == 0 for pid, _ in children)
print(alive * EACH, written, flush=True)
"""


def _plant() -> tuple[int, int]:
    """A user-readable key in this user's user keyring (as a credential helper would leave one)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    token = b"token-" + os.urandom(8).hex().encode()
    key = libc.syscall(248, b"user", b"agentboost-bench", token, len(token), ctypes.c_long(-4))
    libc.syscall(250, 5, ctypes.c_long(key), ctypes.c_long(0x3F3F0000))
    return key, libc.syscall(250, 0, ctypes.c_long(-4), 1)


def _attempts(box: Sandbox, secret: str, key: int, ring: int) -> dict[str, bool]:
    result = box.run_sync(ATTEMPTS.format(secret=secret, pid=os.getpid(), key=key, ring=ring))
    assert result.exit_code == 0, result
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret-dir", default=None)
    args = parser.parse_args()
    if os.geteuid() == 0:
        raise SystemExit("run this as an ordinary user")
    runtime = f"/run/user/{os.getuid()}"
    directory = args.secret_dir or tempfile.mkdtemp(dir=runtime if os.access(runtime, os.W_OK) else None)
    if args.secret_dir is None:
        os.chmod(directory, 0o755)  # only the file's own mode stands in the way
    secret = os.path.join(directory, "secret")
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write("secret")
    key, ring = _plant()
    out: dict[str, object] = {"user": [os.getuid(), os.getgid()]}
    box = Sandbox(SandboxConfig(memory_mb=64, tmp_mb=64, max_processes=16, wall_s=60))
    try:
        iso = box.isolation()
        out.update(uid_setup=iso["uid_setup"], cgroup_setup=iso["cgroup_setup"], cgroup=iso["cgroup"])
        probe = box.run_sync("import os\nprint(os.getuid(), os.getgid())")
        out["identity"] = probe.stdout.split()

        async def four() -> list[str]:
            code = "import os, time\ntime.sleep(1)\nprint(os.getuid())"
            return [r.stdout.strip() for r in await asyncio.gather(*(box.run(code) for _ in range(4)))]

        out["concurrent_uids"] = asyncio.run(four())
        out["default"] = _attempts(box, secret, key, ring)
        held = box.run_sync(HOLD)
        out["memory_mib"] = (dict(zip(("processes", "files"), map(int, held.stdout.split()), strict=True))
                             if held.exit_code == 0 else f"killed ({held.signal or held.exit_code})")  # fmt: skip
    finally:
        box.close()
    bare = Sandbox(SandboxConfig(pid_namespace=False, deny_by_default=False, hidden_paths=(), syscall_filter=False))
    try:
        out["uid_alone"] = _attempts(bare, secret, key, ring)
    finally:
        bare.close()
        ctypes.CDLL(None).syscall(250, 21, ctypes.c_long(key), ctypes.c_long(-4))  # KEYCTL_UNLINK
        os.unlink(secret)
        if args.secret_dir is None:
            os.rmdir(directory)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
