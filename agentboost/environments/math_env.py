"""Math with a sandboxed Python tool: ``{"prompt"|"question", "answer"}`` rows, reward by math equivalence."""

from __future__ import annotations

from typing import Any

from ..rewards.math import math_reward
from .strands_env import StrandsEnv

SYSTEM_PROMPT = (
    "You are a careful mathematician. You can run Python (standard library only) with the `python` tool to "
    "compute or check results. Put your final answer in \\boxed{}."
)


def math_tools(task: dict[str, Any]) -> list[Any]:
    from ..tools.python_tool import make_python_tool

    return [make_python_tool()]


class MathEnv(StrandsEnv):
    """``StrandsEnv`` with the sandboxed ``python`` tool and the math-equivalence reward as defaults."""

    def __init__(self, task: dict[str, Any] | None = None, tools: Any = None, reward_fn: Any = None, **kwargs: Any):
        super().__init__(task, tools if tools is not None else math_tools, reward_fn or math_reward, **kwargs)
