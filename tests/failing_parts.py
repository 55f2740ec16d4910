"""Parts of an agent that fail the ways a user's own do on the first day (issue 40), for the CLI contract's
cases: rewards that raise, return a NaN, an infinity, None or a string; an agent factory that raises; an
environment whose reset raises. Named by reference (``tests.failing_parts:zero``) as a user names theirs."""

from __future__ import annotations

import math
from typing import Any

from agentboost.environments.strands_env import StrandsEnv


def divides_by_zero(task: dict[str, Any], episode: Any) -> float:
    return 1 / 0


def nan(task: dict[str, Any], episode: Any) -> float:
    return math.nan


def infinity(task: dict[str, Any], episode: Any) -> float:
    return math.inf


def nothing(task: dict[str, Any], episode: Any) -> None:
    return None


def text(task: dict[str, Any], episode: Any) -> str:
    return "1.0"


def needs_a_field(task: dict[str, Any], episode: Any) -> float:
    return float(task["expected"])  # a field the rows do not have


def always_zero(task: dict[str, Any], episode: Any) -> float:
    return 0.0


def broken_agent(*, model: Any, tools: list[Any], task: dict[str, Any], **defaults: Any) -> Any:
    raise RuntimeError("the agent factory broke")


class ResetFails(StrandsEnv):
    """An environment whose reset raises (a service it needs is down)."""

    def reset(self) -> tuple[dict[str, Any], dict[str, Any]]:
        raise ConnectionError("the unit service at 127.0.0.1:9 refused the connection")
