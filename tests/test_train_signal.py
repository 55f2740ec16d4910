"""The built-in trainer's learning signal: the KL reference, low-precision weights, the temperature and
the model's own logit processing in the loss, and the numerical guards."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from agentboost.agents.strands_agent import StrandsAgent  # noqa: E402
from agentboost.batch import episodes_to_batch  # noqa: E402
from agentboost.chat.template import ChatTemplate  # noqa: E402
from agentboost.environments.arithmetic import SYSTEM_PROMPT, make_tasks  # noqa: E402
from agentboost.quickstart import ENV, QuickstartConfig, _build_model  # noqa: E402
from agentboost.train import trainer as trainer_module  # noqa: E402
from agentboost.train.demonstration import demo_turns  # noqa: E402
from agentboost.train.grpo import policy_loss  # noqa: E402
from agentboost.train.logprobs import response_logprobs  # noqa: E402
from agentboost.train.sft import demonstration_episodes  # noqa: E402
from agentboost.train.trainer import GRPOTrainer, TrainConfig  # noqa: E402
from agentboost.types import Budget, SamplingParams  # noqa: E402

AGENT = StrandsAgent(system_prompt=SYSTEM_PROMPT)


@pytest.fixture(scope="module")
def tiny():
    rows = make_tasks(32, max_ops=1, max_value=9)
    model, tokenizer = _build_model(QuickstartConfig(hidden_size=64, num_layers=1, seed=0), rows)
    template = ChatTemplate(tokenizer)
    return model, tokenizer, template, rows


def _fresh_copy(model):
    import copy

    return copy.deepcopy(model)


def _scored_demos(template, rows, n_rows: int = 4):
    """Demonstration episodes in groups of two: one rewarded, one not (a GRPO signal in every group)."""
    bare = demonstration_episodes(rows[:n_rows], demo_turns(verbose=False), template, env=ENV, agent=AGENT)
    verbose = demonstration_episodes(rows[:n_rows], demo_turns(verbose=True), template, env=ENV, agent=AGENT)
    episodes = []
    for i, (good, bad) in enumerate(zip(bare, verbose, strict=True)):
        for episode, reward in ((good, 1.0), (bad, 0.0)):
            episode.reward = reward
            episode.metadata["group_id"] = f"g{i}"
            episodes.append(episode)
    return episodes


def _config(tmp_path, **changes):
    base = dict(
        run_dir=str(tmp_path), steps=1, prompts_per_step=2, group_size=2, eval_every=0, save_every=1,
        wandb_project=None, logprob_gap_alarm=None, lr=1e-3,
        sampling=SamplingParams(temperature=1.0, max_tokens_per_call=24),
        budget=Budget(max_turns=3, max_total_tokens=512, wall_clock_s=120),
    )  # fmt: skip
    base.update(changes)
    return TrainConfig(**base)


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# -- 6. the KL reference -------------------------------------------------------------------------
def test_kl_reference_is_the_policy_when_grpo_starts_and_is_restored_on_resume(tiny, tmp_path) -> None:
    model, _, template, rows = tiny
    policy = _fresh_copy(model)
    trainer = GRPOTrainer(policy, template, rows, env=ENV, agent=AGENT, config=_config(tmp_path, kl_coef=0.1))
    with torch.no_grad():  # a warm start happens after the trainer is built (as in the quickstart)
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    warm = _params(policy)
    trainer.fit(resume=False, progress=False)
    reference = dict(trainer.reference.named_parameters())
    assert all(torch.equal(reference[n], warm[n]) for n in warm), "the reference is not the warm-started policy"
    assert trainer.step == 1 and (tmp_path / "checkpoint" / "reference_state.pt").is_file()

    # Resume into a model object that starts elsewhere: the reference comes back from the checkpoint.
    other = _fresh_copy(model)
    resumed = GRPOTrainer(other, template, rows, env=ENV, agent=AGENT, config=_config(tmp_path, kl_coef=0.1, steps=1))
    assert resumed.load_checkpoint()
    reference = dict(resumed.ensure_reference().named_parameters())
    assert all(torch.equal(reference[n], warm[n]) for n in warm), "the resumed reference is not the saved one"


# -- 7. low-precision weights --------------------------------------------------------------------
def test_bf16_full_fine_tuning_keeps_its_small_updates(tiny, tmp_path) -> None:
    """AdamW moves a weight by ~lr per step; a bf16 weight of magnitude 0.02 moves in steps of ~1.2e-4.
    Without fp32 master weights nearly every update at lr 1e-5 rounds away."""
    model, _, template, rows = tiny
    policy = _fresh_copy(model).to(torch.bfloat16)
    trainer = GRPOTrainer(policy, template, rows, env=ENV, agent=AGENT, config=_config(tmp_path, lr=1e-5))
    episodes = _scored_demos(template, rows)
    weights = [n for n, p in policy.named_parameters() if p.dim() == 2]
    before = _params(policy)
    for _ in range(10):
        metrics = trainer.update(episodes)
        assert metrics["skipped_update"] == 0.0
    after = dict(policy.named_parameters())
    changed = sum(int((after[n] != before[n]).sum()) for n in weights) / sum(before[n].numel() for n in weights)
    assert changed > 0.5, f"only {changed:.0%} of the bf16 weights changed in 10 steps at lr 1e-5"
    assert all(p.dtype == torch.bfloat16 for p in policy.parameters())  # still a bf16 model


# -- 8. the loss's log-probs are the sampled distribution's -------------------------------------
def _tiny_with_logit_scaling(kind: str):
    from transformers import CohereConfig, CohereForCausalLM, Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=256)  # fmt: skip
    if kind == "cohere":
        return CohereForCausalLM(CohereConfig(**common, logit_scale=0.125, tie_word_embeddings=False)).eval()
    return Gemma2ForCausalLM(Gemma2Config(**common, head_dim=16, final_logit_softcapping=2.0)).eval()


def _toy_batch(vocab: int):
    from agentboost.episode import Episode, ModelCall, Segment, SegmentKind

    torch.manual_seed(1)
    episode = Episode(id="toy")
    prompt = torch.randint(0, vocab, (7,)).tolist()
    response = torch.randint(0, vocab, (9,)).tolist()
    episode.append(Segment(SegmentKind.PROMPT, prompt, 0))
    episode.append(Segment(SegmentKind.MODEL, response, 0, [0.0] * len(response)))
    episode.calls.append(ModelCall(0, len(prompt), len(prompt), len(response), 9, "stop", ""))
    return episodes_to_batch([episode], pad_token_id=0), prompt + response, len(prompt)


@pytest.mark.parametrize("kind", ["cohere", "gemma2"])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_loss_logprobs_go_through_the_models_own_logit_processing(kind, temperature) -> None:
    model = _tiny_with_logit_scaling(kind)
    batch, ids, p = _toy_batch(model.config.vocab_size)
    with torch.no_grad():
        ours = response_logprobs(model, batch, temperature=temperature)
        logits = model(input_ids=torch.tensor([ids])).logits[0].float() / temperature
    expected = torch.log_softmax(logits, dim=-1)[p - 1 : len(ids) - 1].gather(-1, torch.tensor(ids[p:])[:, None])
    assert torch.allclose(ours[0, : len(ids) - p], expected.squeeze(-1), atol=1e-5)


def test_a_model_whose_head_processing_is_unknown_is_refused(tiny, tmp_path) -> None:
    model, _, template, rows = tiny
    policy = _fresh_copy(model)
    forward = policy.forward

    def scaled_forward(*args, **kwargs):  # post-processing no config attribute announces
        out = forward(*args, **kwargs)
        out.logits = out.logits * 3.0
        return out

    policy.forward = scaled_forward
    with pytest.raises(TypeError, match="post-processes its output logits"):
        GRPOTrainer(policy, template, rows, env=ENV, agent=AGENT, config=_config(tmp_path))


def test_the_trainer_takes_log_probs_at_the_sampling_temperature(tiny, tmp_path, monkeypatch) -> None:
    model, _, template, rows = tiny
    policy = _fresh_copy(model)
    config = _config(tmp_path, sampling=SamplingParams(temperature=0.7, max_tokens_per_call=24))
    trainer = GRPOTrainer(policy, template, rows, env=ENV, agent=AGENT, config=config)
    seen = []
    real = trainer_module.response_logprobs

    def spy(model, batch, **kwargs):
        seen.append(kwargs.get("temperature", 1.0))
        return real(model, batch, **kwargs)

    monkeypatch.setattr(trainer_module, "response_logprobs", spy)
    trainer.update(_scored_demos(template, rows))
    assert seen and set(seen) == {0.7}
    with pytest.raises(ValueError, match="temperature > 0"):
        _config(tmp_path, sampling=SamplingParams(temperature=0.0))


# -- 9. numerical guards -------------------------------------------------------------------------
def test_an_extreme_log_ratio_gives_a_finite_gradient() -> None:
    mask = torch.ones(2, 3)
    old = torch.zeros(2, 3)
    new = torch.full((2, 3), 100.0, requires_grad=True)  # exp(100) overflows float32
    loss, metrics = policy_loss(new, old, torch.tensor([1.0, -1.0]), mask)
    loss.backward()
    assert math.isfinite(float(loss)) and torch.isfinite(new.grad).all()
    kl_new = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = policy_loss(kl_new, old, torch.tensor([1.0, -1.0]), mask, ref_logprobs=old + 60.0, kl_coef=1.0)
    loss.backward()
    assert metrics["kl_ref"] <= 10.0 and torch.isfinite(kl_new.grad).all()


def test_a_step_with_a_non_finite_gradient_is_skipped_and_counted(tiny, tmp_path) -> None:
    model, _, template, rows = tiny
    policy = _fresh_copy(model)
    trainer = GRPOTrainer(policy, template, rows, env=ENV, agent=AGENT, config=_config(tmp_path))
    before = _params(policy)
    first = next(p for p in policy.parameters() if p.requires_grad)
    hook = first.register_hook(lambda grad: grad * float("inf"))
    metrics = trainer.update(_scored_demos(template, rows))
    hook.remove()
    assert metrics["nonfinite_grad_skips"] == 1.0
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())  # nothing written
    metrics = trainer.update(_scored_demos(template, rows))  # the next step trains normally
    assert metrics["nonfinite_grad_skips"] == 0.0
    assert all(torch.isfinite(p).all() for p in policy.parameters())
    assert not all(torch.equal(p, before[n]) for n, p in policy.named_parameters())
