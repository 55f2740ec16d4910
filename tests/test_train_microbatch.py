"""The trainer's length-bucketed micro-batches: the same gradient as one pass over the minibatch
(token-mean over all its loss tokens), with each chunk trimmed to its own rows' lengths."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from agentboost.agents.strands_agent import StrandsAgent  # noqa: E402
from agentboost.batch import compact, episodes_to_batch, length_chunks, select_rows  # noqa: E402
from agentboost.chat.template import ChatTemplate  # noqa: E402
from agentboost.environments.arithmetic import SYSTEM_PROMPT, make_tasks  # noqa: E402
from agentboost.quickstart import ENV, QuickstartConfig, _build_model, demo_turns  # noqa: E402
from agentboost.train import trainer as trainer_module  # noqa: E402
from agentboost.train.logprobs import response_logprobs  # noqa: E402
from agentboost.train.sft import demonstration_episodes  # noqa: E402
from agentboost.train.trainer import GRPOTrainer, TrainConfig  # noqa: E402
from agentboost.types import Budget, SamplingParams  # noqa: E402

AGENT = StrandsAgent(system_prompt=SYSTEM_PROMPT)


@pytest.fixture(scope="module")
def tiny():
    rows = make_tasks(32, max_ops=1, max_value=9)
    model, tokenizer = _build_model(QuickstartConfig(hidden_size=64, num_layers=1, seed=0), rows)
    return model, ChatTemplate(tokenizer), rows


def _episodes(template, rows):
    """Groups of three of very different lengths (a bare answer, a sentence, a long rambling one),
    rewarded differently, with one masked episode: every group has a signal."""

    def rambling(row):
        call, _ = demo_turns(verbose=False)(row)
        return [call, "Let me think about this carefully. " * 12 + str(row["answer"])]

    styles = [(demo_turns(verbose=False), 1.0), (demo_turns(verbose=True), 0.0), (rambling, 0.5)]
    episodes = []
    for turns, reward in styles:
        for i, episode in enumerate(demonstration_episodes(rows[:4], turns, template, env=ENV, agent=AGENT)):
            episode.reward = reward
            episode.metadata["group_id"] = f"g{i}"
            episodes.append(episode)
    episodes[-1].masked = True
    return episodes


def _trainer(model, template, rows, tmp_path, budget):
    config = TrainConfig(
        run_dir=str(tmp_path), steps=1, prompts_per_step=2, group_size=2, eval_every=0, save_every=0,
        wandb_project=None, logprob_gap_alarm=None, lr=1e-3, micro_batch_tokens=budget,
        sampling=SamplingParams(temperature=0.8, max_tokens_per_call=24),
        budget=Budget(max_turns=3, max_total_tokens=512, wall_clock_s=120),
    )  # fmt: skip
    return GRPOTrainer(copy.deepcopy(model), template, rows, env=ENV, agent=AGENT, config=config)


def _update_capturing(trainer, episodes, monkeypatch):
    """Run one update; return (metrics, gradients as clipped, padded shapes seen by the forward)."""
    grads: dict[str, torch.Tensor] = {}
    shapes: list[tuple[int, int]] = []
    real_clip = trainer.optimizer.clip_grad_norm_
    real_logprobs = trainer_module.response_logprobs

    def clip(max_norm):
        for name, p in trainer.model.named_parameters():
            if p.grad is not None:
                grads[name] = p.grad.detach().clone()
        return real_clip(max_norm)

    def spy(model, batch, **kwargs):
        if torch.is_grad_enabled():
            shapes.append(tuple(batch.input_ids.shape))
        return real_logprobs(model, batch, **kwargs)

    monkeypatch.setattr(trainer.optimizer, "clip_grad_norm_", clip)
    monkeypatch.setattr(trainer_module, "response_logprobs", spy)
    metrics = trainer.update(episodes)
    monkeypatch.setattr(trainer_module, "response_logprobs", real_logprobs)
    return metrics, grads, shapes


def test_micro_batches_give_the_one_pass_gradient_on_fewer_padded_tokens(tiny, tmp_path, monkeypatch) -> None:
    model, template, rows = tiny
    episodes = _episodes(template, rows)
    whole, grads_whole, shapes_whole = _update_capturing(
        _trainer(model, template, rows, tmp_path / "a", None), episodes, monkeypatch
    )
    chunked, grads_chunked, shapes_chunked = _update_capturing(
        _trainer(model, template, rows, tmp_path / "b", 1), _episodes(template, rows), monkeypatch
    )
    assert len(shapes_whole) == 1 and len(shapes_chunked) == len(episodes)  # budget 1: a row per chunk
    assert sum(a * b for a, b in shapes_chunked) < 0.8 * shapes_whole[0][0] * shapes_whole[0][1]
    assert grads_whole.keys() == grads_chunked.keys() and grads_whole
    for name, grad in grads_whole.items():
        torch.testing.assert_close(grads_chunked[name], grad, rtol=1e-4, atol=1e-7, msg=name)
    for key in ("pg_loss", "loss", "clip_frac", "approx_kl_old", "loss_tokens", "grad_norm", "logprob_gap"):
        assert chunked[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-7), key


def test_the_chunks_follow_length_and_the_token_budget(tiny) -> None:
    _, template, rows = tiny
    episodes = _episodes(template, rows)
    batch = episodes_to_batch(episodes, pad_token_id=0)
    lengths = batch.attention_mask.sum(1).tolist()
    budget = 3 * max(lengths)
    chunks = length_chunks(batch, list(range(len(batch))), budget)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(batch)))  # every row once
    flat = [lengths[i] for chunk in chunks for i in chunk]
    assert flat == sorted(flat)  # shortest first
    for chunk in chunks:
        assert len(chunk) * max(lengths[i] for i in chunk) <= budget
    assert length_chunks(batch, [0, 1], 1) == [[0], [1]] or length_chunks(batch, [0, 1], 1) == [[1], [0]]


def test_compact_keeps_every_log_prob(tiny) -> None:
    model, template, rows = tiny
    episodes = _episodes(template, rows)
    batch = episodes_to_batch(episodes, pad_token_id=0)
    short = [i for i in range(len(batch)) if not episodes[i].masked][:2]
    sub = select_rows(batch, short)
    trimmed = compact(sub)
    assert trimmed.input_ids.shape[1] < sub.input_ids.shape[1]
    width = trimmed.responses.shape[1]
    assert not bool(sub.attention_mask[:, sub.prompt_length + width :].any())  # only padding was cut
    with torch.no_grad():
        full = response_logprobs(model, sub, temperature=0.8)
        ours = response_logprobs(model, trimmed, temperature=0.8)
    torch.testing.assert_close(ours, full[:, :width], rtol=1e-5, atol=1e-5)
    assert not bool(full[:, width:].any())
