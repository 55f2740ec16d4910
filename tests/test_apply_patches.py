"""apply_patches.py on a fake installed tree: rLLM and veRL dist-info + the target modules, for each supported
stack (rLLM v0.2.1.post1 + veRL 0.6.1, rLLM v0.3.0-pre + veRL 0.7.1), mixed pairs and other versions."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from agentboost import patching

REPO = Path(__file__).resolve().parent.parent

ENGINE = '''"""fake rllm.engine.agent_execution_engine"""
class AsyncAgentExecutionEngine:
    def __init__(self, *args, **kwargs):
        self.agent_class = kwargs.get("agent_class")
        self.env_class = kwargs.get("env_class")
'''
TRAINER = '''"""fake rllm.trainer.verl.agent_ppo_trainer"""
class DataProto: pass
def compute_advantage(data, **kw): return data
def compute_data_metrics(batch, use_critic=False): return {}
class AgentPPOTrainer:
    pass
'''
SERVER = '''"""fake verl vllm_async_server"""
from pydantic import BaseModel
class TokenOutput(BaseModel):
    token_ids: list[int]
    log_probs: list[float] | None = None
class SamplingParams: pass
class TokensPrompt: pass
class vLLMHttpServerBase:
    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None): ...
    async def wake_up(self): ...
'''


def make_tree(
    root: Path, rllm_version: str | None = "0.2.1", verl_version: str | None = "0.6.1", *, rllm_files: bool = True
) -> dict[str, Path]:
    """Fake installs (a version of None leaves that package out). Each release's files differ (a version line),
    as the real ones do; ``rllm_files=False`` is an rLLM without the legacy engine and trainer (main after the tag)."""
    versions = {"rllm": rllm_version, "verl": verl_version}
    files = {
        "rllm/engine/agent_execution_engine.py": ENGINE,
        "rllm/trainer/verl/agent_ppo_trainer.py": TRAINER,
        "verl/workers/rollout/vllm_rollout/vllm_async_server.py": SERVER,
    }
    paths = {}
    for rel, upstream in files.items():
        dist = rel.split("/")[0]
        if versions[dist] is None or (dist == "rllm" and not rllm_files):
            continue
        text = upstream if versions[dist] in ("0.2.1", "0.6.1") else upstream + f"# fake {dist} {versions[dist]}\n"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if str(parent) != ".":
                (root / parent / "__init__.py").touch()
        path.write_bytes(text.encode())
        paths[rel] = path
    for name, version in versions.items():
        if version is None:
            continue
        info = root / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return paths


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """apply_patches.py over the fake installs under ``root`` only: ``-S`` keeps a real rLLM/veRL in
    site-packages out of sight (a package absent from the fake tree must not resolve to the real one,
    which these tests would then patch or revert)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    return subprocess.run([sys.executable, "-S", str(REPO / "apply_patches.py"), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}  # fmt: skip


def test_refuses_unknown_files_and_wrong_versions_changing_nothing(tmp_path) -> None:
    make_tree(tmp_path)
    before = snapshot(tmp_path)
    result = run(tmp_path)
    assert result.returncode == 2 and "not the upstream file" in result.stderr and "--force" in result.stderr
    assert snapshot(tmp_path) == before

    other = tmp_path / "other"
    other.mkdir()
    make_tree(other, verl_version="0.7.0")
    before = snapshot(other)
    result = run(other, "--force")  # --force never accepts an unsupported version
    assert (
        result.returncode == 2 and "verl 0.7.0 is installed" in result.stderr and "Nothing was changed" in result.stderr
    )
    assert snapshot(other) == before  # the rLLM targets, checked first, were not touched either


def test_apply_is_idempotent_check_reports_and_revert_restores_bytes(tmp_path) -> None:
    paths = make_tree(tmp_path)
    originals = {rel: p.read_bytes() for rel, p in paths.items()}
    assert run(tmp_path, "--check").returncode == 1

    result = run(tmp_path, "--force")
    assert result.returncode == 0, result.stderr
    patched = snapshot(tmp_path)
    for rel, path in paths.items():
        data = path.read_bytes()
        assert data.startswith(originals[rel]) and data.count(patching.BEGIN.encode()) == 1
        assert Path(str(path) + patching.BACKUP_SUFFIX).read_bytes() == originals[rel]
    check = run(tmp_path, "--check")
    assert check.returncode == 0 and check.stderr.count("patched") == 3

    again = run(tmp_path, "--force")
    assert again.returncode == 0 and "already patched" in again.stderr
    assert snapshot(tmp_path) == patched  # files and backups untouched

    # the patched modules import and install the adapters (upstream classes subclassed, functions wrapped)
    code = (
        "import rllm.engine.agent_execution_engine as e, rllm.trainer.verl.agent_ppo_trainer as t\n"
        "import verl.workers.rollout.vllm_rollout.vllm_async_server as s\n"
        "assert e.AsyncAgentExecutionEngine is not e.UpstreamAsyncAgentExecutionEngine\n"
        "assert issubclass(t.AgentPPOTrainer, t.UpstreamAgentPPOTrainer)\n"
        "assert s.vLLMHttpServerBase._agentboost_installed and 'StrandsTokenOutput' in dir(s)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.stdout.strip() == "ok", out.stderr

    result = run(tmp_path, "--revert")
    assert result.returncode == 0, result.stderr
    for rel, path in paths.items():
        assert path.read_bytes() == originals[rel]
        assert not Path(str(path) + patching.BACKUP_SUFFIX).exists()
    assert run(tmp_path, "--check").returncode == 1
    assert run(tmp_path, "--revert").returncode == 0  # reverting a clean tree is a no-op


def test_known_upstream_hash_needs_no_force(tmp_path) -> None:
    paths = make_tree(tmp_path)
    path = paths["rllm/engine/agent_execution_engine.py"]
    target = patching.TARGETS[0]
    known = patching.Target(**{**target.__dict__, "known_sha256": (patching.sha256(path.read_bytes()),)})
    plan = patching.plan(patching.Located(known, "0.2.1", path), revert=False, force=False)
    assert plan.new is not None and plan.new.startswith(path.read_bytes())


def test_outdated_block_is_upgraded_and_damaged_file_refused(tmp_path, monkeypatch) -> None:
    paths = make_tree(tmp_path)
    path = paths["rllm/engine/agent_execution_engine.py"]
    original = path.read_bytes()
    target = patching.TARGETS[0]

    def block_v0(target: patching.Target, original: bytes) -> bytes:
        return patching.block_for(target, original).replace(b"adapter v1 ", b"adapter v0 ")

    old_block = block_v0(target, original)
    path.write_bytes(original + old_block)
    located = patching.Located(target, "0.2.1", path)
    # an old block that this agentboost cannot reproduce cannot be told apart from an edited one
    assert patching.parse(target, path.read_bytes()).state is patching.State.MODIFIED
    with pytest.raises(patching.PatchError, match="cannot verify"):
        patching.plan(located, revert=False, force=False)

    monkeypatch.setitem(patching.BLOCK_RENDERERS, 0, block_v0)
    plan = patching.plan(located, revert=False, force=True)
    assert plan.state is patching.State.OUTDATED
    assert plan.new == original + patching.block_for(target, original)
    path.write_bytes(original + old_block.replace(b"else:", b"else:  # tuned by hand"))
    assert patching.parse(target, path.read_bytes()).state is patching.State.MODIFIED

    path.write_bytes(b"# edited by hand\n" + original + old_block)
    with pytest.raises(patching.PatchError, match="does not match its recorded original"):
        patching.plan(located, revert=False, force=True)


def _plans(paths: dict[str, Path]) -> list[patching.Plan]:
    return [
        patching.plan(patching.Located(t, v, paths[t.relpath]), revert=False, force=True)
        for t, v in zip(patching.STACKS[0].targets, ("0.2.1", "0.2.1", "0.6.1"), strict=True)
    ]


def _backups(root: Path) -> list[Path]:
    return sorted(root.rglob("*" + patching.BACKUP_SUFFIX))


def test_a_failed_write_rolls_back_the_targets_already_written(tmp_path, monkeypatch) -> None:
    paths = make_tree(tmp_path)
    originals = {rel: p.read_bytes() for rel, p in paths.items()}
    plans = _plans(paths)
    real = patching._write_atomic
    calls = {"n": 0}

    def flaky(path: Path, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        real(path, data)

    monkeypatch.setattr(patching, "_write_atomic", flaky)
    with pytest.raises(patching.WriteFailed, match="disk full.*every file was restored"):
        patching.execute(plans, revert=False)
    monkeypatch.setattr(patching, "_write_atomic", real)
    for rel, path in paths.items():
        assert path.read_bytes() == originals[rel]
    assert _backups(tmp_path) == []  # issue 23: the backups of that run stayed beside clean files


@pytest.mark.parametrize("failing", [1, 2, 3])
def test_a_failure_after_the_replace_rolls_that_file_back_too(tmp_path, monkeypatch, failing: int) -> None:
    """Issue 23: removing the old bytecode (after os.replace) raised an OSError that left that file patched
    while the others rolled back."""
    paths = make_tree(tmp_path)
    originals = {rel: p.read_bytes() for rel, p in paths.items()}
    real = patching._drop_bytecode
    calls = {"n": 0}

    def flaky(path: Path) -> None:
        calls["n"] += 1
        if calls["n"] == failing:
            raise PermissionError(13, "Permission denied", str(path.parent / "__pycache__"))
        real(path)

    monkeypatch.setattr(patching, "_drop_bytecode", flaky)
    with pytest.raises(patching.WriteFailed, match="Permission denied.*every file was restored"):
        patching.execute(_plans(paths), revert=False)
    assert {rel: p.read_bytes() for rel, p in paths.items()} == originals
    assert _backups(tmp_path) == []


def test_a_failed_revert_keeps_every_file_patched_and_its_backup(tmp_path, monkeypatch) -> None:
    paths = make_tree(tmp_path)
    patching.execute(_plans(paths), revert=False)
    patched = snapshot(tmp_path)
    plans = [patching.plan(patching.Located(p.located.target, p.located.version, p.located.path), revert=True,
                           force=False) for p in _plans(paths)]  # fmt: skip
    real = patching._drop_bytecode
    calls = {"n": 0}

    def flaky(path: Path) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("read-only file system")
        real(path)

    monkeypatch.setattr(patching, "_drop_bytecode", flaky)
    with pytest.raises(patching.WriteFailed, match="reverting failed"):
        patching.execute(plans, revert=True)
    assert snapshot(tmp_path) == patched  # backups included


def test_a_write_failure_is_one_line_exit_3_and_changes_nothing(tmp_path) -> None:
    """Through the script, as a user runs it: no traceback, nothing half-applied."""
    make_tree(tmp_path)
    engine = tmp_path / "rllm/engine/agent_execution_engine.py"
    before = snapshot(tmp_path)
    cache = engine.parent / "__pycache__"
    cache.mkdir()
    (cache / "agent_execution_engine.cpython-311.pyc").mkdir()  # unlink() of a directory: an OSError
    (cache / "agent_execution_engine.cpython-311.pyc" / "x").write_text("")
    result = run(tmp_path, "--force")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and "every file was restored" in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("apply_patches:")]
    assert "agent_execution_engine" in error
    assert snapshot(tmp_path) == before  # the targets as they were, and no backups


def test_check_calls_an_edited_unpatched_file_unknown(tmp_path, monkeypatch, caplog) -> None:
    """Issue 23: --check said "clean" for a target whose contents are not its release's upstream file."""
    paths = make_tree(tmp_path)
    known_upstream(monkeypatch, tmp_path, paths)
    caplog.set_level(logging.INFO, logger="agentboost.patching")
    assert patching.main(["--check"]) == 1
    assert set(states(caplog).values()) == {"clean"}
    engine = paths["rllm/engine/agent_execution_engine.py"]
    engine.write_bytes(engine.read_bytes() + b"# edited by hand\n")
    caplog.clear()
    assert patching.main(["--check"]) == 1
    assert states(caplog)["rllm.engine.agent_execution_engine"] == "unknown"
    assert states(caplog)["rllm.trainer.verl.agent_ppo_trainer"] == "clean"
    assert "applying needs --force" in caplog.text


def test_the_v021_tag_is_refused_naming_post1_and_force(tmp_path, monkeypatch, caplog) -> None:
    """Issue 23: rLLM's v0.2.1 tag reports 0.2.1 like v0.2.1.post1; its engine differs. The refusal says so."""
    paths = make_tree(tmp_path)
    known_upstream(monkeypatch, tmp_path, paths)
    engine = paths["rllm/engine/agent_execution_engine.py"]
    engine.write_bytes(engine.read_bytes().replace(b"fake rllm", b"fake rllm v0.2.1 tag"))
    before = snapshot(tmp_path)
    caplog.set_level(logging.INFO, logger="agentboost.patching")
    assert patching.main([]) == 2
    assert "v0.2.1 tag reports the same version (0.2.1) as v0.2.1.post1" in caplog.text
    assert "@v0.2.1.post1" in caplog.text and "--force" in caplog.text
    assert snapshot(tmp_path) == before


def test_patched_module_still_imports_without_agentboost(tmp_path) -> None:
    paths = make_tree(tmp_path)
    assert run(tmp_path, "--force").returncode == 0
    shadow = tmp_path / "shadow"  # a modified_rllm_files that cannot be imported
    (shadow / "modified_rllm_files").mkdir(parents=True)
    (shadow / "modified_rllm_files" / "__init__.py").write_text("raise ImportError('agentboost removed')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(tmp_path)])}
    code = "import rllm.engine.agent_execution_engine as e; print(hasattr(e, 'UpstreamAsyncAgentExecutionEngine'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=shadow, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False"  # upstream behaviour, with a warning
    assert "adapter modified_rllm_files.agent_execution_engine not loaded" in out.stderr
    assert paths


def known_upstream(monkeypatch, root: Path, paths: dict[str, Path], stack: int | None = None) -> None:
    """The fake files become the known upstream ones of every stack, or of ``stack`` only (so --force is not
    needed), and the fake tree is importable."""

    def known(s: patching.Stack) -> patching.Stack:
        targets = tuple(
            dataclasses.replace(t, known_sha256=(patching.sha256(paths[t.relpath].read_bytes()),)) for t in s.targets
        )
        return dataclasses.replace(s, targets=targets)

    stacks = tuple(known(s) if stack in (None, i) else s for i, s in enumerate(patching.STACKS))
    monkeypatch.setattr(patching, "STACKS", stacks)
    monkeypatch.syspath_prepend(str(root))


def test_code_added_after_patching_is_reported_refused_and_reverted(tmp_path, monkeypatch, caplog) -> None:
    """Issue 14/19a: appended or edited code passed --check and a re-apply silently dropped it."""
    paths = make_tree(tmp_path)
    originals = {rel: p.read_bytes() for rel, p in paths.items()}
    known_upstream(monkeypatch, tmp_path, paths)
    caplog.set_level(logging.INFO, logger="agentboost.patching")
    assert patching.main([]) == 0
    patched = {rel: p.read_bytes() for rel, p in paths.items()}
    engine = paths["rllm/engine/agent_execution_engine.py"]
    server = paths["verl/workers/rollout/vllm_rollout/vllm_async_server.py"]

    def edit() -> None:
        engine.write_bytes(patched["rllm/engine/agent_execution_engine.py"] + b"\nLOCAL_FIX = 1  # added by hand\n")
        server_patched = patched["verl/workers/rollout/vllm_rollout/vllm_async_server.py"]
        server.write_bytes(server_patched.replace(b"    _agentboost_install(globals())\n", b"    pass\n"))

    edit()
    caplog.clear()
    assert patching.main(["--check"]) == 1
    rows = {line.split()[0]: line.split()[1] for line in caplog.messages if line.startswith(("rllm.", "verl."))}
    assert rows == {
        "rllm.engine.agent_execution_engine": "modified",
        "rllm.trainer.verl.agent_ppo_trainer": "patched",
        "verl.workers.rollout.vllm_rollout.vllm_async_server": "modified",
    }
    assert "LOCAL_FIX = 1" in caplog.text and "-    _agentboost_install(globals())" in caplog.text

    before = snapshot(tmp_path)
    caplog.clear()
    assert patching.main([]) == 2  # refused: a re-apply would drop the change
    assert snapshot(tmp_path) == before
    error = caplog.text
    assert f"{engine} was changed after agentboost patched it" in error and "LOCAL_FIX = 1" in error
    assert f"{server} was changed after agentboost patched it" in error and "+    pass" in error
    assert "--force" in error

    assert patching.main(["--force"]) == 0  # discards the changes, with a warning
    assert {rel: p.read_bytes() for rel, p in paths.items()} == patched
    edit()
    assert patching.main(["--revert"]) == 0  # the marker's sha256 still identifies the original bytes
    assert {rel: p.read_bytes() for rel, p in paths.items()} == originals
    assert not any(Path(str(p) + patching.BACKUP_SUFFIX).exists() for p in paths.values())

    # the whole file is compared: code inserted before the block, or a second block, is a change too
    target, original = patching.TARGETS[0], originals["rllm/engine/agent_execution_engine.py"]
    block = patching.block_for(target, original)
    assert patching.parse(target, original + block).state is patching.State.PATCHED
    assert patching.parse(target, original + b"X = 1\n" + block).state is patching.State.MODIFIED
    assert patching.parse(target, original + block + block).state is patching.State.MODIFIED


def test_refuses_an_interpreter_that_finds_agentboost_only_in_the_checkout(tmp_path) -> None:
    """Issue 14/19b: run from the checkout, the import check passed on sys.path[0] while Ray workers could not
    import agentboost and silently ran upstream code."""
    site = tmp_path / "site"
    paths = make_tree(site)
    bare = tmp_path / "bare"  # an interpreter without agentboost installed
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(bare)
    python = bare / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    env = {**os.environ, "PYTHONPATH": str(site)}  # rLLM and veRL visible; agentboost only next to the script

    def apply(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), str(REPO / "apply_patches.py"), *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    before = snapshot(site)
    result = apply("--force")
    assert result.returncode == 2, result.stderr
    assert "cannot import agentboost" in result.stderr and "Ray workers" in result.stderr
    assert f"{python} -m pip install -e {REPO}" in result.stderr
    assert snapshot(site) == before
    assert apply("--check").returncode == 1

    site_packages = next(bare.glob("lib/python3*/site-packages"), None) or bare / "Lib" / "site-packages"
    (site_packages / "agentboost-checkout.pth").write_text(f"{REPO}\n")  # what `pip install -e .` amounts to here
    result = apply("--force")
    assert result.returncode == 0, result.stderr
    assert all(patching.BEGIN.encode() in p.read_bytes() for p in paths.values())
    assert apply("--check").returncode == 0


@pytest.mark.parametrize(("absent", "present"), [("verl", "rllm"), ("rllm", "verl")])
def test_a_missing_package_error_names_the_only_rerun(tmp_path, absent: str, present: str) -> None:
    """Issue 14/19c: --revert with one package absent did not say how to act on the other alone."""
    make_tree(tmp_path, **{f"{absent}_version": None})
    before = snapshot(tmp_path)
    result = run(tmp_path, "--revert")
    assert result.returncode == 2 and f"{absent} is not installed" in result.stderr
    assert f"--revert --only {present}" in result.stderr
    assert snapshot(tmp_path) == before
    assert run(tmp_path, "--revert", "--only", present).returncode == 0


# -- rLLM v0.3.0-pre + veRL 0.7.1, mixed pairs, other versions -------------------------------------------------
RLLM_030, VERL_071 = "0.3.0rc0", "0.7.1"  # what the v0.3.0-pre tag and verl 0.7.1 report as installed versions
SERVER_REL = "verl/workers/rollout/vllm_rollout/vllm_async_server.py"


def states(caplog) -> dict[str, str]:
    """The state column of --check's target rows."""
    rows = [line.split() for line in caplog.messages if line.startswith(("rllm.", "verl."))]
    return {row[0]: row[1] for row in rows if not row[0].endswith(":")}


def test_rllm030_stack_patches_rllm_only_and_reverts_byte_for_byte(tmp_path, monkeypatch, caplog) -> None:
    paths = make_tree(tmp_path, RLLM_030, VERL_071)
    originals = {rel: p.read_bytes() for rel, p in paths.items()}
    known_upstream(monkeypatch, tmp_path, paths)
    caplog.set_level(logging.INFO, logger="agentboost.patching")
    assert patching.main(["--check"]) == 1
    assert states(caplog) == {
        "rllm.engine.agent_execution_engine": "clean",
        "rllm.trainer.verl.agent_ppo_trainer": "clean",
    }
    assert "verl.workers.rollout.vllm_rollout.vllm_async_server: not patched" in caplog.text

    caplog.clear()
    assert patching.main([]) == 0
    assert "stack: rLLM v0.3.0-pre + verl 0.7.1" in caplog.text
    assert "verl 0.7.1's server honours max_tokens" in caplog.text
    assert paths[SERVER_REL].read_bytes() == originals[SERVER_REL]  # veRL 0.7.1 is left alone
    assert not Path(str(paths[SERVER_REL]) + patching.BACKUP_SUFFIX).exists()
    for rel in ("rllm/engine/agent_execution_engine.py", "rllm/trainer/verl/agent_ppo_trainer.py"):
        data = paths[rel].read_bytes()
        assert data.startswith(originals[rel]) and data.count(patching.BEGIN.encode()) == 1
        assert Path(str(paths[rel]) + patching.BACKUP_SUFFIX).read_bytes() == originals[rel]
    patched = snapshot(tmp_path)

    caplog.clear()
    assert patching.main(["--check"]) == 0
    assert set(states(caplog).values()) == {"patched"} and len(states(caplog)) == 2
    caplog.clear()
    assert patching.main([]) == 0 and caplog.text.count("already patched") == 2  # idempotent
    assert snapshot(tmp_path) == patched

    code = (
        "import rllm.engine.agent_execution_engine as e, rllm.trainer.verl.agent_ppo_trainer as t\n"
        "assert e.AsyncAgentExecutionEngine is not e.UpstreamAsyncAgentExecutionEngine\n"
        "assert issubclass(t.AgentPPOTrainer, t.UpstreamAgentPPOTrainer)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.stdout.strip() == "ok", out.stderr

    assert patching.main(["--revert"]) == 0
    assert {rel: p.read_bytes() for rel, p in paths.items()} == originals
    assert not any(Path(str(p) + patching.BACKUP_SUFFIX).exists() for p in paths.values())
    assert patching.main(["--only", "verl"]) == 0  # nothing of veRL 0.7.1 to patch
    assert {rel: p.read_bytes() for rel, p in paths.items()} == originals


def test_each_release_is_checked_against_its_own_files(tmp_path, monkeypatch, caplog) -> None:
    """The same path is a different file in each release: the v0.2.1.post1 engine under rLLM 0.3.0rc0 is refused."""
    paths = make_tree(tmp_path)  # v0.2.1.post1's (fake) files
    known_upstream(monkeypatch, tmp_path, paths, stack=0)
    for dist, version in (("rllm", RLLM_030), ("verl", VERL_071)):
        info = next(tmp_path.glob(f"{dist}-*.dist-info"))
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    before = snapshot(tmp_path)
    caplog.set_level(logging.INFO, logger="agentboost.patching")
    assert patching.main([]) == 2
    assert caplog.text.count("is not the upstream file the adapter was written for") == 2
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("rllm", "verl", "expected"),
    [
        (RLLM_030, "0.6.1", "mixed stack: rllm 0.3.0rc0 belongs to rLLM v0.3.0-pre + verl 0.7.1; verl 0.6.1 belongs"),
        ("0.2.1", VERL_071, "mixed stack: rllm 0.2.1 belongs to rLLM v0.2.1.post1 + verl 0.6.1; verl 0.7.1 belongs"),
        ("0.2.0", "0.6.1", "rllm 0.2.0 is installed"),
        (RLLM_030, "0.9.1", "verl 0.9.1 is installed"),
        ("0.3.1", None, "rllm 0.3.1 is installed"),
    ],
)
def test_other_versions_and_mixed_pairs_are_refused_naming_the_supported_ones(
    tmp_path, rllm: str, verl: str | None, expected: str
) -> None:
    make_tree(tmp_path, rllm, verl)
    before = snapshot(tmp_path)
    flags = ("--force",) if verl is not None else ("--force", "--only", "rllm")
    for args in (flags, ("--force", "--only", "rllm"), ("--check",)):
        result = run(tmp_path, *args)
        assert result.returncode == (1 if args == ("--check",) else 2), (args, result.stderr)
        assert expected in result.stderr, result.stderr
        for name in ("rLLM v0.2.1.post1 + verl 0.6.1 (rllm 0.2.1, verl 0.6.1)",
                     "rLLM v0.3.0-pre + verl 0.7.1 (rllm 0.3.0rc0 / 0.3.0.pre, verl 0.7.1)"):  # fmt: skip
            assert name in result.stderr
    assert snapshot(tmp_path) == before
    assert run(tmp_path, *(("--revert",) if verl else ("--revert", "--only", "rllm"))).returncode == 0  # always


def test_rllm_main_after_the_tag_is_refused_with_the_reason(tmp_path) -> None:
    """rLLM's main branch after v0.3.0-pre also reports 0.3.0rc0 but has no AgentExecutionEngine/AgentPPOTrainer."""
    make_tree(tmp_path, RLLM_030, VERL_071, rllm_files=False)
    before = snapshot(tmp_path)
    result = run(tmp_path, "--force")
    assert result.returncode == 2
    assert "cannot find rllm/engine/agent_execution_engine.py in the installed rllm 0.3.0rc0" in result.stderr
    assert "removed AgentExecutionEngine and AgentPPOTrainer" in result.stderr and "@v0.3.0-pre" in result.stderr
    assert snapshot(tmp_path) == before
    check = run(tmp_path, "--check")
    assert check.returncode == 1 and "missing" in check.stderr


def test_vllm_outside_the_pairs_pin_is_named(caplog) -> None:
    old, new = patching.STACKS
    caplog.set_level(logging.WARNING, logger="agentboost.patching")
    for stack, fine in ((old, ("0.10.2", "0.11.0", "0.10.2+cu128")), (new, ("0.17.0", None))):
        for version in fine:
            patching.warn_vllm(stack, version)
    assert caplog.messages == []
    patching.warn_vllm(old, "0.11.1")
    patching.warn_vllm(new, "0.22.1")
    assert caplog.messages == [
        "vllm 0.11.1 is installed; rLLM v0.2.1.post1 + verl 0.6.1 pins vllm>=0.10.2,<=0.11.0",
        "vllm 0.22.1 is installed; rLLM v0.3.0-pre + verl 0.7.1 pins vllm==0.17.0",
    ]
