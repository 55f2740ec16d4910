"""The long-episode adapter (agentboost.strands_patches) changes cost, never behaviour.

Every test runs the same thing with the adapter off (upstream strands-agents) and on and compares
whole records: episode tokens, masks, logprobs, messages, terminations; what a plain Strands model is
handed per call. Flatness is checked structurally (no timings): the dict copies made per model call and
the depth of the event loop's generator stack must not grow with the episode.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import logging
import pickle
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from strands import Agent, tool
from strands.hooks import BeforeModelCallEvent, HookProvider, HookRegistry, MessageAddedEvent
from strands.middleware import InvokeModelStage
from strands.models.model import Model

import agentboost.strands_patches as patches
from agentboost.agents.strands_agent import StrandsAgent, agent_defaults
from agentboost.backends.base import GenerationRequest
from agentboost.backends.scripted import ScriptedBackend, text_script
from agentboost.chat.template import ChatTemplate
from agentboost.environments.strands_env import StrandsEnv
from agentboost.episode import Episode
from agentboost.errors import BackendError, ToolFatalError
from agentboost.rollout import RolloutSettings, run_episode
from agentboost.types import Budget

from .conftest import template_for
from .helpers import add, calls_text, explode, mul
from .test_template_matrix import SCENARIOS, scenario_texts

KNOWN_VERSION = patches.strands_version() in patches.SUPPORTED_VERSIONS
needs_known_version = pytest.mark.skipif(
    not KNOWN_VERSION, reason=f"strands-agents {patches.strands_version()} is not one the adapter supports"
)


@tool
def echo(value: int) -> int:
    """Return the value.

    Args:
        value: any integer
    """
    return value


@tool
def broken_sandbox(code: str) -> str:
    """A tool whose infrastructure is gone.

    Args:
        code: anything
    """
    raise ToolFatalError("sandbox lost")


def fingerprint(episode: Episode) -> str:
    """The record minus what legitimately differs between two runs (ids, clocks)."""
    data = episode.to_dict()
    for key in ("id", "timings"):
        data.pop(key)
    for call in data["calls"]:
        call.pop("latency_s")
    for stats in data["tools"].values():
        stats.pop("total_time_s")
    for message in data["messages"]:
        message.pop("tracking_id", None)
        message.get("metadata", {}).pop("metrics", None)
    return json.dumps(data, sort_keys=True, default=str)


def run_mode(
    monkeypatch: pytest.MonkeyPatch,
    adapter: bool,
    template: ChatTemplate,
    backend: Any,
    *,
    row: dict[str, Any],
    tools: list[Any],
    agent: StrandsAgent | None = None,
    budget: Budget | None = None,
) -> Episode:
    monkeypatch.setenv(patches.ENV_SWITCH, "1" if adapter else "0")
    env = StrandsEnv(task=row, tools=tools, reward_fn=lambda task, ep: float(ep.final_text.strip() == "20"))
    settings = RolloutSettings(budget=budget or Budget())
    agent = agent or StrandsAgent(system_prompt="You are a careful assistant.")
    return asyncio.run(run_episode(env, agent, backend, template, settings, episode_id="same-id"))


def both_modes(monkeypatch: pytest.MonkeyPatch, make: Any) -> tuple[Episode, Episode]:
    off, on = make(False), make(True)
    assert fingerprint(on) == fingerprint(off)
    return off, on


@pytest.mark.parametrize("config", ["qwen2.5", "qwen3-thinking", "llama3.1"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_episodes_identical_with_the_adapter_on_and_off(monkeypatch, config: str, scenario: str) -> None:
    template = template_for(config)
    texts, row = scenario_texts(config, scenario, template.parser.name)
    script = text_script(template, texts)
    off, on = both_modes(
        monkeypatch,
        lambda adapter: run_mode(
            monkeypatch, adapter, template, ScriptedBackend(script), row=row, tools=[add, mul, explode]
        ),
    )
    assert on.termination.value == "completed" and on.calls


class HistoryEditor(HookProvider):
    """Rewrites an *old* message of the history in place whenever a message is added (so every call
    sees a history that is not an extension of the last one: a new trajectory each time, with the
    adapter on as off), and records the generator depth at every model call."""

    def __init__(self) -> None:
        self.depths: list[int] = []

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(MessageAddedEvent, self.edit)
        registry.add_callback(BeforeModelCallEvent, self.depth)

    def edit(self, event: MessageAddedEvent) -> None:
        first = event.agent.messages[0]["content"][0]
        first["text"] = first["text"] + "!"

    def depth(self, event: BeforeModelCallEvent) -> None:
        frame, depth = sys._getframe(), 0
        while frame is not None:
            frame, depth = frame.f_back, depth + 1
        self.depths.append(depth)


def long_run(
    monkeypatch: pytest.MonkeyPatch, adapter: bool, calls: int, editor: HistoryEditor
) -> tuple[Episode, list[int]]:
    template = template_for("qwen2.5")
    copies: list[int] = []
    counter = [0]
    real_copy_dict = copy._deepcopy_dispatch[dict]  # type: ignore[attr-defined]

    def counting_copy_dict(x: dict, memo: dict, deepcopy: Any = copy.deepcopy) -> dict:
        counter[0] += 1
        return real_copy_dict(x, memo, deepcopy)

    monkeypatch.setitem(copy._deepcopy_dispatch, dict, counting_copy_dict)  # type: ignore[attr-defined]
    call = [*template.encode(calls_text("hermes", [("echo", {"value": 7})])), template.info.eot_token_id]
    final = [*template.encode("20"), template.info.eot_token_id]

    def script(request: GenerationRequest, k: int) -> list[int]:
        copies.append(counter[0])
        return call if k < calls - 1 else final

    def factory(*, model: Any, tools: list[Any], task: Any, **defaults: Any) -> Agent:
        return Agent(model=model, tools=tools, system_prompt="Echo.", hooks=[editor], **defaults)

    episode = run_mode(
        monkeypatch,
        adapter,
        template,
        ScriptedBackend(script),
        row={"prompt": "Echo 7, many times."},
        tools=[echo],
        agent=StrandsAgent(factory),
        budget=Budget(max_turns=calls + 2, max_total_tokens=10**6),
    )
    monkeypatch.setitem(copy._deepcopy_dispatch, dict, real_copy_dict)  # type: ignore[attr-defined]
    return episode, [b - a for a, b in itertools.pairwise(copies)]


@needs_known_version
def test_long_episode_identical_and_flat(monkeypatch) -> None:
    calls = 60
    off_editor, on_editor = HistoryEditor(), HistoryEditor()
    off, off_copies = long_run(monkeypatch, False, calls, off_editor)
    on, on_copies = long_run(monkeypatch, True, calls, on_editor)
    assert fingerprint(on) == fingerprint(off)
    assert on.termination.value == "completed" and len(on.calls) == calls
    assert on.messages[0]["content"][0]["text"].endswith("!" * (2 * calls - 1))  # the edits did happen
    assert on.num_trajectories == calls  # ... and the model saw every one of them
    assert {info.opened_by for info in on.trajectory_info[1:]} == {"history_rewritten"}

    # Upstream copies the whole history (twice) per call and recurses once per cycle ...
    assert sum(off_copies[-10:]) > 4 * sum(off_copies[2:12])
    assert off_editor.depths[-1] > off_editor.depths[5] + 2 * (calls - 10)
    # ... the adapted agent copies only what is new and keeps a constant stack.
    assert max(on_copies[-10:]) <= max(on_copies[2:12])
    assert on_editor.depths[-1] == on_editor.depths[5]


class RecordingModel(Model):
    """A plain Strands model (not agentboost's): records exactly what it is handed each call, then
    scribbles over it (a provider is allowed to), so reused copies would show."""

    def __init__(self, replies: list[list[dict[str, Any]]]) -> None:
        self.replies = replies
        self.seen: list[Any] = []

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    async def structured_output(self, output_model: Any, prompt: Any, system_prompt: Any = None, **kwargs: Any) -> Any:
        raise NotImplementedError
        yield  # pragma: no cover

    async def count_tokens(self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kw: Any) -> int:
        return 0

    async def stream(
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kw: Any
    ) -> AsyncIterator[Any]:
        self.seen.append(json.loads(json.dumps([{"role": m["role"], "content": m["content"]} for m in messages])))
        for m in messages:
            m["content"].append({"text": "scribbled by the provider"})
            for block in m["content"]:
                if "toolUse" in block:
                    block["toolUse"]["name"] = "renamed_by_the_provider"
        reply = self.replies[len(self.seen) - 1]
        yield {"messageStart": {"role": "assistant"}}
        stop = "end_turn"
        for block in reply:
            if "text" in block:
                yield {"contentBlockStart": {"start": {}}}
                yield {"contentBlockDelta": {"delta": {"text": block["text"]}}}
            else:
                use = block["toolUse"]
                stop = "tool_use"
                yield {
                    "contentBlockStart": {"start": {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}}
                }
                yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(use["input"])}}}}
            yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": stop}}


def replies(calls: int) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    for k in range(calls - 1):
        use = {"toolUseId": f"t{k}", "name": "echo" if k % 3 else "bad name!", "input": {"value": k}}
        blocks: list[dict[str, Any]] = [{"toolUse": use}]
        if k % 2 == 0:
            blocks.insert(0, {"text": "   "})  # blank text next to a tool use: normalisation drops it
        out.append(blocks)
    out.append([{"text": "done"}])
    return out


async def redact_middleware(context: Any, next_fn: Any) -> AsyncIterator[Any]:
    """Model-call middleware editing ``context.messages`` in place (the history must not change)."""
    for message in context.messages:
        for block in message["content"]:
            if "toolResult" in block:
                block["toolResult"]["content"] = [{"text": "[redacted]"}]
    async for event in next_fn(context):
        yield event


def plain_agent_run(adapter: bool, middleware: bool, calls: int = 12) -> tuple[list[Any], Any, bool]:
    model = RecordingModel(replies(calls))
    editor = HistoryEditor()
    agent = Agent(model=model, tools=[echo], system_prompt="Echo.", hooks=[editor], **agent_defaults())
    if middleware:
        agent.add_middleware(InvokeModelStage, redact_middleware)
    adapted = patches.adapt_agent(agent, enabled=adapter)
    result = asyncio.run(agent.invoke_async("Echo things.", limits={"turns": calls + 2}))
    history = [{k: v for k, v in m.items() if k not in ("tracking_id", "metadata")} for m in agent.messages]
    return model.seen, (str(result.stop_reason), history), adapted


@pytest.mark.parametrize("middleware", [False, True], ids=["no-middleware", "model-call-middleware"])
def test_a_plain_strands_model_is_handed_the_same_messages(middleware: bool) -> None:
    off_seen, off_history, off_adapted = plain_agent_run(False, middleware)
    on_seen, on_history, on_adapted = plain_agent_run(True, middleware)
    assert not off_adapted and on_adapted == KNOWN_VERSION
    assert on_seen == off_seen
    assert on_history == off_history
    # The scenario exercises what the adapter caches: normalisation, provider scribbles, history edits.
    assert any(
        b.get("name") == "INVALID_TOOL_NAME" for m in on_seen[-1] for c in m["content"] for b in [c.get("toolUse", {})]
    )
    assert all("scribbled by the provider" not in json.dumps(call) for call in on_seen)
    assert on_seen[-1][0]["content"][0]["text"].endswith("!!!")
    if middleware:
        assert "[redacted]" in json.dumps(on_seen[-1]) and "[redacted]" not in json.dumps(on_history)


def test_failures_end_episodes_the_same_way(monkeypatch) -> None:
    template = template_for("qwen2.5")
    tool_calls = text_script(template, [calls_text("hermes", [("echo", {"value": 1})])] * 6)

    def failing_script(request: GenerationRequest, k: int) -> list[int]:
        if k == 5:
            raise BackendError("server exploded at call 5")
        return tool_calls[k]

    off, on = both_modes(
        monkeypatch,
        lambda adapter: run_mode(
            monkeypatch, adapter, template, ScriptedBackend(failing_script), row={"prompt": "go"}, tools=[echo]
        ),
    )
    assert on.termination.value == "infra_error" and "call 5" in on.termination_detail and len(on.calls) == 5

    fatal = text_script(
        template,
        [calls_text("hermes", [("echo", {"value": 1})])] * 3
        + [calls_text("hermes", [("broken_sandbox", {"code": "x"})])] * 2,
    )
    off, on = both_modes(
        monkeypatch,
        lambda adapter: run_mode(
            monkeypatch, adapter, template, ScriptedBackend(fatal), row={"prompt": "go"}, tools=[echo, broken_sandbox]
        ),
    )
    assert on.termination.value == "infra_error" and "sandbox lost" in on.termination_detail

    many = text_script(template, [calls_text("hermes", [("echo", {"value": 1})])] * 8)
    off, on = both_modes(
        monkeypatch,
        lambda adapter: run_mode(
            monkeypatch,
            adapter,
            template,
            ScriptedBackend(many),
            row={"prompt": "go"},
            tools=[echo],
            budget=Budget(max_turns=6),
        ),
    )
    assert on.termination.value == "max_turns" and len(on.calls) == 6


def test_unknown_strands_version_falls_back_with_a_warning(monkeypatch, caplog) -> None:
    monkeypatch.setattr(patches, "strands_version", lambda: "0.0.1")
    monkeypatch.setattr(patches, "_warned", set())
    agent = Agent(model=RecordingModel(replies(1)), tools=[echo], **agent_defaults())
    with caplog.at_level(logging.WARNING, logger="agentboost.strands_patches"):
        assert patches.adapt_agent(agent) is False
        assert patches.adapt_agent(agent) is False
    warnings = [r for r in caplog.records if "0.0.1" in r.getMessage()]
    assert len(warnings) == 1 and "upstream" in warnings[0].getMessage()
    assert type(agent.messages) is list and "_execute_event_loop_cycle" not in agent.__dict__
    assert not patches.is_adapted(agent)
    result = asyncio.run(agent.invoke_async("hi"))
    assert str(result.stop_reason) == "end_turn"


@needs_known_version
def test_supported_version_and_switch(monkeypatch) -> None:
    agent = Agent(model=RecordingModel(replies(1)), tools=[echo], **agent_defaults())
    monkeypatch.setenv(patches.ENV_SWITCH, "0")
    assert patches.adapt_agent(agent) is False and not patches.is_adapted(agent)
    monkeypatch.setenv(patches.ENV_SWITCH, "1")
    assert patches.adapt_agent(agent) is True and patches.is_adapted(agent)
    assert patches.adapt_agent(agent) is True  # idempotent


@needs_known_version
def test_copies_of_the_history_outside_model_calls_are_upstream_ones() -> None:
    agent = Agent(model=RecordingModel(replies(3)), tools=[echo], **agent_defaults())
    assert patches.adapt_agent(agent, enabled=True)
    asyncio.run(agent.invoke_async("Echo things."))
    plain = list(agent.messages)
    for duplicate in (
        copy.deepcopy(agent.messages),
        copy.copy(agent.messages),
        pickle.loads(pickle.dumps(agent.messages)),
    ):
        assert type(duplicate) is list and duplicate == plain
    deep = copy.deepcopy(agent.messages)
    assert all(a is not b for a, b in zip(deep, plain, strict=True))
    snapshot = agent.take_snapshot(preset="session")
    assert type(snapshot.to_dict()["data"]["messages"]) is list


@needs_known_version
def test_tracer_records_the_same_events_and_skips_only_non_recording_spans(monkeypatch) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import NonRecordingSpan, SpanContext
    from strands.telemetry import tracer as tracer_module

    agent = Agent(model=RecordingModel(replies(3)), tools=[echo], **agent_defaults())
    assert patches.adapt_agent(agent, enabled=True)
    asyncio.run(agent.invoke_async("Echo things."))
    strands_tracer = tracer_module.get_tracer()
    sdk = TracerProvider().get_tracer("test")

    def events(messages: Any) -> list[Any]:
        span = sdk.start_span("s")
        strands_tracer._add_event_messages(span, messages)
        return [(e.name, dict(e.attributes or {})) for e in span.events]

    assert events(agent.messages) == events(list(agent.messages)) != []
    serialized = []
    real = tracer_module.serialize
    monkeypatch.setattr(tracer_module, "serialize", lambda obj: serialized.append(1) or real(obj))
    silent = NonRecordingSpan(SpanContext(0, 0, False))
    strands_tracer._add_event_messages(silent, agent.messages)
    assert serialized == []
    strands_tracer._add_event_messages(silent, list(agent.messages))  # not an adapted history: upstream
    assert serialized


def test_an_episode_ended_by_a_tool_failure_leaves_no_cycle_to_be_closed_elsewhere(qwen25_template, caplog) -> None:
    """A failure inside a nested cycle must travel up through the frames between the cycles (tool
    execution, spans) as upstream's does. Thrown at the outer cycle's yield instead, it left those
    frames suspended: asyncio finalised them at shutdown in another context, and OpenTelemetry logged
    'was created in a different Context' for every such episode."""

    from agentboost.errors import ToolFatalError
    from agentboost.types import Termination

    from .helpers import calls_text, run

    @tool
    def breaks() -> str:
        """Fails like a dead sandbox."""
        raise ToolFatalError("sandbox died")

    texts = [calls_text("hermes", [("breaks", {})]), "20"]
    with caplog.at_level(logging.ERROR):
        episode, _ = run(qwen25_template, texts, tools=[breaks])
    assert episode.termination is Termination.INFRA_ERROR
    assert "different Context" not in caplog.text
