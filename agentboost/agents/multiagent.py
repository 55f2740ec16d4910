"""What an agent factory may build, and how one episode drives it: a Strands ``Agent`` (with any
conversation or context manager, and agents used as its tools), a ``Swarm`` or a ``Graph``.

:func:`agents_in` finds every ``Agent`` reachable from what the factory returned (the agent itself, the
agents wrapped as its tools, a Swarm's or Graph's nodes, recursively), so that each agent whose model
records into the episode gets the episode's hooks (tool statistics, parse errors, budgets), tool limits
and the long-episode adapter. Agents a tool builds while it runs are not found: their model calls are
still recorded (each agent's calls are their own trajectories), their tool statistics are not.

:func:`invoke` runs one user turn and says how it ended; :func:`final_messages` is the history the
episode's reward reads (``Episode.messages``): the agent's, or the last node's that ran.
"""

from __future__ import annotations

import logging
from typing import Any

from ..types import Termination

logger = logging.getLogger(__name__)


def is_multiagent(target: Any) -> bool:
    """Whether ``target`` is a Strands multi-agent orchestrator (``Swarm``, ``Graph``, any
    ``MultiAgentBase``)."""
    try:
        from strands.multiagent.base import MultiAgentBase
    except ImportError:  # pragma: no cover
        return False
    return isinstance(target, MultiAgentBase)


def agents_in(target: Any) -> list[Any]:
    """Every Strands ``Agent`` reachable from ``target``, each once, ``target`` first if it is one."""
    from strands import Agent

    found: list[Any] = []
    seen: set[int] = set()
    stack = [target]
    while stack:
        item = stack.pop(0)
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, Agent):
            found.append(item)
            registry = getattr(getattr(item, "tool_registry", None), "registry", {}) or {}
            for tool in registry.values():
                inner = getattr(tool, "_agent", None)
                if isinstance(inner, Agent) or is_multiagent(inner):
                    stack.append(inner)
        elif is_multiagent(item):
            nodes = getattr(item, "nodes", {}) or {}
            for node in nodes.values() if isinstance(nodes, dict) else nodes:
                executor = getattr(node, "executor", None)
                if executor is not None:
                    stack.append(executor)
    return found


async def invoke(target: Any, prompt: Any, *, turns_left: int) -> tuple[Termination, str]:
    """Run one user turn of ``target``; (termination, detail) of how it ended. Exceptions propagate (the
    runner types them)."""
    if not is_multiagent(target):
        result = await target.invoke_async(prompt, limits={"turns": turns_left})
        return stop_reason_termination(str(result.stop_reason))
    from strands.multiagent.base import Status

    result = await target.invoke_async(prompt)
    status = getattr(result, "status", None)
    if status == Status.COMPLETED:
        return Termination.COMPLETED, ""
    if status == Status.INTERRUPTED:
        return Termination.INFRA_ERROR, f"{type(target).__name__} was interrupted: interrupts need a human"
    # A Swarm or Graph that stops without an exception hit its own limits (handoffs, iterations,
    # repeated handoffs, node executions): the agents' doing, as a turn limit is.
    return Termination.MAX_TURNS, f"{type(target).__name__} ended with status {getattr(status, 'value', status)}"


def stop_reason_termination(stop_reason: str) -> tuple[Termination, str]:
    """The termination of an ``Agent`` turn that ended with Strands' ``stop_reason``."""
    if stop_reason in ("end_turn", "stop_sequence"):
        return Termination.COMPLETED, ""
    if stop_reason in ("max_tokens", "limit_output_tokens", "limit_total_tokens"):
        return Termination.MAX_TOKENS, f"stop_reason={stop_reason}"
    if stop_reason in ("limit_turns",):
        return Termination.MAX_TURNS, f"stop_reason={stop_reason}"
    return Termination.INFRA_ERROR, f"the agent stopped with stop_reason={stop_reason!r}"


def final_messages(target: Any) -> list[dict[str, Any]]:
    """The history the episode's reward reads: an agent's own, or that of the node that ran last."""
    if not is_multiagent(target):
        return list(getattr(target, "messages", []) or [])
    state = getattr(target, "state", None)
    order = list(getattr(state, "node_history", None) or getattr(state, "execution_order", None) or [])
    for node in reversed(order):
        executor = getattr(node, "executor", None)
        if executor is not None:
            return final_messages(executor)
    return []


def system_prompt_of(target: Any) -> str | None:
    if is_multiagent(target):
        return None
    prompt = getattr(target, "system_prompt", None)
    return prompt if isinstance(prompt, str) else None
