"""``agentboost prepare`` and ``examples/custom/train_verl.sh``: any rows and environment -> both GPU routes'
datasets (every row checked to build its environment first, nothing written otherwise), and the generic
verl launcher wired from ENV_CLASS, DATA, AGENT_ARGS, ENV_ARGS and PYTHONPATH (resolved with DRY_RUN=1).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agentboost.cli.main import main
from agentboost.data import load_rows
from agentboost.integration.verl_agent_loop import AGENT_LOOP_NAME, row_task

from . import letter_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "custom" / "train_verl.sh"
ENV = "tests.letter_env:LetterCountEnv"


def _rows_file(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_prepare_writes_both_routes_datasets_of_rows_that_build_their_env(tmp_path, capsys) -> None:
    rows = letter_env.rows()
    out = tmp_path / "data" / "letters"
    argv = ["prepare", "--data", str(_rows_file(tmp_path, rows)), "--env", ENV, "--out", str(out), "--system-prompt",
            "Count letters.", "--agent", "tests.letter_env:make_agent", "--register", "no"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert f"every one builds {ENV}" in printed
    assert f"ENV_CLASS={ENV}" in printed and "AGENT_ARGS=agent_factory=tests.letter_env:make_agent" in printed
    train, test = load_rows(out / "train.jsonl"), load_rows(out / "test.jsonl")
    assert (len(train), len(test)) == (9, 1) and sorted(r["task_id"] for r in train + test) == sorted(
        r["task_id"] for r in rows
    )
    import pyarrow.parquet as pq

    for split, expected in (("train", train), ("test", test)):
        verl_rows = pq.read_table(out / "verl" / f"{split}.parquet").to_pylist()
        assert len(verl_rows) == len(expected)
        for verl_row, row in zip(verl_rows, expected, strict=True):
            assert verl_row["agent_name"] == AGENT_LOOP_NAME
            task, system = row_task({**verl_row, "raw_prompt": verl_row["prompt"]})
            assert task == {**row, "data_source": "strands"} and system == "Count letters."  # verl's data_source
    record = json.loads((out / "prepare.json").read_text())
    assert record["env_class"] == ENV and record["rows"] == {"train": 9, "test": 1}
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "no staging directory left"


def test_the_suggested_launch_command_works_from_any_directory(tmp_path, capsys, monkeypatch) -> None:
    """Issue 40: the next command prepare printed named the launch script and the data relative to the
    repository root, and left the user's own package (importable here only) off PYTHONPATH."""
    monkeypatch.chdir(ROOT)  # tests.letter_env is importable from here only
    out = tmp_path / "data" / "letters"
    argv = ["prepare", "--data", str(_rows_file(tmp_path, letter_env.rows())), "--env", ENV, "--out",
            str(out), "--register", "no"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    launch = shlex.split(capsys.readouterr().out.splitlines()[-1])
    assert launch[-2:] == ["bash", str(SCRIPT)], launch
    assert f"DATA={out.resolve()}" in launch and f"PYTHONPATH={ROOT}" in launch, launch


def test_prepare_refuses_a_row_whose_environment_does_not_build_and_writes_nothing(tmp_path, capsys) -> None:
    rows = letter_env.rows()
    rows[3] = {**rows[3], "prompt_key": "nowhere"}
    out = tmp_path / "prepared"
    assert main(["prepare", "--data", str(_rows_file(tmp_path, rows)), "--env", ENV, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "row 3 ('w3') does not build its environment" in err and "nowhere" in err
    assert not out.exists()
    duplicate = [rows[0], dict(rows[0])]
    assert main(["prepare", "--data", str(_rows_file(tmp_path, duplicate)), "--env", ENV, "--out", str(out)]) == 2
    assert "task id 'w0' is both a training and a held-out row" in capsys.readouterr().err and not out.exists()
    assert main(["prepare", "--data", str(_rows_file(tmp_path, [*duplicate, rows[1]])), "--eval-fraction", "0.3",
                 "--env", ENV, "--out", str(out)]) == 2  # fmt: skip
    assert "'w0'" in capsys.readouterr().err and not out.exists()  # twice in the training rows, or on both sides


def _dry_run(**env: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT)], env={**base, **env}, capture_output=True, text=True, timeout=60,
                          cwd=ROOT)  # fmt: skip


def _overrides(stdout: str) -> dict[str, str]:
    words = shlex.split(stdout.replace("\\\n", " "))
    out = {}
    for word in words:
        key, sep, value = word.partition("=")
        if sep and ("." in key or key.startswith("+")):
            out[key] = value
    return out


def test_the_generic_verl_launcher_takes_the_environment_data_and_agent_from_the_environment(tmp_path) -> None:
    done = _dry_run(DRY_RUN="1", ENV_CLASS=ENV, DATA="data/letters", PYTHONPATH="tests_dir:/abs/lib",
                    AGENT_ARGS="agent_factory=tests.letter_env:make_agent system_prompt='You count letters.'",
                    ENV_ARGS="max_word=12")  # fmt: skip
    assert done.returncode == 0, done.stderr
    values = _overrides(done.stdout)
    assert values["+strands.env_class"] == ENV
    assert values["data.train_files"] == f"{ROOT}/data/letters/verl/train.parquet"
    assert values["data.val_files"] == f"{ROOT}/data/letters/verl/test.parquet"
    assert values["+strands.agent_args.agent_factory"] == "tests.letter_env:make_agent"
    assert values["+strands.agent_args.system_prompt"] == "'You count letters.'"  # Hydra's quoting of one string
    assert values["+strands.env_args.max_word"] == "12"
    forwarded = values["++ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH"].strip("'")  # Hydra-quoted string
    assert forwarded == f"{ROOT}/tests_dir:/abs/lib"
    assert values["trainer.experiment_name"] == "custom-strands-verl"
    assert values["algorithm.adv_estimator"] == "agentboost_grpo"


def test_the_generic_verl_launcher_refuses_what_it_cannot_run(tmp_path) -> None:
    missing_env = _dry_run(DRY_RUN="1")
    assert missing_env.returncode == 2 and "ENV_CLASS is required" in missing_env.stderr
    bad_pair = _dry_run(DRY_RUN="1", ENV_CLASS=ENV, AGENT_ARGS="oops")
    assert bad_pair.returncode == 2 and "expected KEY=VALUE, got 'oops'" in bad_pair.stderr
    no_data = _dry_run(ENV_CLASS=ENV, DATA=str(tmp_path / "nothing"))
    assert no_data.returncode == 2 and f"agentboost prepare --data ROWS --env {ENV}" in no_data.stderr


@pytest.mark.parametrize("path", [SCRIPT, SCRIPT.with_name("defaults.sh")])
def test_the_launcher_parses(path: Path) -> None:
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
