"""Limits per run, not per process (issue 22, finding 4): a cgroup per run where the host allows one (cgroup v1
here and in CI, v2 on most clusters: tested with a fake hierarchy), a size- and inode-limited working
directory always. On b14b9f6 a 96 MiB run held 240 MiB in six processes, a run wrote 128 MiB into its
working directory with ``file_size_mb=16``, and eight busy processes of one run took eight times the CPU
of a neighbour's one.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from agentboost.sandbox import Sandbox, SandboxConfig
from tests.sandbox_users import IS_ROOT, as_ordinary_user

_HOLDERS = """
import os, sys, time
kids = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        try:
            held = bytearray(40 * 1024 * 1024)  # zero-filled: every page touched
            time.sleep(2)
        except MemoryError:
            os._exit(3)
        os._exit(0)
    kids.append(pid)
print(sum(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) == 0 for k in kids))
"""


def test_memory_is_the_whole_runs_not_each_processs() -> None:
    box = Sandbox(SandboxConfig(wall_s=30, cpu_s=20, memory_mb=96, max_processes=16))
    try:
        iso = box.isolation()
        if iso.get("cgroup") is False:
            pytest.skip(f"no cgroup for runs here ({iso['cgroup_setup']}); see the ordinary-user test")
        result = box.run_sync(_HOLDERS)
    finally:
        box.close()
    held = int(result.stdout.strip() or 0)
    assert held <= 2, (result, "six processes held 40 MiB each in a 96 MiB run")


_FILLER = """
import os
def fill(directory, count, mb):
    done = 0
    for i in range(count):
        try:
            with open(os.path.join(directory, f"big{i}"), "wb") as fh:
                for _ in range(mb):
                    fh.write(b"x" * (1 << 20))
                    done += 1
        except OSError:
            break
    return done
def files(directory, count):
    made = 0
    try:
        for i in range(count):
            open(os.path.join(directory, f"f{i}"), "w").close()
            made += 1
    except OSError:
        pass
    return made
print(fill(".", 8, 16), fill("/tmp", 8, 16), files("sub" if os.mkdir("sub") is None else ".", 10000))
"""


def _check_filled(stdout: str) -> None:
    workdir_mb, tmp_mb, files = map(int, stdout.split())
    assert workdir_mb <= 64 and tmp_mb <= 64, stdout  # tmp_mb=64 each, not 8 files of file_size_mb=16
    assert files <= 4096, stdout  # max_files


def test_the_working_directory_and_tmp_are_size_and_inode_limited() -> None:
    box = Sandbox(SandboxConfig(wall_s=60, cpu_s=30, memory_mb=512))  # tmp_mb=64, max_files=4096 by default
    try:
        if box.isolation().get("mount_namespace") is False:
            pytest.skip("no mount namespace here: the working directory is host storage (reported)")
        result = box.run_sync(_FILLER)
    finally:
        box.close()
    assert result.exit_code == 0, result
    _check_filled(result.stdout)
    assert box.isolation().get("workdir_tmpfs") is True


def test_as_an_ordinary_user_the_working_directory_is_limited_and_a_missing_cgroup_is_reported() -> None:
    script = (
        "import json\nfrom agentboost.sandbox import Sandbox, SandboxConfig\n"
        "box = Sandbox(SandboxConfig(wall_s=60, cpu_s=30, memory_mb=512))\n"
        f"r = box.run_sync({_FILLER!r})\n"
        "mem = box.run_sync('x = bytearray(2 * 1024 ** 3)')\n"
        "iso = box.isolation()\nbox.close()\n"
        "print(json.dumps({'out': r.stdout, 'err': r.stderr[-300:], 'iso': iso, 'mem': mem.stderr[-200:]}))\n"
    )
    report = as_ordinary_user(script)
    iso = report["iso"]
    if iso["namespaces"] == "none":
        pytest.skip(f"no namespaces as an ordinary user here: {iso['notes']}")
    _check_filled(report["out"])
    if iso["cgroup"] is False:  # reported, and the per-process limits still hold
        assert iso["cgroup_setup"] and "MemoryError" in report["mem"], report
        assert "cgroup: limits are per process, not per run" in report["_stderr"], report["_stderr"]


_BUSY = """
import os, time
def burn(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return time.process_time()
n = {n}
for _ in range(n - 1):
    if os.fork() == 0:
        os.setsid()  # a session (a scheduler autogroup) of its own: no way out of the run's CPU share
        print(burn(2.0), flush=True)
        os._exit(0)
print(burn(2.0), flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"""


def test_a_run_with_many_busy_processes_gets_the_cpu_of_one_run() -> None:
    """Equal CPU weight per run: eight busy processes of one run share what one busy process of a
    neighbour gets (compared with each other, so the machine's load does not matter)."""
    box = Sandbox(SandboxConfig(wall_s=30, cpu_s=20, max_processes=16))
    try:
        if box.isolation().get("cgroup") is False:
            pytest.skip(f"no cgroup for runs here ({box.isolation()['cgroup_setup']})")

        async def both() -> tuple[str, str]:
            many, one = await asyncio.gather(box.run(_BUSY.format(n=8)), box.run(_BUSY.format(n=1)))
            return many.stdout, one.stdout

        many, one = asyncio.run(both())
    finally:
        box.close()
    per_process = sum(map(float, many.split())) / 8  # (without a group each: about what the one process gets)
    assert len(many.split()) == 8 and float(one) >= 2.5 * per_process, (many, one)


def test_each_run_gets_a_group_of_its_own_with_the_configured_limits_and_they_are_removed_on_close() -> None:
    box = Sandbox(SandboxConfig(wall_s=30, memory_mb=200, max_processes=20, cpus=0.5))
    try:
        iso = box.isolation()
        if iso.get("cgroup") is False:
            pytest.skip(f"no cgroup for runs here ({iso['cgroup_setup']})")
        hierarchy = box._cgroups.hierarchy
        seen: list[dict[str, str]] = []

        async def watch() -> None:
            runs = [asyncio.ensure_future(box.run("import time\ntime.sleep(1.5)")) for _ in range(2)]
            await asyncio.sleep(0.8)
            seen.extend(_limits_of(hierarchy, box))
            await asyncio.gather(*runs)

        asyncio.run(watch())
        from agentboost.sandbox.workdir import janitor

        assert janitor().flush()
        parent = next(iter(hierarchy.parents.values()))
        left = [d for d in os.listdir(parent) if d.startswith("run-")]
    finally:
        box.close()
    busy = [s for s in seen if s["procs"]]
    assert len(busy) == 2, seen  # one group per run, each holding its run's processes
    for limits in busy:
        assert limits["memory"] == str(200 * 1024 * 1024) and limits["pids"] == "24", limits
        assert limits["cpu"] in ("50000", "50000 100000"), limits
    # kept (empty) for the next runs: at most one per run that ran at once, and the isolation probe's (its
    # processes may still be exiting when these two runs take their groups)
    assert len(left) <= 3
    assert not any(os.path.exists(p) for p in hierarchy.parents.values())  # closed: all of it removed


@pytest.fixture
def grouped_box():
    """A sandbox whose runs get cgroups (skips where the host gives none)."""
    box = Sandbox(SandboxConfig(wall_s=30))
    try:
        iso = box.isolation()
        if iso.get("cgroup") is False:
            pytest.skip(f"no cgroup for runs here ({iso['cgroup_setup']})")
        yield box
    finally:
        box.close()


def test_a_runs_group_is_reused_once_empty_and_never_while_a_process_is_in_it(grouped_box: Sandbox) -> None:
    import subprocess

    from agentboost.sandbox.workdir import janitor

    box = grouped_box
    cgroups = box._cgroups
    parent = next(iter(cgroups.hierarchy.parents.values()))

    def groups() -> set[str]:
        assert janitor().flush()
        return {d for d in os.listdir(parent) if d.startswith("run-")}

    assert box.run_sync("print(1)").stdout == "1\n"
    first = groups()  # (the isolation probe's group may be one more, if it came back after this run began)
    assert 1 <= len(first) <= 2
    for _ in range(3):
        assert box.run_sync("print(2)").stdout == "2\n"
        assert groups() == first  # no new group: one is reused run after run

    group = cgroups.take()
    assert group.name in first and group.empty()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        for directory in group.dirs:
            Path(directory, "cgroup.procs").write_text(str(sleeper.pid))
        assert not group.empty() and not cgroups.give_back(group)  # busy: not taken back
        assert cgroups.take().name != group.name  # a new one instead
    finally:
        sleeper.kill()
        sleeper.wait()
    assert group.empty() and cgroups.give_back(group)
    assert cgroups.take() is group


def test_an_empty_group_the_janitor_comes_to_late_is_still_reused(grouped_box: Sandbox) -> None:
    """On a loaded host the janitor reached a run's group more than a second after the run (busy removing
    an earlier working directory) and removed it, empty as it was: the next run made a new group."""
    import time

    from agentboost.sandbox.workdir import janitor

    box = grouped_box
    assert box.run_sync("print(1)").stdout == "1\n"
    assert janitor().flush()
    cgroups = box._cgroups
    group = cgroups.take()
    janitor().call(lambda: time.sleep(1.5), "a slow clean-up ahead of it")
    janitor().release_cgroup(group, cgroups)
    assert janitor().flush()
    assert any(free is group for _, free in cgroups._free)  # given back, not removed


def _limits_of(hierarchy, box: Sandbox) -> list[dict[str, str]]:
    out = []
    if hierarchy.version == 2:
        parent = hierarchy.parents["unified"]
        files = {"memory": "memory.max", "pids": "pids.max", "cpu": "cpu.max", "procs": "cgroup.procs"}
        for name in (n for n in os.listdir(parent) if n.startswith("run-")):
            out.append({k: Path(parent, name, f).read_text().strip() for k, f in files.items()})
        return out
    for name in (n for n in os.listdir(hierarchy.parents["memory"]) if n.startswith("run-")):

        def read(c: str, f: str, name: str = name) -> str:
            return Path(hierarchy.parents[c], name, f).read_text().strip()

        out.append({"memory": read("memory", "memory.limit_in_bytes"), "pids": read("pids", "pids.max"),
                    "cpu": read("cpu", "cpu.cfs_quota_us"), "procs": read("pids", "cgroup.procs")})  # fmt: skip
    return out


# --- the path selection and the limits, on a fake hierarchy (no root needed) -------------------------
def _fake_v2(tmp_path: Path, *, own_can_enable: bool) -> Path:
    """A directory laid out like a cgroup2 mount: the root, ``user.slice`` delegated to us (controllers
    handed down), and our own group ``user.slice/me`` holding our processes."""
    root = tmp_path / "cgroup2"
    me = root / "user.slice" / "me"
    me.mkdir(parents=True)
    for directory in (root, root / "user.slice", me):
        (directory / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (directory / "cgroup.procs").write_text("")
    (root / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (root / "user.slice" / "cgroup.subtree_control").write_text("cpu memory pids\n")
    if own_can_enable:
        (me / "cgroup.subtree_control").write_text("")
    else:  # as the kernel refuses (EBUSY) for a group that holds processes: not writable at all here
        (me / "cgroup.subtree_control").mkdir()
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(
        f"30 1 0:26 / {root} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
        f"31 1 0:27 / {tmp_path}/v1mem rw,nosuid - cgroup cgroup rw,memory\n"  # (a v1 memory hierarchy too)
    )
    (proc / "cgroup").write_text("0::/user.slice/me\n")
    return proc


def test_cgroup_v2_is_chosen_where_mounted_and_runs_get_its_limits(tmp_path: Path) -> None:
    from agentboost.sandbox import cgroups as cg

    proc = _fake_v2(tmp_path, own_can_enable=False)
    hierarchy, why = cg.find(proc=str(proc), tag="agentboost-1-test", weight=16)
    assert hierarchy is not None, why
    ours = tmp_path / "cgroup2" / "user.slice" / "agentboost-1-test"  # beside our own group, in the delegation
    assert hierarchy.version == 2 and hierarchy.parents == {"unified": str(ours)}
    assert hierarchy.controllers == ("memory", "pids", "cpu")
    assert (ours / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (ours / "cpu.weight").read_text() == "1600"  # as much CPU as 16 busy processes
    group = hierarchy.make(cg.RunLimits(memory_bytes=64 << 20, pids=36, cpus=1.5))
    run = ours / group.name
    written = {f: (run / f).read_text() for f in ("memory.max", "pids.max", "cpu.weight", "cpu.max")}
    assert written == {"memory.max": str(64 << 20), "pids.max": "36", "cpu.weight": "100", "cpu.max": "150000 100000"}
    assert group.procs == [str(run / "cgroup.procs")]
    unlimited = hierarchy.make(cg.RunLimits(memory_bytes=1 << 30, pids=10, cpus=None))
    assert (ours / unlimited.name / "cpu.max").read_text() == "max 100000"
    for made in (run, ours / unlimited.name):
        for f in made.iterdir():
            f.unlink()  # (a real group's files go with it)
    assert group.remove() and unlimited.remove() and not run.exists()


def test_cgroup_v2_in_the_root_group_and_under_a_configured_base(tmp_path: Path) -> None:
    from agentboost.sandbox import cgroups as cg

    proc = _fake_v2(tmp_path, own_can_enable=True)
    hierarchy, why = cg.find(proc=str(proc), tag="agentboost-2-test")
    assert hierarchy is not None and hierarchy.parents["unified"].endswith("user.slice/me/agentboost-2-test"), why
    assert (tmp_path / "cgroup2" / "user.slice" / "me" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    explicit, why = cg.find(str(tmp_path / "cgroup2" / "user.slice"), proc=str(proc), tag="agentboost-3-test")
    assert explicit is not None and explicit.parents["unified"] == str(
        tmp_path / "cgroup2/user.slice/agentboost-3-test"
    )
    assert cg.find("none", proc=str(proc)) == (None, "SandboxConfig(cgroup='none')")


def test_where_no_cgroup_can_be_made_find_says_why(tmp_path: Path) -> None:
    from agentboost.sandbox import cgroups as cg

    proc = _fake_v2(tmp_path, own_can_enable=False)
    (tmp_path / "cgroup2" / "user.slice" / "cgroup.subtree_control").write_text("cpu\n")  # memory not handed down
    hierarchy, why = cg.find(proc=str(proc), tag="agentboost-4-test")
    assert hierarchy is None and "cgroup v2" in why and "cgroup v1" in why, why


def test_cgroup_v1_hierarchies_are_used_where_mounted_that_way(tmp_path: Path) -> None:
    from agentboost.sandbox import cgroups as cg

    proc = tmp_path / "proc"
    proc.mkdir()
    lines = []
    for i, controller in enumerate(("memory", "pids", "cpu,cpuacct")):
        mount = tmp_path / controller
        mount.mkdir()
        lines.append(f"{40 + i} 1 0:{30 + i} /box {mount} rw - cgroup cgroup rw,{controller}")
    (proc / "mountinfo").write_text("\n".join(lines) + "\n")
    (proc / "cgroup").write_text("5:memory:/box/me\n4:pids:/box\n3:cpu,cpuacct:/box\n0::/\n")
    (tmp_path / "memory" / "me").mkdir()  # (the mounts' root is /box: our paths are relative to it)
    hierarchy, why = cg.find(proc=str(proc), tag="agentboost-5-test", weight=4)
    assert hierarchy is not None and hierarchy.version == 1, why
    assert hierarchy.parents == {"memory": str(tmp_path / "memory/me/agentboost-5-test"),
                                 "pids": str(tmp_path / "pids/agentboost-5-test"),
                                 "cpu": str(tmp_path / "cpu,cpuacct/agentboost-5-test")}  # fmt: skip
    assert (tmp_path / "cpu,cpuacct/agentboost-5-test/cpu.shares").read_text() == "4096"
    group = hierarchy.make(cg.RunLimits(memory_bytes=1 << 26, pids=12, cpus=2.0))
    read = lambda c, f: Path(hierarchy.parents[c], group.name, f).read_text()  # noqa: E731
    assert (read("memory", "memory.limit_in_bytes"), read("pids", "pids.max")) == (str(1 << 26), "12")
    assert (read("cpu", "cpu.shares"), read("cpu", "cpu.cfs_quota_us")) == ("1024", "200000")
    assert len(group.procs) == 3


@pytest.mark.skipif(not IS_ROOT, reason="a sandbox writes its launcher into the groups it makes: root, here")
def test_a_sandbox_under_a_configured_v2_base_makes_a_group_per_run_and_the_launcher_joins_it(tmp_path: Path) -> None:
    proc = _fake_v2(tmp_path, own_can_enable=True)
    base = tmp_path / "cgroup2" / "user.slice"
    box = Sandbox(SandboxConfig(cgroup=str(base), memory_mb=128, max_processes=8))
    try:
        iso = box.isolation()  # the fake groups hold nobody really: reported so, and the run still runs
        assert iso["cgroup"] is False and iso["cgroup_setup"].startswith("cgroup v2 ("), iso
        ours = next(base.glob("agentboost-*"))
        runs = sorted(ours.glob("run-*"))
        assert runs and all((r / "memory.max").read_text() == str(128 << 20) for r in runs)
        assert any((r / "cgroup.procs").read_text() == "0" for r in runs)  # the launcher asked to join
        assert box.run_sync("print(1)").stdout == "1\n"
    finally:
        box.close()
    del proc


def test_a_forked_copy_of_a_sandbox_never_hands_out_the_groups_its_parent_keeps(grouped_box: Sandbox) -> None:
    box = grouped_box
    from agentboost.sandbox.workdir import janitor

    assert box.run_sync("print(1)").stdout == "1\n"
    assert janitor().flush()
    kept = {group.name for _, group in box._cgroups._free}
    assert kept
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read)
        try:
            name = box._cgroups.take().name
            os.write(write, name.encode())
            box._cgroups.give_back(box._cgroups.take())
        finally:
            os._exit(0)
    os.close(write)
    taken = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(child, 0)
    assert taken and taken not in kept  # a group of its own, not one the parent will hand out
    assert {group.name for _, group in box._cgroups._free} == kept
