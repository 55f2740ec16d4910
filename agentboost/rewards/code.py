"""Code reward: the final program against *all* hidden tests, in the sandbox; 1 if every test passes.

Rules (each closes a way the reward of the system we replace could be gamed):

* The program is the last fenced Python block of the agent's **final answer** (reasoning excluded):
  code that only appears in reasoning, in a tool call or in an earlier turn earns nothing.
* No final program -> 0 (``has_program`` = 0); an empty block counts as no program.
* Every hidden test runs (not just up to the first failure), so ``tests_passed`` is the true
  fraction passed. It is a metric, never part of the reward: a program that passes 9 of 10 tests
  gets 0, exactly like one that passes none.
* Nothing about tool use enters the reward: calling the test tool (once or a hundred times) can
  neither add to nor substitute for a correct final program.
* A program's exit status is not a verdict: outputs are compared with the expected outputs, so an
  always-exit-0 or empty program fails every test that expects output.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..episode import Episode
from ..sandbox.testcases import TestCase, run_test_cases
from ..types import RewardOutput

MAX_TESTS = 64
"""Hidden tests per problem beyond this are ignored (a cap on the reward's cost)."""
MAX_PROGRAM_CHARS = 100_000

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


def final_program(text: str) -> str | None:
    """The last fenced (python) code block of ``text``, or None if there is none or it is empty."""
    blocks = _FENCE.findall(text or "")
    if not blocks:
        return None
    program = blocks[-1].strip()
    return program or None


def tests_of(task: dict[str, Any], key: str) -> list[TestCase]:
    """The task's tests under ``key``: a list (or JSON string of a list) of test dicts or TestCases."""
    raw = task.get(key) or []
    if isinstance(raw, str):  # rows stored as parquet keep heterogeneous tests as a JSON string
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"task field {key!r} is not valid JSON: {exc.msg}") from None
    if not isinstance(raw, list):
        raise TypeError(f"task field {key!r} must be a list of tests")
    return [t if isinstance(t, TestCase) else TestCase.from_dict(t) for t in raw[:MAX_TESTS]]


async def code_reward(task: dict[str, Any], episode: Episode) -> RewardOutput:
    """1.0 iff the final program passes every hidden test (``tests``; ``public_tests`` if none)."""
    from ..tools.strands_code_tool import default_sandbox

    tests = tests_of(task, "tests") or tests_of(task, "public_tests")
    if not tests:
        raise ValueError("code task without tests")
    program = final_program(episode.final_text)
    if program is None or len(program) > MAX_PROGRAM_CHARS:
        return RewardOutput(0.0, metrics={"has_program": 0.0, "tests_passed": 0.0}, is_correct=False)
    outcomes = await run_test_cases(default_sandbox(), program, tests)
    passed = sum(o.passed for o in outcomes)
    ok = passed == len(tests)
    verdicts: dict[str, float] = {}
    for outcome in outcomes:
        key = "verdict_" + outcome.verdict.replace(" ", "_")
        verdicts[key] = verdicts.get(key, 0.0) + 1
    return RewardOutput(
        float(ok),
        metrics={"has_program": 1.0, "tests_passed": passed / len(tests), **verdicts},
        is_correct=ok,
    )
