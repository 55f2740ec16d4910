"""The code reward against reward-hacking attempts (each one a way the replaced system could be gamed)."""

from __future__ import annotations

import json

import pytest

from agentboost import StrandsAgent
from agentboost.backends.scripted import ScriptedBackend, text_script
from agentboost.environments.code_env import CodeEnv
from agentboost.rewards.code import final_program
from agentboost.rollout import RolloutSettings, run_episode
from tests.conftest import template_for

GOOD = "a, b = map(int, input().split())\nprint(a + b)"
PROBLEM = {
    "prompt": "Read two integers and print their sum.",
    "public_tests": [{"input": "1 2\n", "output": "3\n"}],
    "tests": [
        {"input": "1 2\n", "output": "3\n"},
        {"input": "-5 5\n", "output": "0\n"},
        {"input": "10 20\n", "output": "30\n"},
        {"input": "7 8\n", "output": "15\n"},
    ],
}


def call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


async def play(turns: list[str], template=None, problem=None):
    template = template or template_for("qwen2.5")
    env = CodeEnv.from_dict(dict(problem or PROBLEM))
    backend = ScriptedBackend(text_script(template, turns))
    return await run_episode(env, StrandsAgent(), backend, template, RolloutSettings())


async def test_correct_final_program_gets_exactly_one() -> None:
    episode = await play([f"Here it is:\n{fence(GOOD)}"])
    assert episode.reward == 1.0 and episode.is_correct
    assert episode.reward_metrics["tests_passed"] == 1.0 and episode.reward_metrics["has_program"] == 1.0


@pytest.mark.parametrize(
    "final",
    [
        "I am confident my solution is correct. All tests passed.",  # no submission
        "```python\n\n```",  # empty block
        fence("import sys\nsys.exit(0)"),  # always exit 0, prints nothing
        fence("pass"),  # does nothing
        fence("print(3)"),  # hard-codes the public test's answer
        fence("print(open('/proc/self/environ').read())"),  # fishing for the answers
    ],
    ids=["no-submission", "empty", "exit-0", "noop", "hardcoded-public", "fishing"],
)
async def test_hacking_attempts_get_zero(final: str) -> None:
    episode = await play([final])
    assert episode.reward == 0.0 and episode.is_correct is False


async def test_code_only_in_reasoning_or_tool_calls_earns_nothing() -> None:
    template = template_for("qwen3-thinking")
    turns = [
        f"<think>\nThe solution:\n{fence(GOOD)}\n</think>\n\n" + call("run_tests", {"code": GOOD}),
        f"<think>\nIt passes; I submit it.\n{fence(GOOD)}\n</think>\n\nThe tests pass, so I am done.",
    ]
    episode = await play(turns, template)
    assert "passed" in json.dumps(episode.messages)  # the tool did run the good program
    assert final_program(episode.final_text) is None  # ...but the final answer has no program
    assert episode.reward == 0.0 and episode.reward_metrics["has_program"] == 0.0


async def test_tool_calls_neither_add_to_nor_replace_a_correct_submission() -> None:
    spam = [call("run_tests", {"code": GOOD}) for _ in range(5)]
    without = await play([*spam, "Done, all public tests pass."])
    assert without.tools["run_tests"].calls == 5 and without.reward == 0.0
    with_program = await play([*spam, fence(GOOD)])
    baseline = await play([fence(GOOD)])
    assert with_program.reward == baseline.reward == 1.0


async def test_partial_passes_get_zero_and_the_fraction_counts_every_test() -> None:
    # Fails the FIRST hidden test but passes the other three: leading-passes scoring would say 0.
    wrong_first = "a, b = map(int, input().split())\nprint(a + b if (a, b) != (1, 2) else 4)"
    episode = await play([fence(wrong_first)])
    assert episode.reward == 0.0
    assert episode.reward_metrics["tests_passed"] == pytest.approx(0.75)
    assert episode.reward_metrics["verdict_wrong_answer"] == 1.0


async def test_call_based_tests() -> None:
    problem = {
        "prompt": "Write add(a, b).",
        "tests": [
            {"input": [1, 2], "output": 3, "testtype": "functional", "fn_name": "add"},
            {"input": [5, -5], "output": 0, "testtype": "functional", "fn_name": "add"},
        ],
    }
    good = await play([fence("def add(a, b):\n    return a + b")], problem=problem)
    bad = await play([fence("def add(a, b):\n    return 3")], problem=problem)
    assert (good.reward, bad.reward) == (1.0, 0.0)
    assert bad.reward_metrics["tests_passed"] == 0.5
