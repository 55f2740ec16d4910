"""The CLIs never pick an environment for the user: ``--env`` or ``--example`` is required (an unnamed
default once added the arithmetic env's calculator tool, reward and system prompt to any dataset), and
the pool's worker memory limit can be set from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentboost.cli.main import main
from agentboost.episode import Episode
from agentboost.types import Termination

ROOT = Path(__file__).resolve().parents[1]
FAKE = ["--backend", "py:tests.pool_tools:directed_backend", "--tokenizer", "offline:qwen2.5", "--workers", "0"]
GENERIC = "agentboost.environments.strands_env:StrandsEnv"


def _data(tmp_path: Path, prompt: str = "What is 2 + 3?") -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"task_id": "t0", "prompt": prompt, "answer": "5"}) + "\n")
    return path


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_a_dataset_without_env_is_refused_naming_the_option(tmp_path, capsys, command) -> None:
    out = tmp_path / "out"
    extra = ["--no-plots"] if command == "eval" else []
    code = main([command, "--data", str(_data(tmp_path)), "--out", str(out), *FAKE, *extra])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "--env" in err and GENERIC in err and "--example" in err
    assert not (out / "episodes.jsonl").exists()  # nothing ran


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_nothing_named_is_refused(tmp_path, capsys, command) -> None:
    code = main([command, "--out", str(tmp_path / "out"), *FAKE])
    assert code == 2 and f"agentboost {command} --example arithmetic" in capsys.readouterr().err


def test_the_named_env_adds_nothing_of_its_own(tmp_path) -> None:
    """``--env StrandsEnv`` runs the row as written: no calculator tool, no system prompt, no reward."""
    out = tmp_path / "out"
    code = main(["rollout", "--data", str(_data(tmp_path)), "--env", GENERIC, "--out", str(out), *FAKE])
    assert code == 0
    [line] = (out / "episodes.jsonl").read_text().splitlines()
    episode = Episode.from_json(line)
    assert episode.termination is Termination.COMPLETED and episode.reward == 0.0
    assert all(m.get("role") != "system" for m in episode.messages)
    assert "calculator" not in json.dumps(episode.messages)


def test_example_without_data_runs_its_generated_tasks(tmp_path) -> None:
    out = tmp_path / "out"
    code = main(["rollout", "--example", "arithmetic", "--limit", "2", "--out", str(out), *FAKE])
    assert code == 0
    episodes = [Episode.from_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert {e.task_id for e in episodes} == {"arith-rollout-0-0", "arith-rollout-0-1"}


def test_an_example_that_needs_data_says_so(tmp_path, capsys) -> None:
    assert main(["eval", "--example", "math", "--out", str(tmp_path / "o"), *FAKE]) == 2
    assert "--data is required for --example math" in capsys.readouterr().err


def test_worker_memory_limit_reaches_the_pool(tmp_path) -> None:
    """``--worker-memory-mb`` replaces a worker that outgrows it; its episode comes back as infra_error, and the
    rollout says so and exits 3 (the other episode's result is kept)."""
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"task_id": "mem", "prompt": 'CALL eat_memory {"mb": 1200}'}) + "\n"
                    + json.dumps({"task_id": "fine", "prompt": "hello"}) + "\n")  # fmt: skip
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "agentboost.cli.main", "rollout", "--data", str(data), "--out", str(out),
         "--env", GENERIC, "--env-arg", "tools=tests.pool_tools:tools_for",
         "--backend", "py:tests.pool_tools:directed_backend", "--tokenizer", "offline:qwen2.5",
         "--workers", "1", "--worker-memory-mb", "700", "--episode-timeout", "60"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-3000:]
    assert "agentboost rollout: 1 of 2 episodes ended in infra_error" in done.stderr and "Traceback" not in done.stderr
    episodes = {e.task_id: e for e in map(Episode.from_json, (out / "episodes.jsonl").read_text().splitlines())}
    assert episodes["mem"].termination is Termination.INFRA_ERROR
    assert "MB > limit 700 MB" in episodes["mem"].termination_detail
    assert episodes["fine"].termination is Termination.COMPLETED
