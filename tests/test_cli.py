"""``agentboost`` CLI on the arithmetic example (tiny local model, generated tasks), and its exit while a
tool thread is stuck."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentboost.cli.main import main
from agentboost.cli.rollout import GENERIC_ENV
from agentboost.episode import Episode
from agentboost.types import Termination


def test_rollout_embedded_default(tmp_path, capsys) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "run"
    args = ["rollout", "--example", "arithmetic", "--limit", "3", "--n", "2", "--max-tokens-per-call", "16"]
    assert main([*args, "--out", str(out)]) == 0
    episodes = [Episode.from_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 6
    for episode in episodes:
        episode.check_invariants()
        assert episode.calls and episode.calls[0].completion_tokens <= 16
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 6 and sum(summary["terminations"].values()) == 6
    assert "Rollout summary" in capsys.readouterr().out
    assert {e.task_id for e in episodes} == {f"arith-rollout-0-{i}" for i in range(3)}


def test_rollout_rejects_missing_data(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code = main(["rollout", "--data", str(tmp_path / "missing.jsonl"), "--env", GENERIC_ENV, "--out", str(out)])
    assert code == 2 and "missing.jsonl: no such file" in capsys.readouterr().err
    assert not out.exists()


def test_a_rollout_onto_an_earlier_one_is_refused_unless_it_may_overwrite(tmp_path, capsys) -> None:
    """Issue 40: --out onto an earlier rollout replaced it silently (8 episodes -> 6); eval refused there."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": "CALL add {}"}) + "\n" for i in range(3)))
    out = tmp_path / "run"
    args = ["rollout", "--data", str(rows), "--env", GENERIC_ENV, "--backend", "py:tests.pool_tools:directed_backend",
            "--tokenizer", "offline:qwen2.5", "--workers", "0", "--out", str(out)]  # fmt: skip
    assert main([*args, "--n", "2"]) == 0, capsys.readouterr().err
    earlier = (out / "episodes.jsonl").read_text()
    capsys.readouterr()
    assert main([*args, "--n", "1"]) == 2
    assert "already holds a rollout" in capsys.readouterr().err
    assert (out / "episodes.jsonl").read_text() == earlier and len(earlier.splitlines()) == 6  # untouched
    assert main([*args, "--n", "1", "--overwrite"]) == 0, capsys.readouterr().err
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 3


def _run_cli(args: list[str], tmp_path, *, limit_s: float = 90.0) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh interpreter (as a user would), with a limit that catches a hang."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "agentboost.cli.main", *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=limit_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the CLI did not exit within {limit_s}s; stderr tail: {str(exc.stderr)[-2000:]}")
    return done


STUCK_TOOL = [
    "--env", "agentboost.environments.strands_env:StrandsEnv",
    "--env-arg", "tools=tests.pool_tools:tools_for", "--env-arg", "reward_fn=tests.pool_tools:reward",
    "--backend", "py:tests.pool_tools:directed_backend", "--tokenizer", "offline:qwen2.5",
    "--episode-timeout", "2", "--workers", "0",
]  # fmt: skip


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_cli_exits_promptly_while_a_tool_thread_is_stuck(tmp_path, command) -> None:
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"task_id": "stuck", "prompt": 'CALL slow {"seconds": 3600}'}) + "\n")
    out = tmp_path / "out"
    extra = ["--no-plots"] if command == "eval" else []
    done = _run_cli([command, "--data", str(data), "--out", str(out), *STUCK_TOOL, *extra], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = (out / "episodes.jsonl").read_text().splitlines()
    assert Episode.from_json(line).termination is Termination.TIMEOUT
    assert (out / ("summary.json" if command == "rollout" else "report.json")).exists()
    assert "tool thread(s) still running" in done.stderr and "slow" in done.stderr
