"""Sandbox isolation across processes and users: run identities, the deny-by-default root, the report.

Sandboxes of different worker processes must not kill each other's programs; a program must not read
host files outside its own view (datasets with gold answers), as root and as an ordinary user.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agentboost.sandbox import Sandbox, SandboxConfig
from agentboost.sandbox import report as report_module

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534
IS_ROOT = os.geteuid() == 0

# Imports this repository's sandbox package alone (stdlib only, under a bare ``agentboost`` package), so a
# system interpreter without agentboost's dependencies can run it.
_IMPORT = (
    "import sys, types\n"
    "pkg = types.ModuleType('agentboost'); pkg.__path__ = [{repo!r} + '/agentboost']; sys.modules['agentboost'] = pkg\n"
    "from agentboost.sandbox import Sandbox, SandboxConfig\n"
)


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# --- defect 11: run identities are unique across processes --------------------------------------
_WORKER = """
import asyncio, json, sys
from agentboost.sandbox import Sandbox, SandboxConfig

box = Sandbox(SandboxConfig(slots=2))
print(json.dumps({"isolation": box.isolation()}), flush=True)
role = sys.argv[1]


leased = box._lease_uid


async def lease_and_say(slot):  # the long run holds its uid from here on: the test says go to the short worker
    lease = await leased(slot)
    if role == "long":
        print(json.dumps({"leased": lease.uid}), flush=True)
    return lease


box._lease_uid = lease_and_say


async def main():
    if role == "long":
        return [await box.run("import time\\ntime.sleep(3)\\nprint('survived')", timeout_s=30)]
    sys.stdin.readline()  # go
    return [await box.run("print(1)") for _ in range(12)]


for r in asyncio.run(main()):
    print(json.dumps({"ok": r.ok, "stdout": r.stdout, "exit": r.exit_code, "signal": r.signal,
                      "uid": getattr(r, "uid", None)}), flush=True)
"""


@pytest.mark.skipif(not IS_ROOT, reason="run uids of their own need root (as non-root there is no cleanup by uid)")
def test_other_processes_runs_do_not_kill_a_running_program(tmp_path: Path) -> None:
    """Two worker processes, same SandboxConfig: runs finishing in one never kill a program of the other."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", _WORKER]
    common = {"cwd": tmp_path, "env": env, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    long = subprocess.Popen([*argv, "long"], **common)
    short = subprocess.Popen([*argv, "short"], stdin=subprocess.PIPE, **common)
    try:
        assert long.stdout is not None and short.stdout is not None and short.stdin is not None
        long_isolation = json.loads(long.stdout.readline())["isolation"]
        json.loads(short.stdout.readline())
        assert "leased" in json.loads(long.stdout.readline())  # the long program holds its uid now
        short.stdin.write("go\n")
        short.stdin.flush()
        short_out, short_err = short.communicate(timeout=60)
        long_out, long_err = long.communicate(timeout=60)
    finally:
        for proc in (long, short):
            if proc.poll() is None:
                proc.kill()
    shorts = _json_lines(short_out)
    [survivor] = [r for r in _json_lines(long_out) if "leased" not in r]
    assert len(shorts) == 12 and all(r["ok"] for r in shorts), short_err
    assert survivor["ok"] and survivor["stdout"] == "survived\n", (survivor, long_err)
    assert survivor["uid"] not in {r["uid"] for r in shorts}
    # the probe ran with its working directory under /tmp (a CI clone): that directory is hidden
    assert os.path.realpath(tmp_path) in long_isolation["hidden_paths"], long_isolation


def test_uid_leases_are_exclusive_until_released_or_the_holder_dies(tmp_path: Path) -> None:
    from agentboost.sandbox.uids import try_lease

    first = try_lease(tmp_path, 5000, 2)
    second = try_lease(tmp_path, 5000, 2)
    assert first is not None and second is not None and {first.uid, second.uid} == {5000, 5001}
    assert try_lease(tmp_path, 5000, 2) is None
    first.release()
    again = try_lease(tmp_path, 5000, 2)
    assert again is not None and again.uid == first.uid
    again.release()
    second.release()
    holder = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "import importlib.util, pathlib\n"
        f"spec = importlib.util.spec_from_file_location('uids', {str(REPO / 'agentboost/sandbox/uids.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['uids'] = m; spec.loader.exec_module(m)\n"
        f"lease = m.try_lease(pathlib.Path({str(tmp_path)!r}), 5000, 1)\n"
        "print(lease.uid, flush=True); import time; time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "5000"
        assert try_lease(tmp_path, 5000, 1) is None  # held by another process
    finally:
        proc.kill()
        proc.wait()
    freed = try_lease(tmp_path, 5000, 1)  # the holder died: the kernel dropped its lock
    assert freed is not None and freed.uid == 5000
    freed.release()


# --- defect 12: deny-by-default filesystem, as root and as an ordinary user ------------------------
def _gold_dir() -> Path:
    """A world-readable dataset outside every default hidden path, e.g. ``--data /var/tmp/...``."""
    gold = Path("/var/tmp") / f"agentboost-gold-{secrets.token_hex(6)}"
    gold.mkdir(mode=0o755)
    gold.chmod(0o755)
    (gold / "gold.jsonl").write_text('{"answer": "204"}\n')
    (gold / "gold.jsonl").chmod(0o644)
    return gold


_READER = """
import os
for path in ({gold!r}, '/etc/passwd'):
    try:
        print(open(path).read().strip())
    except OSError as e:
        print(type(e).__name__)
print(sorted(os.listdir('/')))
try:
    open('/owned', 'w')
    print('wrote /')
except OSError as e:
    print(type(e).__name__)
import ctypes, decimal, hashlib, json, sqlite3, ssl  # the standard library's extension modules load
print('stdlib ok')
print(os.getcwd())
"""


def test_deny_by_default_root_shows_nothing_else_of_the_host() -> None:
    box = Sandbox(SandboxConfig(hidden_paths=()))  # nothing named: protection must not depend on a list
    iso = box.isolation()
    if iso.get("mount_namespace") is False:
        pytest.skip(f"no mount namespace on this machine: {iso}")
    gold = _gold_dir()
    try:
        result = box.run_sync(_READER.format(gold=str(gold / "gold.jsonl")))
    finally:
        shutil.rmtree(gold)
    lines = result.stdout.splitlines()
    assert lines[0] == "FileNotFoundError" and lines[1] == "FileNotFoundError", result
    assert iso["deny_by_default_fs"] and iso["private_tmp"], iso
    on_the_way = {p.split("/")[1] for p in (*iso["visible_paths"], lines[5])}  # interpreter, libraries, workdir
    assert set(eval(lines[2])) <= {"dev", "proc", "tmp", *on_the_way}, lines[2]  # no /var, /home, working dir
    assert lines[3] in {"OSError", "PermissionError"} and lines[4] == "stdlib ok", result


def test_installed_packages_only_on_request_and_hidden_paths_inside_them() -> None:
    """``site_packages=True`` binds the interpreter's site-packages; a hidden path inside is still covered
    (rLLM's dataset registry lives inside site-packages)."""
    site = Path(pytest.importorskip("yaml").__file__).resolve().parent
    code = "import yaml\nprint('imported')"
    if not Sandbox(SandboxConfig()).isolation()["deny_by_default_fs"]:
        pytest.skip("no deny-by-default root on this machine")
    stdlib_only = Sandbox(SandboxConfig()).run_sync(code)
    assert "ModuleNotFoundError" in stdlib_only.stderr
    with_packages = Sandbox(SandboxConfig(site_packages=True, python=sys.executable))
    assert with_packages.run_sync(code).stdout == "imported\n"
    hiding = Sandbox(SandboxConfig(site_packages=True, python=sys.executable, hidden_paths=(str(site),)))
    assert str(site) in hiding.isolation()["hidden_paths"]
    listed = hiding.run_sync(f"import os\nprint(os.listdir({str(site)!r}))")
    assert listed.stdout == "[]\n", listed


@pytest.mark.parametrize("site_packages", [False, True], ids=["stdlib", "site"])
@pytest.mark.parametrize("copies", [False, True], ids=["symlink", "copy"])
def test_an_interpreter_under_tmp_runs_with_and_without_the_zygote(copies: bool, site_packages: bool) -> None:
    """Regression: CI may clone the repository (and its venv) under /tmp, which every run gets as a private
    tmpfs; the interpreter's binds, links and hidden paths there must go inside that tmpfs, not under it.
    ``copies``: the real binary lies under /tmp (else only the venv's link and site-packages do)."""
    venv = Path(tempfile.mkdtemp(prefix="agentboost-venv-", dir="/tmp"))
    try:
        venv.chmod(0o755)
        flags = ["--copies"] if copies else ["--symlinks"]
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", *flags, str(venv)], check=True, timeout=60)
        python = str(venv / "bin" / "python")
        site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        (site / "agentboost_probe_mod.py").write_text("VALUE = 'from the venv'\n")
        (site / "secret").mkdir()
        (site / "secret" / "gold.txt").write_text("gold\n")
        code = (
            "import os\nprint(1)\n"
            "try:\n    import agentboost_probe_mod\n    print(agentboost_probe_mod.VALUE)\n"
            "except ImportError:\n    print('no site')\n"
            f"print(os.listdir({str(site / 'secret')!r}) if os.path.isdir({str(site / 'secret')!r}) else 'absent')\n"
        )
        expected = "1\nfrom the venv\n[]\n" if site_packages else "1\nno site\nabsent\n"
        for zygote in (True, False):
            box = Sandbox(SandboxConfig(python=python, site_packages=site_packages, zygote=zygote,
                                        hidden_paths=(str(site / "secret"),)))  # fmt: skip
            try:
                iso = box.isolation()
                if not iso["deny_by_default_fs"]:
                    pytest.skip(f"no deny-by-default root on this machine: {iso['notes']}")
                if zygote and not iso["zygote"] and Sandbox(SandboxConfig()).isolation()["zygote"]:
                    pytest.fail(f"the zygote works here but not for an interpreter under /tmp: {iso['notes']}")
                result = box.run_sync(code)
            finally:
                box.close()
            assert (result.stdout, result.exit_code) == (expected, 0), (zygote, result)
    finally:
        shutil.rmtree(venv)


def test_without_a_fresh_root_the_hidden_paths_stay_covered_and_the_gap_is_named(caplog, monkeypatch) -> None:
    """Where the deny-by-default root cannot be built, runs fall back to the deny-list (every hidden path
    covered) and the missing layer is named at WARNING."""
    monkeypatch.setattr(report_module, "_logged", set())
    gold = _gold_dir()
    root = Path(tempfile.mkdtemp(prefix="agentboost-box-", dir="/var/tmp"))
    try:
        box = Sandbox(SandboxConfig(root=str(root), hidden_paths=(str(gold),)))
        box._stage.rmdir()  # no mount point for the fresh root: the kernel refuses it, as on a machine without
        with caplog.at_level(logging.INFO, logger=report_module.__name__):
            iso = box.isolation()
        if iso["mount_namespace"] is False:
            pytest.skip(f"no mount namespace on this machine: {iso}")
        result = box.run_sync(f"import os\nprint(os.listdir({str(gold)!r}))")
    finally:
        shutil.rmtree(gold)
        shutil.rmtree(root)
    assert iso["deny_by_default_fs"] is False and any("no-fresh-root" in n for n in iso["notes"]), iso
    assert iso["hidden_paths"] == [str(gold)] and result.stdout == "[]\n", (iso, result)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "deny_by_default_fs: the program sees this host's filesystem" in warnings[0]


_AS_USER = """
import json, os
gold = {gold!r}
direct = open(gold).read().strip()  # this user can read the dataset on the host
box = Sandbox()
iso = box.isolation()
result = box.run_sync("try:\\n    print(open(%r).read())\\nexcept OSError as e:\\n    print(type(e).__name__)" % gold)
listing = "import os\\ntry:\\n    print(os.listdir(%r))\\nexcept OSError as e:\\n    print(type(e).__name__)"
home = box.run_sync(listing % os.getcwd())
print(json.dumps({{"direct": direct, "iso": iso, "sandboxed": result.stdout.strip(), "cwd": os.getcwd(),
                  "cwd_listing": home.stdout.strip(), "stderr": result.stderr[-500:]}}))
"""


def _system_python() -> str | None:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(candidate) and os.access(candidate, os.X_OK):
            return os.path.realpath(candidate)
    return None


def _world_readable(path: Path) -> bool:
    """``path`` and every directory above it can be read by any user (the repository, for user nobody)."""
    return bool(os.stat(path).st_mode & stat.S_IROTH) and all(os.stat(p).st_mode & stat.S_IXOTH for p in path.parents)


def test_ordinary_user_gets_the_same_layers_and_cannot_read_the_dataset() -> None:
    """As root: the sandbox runs in a child as user nobody with a system interpreter (working directory
    under /tmp, like a CI clone). As another user: in a child as that user. Either way the namespaces come
    from an unprivileged user namespace, and a world-readable dataset outside the workdir stays unread."""
    if IS_ROOT:
        python, setpriv = _system_python(), shutil.which("setpriv")
        if python is None or setpriv is None:
            pytest.skip("running as user nobody needs setpriv and a system python")
        if not _world_readable(REPO / "agentboost" / "sandbox" / "sandbox.py"):
            pytest.skip(f"{REPO} is not readable by user nobody")
        prefix = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python]
    else:
        prefix = [sys.executable]
    gold = _gold_dir()
    cwd = Path(tempfile.mkdtemp(prefix="agentboost-ci-clone-", dir="/tmp"))
    cwd.chmod(0o777)
    (cwd / "train.jsonl").write_text('{"answer": "204"}\n')
    (cwd / "train.jsonl").chmod(0o644)
    try:
        script = _IMPORT.format(repo=str(REPO)) + _AS_USER.format(gold=str(gold / "gold.jsonl"))
        env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
        done = subprocess.run([*prefix, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(gold)
        shutil.rmtree(cwd)
    assert done.returncode == 0, done.stderr[-2000:]
    report = _json_lines(done.stdout)[-1]
    iso = report["iso"]
    if iso.get("namespaces") == "none":
        pytest.skip(f"neither root nor unprivileged user namespaces here: {iso['notes']}")
    assert report["direct"] == '{"answer": "204"}'
    assert report["sandboxed"] == "FileNotFoundError", report
    assert report["cwd_listing"] == "FileNotFoundError", report  # the working directory (a CI clone) is absent
    assert iso["namespaces"] == "user namespace" and iso["unprivileged_uid"] is False, iso
    for layer in ("network_namespace", "mount_namespace", "deny_by_default_fs", "private_tmp", "pid_namespace",
                  "private_proc"):  # fmt: skip
        assert iso[layer] is True, (layer, iso)
    assert os.path.realpath(report["cwd"]) in iso["hidden_paths"], iso


# --- the report --------------------------------------------------------------------------------------
def test_isolation_reports_every_layer_and_warns_once_naming_the_missing_ones(caplog, monkeypatch) -> None:
    monkeypatch.setattr(report_module, "_logged", set())
    config = SandboxConfig(isolate_network=False, pid_namespace=False)
    with caplog.at_level(logging.INFO, logger=report_module.__name__):
        partial = Sandbox(config).isolation()
        Sandbox(config).isolation()  # same situation, same process: not logged again
    assert all(isinstance(partial[k], bool) for k in report_module.LAYERS), partial
    assert partial["network_namespace"] is False and partial["pid_namespace"] is False
    assert partial["private_proc"] is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "network_namespace: the program has this host's network" in warnings[0]
    assert "pid_namespace:" in warnings[0] and "private_proc:" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=report_module.__name__):
        full = Sandbox().isolation()
    missing = [k for k in report_module.LAYERS if full[k] is False]
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    if not missing:
        assert [level for level, _ in messages] == [logging.INFO] and "all layers active" in messages[0][1]
    else:
        assert [level for level, _ in messages] == [logging.WARNING]
        assert all(f"{k}:" in messages[0][1] for k in missing)
    if not IS_ROOT and full["pid_namespace"]:
        assert set(missing) <= {"unprivileged_uid", "cgroup"} and "PID namespace is what stops it" in messages[0][1]
