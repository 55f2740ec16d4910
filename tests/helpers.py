"""Shared test tools and scripting helpers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from strands import tool

from agentboost.agents.strands_agent import StrandsAgent
from agentboost.backends.scripted import ScriptedBackend
from agentboost.chat.template import ChatTemplate
from agentboost.environments.strands_env import StrandsEnv
from agentboost.episode import Episode
from agentboost.rollout import RolloutSettings, run_episode


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


@tool
def mul(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a * b


@tool
def explode(reason: str) -> str:
    """A tool that always fails.

    Args:
        reason: why
    """
    raise RuntimeError(f"boom: {reason}")


@tool
def shout(text: str) -> str:
    """Print to stdout (tools are allowed to be noisy) and return the text in capitals.

    Args:
        text: what to shout
    """
    print(f"SHOUTING {text}")
    return text.upper()


def calls_text(parser: str, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
    """Assistant output calling ``calls`` in the model family's own format."""
    if parser == "hermes":
        blocks = ["<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>" for n, a in calls]
        return (content + "\n" if content else "") + "\n".join(blocks)
    if parser == "llama3_json":
        return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    raise ValueError(parser)


def run(
    template: ChatTemplate,
    texts: list[str],
    *,
    row: dict[str, Any] | None = None,
    tools: list[Any] | None = None,
    settings: RolloutSettings | None = None,
    system_prompt: str | None = "You are a careful assistant.",
    backend: Any = None,
) -> tuple[Episode, ScriptedBackend]:
    from agentboost.backends.scripted import text_script

    backend = backend or ScriptedBackend(text_script(template, texts))
    env = StrandsEnv(
        task=row or {"prompt": "What is (2 + 3) * 4?"},
        tools=tools if tools is not None else [add, mul, explode],
        reward_fn=lambda task, ep: float(ep.final_text.strip() == "20"),
    )
    agent = StrandsAgent(system_prompt=system_prompt)
    episode = asyncio.run(run_episode(env, agent, backend, template, settings))
    return episode, backend
