"""Every termination reason is reachable, typed, and failures come back masked with reward 0."""

from __future__ import annotations

import asyncio
import time

from strands import tool

from agentboost.backends.factory import ModelSpec
from agentboost.backends.scripted import ScriptedBackend, text_script
from agentboost.environments.strands_env import StrandsEnv
from agentboost.errors import ToolFatalError
from agentboost.rollout import RolloutSettings
from agentboost.runs import AgentSpec, EpisodeSpec, run_spec
from agentboost.types import Budget, SamplingParams, Termination

from .helpers import add, calls_text, run

REACHED: set[Termination] = set()


def _check(episode, expected: Termination, *, masked: bool) -> None:
    assert episode.termination is expected, episode.termination_detail
    assert episode.masked is masked
    episode.check_invariants()
    if masked:
        assert episode.reward == 0.0
        assert sum(episode.response_mask) == 0
    REACHED.add(expected)


@tool
def sabotage() -> str:
    """A tool whose sandbox is gone."""
    raise ToolFatalError("sandbox died")


@tool
def sleepy(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "awake"


def always_call(template, n: int = 10):
    return text_script(template, [calls_text("hermes", [("add", {"a": i, "b": 1})]) for i in range(n)])


def test_completed(qwen25_template) -> None:
    episode, _ = run(qwen25_template, ["20"])
    _check(episode, Termination.COMPLETED, masked=False)
    assert episode.reward == 1.0


def test_max_turns(qwen25_template) -> None:
    settings = RolloutSettings(budget=Budget(max_turns=2))
    episode, backend = run(
        qwen25_template, [], backend=ScriptedBackend(always_call(qwen25_template)), settings=settings
    )
    _check(episode, Termination.MAX_TURNS, masked=False)
    assert len(episode.calls) == 2 and len(backend.requests) == 2
    assert episode.tool_calls == 2  # the tool results of the last call are not part of the trajectory
    assert episode.segments[-1].kind.value == "model"


def test_max_turns_masked_when_requested(qwen25_template) -> None:
    settings = RolloutSettings(budget=Budget(max_turns=1), mask_truncated=True)
    episode, _ = run(qwen25_template, [], backend=ScriptedBackend(always_call(qwen25_template)), settings=settings)
    _check(episode, Termination.MAX_TURNS, masked=True)


def test_max_tokens(qwen25_template) -> None:
    settings = RolloutSettings(sampling=SamplingParams(max_tokens_per_call=5))
    episode, _ = run(qwen25_template, ["this answer is far too long to fit"], settings=settings)
    _check(episode, Termination.MAX_TOKENS, masked=False)
    assert episode.calls[0].finish_reason == "length"


def test_context_overflow_initial_prompt(qwen25_template) -> None:
    settings = RolloutSettings(budget=Budget(max_prompt_tokens=10))
    episode, backend = run(qwen25_template, ["20"], settings=settings)
    _check(episode, Termination.CONTEXT_OVERFLOW, masked=True)
    assert backend.requests == [] and episode.segments == []


def test_context_overflow_mid_episode(qwen25_template) -> None:
    texts = [calls_text("hermes", [("add", {"a": 2, "b": 3})]), "20"]
    probe, _ = run(qwen25_template, texts)
    # Room for the first call but not for the second prompt.
    budget = Budget(max_total_tokens=len(probe.prompt_ids) + len(probe.segments[1].token_ids) + 5)
    episode, backend = run(qwen25_template, texts, settings=RolloutSettings(budget=budget))
    _check(episode, Termination.CONTEXT_OVERFLOW, masked=True)
    assert len(backend.requests) == 1 and len(episode.calls) == 1


def test_timeout_during_generation(qwen25_template) -> None:
    backend = ScriptedBackend(text_script(qwen25_template, ["20"]), latency_s=3.0)
    started = time.monotonic()
    episode, _ = run(qwen25_template, [], backend=backend, settings=RolloutSettings(budget=Budget(wall_clock_s=0.5)))
    assert time.monotonic() - started < 2.5
    _check(episode, Termination.TIMEOUT, masked=True)


def test_timeout_in_a_hanging_tool(qwen25_template) -> None:
    texts = [calls_text("hermes", [("sleepy", {"seconds": 3})]), "20"]
    episode, _ = run(qwen25_template, texts, tools=[sleepy], settings=RolloutSettings(budget=Budget(wall_clock_s=0.7)))
    # The episode ends at its deadline (+1 s grace) although the tool's thread sleeps on.
    assert episode.timings["rollout_s"] < 2.5
    _check(episode, Termination.TIMEOUT, masked=True)


def test_tool_error_fatal(qwen25_template) -> None:
    texts = [calls_text("hermes", [("sabotage", {})]), "20"]
    episode, _ = run(qwen25_template, texts, tools=[sabotage])
    _check(episode, Termination.TOOL_ERROR, masked=True)
    assert "sandbox died" in episode.termination_detail


def test_tool_error_budget(qwen25_template) -> None:
    texts = [
        calls_text("hermes", [("explode", {"reason": "a"})]),
        calls_text("hermes", [("explode", {"reason": "b"})]),
        "20",
    ]
    settings = RolloutSettings(budget=Budget(max_tool_errors=1))
    episode, _ = run(qwen25_template, texts, settings=settings)
    _check(episode, Termination.TOOL_ERROR, masked=True)
    assert episode.tools["explode"].errors == 2
    assert len(episode.calls) == 2  # stopped right after the second failing tool batch


def test_infra_error_reward_function_crash(qwen25_template) -> None:
    from agentboost.agents.strands_agent import StrandsAgent
    from agentboost.rollout import run_episode

    def broken_reward(task, episode):
        raise ZeroDivisionError("bad grader")

    env = StrandsEnv({"prompt": "q"}, tools=[add], reward_fn=broken_reward)
    backend = ScriptedBackend(text_script(qwen25_template, ["20"]))
    episode = asyncio.run(run_episode(env, StrandsAgent(), backend, qwen25_template))
    _check(episode, Termination.INFRA_ERROR, masked=True)
    assert "bad grader" in episode.termination_detail


def test_infra_error_reward_timeout(qwen25_template) -> None:
    from agentboost.agents.strands_agent import StrandsAgent
    from agentboost.rollout import run_episode

    async def slow_reward(task, episode):
        await asyncio.sleep(5)
        return 1.0

    env = StrandsEnv({"prompt": "q"}, reward_fn=slow_reward)
    backend = ScriptedBackend(text_script(qwen25_template, ["20"]))
    settings = RolloutSettings(budget=Budget(reward_timeout_s=0.2))
    episode = asyncio.run(run_episode(env, StrandsAgent(), backend, qwen25_template, settings))
    _check(episode, Termination.INFRA_ERROR, masked=True)
    assert "timed out" in episode.termination_detail


def test_infra_error_unbuildable_row() -> None:
    spec = EpisodeSpec(row={"no_prompt_here": 1}, agent=AgentSpec(env="agentboost.environments.nope:Env"),
                       model=ModelSpec(backend="tiny"))  # fmt: skip
    episode = asyncio.run(run_spec(spec))
    _check(episode, Termination.INFRA_ERROR, masked=True)
    assert "setup failed" in episode.termination_detail


def test_stray_prints_in_tools_are_harmless(qwen25_template, capsys) -> None:
    from .helpers import shout

    texts = [calls_text("hermes", [("shout", {"text": "hi"})]), "20"]
    episode, _ = run(qwen25_template, texts, tools=[shout])
    _check(episode, Termination.COMPLETED, masked=False)
    assert "SHOUTING hi" in capsys.readouterr().out


def test_every_termination_reached() -> None:
    # Runs after the tests above in this module (pytest keeps definition order).
    assert set(Termination) <= REACHED, sorted(t.value for t in set(Termination) - REACHED)
