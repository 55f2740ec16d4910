"""Competitive programming (DeepCoder-style): public tests through the code tool, hidden tests for the reward.

Rows: ``{"prompt"|"question", "public_tests": [...], "tests": [...]}`` with tests as
``{"input", "output"}`` (stdin/stdout) or ``{"input", "output", "testtype": "functional", "fn_name"}``.
The reward runs the agent's final program (the last fenced Python block of its final answer) against
*all* tests in the sandbox: 1 if every test passes, else 0. The model never sees the hidden tests.
"""

from __future__ import annotations

import re
from typing import Any

from ..episode import Episode
from ..sandbox.testcases import TestCase, run_test_cases
from ..types import RewardOutput
from .strands_env import StrandsEnv

SYSTEM_PROMPT = (
    "You solve programming problems in Python. Test your program with the `run_tests` tool, then give the "
    "complete final program in one ```python code block."
)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
MAX_TESTS = 64


def final_program(text: str) -> str | None:
    blocks = _FENCE.findall(text or "")
    return blocks[-1].strip() or None if blocks else None


def _tests(task: dict[str, Any], key: str) -> list[TestCase]:
    raw = task.get(key) or []
    if not isinstance(raw, list):
        raise TypeError(f"task field {key!r} must be a list of tests")
    return [t if isinstance(t, TestCase) else TestCase.from_dict(t) for t in raw[:MAX_TESTS]]


def code_tools(task: dict[str, Any]) -> list[Any]:
    from ..tools.strands_code_tool import make_code_tool

    return [make_code_tool(_tests(task, "public_tests"))]


async def code_reward(task: dict[str, Any], episode: Episode) -> RewardOutput:
    from ..tools.strands_code_tool import default_sandbox

    tests = _tests(task, "tests") or _tests(task, "public_tests")
    if not tests:
        raise ValueError("code task without tests")
    program = final_program(episode.final_text)
    if program is None:
        return RewardOutput(0.0, metrics={"has_program": 0.0}, is_correct=False)
    outcomes = await run_test_cases(default_sandbox(), program, tests, stop_at_first_failure=True)
    passed = sum(o.passed for o in outcomes)
    ok = passed == len(tests) and len(outcomes) == len(tests)
    return RewardOutput(float(ok), metrics={"has_program": 1.0, "tests_passed": passed / len(tests)}, is_correct=ok)


class CodeEnv(StrandsEnv):
    """``StrandsEnv`` with the public-test code tool and the hidden-test reward as defaults."""

    def __init__(self, task: dict[str, Any] | None = None, tools: Any = None, reward_fn: Any = None, **kwargs: Any):
        super().__init__(task, tools if tools is not None else code_tools, reward_fn or code_reward, **kwargs)
