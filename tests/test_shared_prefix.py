"""The loss's forward runs the rows' common prefix once (system prompt, tool specs) and shares its
cache: same log-probs and gradients as a full forward, checked once per model, full forward otherwise."""

from __future__ import annotations

import copy
import logging

import pytest

torch = pytest.importorskip("torch")

from agentboost.agents.strands_agent import StrandsAgent  # noqa: E402
from agentboost.batch import episodes_to_batch  # noqa: E402
from agentboost.chat.template import ChatTemplate  # noqa: E402
from agentboost.environments.arithmetic import SYSTEM_PROMPT, make_tasks  # noqa: E402
from agentboost.quickstart import ENV, QuickstartConfig, _build_model  # noqa: E402
from agentboost.tools.calculator import evaluate  # noqa: E402
from agentboost.train import logprobs as logprobs_module  # noqa: E402
from agentboost.train.demonstration import demo_turns  # noqa: E402
from agentboost.train.logprobs import response_logprobs, shared_prefix_length  # noqa: E402
from agentboost.train.sft import demonstration_episodes  # noqa: E402

AGENT = StrandsAgent(system_prompt=SYSTEM_PROMPT)


@pytest.fixture(scope="module")
def setup():
    rows = make_tasks(16, max_ops=1, max_value=9)
    model, tokenizer = _build_model(QuickstartConfig(hidden_size=64, num_layers=2, seed=0), rows)
    template = ChatTemplate(tokenizer)
    episodes = demonstration_episodes(rows[:4], demo_turns(verbose=False), template, env=ENV, agent=AGENT)
    episodes += demonstration_episodes(rows[4:8], demo_turns(verbose=True), template, env=ENV, agent=AGENT)
    return model, tokenizer, episodes


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    values = response_logprobs(model, batch, temperature=0.7)
    loss = -(values * batch.response_mask).sum()
    loss.backward()
    return values.detach(), {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def _assert_shared_equals_full(model, batch, k: int) -> None:
    """The shared-prefix path is taken (with prefix ``k``) and gives the full forward's log-probs and gradients."""
    shared_model, full_model = copy.deepcopy(model), copy.deepcopy(model)
    logprobs_module._SHARES_PREFIX[full_model] = False  # as for a model whose cache cannot be shared
    shared_model.train()
    full_model.train()
    calls = []
    original = logprobs_module._shared_prefix_forward
    logprobs_module._shared_prefix_forward = lambda *a, **kw: calls.append(a[-1]) or original(*a, **kw)
    try:
        shared_values, shared_grads = _loss_and_grads(shared_model, batch)
        full_values, full_grads = _loss_and_grads(full_model, batch)
    finally:
        logprobs_module._shared_prefix_forward = original
    assert logprobs_module._SHARES_PREFIX[shared_model] is True
    assert k in calls, "the shared path was taken for the checked model"
    assert torch.allclose(shared_values, full_values, atol=1e-5)
    for name, grad in full_grads.items():
        # another summation order (the prefix's rows summed once): an error relative to the gradient's own
        # scale, not per element (an embedding row's gradient sums many positions; one machine missed by 1e-6)
        error = float((shared_grads[name] - grad).abs().max())
        assert error <= 1e-4 * float(grad.abs().max()) + 1e-7, (name, error, float(grad.abs().max()))


def test_shared_prefix_gives_the_full_forwards_logprobs_and_gradients(setup) -> None:
    model, tokenizer, episodes = setup
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    k = shared_prefix_length(batch.input_ids, batch.attention_mask, batch.position_ids, batch.prompt_length)
    assert k > 100, "the quickstart's rows share the system prompt and the tool specs"
    _assert_shared_equals_full(model, batch, k)


def test_rows_of_different_prompt_lengths_share_their_prefix_with_the_full_forwards_results(setup) -> None:
    # prompts are left-padded: "What is 7*8?" and "What is 714*86?" put the same system prompt at other
    # columns; realigned, they share it (the quickstart's warm start draws such expressions)
    model, tokenizer, _ = setup
    template = ChatTemplate(tokenizer)
    expressions = ["7*8", "714*86", "12+345", "9-3", "88*7", "123-45"]
    rows = [{"task_id": f"t{i}", "prompt": f"What is {e}?", "expression": e, "answer": str(evaluate(e))}
            for i, e in enumerate(expressions)]  # fmt: skip
    episodes = demonstration_episodes(rows, demo_turns(verbose=False), template, env=ENV, agent=AGENT)
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    starts = batch.attention_mask.argmax(dim=1)
    assert len(set(starts.tolist())) > 1, "prompts of several lengths"
    k = shared_prefix_length(batch.input_ids, batch.attention_mask, batch.position_ids, batch.prompt_length)
    assert k > 100
    _assert_shared_equals_full(model, batch, k)


def test_rows_without_a_common_prefix_run_in_full(setup) -> None:
    model, tokenizer, episodes = setup
    batch = episodes_to_batch(episodes[:1], pad_token_id=tokenizer.pad_token_id)
    assert shared_prefix_length(batch.input_ids, batch.attention_mask, batch.position_ids, batch.prompt_length) == 0
    ids = batch.input_ids.clone().repeat(2, 1)
    ids[1, 0] = (ids[1, 0] + 1) % 50  # differ at the first token
    attention, positions = batch.attention_mask.repeat(2, 1), batch.position_ids.repeat(2, 1)
    assert shared_prefix_length(ids, attention, positions, batch.prompt_length) == 0
    padded = attention.clone()
    padded[1, :3] = 0  # a left-padded row shares nothing under its padding
    assert shared_prefix_length(batch.input_ids.repeat(2, 1), padded, positions, batch.prompt_length) == 0
    # never past the last prompt position, whose hidden state the first response token needs
    same = shared_prefix_length(batch.input_ids.repeat(2, 1), attention, positions, batch.prompt_length)
    assert same == batch.prompt_length - 1


def test_a_model_whose_cache_cannot_be_shared_falls_back_once_and_says_so(setup, monkeypatch, caplog) -> None:
    model, tokenizer, episodes = setup
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    fresh = copy.deepcopy(model)
    expected = response_logprobs(model, batch).detach()

    def unsupported(*args, **kwargs):
        raise AttributeError("'Cache' object has no attribute 'batch_repeat_interleave'")

    monkeypatch.setattr(logprobs_module, "_shared_prefix_forward", unsupported)
    with caplog.at_level(logging.INFO, logger="agentboost.train.logprobs"):
        first = response_logprobs(fresh, batch).detach()
        second = response_logprobs(fresh, batch).detach()
    assert logprobs_module._SHARES_PREFIX[fresh] is False
    assert torch.allclose(first, expected, atol=1e-5) and torch.allclose(second, expected, atol=1e-5)
    notes = [r for r in caplog.records if "cannot be shared" in r.getMessage()]
    assert len(notes) == 1 and "batch_repeat_interleave" in notes[0].getMessage()


def test_a_shared_forward_that_differs_from_the_full_one_is_not_used(setup, monkeypatch) -> None:
    model, tokenizer, episodes = setup
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    fresh = copy.deepcopy(model)
    expected = response_logprobs(model, batch).detach()
    original = logprobs_module._shared_prefix_forward
    monkeypatch.setattr(logprobs_module, "_shared_prefix_forward", lambda *a, **kw: original(*a, **kw) + 0.5)
    got = response_logprobs(fresh, batch).detach()
    assert logprobs_module._SHARES_PREFIX[fresh] is False
    assert torch.allclose(got, expected, atol=1e-5)


def _gemma2(vocab: int):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=512, max_position_embeddings=1024,
    )  # fmt: skip
    return Gemma2ForCausalLM(config)


@pytest.mark.parametrize("kind", ["gradient_checkpointing", "gemma2"])
def test_a_model_that_keeps_no_cache_in_training_runs_in_full(setup, kind) -> None:
    """Some models keep no cache in training mode (gradient checkpointing; Gemma 2 creates one only in
    eval mode) although the once-per-model check, run in eval mode, found sharing to work: the
    training forward then runs in full, with the full forward's log-probs and gradients."""
    model, tokenizer, episodes = setup
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    base = copy.deepcopy(model) if kind == "gradient_checkpointing" else _gemma2(model.config.vocab_size)
    policy, full_model = copy.deepcopy(base), copy.deepcopy(base)
    logprobs_module._SHARES_PREFIX[full_model] = False
    if kind == "gradient_checkpointing":
        policy.gradient_checkpointing_enable()
    with torch.no_grad():
        policy.eval()
        response_logprobs(policy, batch, temperature=0.7)  # the check runs here, in eval mode
    assert logprobs_module._SHARES_PREFIX[policy] is True
    policy.train()
    full_model.train()
    values, grads = _loss_and_grads(policy, batch)
    full_values, full_grads = _loss_and_grads(full_model, batch)
    torch.testing.assert_close(values, full_values, rtol=1e-5, atol=1e-5)
    for name, grad in full_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert logprobs_module._SHARES_PREFIX[policy] is False  # no prefix forward thrown away on every batch


def test_a_prefix_forward_that_returns_an_empty_cache_runs_in_full(setup) -> None:
    """A model whose layers drop the cache in training (checkpointed layers that discard
    ``past_key_values``) returns an empty cache object: the tails would run with no prefix at all.
    Detected, and the forward runs in full."""
    from transformers import DynamicCache

    model, tokenizer, episodes = setup
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    policy, full_model = copy.deepcopy(model), copy.deepcopy(model)
    logprobs_module._SHARES_PREFIX[full_model] = False
    with torch.no_grad():
        policy.eval()
        response_logprobs(policy, batch, temperature=0.7)  # the check passes, in eval mode
    assert logprobs_module._SHARES_PREFIX[policy] is True

    def drop_cache(module, args, kwargs, output):
        if policy.training and kwargs.get("use_cache") and kwargs.get("past_key_values") is None:
            output.past_key_values = DynamicCache()
        return output

    policy.model.register_forward_hook(drop_cache, with_kwargs=True)
    policy.train()
    full_model.train()
    values, grads = _loss_and_grads(policy, batch)
    full_values, full_grads = _loss_and_grads(full_model, batch)
    torch.testing.assert_close(values, full_values, rtol=1e-5, atol=1e-5)
    for name, grad in full_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert logprobs_module._SHARES_PREFIX[policy] is False  # no prefix forward thrown away on every batch


def test_running_out_of_memory_in_the_check_does_not_switch_sharing_off_for_good(setup, monkeypatch) -> None:
    model, tokenizer, episodes = setup
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    policy = copy.deepcopy(model)

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(logprobs_module, "_shared_prefix_forward", oom)
    with torch.no_grad(), pytest.raises(torch.OutOfMemoryError):
        response_logprobs(policy.eval(), batch, temperature=0.7)
    assert policy not in logprobs_module._SHARES_PREFIX  # decided on the next batch, not now
