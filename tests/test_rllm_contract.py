"""StrandsAgent / StrandsEnv against rLLM v0.2.1's BaseAgent / BaseEnv contract.

Runs against the local protocol when rLLM is absent (CI) and against rLLM's own classes when it is
installed; with rLLM installed, the local protocol is also exercised in a subprocess.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from agentboost.agents.strands_agent import StrandsAgent
from agentboost.backends.scripted import ScriptedBackend, text_script
from agentboost.compat import rllm as compat
from agentboost.environments.strands_env import StrandsEnv
from agentboost.rollout import run_episode
from agentboost.types import Termination

from .helpers import add, calls_text, mul


def reward(task, episode):
    return float(episode.final_text == str(task["answer"]))


def test_classes_implement_the_contract() -> None:
    assert issubclass(StrandsAgent, compat.BaseAgent)
    assert issubclass(StrandsEnv, compat.BaseEnv)
    agent = StrandsAgent(system_prompt="s")  # instantiable: every abstract method implemented
    env = StrandsEnv.from_dict({"prompt": "p", "answer": 1, "tools": [add], "reward_fn": reward})
    assert env.task == {"prompt": "p", "answer": 1}
    assert StrandsEnv.is_multithread_safe() is True
    env.idx = 7
    assert env.idx == 7
    assert agent.get_current_state() is None
    assert agent.trajectory.steps == []


def test_episode_through_the_contract(qwen25_template) -> None:
    texts = [calls_text("hermes", [("add", {"a": 2, "b": 3})]), calls_text("hermes", [("mul", {"a": 5, "b": 4})]), "20"]
    env = StrandsEnv.from_dict({"prompt": "What is (2+3)*4?", "answer": 20, "tools": [add, mul], "reward_fn": reward})
    agent = StrandsAgent(system_prompt="Use tools.")
    obs, info = env.reset()
    assert obs["prompt"] == "What is (2+3)*4?" and info == {"validation": False}
    agent.update_from_env(obs, 0.0, False, info)
    assert agent.chat_completions[-1] == {"role": "user", "content": "What is (2+3)*4?"}
    with pytest.raises(TypeError, match="never consumes text"):
        agent.update_from_model("some text")

    backend = ScriptedBackend(text_script(qwen25_template, texts))
    episode = asyncio.run(run_episode(env, agent, backend, qwen25_template))
    assert episode.termination is Termination.COMPLETED and episode.reward == 1.0

    traj = agent.trajectory
    assert isinstance(traj, compat.Trajectory)
    assert len(traj.steps) == 3 and traj.reward == 1.0
    assert all(isinstance(s, compat.Step) for s in traj.steps)
    flat = episode.prompt_ids + episode.response_ids
    for step, call in zip(traj.steps, episode.calls, strict=True):
        assert step.prompt_ids == flat[: call.context_tokens]
        assert step.response_ids == flat[call.context_tokens : call.context_tokens + call.completion_tokens]
        assert len(step.logprobs) == len(step.response_ids)
    # Each step's prompt extends the previous step's prompt + response (cumulative, token-exact).
    for prev, nxt in zip(traj.steps, traj.steps[1:], strict=False):
        assert nxt.prompt_ids[: len(prev.prompt_ids) + len(prev.response_ids)] == prev.prompt_ids + prev.response_ids
    assert traj.steps[0].action[0]["name"] == "add"
    assert agent.get_current_state() is traj.steps[-1] and traj.steps[-1].done and traj.steps[-1].reward == 1.0
    roles = [m["role"] for m in agent.chat_completions]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]

    agent.update_from_env(None, 0.5, True, {"note": "engine wrote this"})
    assert agent.get_current_state().reward == 0.5 and agent.get_current_state().info["note"] == "engine wrote this"

    # BaseEnv.step: the action is the finished episode; called off the event loop (as rLLM's engine does).
    obs2, r, done, _ = env.step(episode)
    assert (obs2, r, done) == (None, 1.0, True)
    with pytest.raises(TypeError):
        env.step("text action")


def test_env_from_dict_tool_factory_and_references() -> None:
    env = StrandsEnv.from_dict({"q": "x", "prompt_key": "q", "tools": "tests.test_rllm_contract:tool_factory"})
    env.reset()
    assert [t.tool_name for t in env.tools] == ["add", "mul"]
    assert env.initial_prompt() == "x"
    with pytest.raises(KeyError, match="prompt"):
        StrandsEnv.from_dict({"nothing": 1}).initial_prompt()
    with pytest.raises(TypeError, match="not a Strands tool"):
        StrandsEnv.from_dict({"prompt": "p", "tools": [len]}).reset()


def tool_factory(task):
    return [add, mul]


@pytest.mark.rllm
@pytest.mark.skipif(not compat.RLLM_AVAILABLE, reason="rLLM v0.2.1 is not installed (it is not on PyPI)")
def test_real_rllm_classes_are_used_and_local_protocol_behaves_the_same() -> None:
    import rllm.agents.agent as rllm_agent
    import rllm.environments.base.base_env as rllm_env

    assert compat.BaseAgent is rllm_agent.BaseAgent and compat.BaseEnv is rllm_env.BaseEnv
    env = dict(os.environ, AGENTBOOST_RLLM="local")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", __file__, "-k", "not real_rllm"],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
