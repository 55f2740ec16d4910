"""Math (sandboxed python tool) and code (public tests in the tool, hidden tests in the reward) environments."""

from __future__ import annotations

import json

from agentboost import StrandsAgent
from agentboost.backends.scripted import ScriptedBackend, text_script
from agentboost.environments.code_env import CodeEnv, final_program
from agentboost.environments.math_env import MathEnv
from agentboost.rollout import RolloutSettings, run_episode
from agentboost.types import Termination


def call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


async def play(env, template, turns):
    backend = ScriptedBackend(text_script(template, turns))
    return await run_episode(env, StrandsAgent(), backend, template, RolloutSettings())


async def test_math_env_runs_python_in_the_sandbox_and_checks_equivalence(qwen25_template, monkeypatch) -> None:
    monkeypatch.setenv("AGENTBOOST_TEST_SECRET", "s3cr3t")
    env = MathEnv.from_dict({"prompt": "What is 2^10 / 4?", "answer": "256"})
    code = "import os\nprint(2**10 // 4, os.environ.get('AGENTBOOST_TEST_SECRET'))"
    episode = await play(env, qwen25_template, [call("python", {"code": code}), "So it is \\boxed{256.0}."])
    assert episode.termination is Termination.COMPLETED and episode.reward == 1.0
    tool_text = json.dumps(episode.messages)
    assert "256 None" in tool_text  # ran, and the sandbox scrubbed the environment
    wrong = await play(MathEnv.from_dict({"prompt": "x", "answer": "256"}), qwen25_template, ["\\boxed{255}"])
    assert wrong.reward == 0.0


async def test_python_tool_reports_errors_and_timeouts(qwen25_template) -> None:
    env = MathEnv.from_dict({"prompt": "p", "answer": "1"})
    turns = [
        call("python", {"code": "raise SystemExit(3)"}),
        call("python", {"code": "while True: pass"}),
        "\\boxed{1}",
    ]
    episode = await play(env, qwen25_template, turns)
    text = json.dumps(episode.messages)
    assert "exit code 3" in text and "killed: exceeded" in text
    assert episode.tools["python"].errors == 2 and episode.reward == 1.0


PROBLEM = {
    "prompt": "Read two integers and print their sum.",
    "public_tests": [{"input": "1 2\n", "output": "3\n"}],
    "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "-5 5\n", "output": "0\n"}],
}


async def test_code_env_rewards_only_programs_that_pass_hidden_tests(qwen25_template) -> None:
    good = "a, b = map(int, input().split())\nprint(a + b)"
    overfit = "print(3)"
    episode = await play(CodeEnv.from_dict(dict(PROBLEM)), qwen25_template,
                         [call("run_tests", {"code": overfit}), f"```python\n{overfit}\n```"])  # fmt: skip
    assert "1/1" in json.dumps(episode.messages) or "PASS" in json.dumps(episode.messages).upper()
    assert episode.reward == 0.0  # passes the public test, fails the hidden one
    episode = await play(CodeEnv.from_dict(dict(PROBLEM)), qwen25_template, [f"Done:\n```python\n{good}\n```"])
    assert episode.reward == 1.0 and episode.is_correct
    none = await play(CodeEnv.from_dict(dict(PROBLEM)), qwen25_template, ["I cannot solve it."])
    assert none.reward == 0.0 and none.reward_metrics.get("has_program") == 0.0


def test_final_program_takes_the_last_fenced_block() -> None:
    assert final_program("```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```") == "print(2)"
    assert final_program("no code") is None
