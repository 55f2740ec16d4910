"""rLLM's PPO trainer adapter and the episode -> veRL batch conversion (fakes: tests/fake_stack.py;
with veRL installed, also against veRL's own DataProto, padding and GRPO advantage)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from agentboost import StrandsAgent
from agentboost.environments.arithmetic import ArithmeticEnv, make_tasks
from agentboost.episode import Episode
from agentboost.integration.metrics import StaleRolloutError, episode_metrics
from agentboost.integration.verl_batch import (
    MASKED_KEY,
    episodes_to_verl,
    isolated_masked_uids,
    mask_padding_rows,
)
from agentboost.types import Termination
from modified_rllm_files import agent_ppo_trainer as trainer_adapter
from tests import fake_stack


def make_trainer(tokenizer: Any, tmp_path: Any, config: dict | None = None, world_size: int = 4, **agent: Any):
    config = config or fake_stack.training_config(**{"trainer.default_local_dir": str(tmp_path)})
    engine, servers = fake_stack.make_engine(tokenizer, config=config, **agent)
    ns = fake_stack.trainer_namespace()
    assert trainer_adapter.install(ns) is True and trainer_adapter.install(ns) is False
    trainer = ns["AgentPPOTrainer"](config, tokenizer, agent_class=engine.agent_class, env_class=engine.env_class,
                                    engine=engine, world_size=world_size)  # fmt: skip
    return trainer, engine, ns


def test_trainer_builds_the_batch_from_episodes(qwen25_tokenizer, tmp_path) -> None:
    trainer, engine, ns = make_trainer(qwen25_tokenizer, tmp_path)
    rows = make_tasks(2, seed=5, max_ops=1, max_value=9)
    rows[1] = {**rows[1], "tools": ["no.such.module:tool"]}
    fake_stack.load_rows(engine, rows, n=3)
    batch, metrics = trainer.generate_agent_trajectory(timing_raw={}, meta_info={})
    assert len(batch) == 6
    assert batch.batch["prompts"].shape == (6, 512) and batch.batch["responses"].shape == (6, 256)
    assert batch.batch["input_ids"].shape == (6, 768)
    masked = batch.non_tensor_batch[MASKED_KEY].tolist()
    assert masked == [False, False, False, True, True, True]
    assert batch.batch["response_mask"][3:].sum() == 0 and batch.batch["token_level_scores"][3:].sum() == 0
    scores = batch.batch["token_level_scores"].sum(-1)
    assert scores[:3].tolist() == [1.0, 1.0, 1.0]
    lp, mask = batch.batch["rollout_log_probs"], batch.batch["response_mask"].bool()
    assert (lp[mask] != 0).all() and (lp[~mask] == 0).all()
    assert metrics["strands/termination/completed"] == 0.5 and metrics["strands/termination/infra_error"] == 0.5
    assert metrics["strands/tool/calculator/calls_per_episode"] == 0.5  # 3 of 6 episodes called it once
    saved = (tmp_path / "episodes" / "1.jsonl").read_text().splitlines()
    assert [Episode.from_dict(json.loads(line)).termination for line in saved][3] is Termination.INFRA_ERROR


def test_padding_rows_are_masked_and_failed_rows_do_not_skew_groups(qwen25_tokenizer, tmp_path) -> None:
    trainer, engine, ns = make_trainer(qwen25_tokenizer, tmp_path, world_size=4)
    fake_stack.load_rows(engine, make_tasks(1, seed=6, max_ops=1, max_value=9), n=3)
    batch, _ = trainer.generate_agent_trajectory(meta_info={})
    batch.non_tensor_batch["uid"] = np.array(["p0"] * 3, dtype=object)
    # one sample of the group failed (infra error: masked, reward 0) and one earned nothing
    batch.non_tensor_batch[MASKED_KEY][2] = True
    batch.batch["response_mask"][2] = 0
    batch.batch["token_level_scores"][2] = 0
    batch.batch["token_level_scores"][1] = 0
    out = ns["compute_advantage"](batch)
    adv = out.batch["advantages"].sum(-1) / out.batch["response_mask"].sum(-1).clamp(min=1)
    # GRPO over the two real samples (rewards 1 and 0): +0.707 / -0.707; the masked row contributes nothing
    assert adv[0].item() == pytest.approx(1 / np.sqrt(2), rel=1e-4)
    assert adv[1].item() == pytest.approx(-1 / np.sqrt(2), rel=1e-4)
    assert out.batch["advantages"][2].abs().sum() == 0
    assert out.non_tensor_batch["uid"].tolist() == ["p0"] * 3  # rLLM's uids are restored afterwards

    padded = trainer._pad_dataproto_to_world_size(out)
    assert len(padded) == 4
    assert padded.batch["response_mask"][3].sum() == 0 and padded.batch["advantages"][3].abs().sum() == 0
    assert padded.non_tensor_batch[MASKED_KEY][3] and padded.non_tensor_batch["uid"][3] != "p0"


def _per_row(out: Any) -> Any:
    return out.batch["advantages"].sum(-1) / out.batch["response_mask"].sum(-1).clamp(min=1)


def _mask_row(batch: Any, i: int) -> None:
    batch.non_tensor_batch[MASKED_KEY][i] = True
    batch.batch["response_mask"][i] = 0
    batch.batch["token_level_scores"][i] = 0


def test_a_lone_survivor_of_its_group_gets_no_advantage(qwen25_tokenizer, tmp_path) -> None:
    """veRL treats a group of one as mean 0 / std 1: the survivor of a group whose other members
    failed would be trained on its raw reward (REINFORCE without a baseline). The rule, as in the
    built-in trainer: fewer than 2 unmasked members -> advantage 0."""
    trainer, engine, ns = make_trainer(qwen25_tokenizer, tmp_path)
    fake_stack.load_rows(engine, make_tasks(2, seed=6, max_ops=1, max_value=9), n=3)
    batch, _ = trainer.generate_agent_trajectory(meta_info={})
    batch.non_tensor_batch["uid"] = np.array(["a"] * 3 + ["b"] * 3, dtype=object)
    assert batch.batch["token_level_scores"].sum(-1).tolist() == [1.0] * 6
    _mask_row(batch, 1)
    _mask_row(batch, 2)  # group a: two infra failures, one survivor with reward 1
    batch.batch["token_level_scores"][4] = 0  # group b: rewards 1, 0, 1
    with isolated_masked_uids(batch):  # the adapter before this fix: failures isolated, survivor alone
        raw = fake_stack.grpo_compute_advantage(batch)
    assert _per_row(raw)[0].item() == pytest.approx(1.0, rel=1e-4)  # its raw reward
    out = ns["compute_advantage"](batch, adv_estimator="grpo")
    adv = _per_row(out)
    assert adv[0].item() == 0.0 and out.batch["advantages"][0].abs().sum() == 0
    assert adv[1].item() == 0.0 and adv[2].item() == 0.0
    assert adv[3].item() > 0 > adv[4].item() and adv[5].item() == pytest.approx(adv[3].item())
    # A critic-based estimator has no groups: nothing is zeroed.
    _mask_row(batch, 4)
    _mask_row(batch, 5)
    out = ns["compute_advantage"](batch, adv_estimator="gae")
    assert _per_row(out)[3].item() == pytest.approx(1.0, rel=1e-4)


def test_rows_cut_by_the_batch_lengths_are_masked_and_counted(qwen25_tokenizer, tmp_path) -> None:
    """A row longer than data.max_response_length (the episode budget was configured larger) loses
    its tail: it must not keep its reward, join its group, or be trained on half-seen."""
    strands = {"budget": {"max_response_tokens": 4096, "max_total_tokens": 8192}}
    config = fake_stack.training_config(
        **{"trainer.default_local_dir": str(tmp_path), "rllm.strands": strands, "data.max_response_length": 40}
    )
    trainer, engine, ns = make_trainer(qwen25_tokenizer, tmp_path, config=config)
    fake_stack.load_rows(engine, make_tasks(1, seed=10, max_ops=1, max_value=9), n=2)
    for server in engine.rollout_engine.rollout_manager.server_handles:
        server.server.engine.ramble = 30  # about 30 extra tokens in the final answer: longer than 40 in all
    batch, metrics = trainer.generate_agent_trajectory(meta_info={})
    assert batch.non_tensor_batch[MASKED_KEY].tolist() == [True, True]
    assert batch.batch["token_level_scores"].abs().sum() == 0 and batch.batch["response_mask"].sum() == 0
    assert metrics["strands/masked_fraction"] == 1.0 and metrics["strands/batch_cut_fraction"] == 1.0
    saved = [json.loads(line) for line in (tmp_path / "episodes" / "1.jsonl").read_text().splitlines()]
    assert all(e["masked"] and "max_response_length=40" in e["metadata"]["batch_cut"] for e in saved)


def test_a_step_with_every_row_masked_skips_the_update(qwen25_tokenizer, tmp_path, caplog) -> None:
    """One step of server outage must not kill the run (veRL's metrics take max over an empty
    selection) nor move the weights (an optimizer step on stale momentum)."""
    trainer, engine, ns = make_trainer(qwen25_tokenizer, tmp_path)
    trainer.init_workers()
    rows = [{**r, "tools": ["no.such.module:tool"]} for r in make_tasks(2, seed=11, max_ops=1, max_value=9)]
    fake_stack.load_rows(engine, rows, n=2)
    batch, _ = trainer.generate_agent_trajectory(meta_info={})
    assert batch.batch["response_mask"].sum() == 0
    batch.non_tensor_batch["uid"] = np.array(["a", "a", "b", "b"], dtype=object)
    batch = ns["compute_advantage"](batch, adv_estimator="grpo")
    with caplog.at_level("WARNING"):
        output = trainer.actor_rollout_wg.update_actor(batch)
    assert trainer.actor_rollout_wg.__class__ is fake_stack.FakeWorkerGroup
    assert trainer.actor_rollout_wg.updates == []  # the real update never ran
    assert output.meta_info["metrics"] == {"strands/actor_update_skipped": [1.0]}
    assert "every row of this step is masked" in caplog.text and "infra_error: 4" in caplog.text
    with pytest.raises(RuntimeError):
        fake_stack.compute_data_metrics(batch)  # what veRL's own metrics do with this batch
    metrics = ns["compute_data_metrics"](batch, use_critic=False)
    assert metrics["strands/update_skipped"] == 1.0
    # The next step is normal again.
    fake_stack.load_rows(engine, make_tasks(1, seed=12, max_ops=1, max_value=9), n=2)
    batch, _ = trainer.generate_agent_trajectory(meta_info={})
    trainer.actor_rollout_wg.update_actor(batch)
    assert trainer.actor_rollout_wg.updates == [2]
    assert ns["compute_data_metrics"](batch, use_critic=False)["strands/update_skipped"] == 0.0


def test_logprob_gap_metrics_and_stale_rollout_alarm(qwen25_tokenizer, tmp_path) -> None:
    strands = {"logprob_gap_alarm": 0.5, "logprob_gap_patience": 2}
    config = fake_stack.training_config(**{"trainer.default_local_dir": str(tmp_path), "rllm.strands": strands})
    trainer, engine, ns = make_trainer(qwen25_tokenizer, tmp_path, config=config)
    fake_stack.load_rows(engine, make_tasks(1, seed=7, max_ops=1, max_value=9), n=2)
    batch, _ = trainer.generate_agent_trajectory(meta_info={})
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"] + 0.01  # fresh: numerics only
    metrics = ns["compute_data_metrics"](batch, use_critic=False)
    assert metrics["strands/logprob_gap/mean_abs"] == pytest.approx(0.01, abs=1e-5)
    assert metrics["strands/logprob_gap/tokens"] == float(batch.batch["response_mask"].sum())
    assert "critic/score/mean" in metrics  # upstream metrics kept
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"] - 2.0  # stale rollouts
    metrics = ns["compute_data_metrics"](batch, use_critic=False)
    assert metrics["strands/logprob_gap/alarm_strikes"] == 1.0
    with pytest.raises(StaleRolloutError, match="log-prob gap 2.000"):
        ns["compute_data_metrics"](batch, use_critic=False)


def test_validation_counts_failures_and_logs_strands_metrics(qwen25_tokenizer, tmp_path) -> None:
    trainer, engine, ns = make_trainer(qwen25_tokenizer, tmp_path)
    rows = make_tasks(2, seed=8, max_ops=1, max_value=9)
    rows[0] = {**rows[0], "tools": ["no.such.module:tool"]}
    fake_stack.load_rows(engine, rows, n=2)
    metrics = trainer._validate_agent()
    assert metrics["val/test_score/x"] == 0.5  # the 2 failed rows stay in the denominator
    assert metrics["val/strands/termination/infra_error"] == 0.5


def test_other_agents_use_rllm_code(qwen25_tokenizer, tmp_path) -> None:
    class OtherAgent:
        pass

    class OtherEnv:
        pass

    trainer, _, _ = make_trainer(qwen25_tokenizer, tmp_path, agent_class=OtherAgent, env_class=OtherEnv)
    assert trainer.generate_agent_trajectory(meta_info={}) == ("upstream", {})


def test_trainer_refuses_stepwise_advantage(qwen25_tokenizer, tmp_path) -> None:
    config = fake_stack.training_config(**{"rllm.stepwise_advantage": {"enable": True}})
    with pytest.raises(ValueError, match="stepwise_advantage"):
        make_trainer(qwen25_tokenizer, tmp_path, config=config)


def _episodes(qwen25_template: Any) -> list[Episode]:
    from tests.helpers import run

    return [run(qwen25_template, ["4"], task={"prompt": "What is 2 + 2?", "answer": "4"}) for _ in range(3)]


def test_with_real_verl_dataproto_padding_and_grpo(qwen25_tokenizer, tmp_path) -> None:
    verl = pytest.importorskip("verl", reason="veRL is not installed (pip install -e '.[verl]')")
    from verl import DataProto
    from verl.protocol import pad_dataproto_to_divisor
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    trainer, engine, _ = make_trainer(qwen25_tokenizer, tmp_path)
    fake_stack.load_rows(engine, make_tasks(2, seed=9, max_ops=1, max_value=9), n=3)
    from modified_rllm_files.agent_ppo_trainer import run_coroutine

    episodes = run_coroutine(engine.run_strands_episodes())
    episodes[1].masked, episodes[4].reward = True, 0.0  # one failure, one miss
    tensors, non_tensors = episodes_to_verl(episodes, pad_token_id=qwen25_tokenizer.pad_token_id,
                                            max_prompt_length=512, max_response_length=256)  # fmt: skip
    data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    data.non_tensor_batch["uid"] = np.array(["a"] * 3 + ["b"] * 3, dtype=object)
    with isolated_masked_uids(data) as isolated:
        adv, _ = compute_grpo_outcome_advantage(
            data.batch["token_level_scores"], data.batch["response_mask"], data.non_tensor_batch["uid"]
        )
    assert isolated == 1 and data.non_tensor_batch["uid"].tolist() == ["a"] * 3 + ["b"] * 3
    per_row = adv.sum(-1) / data.batch["response_mask"].sum(-1).clamp(min=1)
    assert per_row[0] == pytest.approx(0.0) and per_row[2] == pytest.approx(0.0)  # group a: both real rows won
    assert per_row[3] > 0 > per_row[4]
    padded, pad = pad_dataproto_to_divisor(data, 4)
    assert pad == 2 and mask_padding_rows(padded, 6) == 2
    assert padded.batch["response_mask"][6:].sum() == 0
    assert verl.__version__


def test_episode_metrics_cover_every_termination() -> None:
    episodes = [Episode(id=str(i), termination=t) for i, t in enumerate(Termination)]
    metrics = episode_metrics(episodes)
    assert sum(metrics[f"strands/termination/{t.value}"] for t in Termination) == pytest.approx(1.0)


_ = (torch, StrandsAgent, ArithmeticEnv, _episodes)


def test_lone_survivor_rule_with_real_verl_compute_advantage(qwen25_tokenizer, tmp_path) -> None:
    ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="veRL is not installed")
    from verl import DataProto

    from modified_rllm_files.agent_ppo_trainer import run_coroutine

    ns = fake_stack.trainer_namespace()
    ns["compute_advantage"], ns["DataProto"] = ray_trainer.compute_advantage, DataProto
    assert trainer_adapter.install(ns) is True
    _, engine, _ = make_trainer(qwen25_tokenizer, tmp_path)
    fake_stack.load_rows(engine, make_tasks(2, seed=13, max_ops=1, max_value=9), n=3)
    episodes = run_coroutine(engine.run_strands_episodes())
    episodes[1].masked = episodes[2].masked = True  # group a: one survivor; group b: rewards 1, 0, 1
    episodes[4].reward = 0.0
    tensors, non_tensors = episodes_to_verl(episodes, pad_token_id=qwen25_tokenizer.pad_token_id,
                                            max_prompt_length=512, max_response_length=256)  # fmt: skip
    data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    data.non_tensor_batch["uid"] = np.array(["a"] * 3 + ["b"] * 3, dtype=object)
    out = ns["compute_advantage"](data, adv_estimator="grpo", num_repeat=3, norm_adv_by_std_in_grpo=True)
    per_row = out.batch["advantages"].sum(-1) / out.batch["response_mask"].sum(-1).clamp(min=1)
    assert per_row[:3].abs().sum() == 0  # veRL alone: the survivor's raw reward (1.0)
    assert per_row[3] > 0 > per_row[4] and per_row[5] == pytest.approx(per_row[3].item())
    assert out.non_tensor_batch["uid"].tolist() == ["a"] * 3 + ["b"] * 3
