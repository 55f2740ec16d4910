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
from agentboost.quickstart import ENV, QuickstartConfig, _build_model  # noqa: E402
from agentboost.train import trainer as trainer_module  # noqa: E402
from agentboost.train.demonstration import demo_turns  # noqa: E402
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
    trained = sum(not e.masked for e in episodes)  # budget 1: a row per chunk; masked rows have no loss
    assert len(shapes_whole) == 1 and len(shapes_chunked) == trained < len(episodes)
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
        if len(chunk) > 1:  # what the forward is given: the chunk's rows, trimmed to their own padding
            assert len(chunk) * compact(select_rows(batch, chunk)).input_ids.shape[1] <= budget
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


def test_a_chunk_is_priced_at_the_width_its_rows_are_padded_to() -> None:
    """Left-padded prompts and right-padded responses: a row with a long prompt and a short response
    next to one with a short prompt and a long response is padded to long + long, twice either length."""
    from types import SimpleNamespace

    attention = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1, 1, 1]])
    batch = SimpleNamespace(prompt_length=4, attention_mask=attention)  # rows of 5 tokens, padded to 8
    assert length_chunks(batch, [0, 1], 10) == [[0], [1]]
    assert length_chunks(batch, [0, 1], 16) == [[0, 1]]


def test_low_precision_gradients_are_summed_in_fp32_across_micro_batches() -> None:
    """Chunk gradients of GRPO largely cancel (advantages sum to 0 in a group): summed in bf16, 1000 +
    0.5 is 1000 and the 0.5 is lost; the optimizer sums them in its fp32 masters."""
    from agentboost.train.optim import MasterWeightAdamW

    weight = torch.zeros(1, dtype=torch.bfloat16, requires_grad=True)
    optimizer = MasterWeightAdamW([weight], lr=1e-3)
    for scale in (1000.0, 0.5, -1000.0):
        (weight * scale).sum().backward()
        optimizer.accumulate()
    assert optimizer.clip_grad_norm_(1e9) == pytest.approx(0.5)
    optimizer.step()
    assert all(m.grad is None for m in optimizer.masters)  # not kept through the next rollout


def test_the_trainer_sums_a_bf16_models_chunk_gradients_in_fp32(tiny, tmp_path) -> None:
    model, template, rows = tiny
    trainer = _trainer(copy.deepcopy(model).to(torch.bfloat16), template, rows, tmp_path, 1)
    assert trainer.optimizer.has_masters
    bf16_grad_before_backward: list[bool] = []
    weight = next(p for p in trainer.model.parameters() if p.requires_grad)
    weight.register_hook(lambda grad: bf16_grad_before_backward.append(weight.grad is not None))
    trainer.update(_episodes(template, rows))
    assert len(bf16_grad_before_backward) > 1 and not any(bf16_grad_before_backward)


def test_a_minibatch_of_masked_rows_does_not_move_the_weights(tiny, tmp_path, monkeypatch) -> None:
    """With several minibatches, one holding only masked rows has no loss: an Adam step on its zero
    gradient would still move the weights (momentum, weight decay): no step is taken for it."""
    model, template, rows = tiny
    episodes = _episodes(template, rows)
    trainer = _trainer(model, template, rows, tmp_path, None)
    trainer.config.minibatches = len(episodes)  # a row per minibatch
    steps: list[int] = []
    real_step = trainer.optimizer.step
    monkeypatch.setattr(trainer.optimizer, "step", lambda: steps.append(1) or real_step())
    metrics = trainer.update(episodes)
    assert len(steps) == sum(not e.masked for e in episodes) < len(episodes)
    assert metrics["loss_tokens"] > 0


@pytest.mark.parametrize(("field", "value"), [("micro_batch_tokens", 0), ("minibatches", 0), ("ppo_epochs", 0)])
def test_impossible_micro_batch_settings_are_refused(field, value) -> None:
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


def test_grpo_after_a_warm_start_trains_the_warm_started_bf16_weights(tiny, tmp_path, monkeypatch) -> None:
    """The trainer's optimizer is made before the warm start runs: for a bf16 model its fp32 masters were
    the weights before the warm start, and GRPO's first step wrote them back over everything the warm start
    had trained (found by a review). The loop hands the optimizer the warm-started weights."""
    from dataclasses import replace

    from agentboost.quickstart import quickstart_plan
    from agentboost.train import run as run_module
    from agentboost.train.run import run_training

    made: list[GRPOTrainer] = []

    class Recorded(GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(run_module, "GRPOTrainer", Recorded)

    model, template, rows = tiny
    policy = copy.deepcopy(model).to(torch.bfloat16)
    initial = {k: v.clone() for k, v in policy.state_dict().items()}

    class ShiftingWarmStart:
        def run(self, trainer, directory, *, progress):
            with torch.no_grad():
                for p in trainer.model.parameters():
                    p.add_(0.25)
            return {"kind": "shift"}

    cfg = QuickstartConfig(hidden_size=64, num_layers=1, seed=0, train_tasks=8, eval_tasks=2, grpo_steps=1,
                           prompts_per_step=2, group_size=2, eval_every=0, wandb_project=None, tensorboard=False,
                           run_dir=str(tmp_path / "run"), device="cpu")  # fmt: skip
    plan = replace(quickstart_plan(cfg), build_model=lambda: (policy, template.tokenizer),
                   warm_start=ShiftingWarmStart())  # fmt: skip
    run_training(plan, progress=False)
    optimizer = made[0].optimizer
    assert optimizer.has_masters
    for p, master in zip(optimizer.params, optimizer.masters, strict=True):  # GRPO's masters are the weights
        assert float((master.detach() - p.detach().float()).abs().max()) < 0.02  # (before: the initial ones, 0.25 off)
    moved = max(float((policy.state_dict()[k].float() - (v.float() + 0.25)).abs().max()) for k, v in initial.items())
    assert moved < 0.05  # at most one GRPO step from the warm-started weights
