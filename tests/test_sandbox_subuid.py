"""An ordinary user's runs under a uid of their own: subordinate ids (issue 39, finding 7).

As an ordinary user every run kept the trainer's uid: with a layer off (no PID namespace, the host's tree,
no system-call filter) the program read the trainer's 0600 files, signalled its processes and read the keys
in its keyrings. Where the host grants the user subordinate ids (``newuidmap``/``newgidmap`` installed,
``/etc/subuid`` and ``/etc/subgid`` entries) each run now gets a uid and gid of that range of its own;
these tests run the sandbox as a throwaway user that useradd gave such a range (root makes it; nothing is
installed here: without ``newuidmap`` they skip, CI's ``.ci/run`` installs Debian's ``uidmap``). Where no
subordinate ids are granted, the WARNING names what is missing and ``require_separate_uid`` refuses.
"""

from __future__ import annotations

import json
import os
import platform
import pwd
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentboost.sandbox import uids
from tests.sandbox_users import IS_ROOT, NOBODY, as_ordinary_user

TOOLS = "/usr/bin:/bin:/usr/sbin:/sbin"
LIMITS = {"wall_s": 30, "cpu_s": 20, "memory_mb": 256, "max_processes": 16}


@pytest.fixture(scope="module")
def trainer() -> Iterator[pwd.struct_passwd]:
    """A throwaway account with subordinate ids (useradd gives a new user a range; userdel takes it back),
    and a directory of its own under /run for its files; all removed afterwards."""
    if not IS_ROOT:
        pytest.skip("making an account with subordinate ids needs root")
    if platform.machine() != "x86_64":
        pytest.skip("the programs use x86_64 system-call numbers")
    missing = [t for t in ("newuidmap", "newgidmap", "useradd", "userdel") if shutil.which(t, path=TOOLS) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (Debian: apt-get install uidmap; .ci/run does)")
    name = f"abx-{secrets.token_hex(4)}"
    useradd = [shutil.which("useradd", path=TOOLS), "--no-create-home", "--home-dir", "/nonexistent", "--shell",
               "/usr/sbin/nologin", "--user-group", name]  # fmt: skip
    made = subprocess.run(useradd, capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    account = pwd.getpwnam(name)
    files = Path("/run") / name
    try:
        if not any(line.startswith(f"{name}:") for line in Path("/etc/subuid").read_text().splitlines()):
            pytest.skip("useradd gave the new account no subordinate ids (SUB_UID_COUNT=0 in /etc/login.defs?)")
        files.mkdir(mode=0o755)
        os.chown(files, account.pw_uid, account.pw_gid)
        yield account
    finally:
        subprocess.run([shutil.which("userdel", path=TOOLS), name], capture_output=True)
        for leftover in (files, Path(f"/tmp/agentboost-sandbox-{account.pw_uid}"),
                         Path(f"/run/lock/agentboost-sandbox-uids-{account.pw_uid}")):  # fmt: skip
            shutil.rmtree(leftover, ignore_errors=True)


def _as(account: pwd.struct_passwd, script: str) -> dict:
    return as_ordinary_user(script, user=(account.pw_uid, account.pw_gid))


# The attacks of finding 7 with every other layer that stops them off (no PID namespace, the host's tree
# with nothing hidden, no system-call filter), so what is left between the program and the trainer is its uid.
ATTACKS = r"""
import ctypes, json, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
secret = {files!r} + "/secret"
with open(secret, "w") as fh:
    fh.write("trainer-secret")
os.chmod(secret, 0o600)
token = b"tok-" + os.urandom(6).hex().encode()
planted = libc.syscall(248, b"user", b"agentboost-planted", token, len(token), ctypes.c_long(-4))
libc.syscall(250, 5, ctypes.c_long(planted), ctypes.c_long(0x3F3F0000))  # KEYCTL_SETPERM: the user may read
user_keyring = libc.syscall(250, 0, ctypes.c_long(-4), 1)  # KEYCTL_GET_KEYRING_ID: the trainer's user keyring
sleeper = subprocess.Popen(["sleep", "300"])
from agentboost.sandbox import Sandbox, SandboxConfig
box = Sandbox(SandboxConfig(pid_namespace=False, deny_by_default=False, hidden_paths=(), syscall_filter=False,
                            **{limits!r}))
iso = box.isolation()
program = '''
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {{"uid": os.getuid()}}
def attempt(name, call):
    try:
        result = call()
        out[name] = result is None or result >= 0
    except OSError as exc:
        out[name] = False
attempt("read_0600_file", lambda: len(open(%(secret)r).read()))
attempt("signal_trainer", lambda: os.kill(%(trainer)d, 0))
attempt("kill_trainer_child", lambda: os.kill(%(sleeper)d, 9))
buf = ctypes.create_string_buffer(64)
attempt("read_planted_key", lambda: libc.syscall(250, 11, ctypes.c_long(%(planted)d), buf, 64))
out["key_bytes"] = buf.raw.rstrip(b"\\0").decode(errors="replace")
attempt("describe_planted_key", lambda: libc.syscall(250, 6, ctypes.c_long(%(planted)d), buf, 64))
attempt("write_trainer_user_keyring", lambda: libc.syscall(248, b"user", b"x", b"y", 1, ctypes.c_long(%(ring)d)))
own = libc.syscall(250, 0, ctypes.c_long(-4), 1)
out["own_user_keyring"] = own
try:
    out["proc_keys"] = open("/proc/keys").read()
except OSError:
    out["proc_keys"] = ""
print(json.dumps(out))
''' % {{"secret": secret, "trainer": os.getpid(), "sleeper": sleeper.pid, "planted": planted, "ring": user_keyring}}
result = box.run_sync(program)
box.close()
alive = sleeper.poll() is None
sleeper.kill()
libc.syscall(250, 21, ctypes.c_long(planted), ctypes.c_long(-4))  # KEYCTL_UNLINK
print(json.dumps({{"trainer_uid": os.getuid(), "planted": planted, "user_keyring": user_keyring,
                  "token": token.decode(), "sleeper_alive": alive, "iso": {{k: v for k, v in iso.items()
                  if isinstance(v, (bool, str))}}, "run_uid": result.uid, "exit": result.exit_code,
                  "stdout": result.stdout, "stderr": result.stderr[-1000:]}}))
"""


def test_a_run_cannot_read_signal_or_take_the_keys_of_the_trainers_uid(trainer: pwd.struct_passwd) -> None:
    report = _as(trainer, ATTACKS.format(files=f"/run/{trainer.pw_name}", limits=LIMITS))
    assert report["planted"] > 0 and report["user_keyring"] > 0, report
    assert report["exit"] == 0, report
    out = json.loads(report["stdout"].strip().splitlines()[-1])
    assert out["uid"] == report["run_uid"] != report["trainer_uid"], report
    assert report["iso"]["unprivileged_uid"] is True, report["iso"]
    assert report["iso"]["uid_setup"].startswith(f"subordinate ids of {trainer.pw_name}"), report["iso"]
    assert not out["read_0600_file"], out
    assert not out["signal_trainer"] and not out["kill_trainer_child"] and report["sleeper_alive"], out
    assert not out["read_planted_key"] and not out["describe_planted_key"], out
    assert report["token"] not in out["key_bytes"] and report["token"] not in report["stdout"], out
    assert not out["write_trainer_user_keyring"], out
    assert out["own_user_keyring"] != report["user_keyring"], out
    assert str(report["planted"]) not in out["proc_keys"] and "agentboost-planted" not in out["proc_keys"], out


# The default sandbox (zygote, filter, deny-by-default root) and a batch harness: every run its own uid.
CONCURRENT = r"""
import asyncio, json, logging, os
logging.basicConfig(level=logging.WARNING)
from agentboost.sandbox import Sandbox, SandboxConfig
from agentboost.sandbox.batch import BatchInput, run_batch
box = Sandbox(SandboxConfig(**{limits!r}))
other = Sandbox(SandboxConfig(**{limits!r}))  # a second sandbox, as a second worker process would have
iso = box.isolation()
other.isolation()
program = "import os, time\ntime.sleep(1.5)\nprint(os.getuid(), os.getgid())"
async def main():
    runs = await asyncio.gather(*(b.run(program) for b in (box, box, box, other, other)))
    async def alone(i):
        raise AssertionError(f"input {{i}} was not reported")
    batch = await run_batch(box, "import os\nprint(os.getuid(), os.getgid())", [BatchInput(""), BatchInput("")],
                            timeout_s=30.0, stdout_cap=1000, single=alone)
    return runs, batch
runs, batch = asyncio.run(main())
box.close()
other.close()
pool = box._subids
print(json.dumps({{"trainer_uid": os.getuid(), "pool": [pool.uid_first, pool.gid_first, pool.count],
                  "iso": {{k: v for k, v in iso.items() if isinstance(v, (bool, str))}},
                  "runs": [[r.uid, r.exit_code, r.stdout, r.stderr[-300:]] for r in runs],
                  "batch": [[r.exit_code, r.stdout, r.stderr[-300:]] for r in batch]}}))
"""


def test_concurrent_runs_get_distinct_subordinate_uids(trainer: pwd.struct_passwd) -> None:
    report = _as(trainer, CONCURRENT.format(limits=LIMITS))
    first, gid_first, count = report["pool"]
    assert report["iso"]["unprivileged_uid"] is True and report["iso"]["zygote"] is True, report["iso"]
    assert "NEITHER" not in report["_stderr"], report["_stderr"]
    seen = []
    for uid, code, stdout, stderr in report["runs"]:
        assert code == 0, (stdout, stderr)
        inside_uid, inside_gid = map(int, stdout.split())
        assert inside_uid == uid and first <= uid < first + count, (uid, first, count)
        assert inside_gid == gid_first + uid - first, (inside_gid, gid_first)
        seen.append(uid)
    assert len(set(seen)) == len(seen) and report["trainer_uid"] not in seen, seen
    for code, stdout, stderr in report["batch"]:
        assert code == 0, (stdout, stderr)
        assert first <= int(stdout.split()[0]) < first + count, stdout


NO_SUBIDS = r"""
import json, logging, os
logging.basicConfig(level=logging.WARNING)
from agentboost.sandbox import Sandbox, SandboxConfig, SandboxUnavailable, uids
_, why = uids.subordinate_ids(1000)
try:
    Sandbox(SandboxConfig(require_separate_uid=True, **{limits!r}))
    refused = None
except SandboxUnavailable as exc:
    refused = str(exc)
box = Sandbox(SandboxConfig(**{limits!r}))
iso = box.isolation()
result = box.run_sync("import os\nprint(os.getuid())")
box.close()
print(json.dumps({{"why": why, "refused": refused, "uid_setup": iso["uid_setup"], "notes": iso["notes"],
                  "cgroup": iso["cgroup"], "unprivileged_uid": iso["unprivileged_uid"], "stdout": result.stdout}}))
"""


def test_without_subordinate_ids_the_warning_names_what_is_missing_and_require_separate_uid_refuses() -> None:
    """User nobody: no /etc/subuid entry (or no newuidmap on this host)."""
    report = as_ordinary_user(NO_SUBIDS.format(limits=LIMITS))
    why = report["why"]
    assert why and ("newuidmap" in why or "newgidmap" in why or "/etc/sub" in why), why
    if IS_ROOT and shutil.which("newuidmap", path=TOOLS) and shutil.which("newgidmap", path=TOOLS):
        assert why == "no /etc/subuid entry for nobody", why
    assert report["refused"] and why in report["refused"] and "require_separate_uid" in report["refused"], report
    assert report["unprivileged_uid"] is False and report["uid_setup"] == f"none: {why}", report
    assert f"no-separate-uid {why}" in report["notes"], report["notes"]
    assert int(report["stdout"]) == (NOBODY if IS_ROOT else os.getuid()), report
    if not report["cgroup"]:  # the one-line warning, naming what is missing
        lines = [line for line in report["_stderr"].splitlines() if "NEITHER a cgroup NOR a uid" in line]
        assert len(lines) == 1 and why in lines[0], report["_stderr"]


def test_subordinate_ids_name_what_is_missing(tmp_path: Path) -> None:
    """The host's grant read from /etc/subuid-style files: what is missing is named; the pool is the end of
    the first range, less its last two ids."""
    user = pwd.getpwuid(os.getuid()).pw_name
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text(f"someone:100000:65536\n{user}:200000:65536\n{user}:900000:10\n")
    subgid.write_text(f"{os.getuid()}:300000:5000\n")
    empty = tmp_path / "bin"
    empty.mkdir()
    ids, why = uids.subordinate_ids(1000, subuid=str(subuid), subgid=str(subgid), search=str(empty))
    assert ids is None and why == "newuidmap is not installed (Debian and Ubuntu: package uidmap)", why
    fake = empty / "newuidmap"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    ids, why = uids.subordinate_ids(1000, subuid=str(subuid), subgid=str(subgid), search=str(empty))
    assert ids is None and why == f"{fake} is not setuid root", why
    real = shutil.which("newuidmap", path=TOOLS)
    if real is None or not os.stat(real).st_mode & stat.S_ISUID:
        pytest.skip("newuidmap (setuid) is not installed here: the granted case is not checked")
    if pwd.getpwuid(os.getuid()).pw_gid != os.getgid():
        pytest.skip("this process's real gid is not its account's primary group")
    tools = os.path.dirname(real)
    ids, why = uids.subordinate_ids(1000, subuid=str(tmp_path / "none"), subgid=str(subgid), search=tools)
    assert ids is None and why == f"no {tmp_path / 'none'} entry for {user}", why
    ids, why = uids.subordinate_ids(1000, subuid=str(subuid), subgid=str(subgid), search=tools)
    assert ids is not None, why
    assert (ids.uid_first, ids.gid_first, ids.count) == (200000 + 65534 - 1000, 300000 + 4998 - 1000, 1000)
    assert ids.gid(ids.uid_first + 7) == ids.gid_first + 7
    whole, _ = uids.subordinate_ids(10**6, subuid=str(subuid), subgid=str(subgid), search=tools)
    assert whole is not None and whole.count == 5000  # the smaller range, whole (nothing spared)
    assert (whole.uid_first, whole.gid_first) == (200000 + 65536 - 5000, 300000)
