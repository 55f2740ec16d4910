"""Code reward: the final program against *all* hidden tests, in the sandbox; 1 if every test passes.

Rules (each closes a way the reward of the system we replace could be gamed):

* The program is the last fenced Python block of the agent's **final answer** (reasoning excluded,
  ``<think>`` blocks in the text too): code that only appears in reasoning, in a tool call or in an
  earlier turn earns nothing.
* Only an episode the agent finished (termination ``completed``) is graded: one cut off by the turn
  or token limit has no final answer, whatever its last message holds (``completed`` = 0).
* No final program -> 0 (``has_program`` = 0); an empty block counts as no program.
* Every hidden test runs (not just up to the first failure), so ``tests_passed`` is the true
  fraction passed. It is a metric, never part of the reward: a program that passes 9 of 10 tests
  gets 0, exactly like one that passes none. Exception: once a test exceeds the time limit the
  rest are not run (the reward is 0 anyway) and count as not passed, so ``tests_passed`` is then a
  lower bound. A problem with more than ``MAX_TESTS`` tests is refused (an error, never truncated).
* The whole suite has a budget: what is left of the reward's own (``Budget.reward_timeout_s``, as the
  episode runner's clock says, minus a margin), else ``SUITE_BUDGET_S``; time waiting for a sandbox slot
  is not charged. A program too slow to finish its suite within it gets 0 (its remaining tests are
  ``suite time limit exceeded``): a slow program is the policy's doing, scored, never masked.
* Expected values are compared with the type the dataset stores, integers exactly, reals (only where
  the expected value is one) by the task's ``float_tolerance`` or else its source benchmark's rule
  (:mod:`agentboost.sandbox.grading`).
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
from ..sandbox.grading import float_rule_for
from ..sandbox.testcases import TestCase, run_test_cases
from ..types import RewardOutput
from ..utils.clock import current_clock
from .answer import final_answer_text, strip_reasoning

MAX_TESTS = 1000
"""A problem with more hidden tests is refused (the data preparation drops such problems)."""
MAX_PROGRAM_CHARS = 100_000
SUITE_BUDGET_S = 50.0
"""The suite's budget when no episode runner's clock is given (the default reward timeout is 60 s)."""


def suite_budget() -> float:
    """What is left of the reward's budget, minus a margin for stopping cleanly (module doc)."""
    clock = current_clock()
    if clock is None:
        return SUITE_BUDGET_S
    left = clock.remaining()
    return max(0.1, left - min(5.0, max(0.5, 0.1 * left)))


_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


def final_program(text: str) -> str | None:
    """The last fenced (python) code block of ``text`` outside ``<think>`` blocks, or None if there is
    none or it is empty."""
    text = strip_reasoning(text)
    blocks = _FENCE.findall(text)
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
    if len(raw) > MAX_TESTS:
        raise ValueError(f"task field {key!r} has {len(raw)} tests (more than {MAX_TESTS}); not truncated")
    return [t if isinstance(t, TestCase) else TestCase.from_dict(t) for t in raw]


async def code_reward(task: dict[str, Any], episode: Episode) -> RewardOutput:
    """1.0 iff the final program passes every hidden test (``tests``; ``public_tests`` if none)."""
    from ..tools.strands_code_tool import default_sandbox

    tests = tests_of(task, "tests") or tests_of(task, "public_tests")
    if not tests:
        raise ValueError("code task without tests")
    answer = final_answer_text(episode)
    completed = answer is not None
    program = final_program(answer) if answer is not None else None
    if program is None or len(program) > MAX_PROGRAM_CHARS:
        metrics = {"has_program": 0.0, "tests_passed": 0.0, "completed": float(completed)}
        return RewardOutput(0.0, metrics=metrics, is_correct=False)
    outcomes = await run_test_cases(default_sandbox(), program, tests, float_tolerance=float_rule_for(task),
                                    stop_after_timeout=True, budget_s=suite_budget())  # fmt: skip
    passed = sum(o.passed for o in outcomes)
    ok = passed == len(tests)
    verdicts: dict[str, float] = {}
    for outcome in outcomes:
        key = "verdict_" + outcome.verdict.replace(" ", "_")
        verdicts[key] = verdicts.get(key, 0.0) + 1
    return RewardOutput(
        float(ok),
        metrics={"has_program": 1.0, "completed": 1.0, "tests_passed": passed / len(tests), **verdicts},
        is_correct=ok,
    )
