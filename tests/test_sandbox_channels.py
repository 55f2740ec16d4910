"""Channels between runs through what the host's kernel keeps for every run (as root and as an ordinary user).

The directory-lookup channel: a run that looks up a missing name in a directory bound from the host's
disk (``stat("/usr/lib/python3.11/.x17")``) leaves a negative dentry there; a later run times the same
lookup (about 6 µs uncached, 1.7 µs cached) and reads what the first wrote: on the root built from the
host's files, 20,000 bits in 0.1 s between two runs, 0.2% wrong, as root and as user nobody. A tmpfs keeps
no negative dentry, caches no ACL and holds every page in memory, so the runs' read-only files are bound
from a copy on one (:mod:`agentboost.sandbox.mirror`): every directory a run can look a name up in is on a
tmpfs (or is its own ``/proc``). ``benchmarks/lookup_channel.py`` measures the channel itself.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import shutil
import stat
import sys
import tempfile
import threading
import time

import pytest

from agentboost.sandbox import Sandbox, SandboxConfig
from agentboost.sandbox import mirror as mirror_module
from agentboost.sandbox.batch import BatchInput, run_batch
from agentboost.sandbox.mirror import mirror_for
from agentboost.sandbox.rootfs import plan_for
from tests.sandbox_users import as_ordinary_user

LIMITS = {"wall_s": 30, "cpu_s": 20, "memory_mb": 256, "max_processes": 16}

# Every mount of the run whose mount point is a directory, with its filesystem type, as JSON.
DIRECTORY_MOUNTS = r"""
import json, os
mounts = []
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    point, fstype = fields[4].replace("\\040", " "), fields[fields.index("-") + 1]
    if os.path.isdir(point):
        mounts.append([point, fstype])
print(json.dumps(mounts))
"""


def _skip_where_no_copy_can_be_made(notes: list[str]) -> None:
    """Skip on a host whose /dev/shm cannot hold the copy (absent, not a tmpfs, noexec, full: a small
    container); any other reason for no copy is a failure."""
    for note in notes:
        if note.startswith("no-memory-root") and any(
            why in note for why in ("no /dev/shm", "is not a tmpfs", "noexec", "read-only", "No space left")
        ):
            pytest.skip(f"this host cannot hold the copy: {note}")


def _on_disk(stdout: str) -> list[list[str]]:
    """The directory mounts that keep what a lookup leaves (anything but a tmpfs and the run's /proc)."""
    mounts = json.loads(stdout.strip().splitlines()[-1])
    assert any(point == "/usr/lib/python3.11" or "python3" in point for point, _ in mounts), mounts
    return [m for m in mounts if m[1] not in ("tmpfs", "proc")]


def test_every_directory_a_run_looks_names_up_in_keeps_no_trace_of_it() -> None:
    """Zygote run, started run and a batch input: the standard library and every other directory of the
    root is a tmpfs (the host's ext4 directories were bound before)."""
    box = Sandbox(SandboxConfig(**LIMITS))
    cold = Sandbox(SandboxConfig(zygote=False, **LIMITS))
    try:
        iso = box.isolation()
        if not iso["deny_by_default_fs"]:
            pytest.skip(f"no fresh root here: {iso['notes']}")
        _skip_where_no_copy_can_be_made(iso["notes"])
        assert iso["root_in_memory"] is True, iso["notes"]
        results = [box.run_sync(DIRECTORY_MOUNTS), cold.run_sync(DIRECTORY_MOUNTS)]

        async def alone(i: int):
            raise AssertionError(f"input {i} was not reported")

        results += asyncio.run(run_batch(box, DIRECTORY_MOUNTS, [BatchInput(""), BatchInput("")], timeout_s=30.0,
                                         stdout_cap=100_000, single=alone))  # fmt: skip
    finally:
        box.close()
        cold.close()
    for result in results:
        assert result.exit_code == 0, result
        assert _on_disk(result.stdout) == [], result.stdout


def test_as_an_ordinary_user_the_root_is_in_memory_too() -> None:
    script = f"""
import json
from agentboost.sandbox import Sandbox, SandboxConfig
box = Sandbox(SandboxConfig(**{LIMITS!r}))
iso = box.isolation()
result = box.run_sync({DIRECTORY_MOUNTS!r})
box.close()
print(json.dumps({{"iso": {{k: v for k, v in iso.items() if isinstance(v, bool)}}, "notes": iso["notes"],
                  "run": [result.exit_code, result.stdout, result.stderr[-500:]]}}))
"""
    report = as_ordinary_user(script)
    if not report["iso"]["deny_by_default_fs"]:
        pytest.skip(f"no fresh root for this user here: {report['notes']}")
    _skip_where_no_copy_can_be_made(report["notes"])
    assert report["iso"]["root_in_memory"] is True, report["notes"]
    code, stdout, _ = report["run"]
    assert code == 0, report
    assert _on_disk(stdout) == [], stdout


def test_the_copy_is_made_once_only_a_directory_of_this_uid_is_used_and_unused_ones_go(caplog) -> None:
    """Made once (workers starting together wait for one of them, later calls find it), file modes and
    times kept (set-id bits and write for others dropped), a directory of the copy's name that others
    may write is never used (a copy of its own is made instead); copies no process holds, made over an hour
    ago, are removed (before 148eb1e each stayed until a reboot: one more for every venv in a temporary
    directory, 132 MB each), those held or younger kept."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    base = tempfile.mkdtemp(prefix="agentboost-test-mirror-", dir="/dev/shm")
    holder = None
    try:
        plan = plan_for(os.path.realpath(sys.executable), site_packages=False)
        stale, held, young = (os.path.join(base, f"agentboost-root-{os.geteuid()}-{c * 24}") for c in "012")
        half = os.path.join(base, f"agentboost-root-{os.geteuid()}-x.building")
        long_ago = time.time() - 2 * mirror_module.SWEEP_AGE_S
        for directory in (stale, held, young, half):
            os.makedirs(directory + "/usr", mode=0o755)
            os.chmod(directory, 0o755)
            if directory != half:
                open(directory + ".lock", "w").close()
        for path in (stale + ".lock", held + ".lock", half):
            os.utime(path, (long_ago, long_ago))
        holder = os.open(held + ".lock", os.O_RDWR)
        fcntl.flock(holder, fcntl.LOCK_SH)  # (as another process using that copy holds it)
        with caplog.at_level(logging.INFO, logger=mirror_module.__name__):
            found: list[tuple[str | None, str]] = []
            workers = [threading.Thread(target=lambda: found.append(mirror_for(plan, base))) for _ in range(3)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
        first, why = found[0]
        if first is None:
            pytest.skip(f"no copy in memory here: {why}")
        assert found == [(first, "memory")] * 3
        assert len([r for r in caplog.records if "copied into memory" in r.getMessage()]) == 1  # (one copy made)
        left = {os.path.basename(p) for p in (first, held, young)}
        assert sorted(os.listdir(base)) == sorted(left | {n + ".lock" for n in left})  # (stale and half: gone)
        bound = next(str(op[1]) for op in plan.ops if op[0] == "ro" and op[2])
        some = next(p for p in (os.path.join(bound, n) for n in sorted(os.listdir(bound))) if os.path.isfile(p))
        host, copy = os.stat(some), os.stat(first + some)
        assert copy.st_mtime_ns == host.st_mtime_ns
        assert stat.S_IMODE(copy.st_mode) == stat.S_IMODE(host.st_mode) & 0o755
        assert copy.st_uid == os.geteuid() and not os.stat(first).st_mode & 0o022
        os.chmod(first, 0o777)  # (as another user's directory of that name would be: writable by others)
        own, _ = mirror_for(plan, base)  # a copy of its own instead (another user cannot turn the copy off)
        assert own is not None and own != first and os.path.isfile(own + some) and not os.stat(own).st_mode & 0o022
    finally:
        if holder is not None:
            os.close(holder)
        shutil.rmtree(base, ignore_errors=True)
