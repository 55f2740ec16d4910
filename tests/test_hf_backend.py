"""The in-process transformers backend on a real (tiny, randomly initialised) Qwen2 model."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from agentboost.backends.base import GenerationRequest  # noqa: E402
from agentboost.backends.hf_local import HFLocalBackend  # noqa: E402
from agentboost.errors import BackendContextOverflow  # noqa: E402
from agentboost.offline.tiny_model import build_tiny_qwen2  # noqa: E402
from agentboost.types import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_qwen2(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1)


def _req(prompt, *, max_tokens=12, temperature=0.0, seed=None, stops=(), rid="r"):
    return GenerationRequest(
        prompt_ids=list(prompt), sampling=SamplingParams(temperature=temperature, seed=seed),
        max_tokens=max_tokens, request_id=rid, stop_token_ids=tuple(stops),
    )  # fmt: skip


def _gen(backend, requests):
    async def go():
        return await asyncio.gather(*(backend.generate(r) for r in requests))

    return asyncio.run(go())


def test_batched_greedy_equals_single(tiny) -> None:
    model, tok = tiny
    prompts = [tok.encode("Hello there"), tok.encode("A much longer prompt with several more tokens in it"), [5, 6]]
    single = [_gen(HFLocalBackend(model, max_batch_size=1), [_req(p)])[0].token_ids for p in prompts]
    backend = HFLocalBackend(model, max_batch_size=8, batch_window_s=0.05)
    batched = [r.token_ids for r in _gen(backend, [_req(p, rid=str(i)) for i, p in enumerate(prompts)])]
    assert batched == single
    assert backend.batches == 1


def test_logprobs_are_the_models_raw_logprobs(tiny) -> None:
    model, tok = tiny
    prompt = tok.encode("Check the logprobs")
    result = _gen(HFLocalBackend(model), [_req(prompt, temperature=1.0, seed=3, max_tokens=8)])[0]
    assert len(result.logprobs) == len(result.token_ids) == 8
    full = torch.tensor([prompt + result.token_ids])
    with torch.no_grad():
        logits = model(full).logits[0].float()
    ref = torch.log_softmax(logits, -1)
    for i, token in enumerate(result.token_ids):
        assert result.logprobs[i] == pytest.approx(float(ref[len(prompt) - 1 + i, token]), abs=1e-4)


def test_seeds_reproduce_and_stops_and_budgets_apply(tiny) -> None:
    model, tok = tiny
    backend = HFLocalBackend(model)
    prompt = tok.encode("seeded sampling")
    a = _gen(backend, [_req(prompt, temperature=1.0, seed=11, max_tokens=10)])[0]
    b = _gen(backend, [_req(prompt, temperature=1.0, seed=11, max_tokens=10)])[0]
    assert a.token_ids == b.token_ids and a.finish_reason == "length" and len(a.token_ids) == 10
    stop = a.token_ids[3]
    c = _gen(backend, [_req(prompt, temperature=1.0, seed=11, max_tokens=10, stops=[stop])])[0]
    first = a.token_ids.index(stop)
    assert c.token_ids == a.token_ids[: first + 1] and c.finish_reason == "stop"


def test_rollouts_come_from_the_current_weights(tiny) -> None:
    model, tok = tiny
    backend = HFLocalBackend(model)
    prompt = tok.encode("policy freshness")
    before = _gen(backend, [_req(prompt, max_tokens=6)])[0].token_ids
    with backend.lock, torch.no_grad():
        saved = model.model.norm.weight.clone()
        model.model.norm.weight.mul_(-3.0)
    try:
        after = _gen(backend, [_req(prompt, max_tokens=6)])[0].token_ids
    finally:
        with torch.no_grad():
            model.model.norm.weight.copy_(saved)
    assert before != after


def test_context_overflow(tiny) -> None:
    model, _ = tiny
    backend = HFLocalBackend(model, max_context=64)
    with pytest.raises(BackendContextOverflow):
        _gen(backend, [_req(list(range(60)), max_tokens=10)])


def test_a_shared_prefix_is_prefilled_once_with_the_same_tokens_and_logprobs(tiny) -> None:
    model, tok = tiny
    system = tok.encode("You are a calculator assistant. Use the calculator tool, then answer with the number.")
    assert len(system) >= 16
    tails = [tok.encode(" What is 7 * 8?"), tok.encode(" What is 1 - 2 + 3?"), tok.encode(" Hi")]
    requests = [_req(system + t, rid=str(i), temperature=1.0, seed=i, max_tokens=10) for i, t in enumerate(tails)]

    def run(share):
        backend = HFLocalBackend(model, max_batch_size=8, batch_window_s=0.05)
        backend.shares_prefix = None if share else False
        results = _gen(backend, requests)
        assert backend.batches == 1
        return backend, results

    shared_backend, shared = run(True)
    _, full = run(False)
    assert shared_backend.shares_prefix is True
    for a, b in zip(shared, full, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.parametrize("share", [True, False], ids=["shared-prefix", "full-prefill"])
def test_finished_rows_leave_the_batch_and_the_others_decode_as_alone(tiny, share) -> None:
    """Rows that stop early (their budget, a stop token) are dropped with their cache while the rest
    decode on: every request's tokens and log-probs are what it gets decoded alone."""
    model, tok = tiny
    system = tok.encode("You are a calculator assistant. Use the calculator tool, then answer with the number.")
    tails = [" What is 7 * 8?", " What is 1 - 2 + 3?", " Hi", " Compute 12 / 4", " And 5 * 5 * 5 now?", " 9"]
    requests = [
        _req(system + tok.encode(t), rid=str(i), temperature=1.0, seed=100 + i, max_tokens=2 + 4 * i)
        for i, t in enumerate(tails)
    ]
    alone = [_gen(HFLocalBackend(model, max_batch_size=1), [r])[0] for r in requests]
    stop = alone[5].token_ids[3]  # a stop token that ends the last request early, maybe others too
    requests[5] = _req(system + tok.encode(tails[5]), rid="5", temperature=1.0, seed=105, max_tokens=22, stops=[stop])
    alone[5] = _gen(HFLocalBackend(model, max_batch_size=1), [requests[5]])[0]
    backend = HFLocalBackend(model, max_batch_size=8, batch_window_s=0.05)
    backend.shares_prefix = None if share else False
    batched = _gen(backend, requests)
    assert backend.batches == 1 and backend.compactions >= 2
    for a, b in zip(batched, alone, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert [len(r.token_ids) for r in batched[:5]] == [2, 6, 10, 14, 18]


def test_a_model_whose_cache_cannot_be_shared_is_prefilled_in_full(tiny, monkeypatch) -> None:
    model, tok = tiny
    system = tok.encode("You are a calculator assistant. Use the calculator tool, then answer with the number.")
    requests = [_req(system + tok.encode(t), rid=t) for t in (" one", " two plus")]
    expected = [r.token_ids for r in _gen(HFLocalBackend(model, max_batch_size=1), requests)]
    backend = HFLocalBackend(model, max_batch_size=8, batch_window_s=0.05)

    def unsupported(self, requests, k):
        raise AttributeError("no batch_repeat_interleave")

    monkeypatch.setattr(HFLocalBackend, "_prefill_sharing", unsupported)
    assert [r.token_ids for r in _gen(backend, requests)] == expected
    assert backend.shares_prefix is False


def test_a_sliding_window_model_is_prefilled_in_full(tiny) -> None:
    """A shared prefill puts each prompt's left padding between the prefix and its tail; under a
    sliding window those pad slots take window positions, so a padded prompt would see fewer real
    tokens than in a full prefill (its log-probs would be wrong). Such models are prefilled in full."""
    from transformers import MistralConfig, MistralForCausalLM

    _, tok = tiny
    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, sliding_window=24, max_position_embeddings=256, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    model = MistralForCausalLM(config).eval()
    system = tok.encode("You are a calculator assistant. Use the calculator tool, then answer with the number.")
    tails = [tok.encode(" What is 7 * 8? Please answer with just the number"), tok.encode(" Hi")]
    requests = [_req(system + t, rid=str(i), temperature=1.0, seed=i, max_tokens=8) for i, t in enumerate(tails)]
    alone = [_gen(HFLocalBackend(model, max_batch_size=1), [r])[0] for r in requests]
    backend = HFLocalBackend(model, max_batch_size=8, batch_window_s=0.05)
    # The first batch is one GRPO group: the same prompt n times, no padding, nothing to see there.
    _gen(backend, [_req(system + tails[1], rid=f"g{i}", temperature=1.0, seed=i, max_tokens=4) for i in range(2)])
    batched = _gen(backend, requests)
    assert backend.batches == 2 and backend.shares_prefix is False
    for a, b in zip(batched, alone, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def _batch_sizes(backend, monkeypatch) -> list[int]:
    """The size of every batch ``backend`` decodes from now on (filled as it decodes)."""
    sizes: list[int] = []
    decode = backend._decode_batch

    def recorded(requests, stop=None):
        sizes.append(len(requests))
        return decode(requests, stop)

    monkeypatch.setattr(backend, "_decode_batch", recorded)
    return sizes


def test_requests_queued_behind_a_busy_event_loop_all_join_one_batch(tiny, monkeypatch) -> None:
    """Episodes' Python (Strands, templates) keeps the event loop busy for milliseconds at a time: requests
    already waiting must all join the batch, however long the loop took to hand the batcher its turn (one
    request per busy loop turn made GRPO decode its 64 episodes in batches of 2-5, 3-4x slower)."""
    import time

    model, tok = tiny
    backend = HFLocalBackend(model, max_batch_size=64, batch_window_s=0.005)
    sizes = _batch_sizes(backend, monkeypatch)
    prompt = tok.encode("Hello there")

    async def busy() -> None:  # other episodes' work between the batcher's turns
        for _ in range(40):
            time.sleep(0.004)
            await asyncio.sleep(0)

    async def go():
        hogs = [asyncio.ensure_future(busy()) for _ in range(4)]
        results = await asyncio.gather(*(backend.generate(_req(prompt, max_tokens=2, rid=str(i))) for i in range(24)))
        await asyncio.gather(*hogs)
        return results

    results = asyncio.run(go())
    assert len(results) == 24
    assert sizes == [24]


def test_a_batch_stays_open_while_requests_keep_arriving_up_to_its_cap(tiny, monkeypatch) -> None:
    model, tok = tiny

    def run(window: float, cap: float, gap: float) -> list[int]:
        backend = HFLocalBackend(model, max_batch_size=64, batch_window_s=window, max_batch_wait_s=cap)
        sizes = _batch_sizes(backend, monkeypatch)
        prompt = tok.encode("Hello there")

        async def late(i: int):
            await asyncio.sleep(i * gap)
            return await backend.generate(_req(prompt, max_tokens=2, rid=str(i)))

        async def go():
            return await asyncio.gather(*(late(i) for i in range(6)))

        asyncio.run(go())
        return sizes

    assert run(window=0.5, cap=5.0, gap=0.05) == [6]  # each arrival inside the window of the one before
    capped = run(window=0.15, cap=0.25, gap=0.1)  # the cap closes the batch while requests still come
    assert sum(capped) == 6 and len(capped) >= 2 and capped[0] < 6


def test_only_caches_of_plain_key_value_layers_drop_finished_rows() -> None:
    """A layer that subclasses DynamicLayer but holds more state (transformers 5's hybrid linear-attention
    layers: convolution and recurrent states) would keep every row of that state: such caches are not
    compacted."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    from agentboost.backends.hf_local import _compactable

    class HybridLayer(DynamicLayer):
        pass

    cache = DynamicCache()
    cache.layers = [DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=8)]
    assert _compactable(cache)
    cache.layers = [DynamicLayer(), HybridLayer()]
    assert not _compactable(cache)


def test_each_call_of_a_seeded_episode_draws_from_its_own_seed(tiny) -> None:
    """Issue 38 (3): a window of 2 messages makes an agent's later calls send the identical prompt; seeded
    by the episode's seed and the prompt's length they drew the identical sample. Seeded by (episode
    seed, call), each draws its own."""
    import dataclasses

    from strands import Agent
    from strands.agent.conversation_manager import SlidingWindowConversationManager

    from agentboost.agents.strands_agent import StrandsAgent
    from agentboost.backends.base import GenerationResult
    from agentboost.chat.template import ChatTemplate
    from agentboost.environments.strands_env import StrandsEnv
    from agentboost.rollout import RolloutSettings, run_episode
    from agentboost.types import Budget, Termination

    from .helpers import add, calls_text

    model, tok = tiny
    template = ChatTemplate(tok)
    real = HFLocalBackend(model)
    drawn: list[tuple[list[int], list[int], int]] = []

    class Tee:  # samples with the real backend, then answers the agent from a script (8 calls)
        async def generate(self, request):
            sample = await real.generate(dataclasses.replace(request, max_tokens=6))
            drawn.append((request.prompt_ids, sample.token_ids, request.sampling.seed))
            text = calls_text(template.parser.name, [("add", {"a": 1, "b": 1})]) if len(drawn) < 8 else "2"
            ids = [*template.encode(text), template.info.eot_token_id]
            return GenerationResult(token_ids=ids, finish_reason="stop", logprobs=[-0.1] * len(ids))

    def factory(*, model, tools, task, **defaults):
        window = SlidingWindowConversationManager(window_size=2, per_turn=True)
        return Agent(model=model, tools=tools, **{**defaults, "conversation_manager": window})

    env = StrandsEnv({"prompt": "Add one and one."}, tools=[add], reward_fn=lambda t, e: 1.0)
    sampling = SamplingParams(temperature=1.0, seed=7, max_tokens_per_call=64)
    settings = RolloutSettings(sampling=sampling, budget=Budget(max_turns=10))
    episode = asyncio.run(run_episode(env, StrandsAgent(factory), Tee(), template, settings))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert len(drawn) == len(episode.calls) == 8
    prompts = [tuple(p) for p, _, _ in drawn]
    repeated = [i for i, p in enumerate(prompts) if prompts.count(p) > 1]
    assert len(repeated) >= 5, "the window sends one prompt again and again"
    assert len({tuple(drawn[i][1]) for i in repeated}) == len(repeated), "each call draws its own sample"
    assert len({seed for _, _, seed in drawn}) == 8
