"""W&B tables of sample trajectories: the shared rows, the built-in trainer's eval steps (a real offline
W&B run, and a fake wandb module), the rLLM/veRL validation hook, and W&B being absent or failing."""

from __future__ import annotations

import json
import logging
import sys
import types
from typing import Any

import pytest

from agentboost.episode import Episode
from agentboost.viewer.rows import TABLE_COLUMNS, log_trajectory_table, pick, trajectory_rows
from tests.viewer_episodes import HOSTILE, make_episodes


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


def test_rows_hold_prompt_response_reward_termination_and_tools(episodes) -> None:
    rows = {row[1]: dict(zip(TABLE_COLUMNS, row, strict=True)) for row in trajectory_rows(episodes, step=7)}
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
    failed = rows[f"t2{HOSTILE}:1"]
    assert (failed["termination"], failed["masked"], failed["prompt"], failed["response"]) == (
        "infra_error",
        True,
        "",
        "",
    )
    long = trajectory_rows(episodes[:1], step=0, max_chars=40)[0]
    assert long[4].endswith("more items not shown]") and len(long[4]) < 120


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
    assert {row[1] for row in table.data} == {e.id for e in trainer.last_eval_episodes}
    assert all(row[0] == 2 and row[3].startswith("What is") for row in table.data)
    # the same step's scalars went to the same W&B step, and the episodes are kept for `agentboost view`
    assert any("eval/reward_mean" in data and step == 2 for data, step in run.logged)
    assert [e.id for e in load(tmp_path / "episodes" / "eval_step2.jsonl").episodes] == [
        e.id for e in trainer.last_eval_episodes]  # fmt: skip
    assert run.finished


def test_offline_wandb_run_holds_the_table(episodes, tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    from agentboost.train.metrics import MetricsLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLogger(tmp_path, project="agentboost-test")
    log.log_episodes("eval", episodes, step=2)
    log.log({"step": 2, "eval/reward_mean": 0.5})
    log.close()
    files = list(tmp_path.glob("wandb/offline-run-*/files/media/table/eval/trajectories_*.table.json"))
    assert len(files) == 1, list(tmp_path.rglob("*"))
    table = json.loads(files[0].read_text())
    assert table["columns"] == TABLE_COLUMNS and len(table["data"]) == len(episodes)
    assert {row[1] for row in table["data"]} == {e.id for e in episodes}
    assert {row[6] for row in table["data"]} == {"completed", "max_turns", "infra_error"}


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
    assert sorted(row[6] for row in table.data) == ["completed", "completed", "infra_error", "infra_error"]
