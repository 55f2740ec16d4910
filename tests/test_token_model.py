"""TokenModel behaviour beyond the template matrix: stream events, budgets, divergence detection."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from strands import Agent, tool
from strands.hooks import AfterModelCallEvent

from agentboost.agents.strands_agent import StrandsAgent, agent_defaults, check_agent
from agentboost.backends.base import GenerationResult
from agentboost.backends.scripted import ScriptedBackend, text_script
from agentboost.chat.messages import strands_to_hf, tool_specs_to_openai
from agentboost.episode import SegmentKind
from agentboost.errors import BackendError
from agentboost.model import TokenModel
from agentboost.rollout import RolloutSettings
from agentboost.types import Budget, SamplingParams, Termination

from .conftest import template_for
from .helpers import add, calls_text, mul, run


def _collect(model: TokenModel, messages, **kwargs):
    async def go():
        return [event async for event in model.stream(messages, [add.tool_spec, mul.tool_spec], "sys", **kwargs)]

    return asyncio.run(go())


def test_stream_events_are_well_formed() -> None:
    template = template_for("qwen3-thinking")
    text = "<think>\nplan\n</think>\nsure\n" + calls_text("hermes", [("add", {"a": 1, "b": 2})])
    backend = ScriptedBackend(text_script(template, [text]))
    model = TokenModel(backend, template)
    events = _collect(
        model,
        [{"role": "user", "content": [{"text": "hi"}]}],
        tool_choice=None,
        some_future_kwarg=object(),  # unknown kwargs are accepted
    )
    keys = [next(iter(e)) for e in events]
    assert keys[0] == "messageStart" and keys[-2:] == ["messageStop", "metadata"]
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"
    deltas = [e["contentBlockDelta"]["delta"] for e in events if "contentBlockDelta" in e]
    assert deltas[0] == {"reasoningContent": {"text": "plan"}}
    assert deltas[1] == {"text": "sure"}
    assert deltas[2] == {"toolUse": {"input": '{"a": 1, "b": 2}'}}
    start = [e for e in events if "contentBlockStart" in e][2]["contentBlockStart"]["start"]
    assert start == {"toolUse": {"toolUseId": "call_0_0", "name": "add"}}
    assert keys.count("contentBlockStart") == keys.count("contentBlockStop") == 3
    usage = events[-1]["metadata"]["usage"]
    assert usage["outputTokens"] == len(model.episode.segments[1].token_ids)
    assert usage["inputTokens"] == len(model.episode.prompt_ids)


def test_end_turn_and_max_tokens_stop_reasons(qwen25_template) -> None:
    backend = ScriptedBackend(text_script(qwen25_template, ["The answer is 3.", "x " * 50]))
    model = TokenModel(backend, qwen25_template, sampling=SamplingParams(max_tokens_per_call=10))
    events = _collect(model, [{"role": "user", "content": [{"text": "hi"}]}])
    assert events[-2]["messageStop"]["stopReason"] == "end_turn"
    model2 = TokenModel(ScriptedBackend([list(range(100, 200))]), qwen25_template,
                        sampling=SamplingParams(max_tokens_per_call=10))  # fmt: skip
    events2 = _collect(model2, [{"role": "user", "content": [{"text": "hi"}]}])
    assert events2[-2]["messageStop"]["stopReason"] == "max_tokens"
    assert model2.episode.calls[0].finish_reason == "length"
    assert len(model2.episode.segments[1].token_ids) == 10


def test_truncated_output_never_executes_tools(qwen25_template) -> None:
    # A tool call cut by max_tokens must not run: the episode ends as max_tokens.
    complete = calls_text("hermes", [("add", {"a": 1, "b": 2})])
    ids = qwen25_template.encode(complete)
    episode, _ = run(qwen25_template, [], backend=ScriptedBackend([ids]),
                     settings=RolloutSettings(sampling=SamplingParams(max_tokens_per_call=len(ids) - 1)))  # fmt: skip
    assert episode.termination is Termination.MAX_TOKENS
    assert episode.tool_calls == 0
    assert episode.reward == 0.0 and not episode.masked


def test_non_eot_stop_token_gets_template_eot_as_env_token(qwen25_template) -> None:
    """A response that stops with <|endoftext|> (a stop token, not the template's <|im_end|>) is kept as
    sampled; the next call's env segment starts with the template's end-of-turn token (mask 0)."""
    tpl = qwen25_template
    endoftext = tpl.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert endoftext in tpl.stop_token_ids and endoftext not in tpl.eot_token_ids
    first = [*tpl.encode(calls_text("hermes", [("add", {"a": 2, "b": 3})])), endoftext]
    second = [*tpl.encode("20"), tpl.info.eot_token_id]
    episode, backend = run(tpl, [], backend=ScriptedBackend([first, second]))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    env_segment = episode.segments[2]
    assert env_segment.kind is SegmentKind.ENV
    assert env_segment.token_ids[0] == tpl.info.eot_token_id
    assert episode.segments[1].token_ids == first  # the sampled tokens, untouched
    text = tpl.decode(episode.prompt_ids + episode.response_ids)
    assert "<|endoftext|><|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response>" in text
    assert backend.requests[1].prompt_ids == episode.prompt_ids + episode.response_ids[: -len(second)]


def test_each_call_max_tokens_is_the_remaining_budget(qwen25_template) -> None:
    texts = [calls_text("hermes", [("add", {"a": 2, "b": 3})]), calls_text("hermes", [("mul", {"a": 5, "b": 4})]), "20"]
    budget = Budget(max_total_tokens=2000, max_response_tokens=600)
    episode, backend = run(qwen25_template, texts, settings=RolloutSettings(budget=budget))
    assert episode.termination is Termination.COMPLETED
    prompt_len = len(episode.prompt_ids)
    for call, request in zip(episode.calls, backend.requests, strict=True):
        response_so_far = call.context_tokens - prompt_len
        assert request.max_tokens == min(2000 - call.context_tokens, 600 - response_so_far)
        assert call.max_tokens == request.max_tokens


def test_hook_retry_of_a_completed_call_opens_a_new_trajectory(qwen25_template) -> None:
    """A hook that re-runs a successful model call discards its response: the history no longer extends
    what the model saw, so the retry opens a new trajectory (each one token-exact)."""
    texts = [calls_text("hermes", [("add", {"a": 2, "b": 3})]), "20", "20"]
    retried = []

    def retry_once(event: AfterModelCallEvent) -> None:
        if event.stop_response is not None and not retried:
            retried.append(True)
            event.retry = True

    def factory(*, model, tools, task, **defaults):
        return Agent(model=model, tools=tools, hooks=[retry_once], **defaults)

    from agentboost.environments.strands_env import StrandsEnv
    from agentboost.rollout import run_episode

    env = StrandsEnv({"prompt": "q"}, tools=[add], reward_fn=lambda t, e: 1.0)
    backend = ScriptedBackend(text_script(qwen25_template, texts))
    episode = asyncio.run(run_episode(env, StrandsAgent(factory), backend, qwen25_template))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert not episode.masked and episode.reward == 1.0
    first, second = episode.trajectories
    assert [t.info.opened_by for t in episode.trajectories] == ["start", "history_rewritten"]
    assert "previous response is not next" in second.info.detail
    assert first.prompt_ids == second.prompt_ids  # the retry was given the same history
    assert len(first.calls) == 1 and len(second.calls) == 1 and episode.final_text == "20"
    assert second.info.rerendered_tokens == len(second.prompt_ids)
    episode.check_invariants()


def test_server_prompt_echo_mismatch_is_divergence(qwen25_template) -> None:
    class LyingBackend(ScriptedBackend):
        async def generate(self, request):
            result = await super().generate(request)
            result.prompt_token_ids = result.prompt_token_ids[:-1]
            return result

    episode, _ = run(qwen25_template, ["20"], backend=LyingBackend(text_script(qwen25_template, ["20"])))
    assert episode.termination is Termination.INFRA_ERROR
    assert "different prompt" in episode.termination_detail
    assert episode.calls == []  # nothing committed


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: setattr(r, "logprobs", None), "logprobs were requested"),
        (lambda r: setattr(r, "logprobs", r.logprobs[:-1]), "misaligned"),
        (lambda r: setattr(r, "token_ids", r.token_ids + [1] * 5000), "max_tokens"),
        (lambda r: setattr(r, "finish_reason", "abort"), "finish reason"),
        (lambda r: setattr(r, "token_ids", [-1]), "non-negative"),
    ],
)
def test_malformed_backend_results_are_infra_errors(qwen25_template, mutate, message) -> None:
    class BadBackend(ScriptedBackend):
        async def generate(self, request):
            result: GenerationResult = await super().generate(request)
            mutate(result)
            return result

    settings = RolloutSettings(sampling=SamplingParams(max_tokens_per_call=100))
    episode, _ = run(
        qwen25_template, ["20"], backend=BadBackend(text_script(qwen25_template, ["20"])), settings=settings
    )
    assert episode.termination is Termination.INFRA_ERROR
    assert message in episode.termination_detail
    assert episode.masked


def test_model_is_not_reentrant(qwen25_template) -> None:
    backend = ScriptedBackend(text_script(qwen25_template, ["a", "b"]), latency_s=0.2)
    model = TokenModel(backend, qwen25_template)

    async def go():
        msgs = [{"role": "user", "content": [{"text": "hi"}]}]

        async def drain():
            return [e async for e in model.stream(msgs, None, None)]

        return await asyncio.gather(drain(), drain(), return_exceptions=True)

    results = asyncio.run(go())
    assert any(isinstance(r, RuntimeError) and "in flight" in str(r) for r in results)


def test_cancel_signal_aborts_without_committing(qwen25_template) -> None:
    backend = ScriptedBackend(text_script(qwen25_template, ["20"]), latency_s=5.0)
    model = TokenModel(backend, qwen25_template)
    cancel = threading.Event()

    async def go():
        async def trigger():
            await asyncio.sleep(0.3)
            cancel.set()

        trigger_task = asyncio.ensure_future(trigger())
        events = [
            e
            async for e in model.stream(
                [{"role": "user", "content": [{"text": "hi"}]}], None, None, cancel_signal=cancel
            )
        ]
        await trigger_task
        return events

    events = asyncio.run(go())
    assert events == []
    assert model.episode.segments == [] and model.episode.calls == []


def test_count_tokens_needs_no_network(qwen25_template) -> None:
    model = TokenModel(ScriptedBackend([[1]]), qwen25_template)
    assert asyncio.run(model.count_tokens([{"role": "user", "content": [{"text": "x" * 400}]}])) > 50


def test_structured_output_is_refused(qwen25_template) -> None:
    model = TokenModel(ScriptedBackend([[1]]), qwen25_template)

    async def go():
        async for _ in model.structured_output(dict, []):
            pass

    with pytest.raises(NotImplementedError):
        asyncio.run(go())


def test_agent_checks_accept_conversation_managers_and_refuse_other_models(qwen25_template) -> None:
    from strands.agent.conversation_manager import SlidingWindowConversationManager

    model = TokenModel(ScriptedBackend([[1]]), qwen25_template)
    check_agent(Agent(model=model, conversation_manager=SlidingWindowConversationManager()), model)
    check_agent(Agent(model=model.sibling(sampling=SamplingParams(temperature=0.5))), model)
    with pytest.raises(ValueError, match="TokenModel"):
        check_agent(Agent(model=TokenModel(ScriptedBackend([[1]]), qwen25_template), **agent_defaults()), model)
    check_agent(Agent(model=model, **agent_defaults()), model)


def test_a_changed_tool_list_opens_a_new_trajectory(qwen25_template) -> None:
    texts = ["x", "y"]
    model = TokenModel(ScriptedBackend(text_script(qwen25_template, texts)), qwen25_template)

    async def go():
        msgs = [{"role": "user", "content": [{"text": "hi"}]}]
        [e async for e in model.stream(msgs, [add.tool_spec], None)]
        msgs += [{"role": "assistant", "content": [{"text": "x"}]}, {"role": "user", "content": [{"text": "more"}]}]
        [e async for e in model.stream(msgs, [add.tool_spec, mul.tool_spec], None)]

    asyncio.run(go())
    episode = model.episode
    assert [t.opened_by for t in episode.trajectory_info] == ["start", "tools_changed"]
    second = episode.trajectories[1]
    assert second.prompt_ids == qwen25_template.initial_prompt(
        strands_to_hf(msgs_after_first()), tool_specs_to_openai([add.tool_spec, mul.tool_spec])
    )
    episode.check_invariants()


def msgs_after_first() -> list[dict]:
    return [
        {"role": "user", "content": [{"text": "hi"}]},
        {"role": "assistant", "content": [{"text": "x"}]},
        {"role": "user", "content": [{"text": "more"}]},
    ]


def test_backend_error_type_maps_to_infra_error(qwen25_template) -> None:
    class Failing:
        async def generate(self, request):
            raise BackendError("server on fire")

    episode, _ = run(qwen25_template, [], backend=Failing())
    assert episode.termination is Termination.INFRA_ERROR and "server on fire" in episode.termination_detail
    assert episode.masked


@tool
def chatty(n: int) -> str:
    """Return n characters.

    Args:
        n: how many
    """
    return "y" * n


@tool
async def dawdle(seconds: float) -> str:
    """Wait.

    Args:
        seconds: how long
    """
    await asyncio.sleep(seconds)
    return "finally"


def test_tool_output_is_capped_and_slow_calls_time_out(qwen25_template) -> None:
    texts = [
        calls_text("hermes", [("chatty", {"n": 50_000}), ("dawdle", {"seconds": 5})]),
        "20",
    ]
    budget = Budget(max_tool_output_chars=1000, tool_timeout_s=0.5)
    started = time.monotonic()
    episode, _ = run(qwen25_template, texts, tools=[chatty, dawdle], settings=RolloutSettings(budget=budget))
    assert time.monotonic() - started < 4
    assert episode.termination is Termination.COMPLETED  # a slow tool is an error result, not the end
    results = [b["toolResult"] for m in episode.messages for b in m["content"] if "toolResult" in b]
    chatty_text = "".join(i["text"] for i in results[0]["content"])
    assert chatty_text.startswith("y" * 1000) and "output truncated: 49000 more characters" in chatty_text
    assert results[1]["status"] == "error" and "timed out after 0.5 s" in results[1]["content"][0]["text"]
    assert episode.tools["chatty"].truncated == 1 and episode.tools["dawdle"].timeouts == 1
    assert episode.tools["dawdle"].errors == 1
