"""The single-machine trainer: batch conversion, GRPO maths, honest learning-signal checks, resume."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from agentboost.agents.strands_agent import StrandsAgent  # noqa: E402
from agentboost.batch import episodes_to_batch  # noqa: E402
from agentboost.chat.template import ChatTemplate  # noqa: E402
from agentboost.environments.arithmetic import SYSTEM_PROMPT, make_tasks  # noqa: E402
from agentboost.episode import Episode  # noqa: E402
from agentboost.quickstart import ENV, QuickstartConfig, _build_model, run_quickstart  # noqa: E402
from agentboost.train.demonstration import demo_turns  # noqa: E402
from agentboost.train.grpo import group_advantages, policy_loss  # noqa: E402
from agentboost.train.logprobs import response_logprobs  # noqa: E402
from agentboost.train.sft import demonstration_episodes, sft  # noqa: E402
from agentboost.train.trainer import GRPOTrainer, StaleRolloutError, TrainConfig  # noqa: E402
from agentboost.types import Budget, SamplingParams, Termination  # noqa: E402

AGENT = StrandsAgent(system_prompt=SYSTEM_PROMPT)


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    rows = make_tasks(64, max_ops=1, max_value=9)
    model, tokenizer = _build_model(QuickstartConfig(hidden_size=64, num_layers=1, seed=0), rows)
    template = ChatTemplate(tokenizer)
    return model, tokenizer, template, rows


def _demos(template, rows, verbose_fraction):
    """Demonstrations; the first ``verbose_fraction`` of the rows answer with a sentence."""
    n_verbose = round(verbose_fraction * len(rows))
    verbose = demonstration_episodes(rows[:n_verbose], demo_turns(verbose=True), template, env=ENV, agent=AGENT)
    bare = demonstration_episodes(rows[n_verbose:], demo_turns(verbose=False), template, env=ENV, agent=AGENT)
    return verbose + bare


# --- GRPO maths -------------------------------------------------------------------------------
def test_group_advantages() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5])
    groups = ["a", "a", "a", "a", "b", "b", "c"]
    masked = [False, False, False, False, False, True, False]
    adv = group_advantages(rewards, groups, masked)
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std(unbiased=True)
    assert torch.allclose(adv[:4], (torch.tensor([1.0, 0.0, 0.0, 1.0]) - 0.5) / (std + 1e-6))
    assert adv[4] == 0 and adv[5] == 0  # b: the masked member leaves a lone sample, no baseline
    assert adv[6] == 0  # c: lone sample
    centered = group_advantages(rewards, groups, masked, normalize_std=False)
    assert torch.allclose(centered[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_policy_loss_values() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([2.0, -1.0])
    same = torch.zeros(2, 3)
    loss, m = policy_loss(same, same, adv, mask)
    assert math.isclose(float(loss), -(2.0 * 2 - 1.0 * 1) / 3, rel_tol=1e-6)  # token-mean
    assert m["clip_frac"] == 0.0
    doubled = torch.full((2, 3), math.log(2.0))
    loss, m = policy_loss(doubled, same, adv, mask, clip_high=0.28)
    # positive advantage: clipped at 1.28; negative advantage: the pessimistic unclipped 2x
    assert math.isclose(float(loss), -(2 * (1.28 * 2.0) + 1 * (2.0 * -1.0)) / 3, rel_tol=1e-5)
    assert m["clip_frac"] == pytest.approx(2 / 3)  # veRL's: tokens where the clip decides (not the A<0 one)
    _, m = policy_loss(same, same, adv, mask, ref_logprobs=same, kl_coef=0.1)
    assert m["kl_ref"] == 0.0
    _, m = policy_loss(same, same, adv, mask, ref_logprobs=same - 0.5, kl_coef=0.1)
    assert m["kl_ref"] > 0


# --- batch conversion -------------------------------------------------------------------------
def test_episodes_to_batch(setup) -> None:
    _, tokenizer, template, rows = setup
    demos = _demos(template, rows[:2], 0.0)
    failed = Episode(id="failed", termination=Termination.INFRA_ERROR, masked=True)
    batch = episodes_to_batch([*demos, failed], pad_token_id=tokenizer.pad_token_id)
    n_p = max(len(d.prompt_ids) for d in demos)
    n_r = max(len(d.response_ids) for d in demos)
    assert batch.prompts.shape == (3, n_p) and batch.responses.shape == (3, n_r)
    for i, demo in enumerate(demos):
        assert batch.prompts[i, n_p - len(demo.prompt_ids) :].tolist() == demo.prompt_ids  # left-padded
        assert batch.responses[i, : len(demo.response_ids)].tolist() == demo.response_ids  # right-padded
        assert batch.response_mask[i, : len(demo.response_ids)].tolist() == demo.response_mask
        assert batch.token_level_scores[i].nonzero().flatten().tolist() == [len(demo.response_ids) - 1]
        assert batch.token_level_scores[i, len(demo.response_ids) - 1] == demo.reward
        real = batch.attention_mask[i].sum().item()
        assert real == len(demo.prompt_ids) + len(demo.response_ids)
        assert batch.position_ids[i].max().item() == real - 1
    assert batch.response_mask[2].sum() == 0 and batch.rewards[2] == 0 and batch.masked[2]
    cut = episodes_to_batch(demos, pad_token_id=0, max_response_length=5)
    assert cut.truncated == [True, True] and int(cut.response_mask.sum()) == 0


def test_response_logprobs_match_full_forward(setup) -> None:
    model, tokenizer, template, rows = setup
    batch = episodes_to_batch(_demos(template, rows[:3], 0.5), pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        fast = response_logprobs(model, batch)
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits
    full = torch.log_softmax(logits.float(), -1)
    p = batch.prompt_length
    for i in range(len(batch)):
        for j in batch.response_mask[i].nonzero().flatten().tolist():
            ref = full[i, p + j - 1, batch.responses[i, j]]
            assert abs(float(fast[i, j]) - float(ref)) < 1e-4
    assert float(fast[batch.response_mask == 0].abs().sum()) == 0.0


# --- learning signal ------------------------------------------------------------------------------
def test_sft_reduces_the_loss(setup) -> None:
    model, tokenizer, template, rows = setup
    losses = sft(model, _demos(template, rows[:32], 0.5), pad_token_id=tokenizer.pad_token_id, steps=40,
                 lr=3e-3, batch_size=8, progress=False)  # fmt: skip
    assert losses[-1] < 0.5 * losses[0]


def test_a_grpo_update_moves_probability_towards_rewarded_samples(setup) -> None:
    """One update on a group where the bare answer is rewarded and the sentence is not: the
    rewarded final answer becomes more likely, and more likely relative to the unrewarded one. (The
    tool-call turn is identical in both, so its advantages cancel; we look at the final turn.)"""
    model, tokenizer, template, rows = setup
    row = rows[5]
    good = _demos(template, [row] * 4, 0.0)  # bare number: reward 1
    bad = _demos(template, [row] * 4, 1.0)  # sentence: reward 0
    assert all(e.reward == 1.0 for e in good) and all(e.reward == 0.0 for e in bad)
    episodes = good + bad
    for e in episodes:
        e.metadata["group_id"] = "g"
    config = TrainConfig(lr=1e-3, logprob_gap_alarm=None, wandb_project=None)
    trainer = GRPOTrainer(model, template, rows, env=ENV, agent=AGENT, config=config)
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    final_turn = torch.zeros_like(batch.response_mask, dtype=torch.float)
    for i, e in enumerate(episodes):
        n, k = len(e.response_ids), len(e.segments[-1].token_ids)
        assert e.segments[-1].kind.value == "model" and batch.response_mask[i, n - k : n].all()
        final_turn[i, n - k : n] = 1.0

    def final_answer_logprob() -> tuple[float, float]:
        with torch.no_grad():
            per_row = (response_logprobs(model, batch) * final_turn).sum(1)
        return float(per_row[:4].mean()), float(per_row[4:].mean())

    good_before, bad_before = final_answer_logprob()
    metrics = trainer.update(episodes)
    good_after, bad_after = final_answer_logprob()
    assert metrics["skipped_update"] == 0.0 and metrics["groups_with_signal"] == 1.0
    assert metrics["advantage_abs_mean"] > 0.9
    assert good_after > good_before
    assert good_after - bad_after > good_before - bad_before + 0.01


def test_stale_rollouts_stop_training(setup) -> None:
    model, _tokenizer, template, rows = setup
    episodes = _demos(template, rows[:2], 0.0)  # scripted logprobs (-0.25) are not the model's
    for e in episodes:
        e.segments[1].logprobs = [-0.25] * len(e.segments[1].token_ids)
    trainer = GRPOTrainer(model, template, rows, env=ENV, agent=AGENT, config=TrainConfig(wandb_project=None))
    with pytest.raises(StaleRolloutError, match="logprob gap"):
        trainer.update(episodes)


def test_rollouts_come_from_the_live_policy(setup) -> None:
    model, tokenizer, template, rows = setup
    config = TrainConfig(wandb_project=None, budget=Budget(max_turns=2, max_total_tokens=512),
                         sampling=SamplingParams(temperature=1.0, max_tokens_per_call=24))  # fmt: skip
    trainer = GRPOTrainer(model, template, rows, env=ENV, agent=AGENT, config=config)
    episodes = trainer.rollout(rows[:2], n=2, sampling=config.sampling, tag="live")
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        trainer_lp = response_logprobs(model, batch)
    mask = batch.response_mask.bool()
    gap = (trainer_lp[mask] - batch.rollout_log_probs[mask]).abs().max()
    assert gap < 1e-3  # rollout logprobs are the current weights' logprobs


# --- loop, checkpoints, quickstart ------------------------------------------------------------------
def test_fit_checkpoint_and_resume(tmp_path, setup) -> None:
    model, _tokenizer, template, rows = setup
    config = TrainConfig(run_dir=str(tmp_path), steps=2, prompts_per_step=2, group_size=2, save_every=1,
                         eval_every=0, wandb_project=None, budget=Budget(max_turns=2, max_total_tokens=512),
                         sampling=SamplingParams(temperature=1.0, max_tokens_per_call=16))  # fmt: skip
    trainer = GRPOTrainer(model, template, rows, env=ENV, agent=AGENT, config=config)
    history = trainer.fit(resume=False, progress=False)
    assert [h["step"] for h in history] == [1, 2]
    assert (tmp_path / "checkpoint" / "trainer_state.json").is_file()
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 3
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # scramble: resume must restore the checkpointed weights
    config.steps = 3
    resumed = GRPOTrainer(model, template, rows, env=ENV, agent=AGENT, config=config)
    assert resumed.load_checkpoint() and resumed.step == 2 and len(resumed.history) == 2
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    history = resumed.fit(resume=False, progress=False)
    assert [h["step"] for h in history] == [1, 2, 3]


def test_quickstart_smoke(tmp_path) -> None:
    config = QuickstartConfig(
        run_dir=str(tmp_path / "qs"), hidden_size=32, num_layers=1, train_tasks=32, eval_tasks=8, demos=32,
        sft_steps=20, sft_batch=8, grpo_steps=2, prompts_per_step=2, group_size=4, eval_every=1,
        wandb_project="agentboost-test",
    )  # fmt: skip
    summary = run_quickstart(config, progress=False)
    run_dir = tmp_path / "qs"
    for name in ("curves.png", "metrics.csv", "metrics.jsonl", "summary.json"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "final_model" / "config.json").is_file()
    assert list(run_dir.glob("wandb/offline-run-*")), "W&B logs offline"
    stored = json.loads((run_dir / "summary.json").read_text())
    assert stored["before"] and stored["after"] and "improvement" in stored
    assert summary["timings"]["total_s"] > 0
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["warm_start/step"] for row in logged if "warm_start/step" in row] == list(range(1, 21))
    assert [row["step"] for row in logged if "step" in row] == [1, 2]  # GRPO's rows after the warm start's
    assert len((run_dir / "metrics.csv").read_text().splitlines()) == 1 + 20 + 2
