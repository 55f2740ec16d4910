"""W&B tables of sample trajectories: the shared rows (one per trajectory: episodes of several give a row
per trajectory), the built-in trainer's eval steps (a real offline W&B run, and a fake wandb module), the
rLLM/veRL validation hook, and W&B being absent or failing."""

from __future__ import annotations

import json
import logging
import sys
import types
from typing import Any

import pytest

from agentboost.episode import Episode
from agentboost.viewer.rows import TABLE_COLUMNS, log_trajectory_table, pick, trajectory_rows
from tests.viewer_episodes import HOSTILE, make_episodes, make_multi_trajectory_episodes


class FakeTable:
    def __init__(self, columns: list[str], data: list[list[Any]]) -> None:
        self.columns, self.data = columns, data


class FakeRun:
    def __init__(self, fail: bool = False) -> None:
        self.logged: list[tuple[dict[str, Any], int | None]] = []
        self.fail = fail
        self.finished = False

    def log(self, data: dict[str, Any], step: int | None = None) -> None:
        if self.fail and any(isinstance(v, FakeTable) for v in data.values()):
            raise RuntimeError("wandb is down")
        self.logged.append((data, step))

    def finish(self) -> None:
        self.finished = True

    def tables(self) -> list[tuple[str, FakeTable, int | None]]:
        return [(k, v, step) for data, step in self.logged for k, v in data.items() if isinstance(v, FakeTable)]


def fake_wandb(run: FakeRun | None) -> types.ModuleType:
    module = types.ModuleType("wandb")
    module.Table = FakeTable
    module.run = run
    module.init = lambda **kwargs: run
    return module


@pytest.fixture(scope="module")
def episodes(qwen25_template) -> list[Episode]:
    return make_episodes(qwen25_template)


@pytest.fixture(scope="module")
def multi(qwen25_template) -> list[Episode]:
    """``window:0`` (6 trajectories), ``pair:0`` (main, helper), ``summary:0`` (an untrained aux trajectory)."""
    return make_multi_trajectory_episodes(qwen25_template)


def as_dicts(rows: list[list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(TABLE_COLUMNS, row, strict=True)) for row in rows]


def test_rows_hold_prompt_response_reward_termination_and_tools(episodes) -> None:
    rows = {row["episode_id"]: row for row in as_dicts(trajectory_rows(episodes, step=7))}
    assert len(rows) == len(episodes)  # one row per episode of one trajectory
    first = rows["t0:0"]
    assert first["step"] == 7 and first["task_id"] == "t0" and first["prompt"] == "What is (2 + 3) * 4?"
    assert first["response"].splitlines() == [
        '[call add] {"a": 2, "b": 3}', '[call explode] {"reason": "x"}', "[add success] 5",
        "[explode error] Error: RuntimeError - boom: x", '[call fetch] {"url": "http://example.invalid"}',
        f"[fetch success] page http://example.invalid: {HOSTILE}", "assistant: 20",
    ]  # fmt: skip
    assert (first["reward"], first["termination"], first["tool_calls"], first["tool_errors"], first["turns"]) == (
        1.0, "completed", 3, 1, 3)  # fmt: skip
    assert first["tools"] == "add 1, explode 1 (1 error), fetch 1" and first["masked"] is False
    assert (first["trajectory"], first["trajectories"], first["agent"], first["opened_by"]) == (
        0, 1, episodes[0].trajectory_info[0].agent, "start")  # fmt: skip
    failed = rows[f"t2{HOSTILE}:1"]
    assert (failed["termination"], failed["masked"], failed["prompt"], failed["response"]) == (
        "infra_error",
        True,
        "",
        "",
    )
    assert (failed["trajectory"], failed["trajectories"], failed["agent"]) == (0, 0, "")
    long = as_dicts(trajectory_rows(episodes[:1], step=0, max_chars=40))[0]
    assert long["response"].endswith("more items not shown]") and len(long["response"]) < 120


def test_an_episode_of_several_trajectories_gives_a_row_per_trajectory(multi) -> None:
    window, pair, summary = multi
    rows = as_dicts(trajectory_rows(multi, step=3))
    assert [(r["episode_id"], r["trajectory"], r["trajectories"]) for r in rows] == [
        *(("window:0", t, 6) for t in (0, 1, 4, 5)),  # the first and the last ones of six
        ("pair:0", 0, 2), ("pair:0", 1, 2), ("summary:0", 0, 3), ("summary:0", 1, 3), ("summary:0", 2, 3),
    ]  # fmt: skip
    by = {(r["episode_id"], r["trajectory"]): r for r in rows}
    # each row: what that trajectory's model was given, and what followed
    first, last = by["window:0", 0], by["window:0", 5]
    assert first["prompt"] == "Count up from 0." and first["agent"] == f"adder{HOSTILE}"
    assert first["response"].splitlines() == ['[call add] {"a": 0, "b": 1}', "[add success] 1",
                                              '[call add] {"a": 1, "b": 1}']  # fmt: skip
    assert (first["opened_by"], first["turns"]) == ("start", 2) and (last["opened_by"], last["turns"]) == (
        "history_rewritten", 1)  # fmt: skip
    assert last["prompt"].splitlines() == ['[call add] {"a": 4, "b": 1}', "[add success] 5",
                                           '[call add] {"a": 5, "b": 1}', "[add success] 6"]  # fmt: skip
    assert last["response"] == f"assistant: 6 {HOSTILE}"
    assert all((r["termination"], r["tool_calls"], r["tools"]) == ("completed", 6, "add 6")
               for r in rows if r["episode_id"] == "window:0")  # fmt: skip
    helper = by["pair:0", 1]
    assert (helper["agent"], helper["opened_by"], helper["reward"], by["pair:0", 0]["reward"]) == (
        "helper", "new_agent", 0.5, 1.0)  # fmt: skip
    assert helper["prompt"] == "add 0 and 1"
    assert helper["response"].splitlines() == ['[call add] {"a": 0, "b": 1}', "[add success] 1", "assistant: 1"]
    aux = by["summary:0", 1]
    assert (aux["agent"], aux["masked"], by["summary:0", 2]["masked"]) == ("aux", True, False)  # not trained
    assert aux["response"] == "assistant: * summary 0: numbers were added"
    assert "* summary 0: numbers were added" in by["summary:0", 2]["prompt"]  # the summary replaced the history
    # a long history is cut to its tail (the turns just before the call), and says so
    cut = as_dicts(trajectory_rows([window], step=0, max_chars=30))[-1]["prompt"]
    assert cut.startswith("[... ") and "earlier characters not shown]" in cut and cut.endswith("[add success] 6")
    assert len(as_dicts(trajectory_rows(multi, step=0, max_trajectories=1))) == 3  # the first of each


def test_a_table_of_episodes_of_several_trajectories(episodes, multi) -> None:
    run = FakeRun()
    assert log_trajectory_table("eval/trajectories", episodes + multi, step=4, wandb=fake_wandb(run), run=run)
    [(key, table, step)] = run.tables()
    assert (key, step, table.columns) == ("eval/trajectories", 4, TABLE_COLUMNS)
    assert len(table.data) == len(episodes) + 4 + 2 + 3


def test_the_sample_takes_every_ending_before_repeating_one(episodes) -> None:
    assert [e.termination.value for e in pick(episodes, 3)] == ["completed", "max_turns", "infra_error"]
    assert [e.id for e in pick(episodes, 4)][-1] == "t0:1"
    assert len(pick(episodes, 100)) == len(episodes)


def test_no_wandb_means_no_table_and_no_error(episodes, tmp_path, monkeypatch) -> None:
    from agentboost.train.metrics import MetricsLogger

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    log = MetricsLogger(tmp_path, project="agentboost-test")
    path = log.log_episodes("eval", episodes, step=3)
    log.log({"step": 3, "reward_mean": 0.5})
    log.close()
    assert [Episode.from_json(line).id for line in path.read_text().splitlines()] == [e.id for e in episodes]
    assert path == tmp_path / "episodes" / "eval_step3.jsonl"
    assert log_trajectory_table("eval/trajectories", episodes, step=3) is False  # no active run anywhere


def test_wandb_failing_never_stops_training(episodes, caplog) -> None:
    run = FakeRun(fail=True)
    with caplog.at_level(logging.WARNING, logger="agentboost.viewer.rows"):
        assert log_trajectory_table("eval/trajectories", episodes, step=1, wandb=fake_wandb(run), run=run) is False
    assert "could not log the W&B trajectory table eval/trajectories at step 1: RuntimeError" in caplog.text


def test_builtin_trainer_logs_a_table_per_eval_step(qwen25_tokenizer, tmp_path, monkeypatch) -> None:
    pytest.importorskip("torch")
    from agentboost.agents.strands_agent import StrandsAgent
    from agentboost.chat.template import ChatTemplate
    from agentboost.environments.arithmetic import SYSTEM_PROMPT, make_tasks
    from agentboost.offline.tiny_model import build_tiny_qwen2
    from agentboost.train.trainer import GRPOTrainer, TrainConfig
    from agentboost.types import Budget, SamplingParams
    from agentboost.viewer.source import load

    run = FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(run))
    model, tokenizer = build_tiny_qwen2(tokenizer=qwen25_tokenizer, hidden_size=32, num_layers=1, num_heads=2,
                                        num_kv_heads=1, intermediate_size=64)  # fmt: skip
    config = TrainConfig(run_dir=str(tmp_path), steps=2, prompts_per_step=1, group_size=2, eval_every=2,
                         save_every=0, wandb_project="agentboost-test", logprob_gap_alarm=None,
                         budget=Budget(max_turns=2, max_total_tokens=1024),
                         sampling=SamplingParams(temperature=1.0, max_tokens_per_call=4),
                         eval_sampling=SamplingParams(temperature=0.0, max_tokens_per_call=4))  # fmt: skip
    trainer = GRPOTrainer(model, ChatTemplate(tokenizer), make_tasks(2, seed=1), eval_rows=make_tasks(3, seed=2),
                          env="agentboost.environments.arithmetic:ArithmeticEnv",
                          agent=StrandsAgent(system_prompt=SYSTEM_PROMPT), config=config)  # fmt: skip
    trainer.fit(resume=False, progress=False)
    tables = run.tables()
    assert [(key, step) for key, _, step in tables] == [("eval/trajectories", 2)]  # eval_every=2: step 2 only
    table = tables[0][1]
    assert table.columns == TABLE_COLUMNS and len(table.data) == 3
    assert {row["episode_id"] for row in as_dicts(table.data)} == {e.id for e in trainer.last_eval_episodes}
    assert all(row["step"] == 2 and row["prompt"].startswith("What is") for row in as_dicts(table.data))
    # the same step's scalars went to the same W&B step, and the episodes are kept for `agentboost view`
    assert any("eval/reward_mean" in data and step == 2 for data, step in run.logged)
    assert [e.id for e in load(tmp_path / "episodes" / "eval_step2.jsonl").episodes] == [
        e.id for e in trainer.last_eval_episodes]  # fmt: skip
    assert run.finished


def test_offline_wandb_run_holds_the_table(episodes, multi, tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    from agentboost.train.metrics import MetricsLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLogger(tmp_path, project="agentboost-test")
    log.log_episodes("eval", episodes + multi, step=2)
    log.log({"step": 2, "eval/reward_mean": 0.5})
    log.close()
    files = list(tmp_path.glob("wandb/offline-run-*/files/media/table/eval/trajectories_*.table.json"))
    assert len(files) == 1, list(tmp_path.rglob("*"))
    table = json.loads(files[0].read_text())
    assert table["columns"] == TABLE_COLUMNS and len(table["data"]) == len(episodes) + 4 + 2 + 3
    rows = as_dicts(table["data"])
    assert {row["episode_id"] for row in rows} == {e.id for e in episodes + multi}
    assert {row["termination"] for row in rows} == {"completed", "max_turns", "infra_error"}
    assert [(row["trajectory"], row["agent"], row["reward"]) for row in rows if row["episode_id"] == "pair:0"] == [
        (0, "main", 1.0), (1, "helper", 0.5)]  # fmt: skip


def test_rllm_validation_logs_a_table_at_the_validation_step(qwen25_tokenizer, tmp_path, monkeypatch) -> None:
    pytest.importorskip("torch")
    from agentboost.environments.arithmetic import make_tasks
    from tests import fake_stack
    from tests.test_trainer_adapter import make_trainer

    trainer, engine, _ = make_trainer(qwen25_tokenizer, tmp_path)
    rows = make_tasks(2, seed=8, max_ops=1, max_value=9)
    rows[0] = {**rows[0], "tools": ["no.such.module:tool"]}
    fake_stack.load_rows(engine, rows, n=2)
    monkeypatch.delitem(sys.modules, "wandb", raising=False)  # no W&B in this process: no table, no error
    metrics = trainer._validate_agent()
    assert metrics["val/strands/termination/infra_error"] == 0.5

    run = FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(run))  # veRL's Tracking started a run
    trainer.global_steps = 5
    fake_stack.load_rows(engine, rows, n=2)
    metrics = trainer._validate_agent()
    assert metrics["val/strands/termination/infra_error"] == 0.5  # the metrics are unchanged
    [(key, table, step)] = run.tables()
    assert (key, step) == ("val/strands/trajectories", 5) and table.columns == TABLE_COLUMNS
    assert sorted(row["termination"] for row in as_dicts(table.data)) == [
        "completed", "completed", "infra_error", "infra_error"]  # fmt: skip


def test_warm_start_rows_come_first_in_wandb_and_each_phase_has_its_own_axis(tmp_path, monkeypatch) -> None:
    """Issue 40: the warm start logs a row per step to the run's metrics; W&B's step counts on across both
    phases (a W&B run refuses a step lower than the last), each phase's metrics charted against its own step."""
    from agentboost.train.metrics import MetricsLogger

    class DefiningRun(FakeRun):
        def __init__(self) -> None:
            super().__init__()
            self.axes: dict[str, str | None] = {}

        def define_metric(self, name: str, step_metric: str | None = None) -> None:
            self.axes[name] = step_metric

    run = DefiningRun()
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(run))
    log = MetricsLogger(tmp_path, project="agentboost-test", wandb_mode="offline")
    for step in (1, 2, 3):
        log.log_warm_start({"warm_start/step": step, "warm_start/loss": 1.0 / step})
    log.log({"step": 1, "reward_mean": 0.5})
    log.log({"step": 2, "reward_mean": 0.75})
    log.close()
    assert [step for _, step in run.logged] == [1, 2, 3, 4, 5]
    assert run.axes["warm_start/loss"] == "warm_start/step" and run.axes["reward_mean"] == "step"
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0] == "warm_start/step,warm_start/loss,step,reward_mean" and len(lines) == 6
