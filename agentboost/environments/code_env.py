"""Competitive programming (DeepCoder-style): public tests through the code tool, hidden tests for the reward.

Rows: ``{"prompt"|"question", "public_tests": [...], "tests": [...]}`` with tests as
``{"input", "output"}`` (stdin/stdout) or ``{"input", "output", "testtype": "functional", "fn_name"}``.
The reward (:mod:`agentboost.rewards.code`) runs the final program against *all* hidden tests in the
sandbox: 1 if every test passes, else 0. The model never sees the hidden tests.
"""

from __future__ import annotations

from typing import Any

from ..rewards.code import code_reward, final_program, tests_of
from .strands_env import StrandsEnv

__all__ = ["SYSTEM_PROMPT", "CodeEnv", "code_reward", "code_tools", "final_program"]

SYSTEM_PROMPT = (
    "You solve programming problems in Python. Test your program with the `run_tests` tool, then give the "
    "complete final program in one ```python code block."
)


def code_tools(task: dict[str, Any]) -> list[Any]:
    from ..tools.strands_code_tool import make_code_tool

    return [make_code_tool(tests_of(task, "public_tests"))]


class CodeEnv(StrandsEnv):
    """``StrandsEnv`` with the public-test code tool and the hidden-test reward as defaults."""

    def __init__(self, task: dict[str, Any] | None = None, tools: Any = None, reward_fn: Any = None, **kwargs: Any):
        super().__init__(task, tools if tools is not None else code_tools, reward_fn or code_reward, **kwargs)
