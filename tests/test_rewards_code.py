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


async def play(turns: list[str], template=None, problem=None, settings=None):
    template = template or template_for("qwen2.5")
    env = CodeEnv.from_dict(dict(problem or PROBLEM))
    backend = ScriptedBackend(text_script(template, turns))
    return await run_episode(env, StrandsAgent(), backend, template, settings or RolloutSettings())


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


async def test_reasoning_written_as_text_is_not_the_answer_on_templates_without_a_reasoning_section() -> None:
    for final in (f"<think>\n{fence(GOOD)}\n</think>\nI am done.", f"Done.\n<think>\n{fence(GOOD)}"):
        episode = await play([final])  # qwen2.5: <think> stays in the text
        assert episode.reward == 0.0 and episode.reward_metrics["has_program"] == 0.0, final


async def test_an_episode_cut_off_by_the_turn_limit_has_no_final_answer() -> None:
    from agentboost.types import Budget

    settings = RolloutSettings(budget=Budget(max_turns=1))
    episode = await play([f"Here:\n{fence(GOOD)}\n" + call("run_tests", {"code": GOOD})], settings=settings)
    assert episode.termination.value == "max_turns"
    assert episode.reward == 0.0 and episode.reward_metrics["completed"] == 0.0


async def test_every_hidden_test_counts_however_many() -> None:
    tests = [{"input": f"{i} 0\n", "output": f"{i}\n"} for i in range(70)]
    fails_late = "a, b = map(int, input().split())\nprint(a if a < 64 else -1)"
    episode = await play([fence(fails_late)], problem={"prompt": "Sum.", "tests": tests})
    assert episode.reward == 0.0 and episode.reward_metrics["tests_passed"] == pytest.approx(64 / 70)
    from agentboost.rewards.code import MAX_TESTS, tests_of

    with pytest.raises(ValueError, match="not truncated"):
        tests_of({"tests": tests * (MAX_TESTS // 70 + 1)}, "tests")


async def test_reals_spacing_and_long_outputs_are_judged_fairly() -> None:
    problem = {"prompt": "p", "tests": [{"input": "3\n", "output": "0.3333333333\n"}]}
    assert (await play([fence("input()\nprint(' 0.333333333 ')")], problem=problem)).reward == 1.0
    assert (await play([fence("input()\nprint(0.3334)")], problem=problem)).reward == 0.0
    exact = {**problem, "float_tolerance": None}
    assert (await play([fence("input()\nprint(0.333333333)")], problem=exact)).reward == 0.0
    integers = {"prompt": "p", "tests": [{"input": "", "output": "3\n"}]}
    assert (await play([fence("print('3.0000001')")], problem=integers)).reward == 0.0  # integers are exact
    big = "\n".join(str(i) for i in range(20000))  # ~108 KB, above the default 64 KiB output cap
    long = {"prompt": "p", "tests": [{"input": "", "output": big + "\n"}]}
    assert (await play([fence("for i in range(20000):\n    print(i)")], problem=long)).reward == 1.0
    flood = await play([fence("while True:\n    print('y' * 1000)")], problem=long)
    assert flood.reward == 0.0 and flood.reward_metrics["verdict_output_limit_exceeded"] == 1.0


async def test_call_results_need_the_same_json_type() -> None:
    def problem(output):
        return {"prompt": "f", "tests": [{"input": [], "output": output, "testtype": "functional", "fn_name": "f"}]}

    cases = [
        (True, "return 1", 0.0), (True, "return True", 1.0), ([3], "return 3", 0.0), ([3], "return [3]", 1.0),
        (2.5, "return 2.5000000001", 1.0), ("3", "return 3", 0.0), ("3", "return '3'", 1.0),
    ]  # fmt: skip
    for output, body, expected in cases:
        episode = await play([fence(f"def f():\n    {body}")], problem=problem(output))
        assert episode.reward == expected, (output, body)
    liar = "class Any:\n    def __eq__(self, other):\n        return True\ndef f():\n    return Any()"
    assert (await play([fence(liar)], problem=problem(7))).reward == 0.0  # not JSON: a runtime error


async def test_a_slow_program_stops_the_suite_after_its_first_timeout() -> None:
    import time

    tests = [{"input": f"{i}\n", "output": f"{i}\n"} for i in range(40)]
    slow = "import time\nn = int(input())\nif n == 0:\n    time.sleep(60)\nprint(n)"
    started = time.monotonic()
    episode = await play([fence(slow)], problem={"prompt": "p", "tests": tests})
    metrics = episode.reward_metrics
    assert episode.reward == 0.0 and metrics["verdict_time_limit_exceeded"] == 1.0
    assert metrics["tests_passed"] + metrics.get("verdict_not_run", 0) / 40 == pytest.approx(39 / 40)
    assert time.monotonic() - started < 30


# --- issue 22: the masking rule applied to the code reward ---------------------------------------------
async def test_a_program_too_slow_for_its_suite_scores_zero_and_is_trained_on() -> None:
    """Finding 11: a wrong program that sleeps just under the per-test limit on every test never times
    out a test; the suite's budget (what is left of the reward's) ends it with a verdict: reward 0, the
    episode trained on, not masked as an infrastructure failure."""
    from agentboost.types import Budget

    tests = [{"input": f"{i}\n", "output": f"{i}\n"} for i in range(26)]
    slow = "import time\ntime.sleep(0.9)\nprint(-1)"
    settings = RolloutSettings(budget=Budget(reward_timeout_s=4.0))
    episode = await play([fence(slow)], problem={"prompt": "p", "tests": tests}, settings=settings)
    assert episode.termination.value == "completed" and not episode.masked, episode.termination_detail
    assert episode.reward == 0.0 and episode.reward_metrics.get("verdict_suite_time_limit_exceeded", 0) >= 1


async def test_waiting_for_a_sandbox_slot_does_not_use_up_the_rewards_time(monkeypatch) -> None:
    """Finding 8: the reward's sandbox is busy for longer than the reward's whole budget (other episodes'
    runs); the wait is not the reward's: a correct program still gets 1, and nothing is masked."""
    import asyncio

    from agentboost.sandbox import Sandbox, SandboxConfig
    from agentboost.tools import strands_code_tool
    from agentboost.types import Budget

    box = Sandbox(SandboxConfig(slots=1, wall_s=10, cpu_s=10, memory_mb=256, max_processes=16))
    monkeypatch.setattr(strands_code_tool, "_default", box)
    try:
        await asyncio.to_thread(box.isolation)
        holder = asyncio.ensure_future(box.run("import time\ntime.sleep(3.5)", timeout_s=10))
        await asyncio.sleep(0.3)
        settings = RolloutSettings(budget=Budget(reward_timeout_s=2.0))
        episode = await play([fence(GOOD)], settings=settings)
        await holder
    finally:
        box.close()
    assert not episode.masked and episode.termination.value == "completed", episode.termination_detail
    assert episode.reward == 1.0
