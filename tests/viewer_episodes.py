"""Real episodes (scripted model, real Strands agent and tools) for the viewer and trajectory-table
tests, with hostile text wherever an episode can carry it: tool output, model output, task ids, prompts,
termination details, agent names. :func:`make_multi_trajectory_episodes` runs agents whose episodes are
several trajectories (a sliding window, an agent used as a tool, a summariser) through the real code
path (``run_episode`` with a TokenModel)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from strands import Agent, tool

from agentboost.agents.strands_agent import StrandsAgent
from agentboost.backends.base import GenerationRequest
from agentboost.backends.scripted import ScriptedBackend
from agentboost.chat.template import ChatTemplate
from agentboost.environments.strands_env import StrandsEnv
from agentboost.episode import Episode
from agentboost.rollout import RolloutSettings, run_episode
from agentboost.types import Budget, RewardOutput, Termination
from tests.helpers import add, calls_text, explode, mul, run

HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"></script><!--'
MULTIBYTE = "héllo 你好 🎉 naïve"


@tool
def fetch(url: str) -> str:
    """Fetch a web page.

    Args:
        url: the address
    """
    return f"page {url}: {HOSTILE}"


def make_episodes(template: Any) -> list[Episode]:
    """Six episodes over three tasks: rewards 1 and 0, a tool error, hostile tool and model output,
    multi-byte text, a turn limit and an infrastructure failure."""
    tools = [add, mul, explode, fetch]
    hostile_task = f"t2{HOSTILE}"
    scripts: list[tuple[str, list[str], dict[str, Any]]] = [
        ("t0", [calls_text("hermes", [("add", {"a": 2, "b": 3}), ("explode", {"reason": "x"})]),
                calls_text("hermes", [("fetch", {"url": "http://example.invalid"})]), "20"], {}),
        ("t0", ["21 " + HOSTILE], {}),
        ("t1", [MULTIBYTE], {"row": {"prompt": "Say hello in three languages."}}),
        ("t1", [calls_text("hermes", [("mul", {"a": 5, "b": 4})])],
         {"settings": RolloutSettings(budget=Budget(max_turns=1))}),
        (hostile_task, [calls_text("hermes", [("mul", {"a": 5, "b": 4})]), "20"],
         {"row": {"prompt": "What is 5 * 4? " + HOSTILE}}),
    ]  # fmt: skip
    episodes = []
    counts: dict[str, int] = {}
    for task, texts, kwargs in scripts:
        episode, _ = run(template, texts, tools=tools, **kwargs)
        k = counts[task] = counts.get(task, -1) + 1
        episode.id, episode.task_id = f"{task}:{k}", task
        episodes.append(episode)
    episodes.append(Episode.failed(f"{hostile_task}:1", Termination.INFRA_ERROR, f"server down {HOSTILE}",
                                   task_id=hostile_task))  # fmt: skip
    return episodes


def role_script(template: ChatTemplate, scripts: dict[str, Callable[[int], str]]) -> Callable[..., list[int]]:
    """A ScriptedBackend script answering each role (``ROLE=<name>`` in its system prompt, or the Strands
    summariser's prompt) from its own script: reply ``k`` of a role is ``scripts[role](k)``."""
    counts: dict[str, int] = {}

    def answer(request: GenerationRequest, _k: int) -> list[int]:
        text = template.decode(request.prompt_ids)
        found = re.search(r"ROLE=(\w+)", text)
        role = "summarizer" if "conversation summarizer" in text else found.group(1) if found else "?"
        k = counts[role] = counts.get(role, -1) + 1
        return [*template.encode(scripts[role](k)), template.info.eot_token_id]

    return answer


def run_agent(template: ChatTemplate, factory: Any, scripts: dict[str, Callable[[int], str]], *, budget: Budget,
              reward: Any = None, train_aux_calls: bool = True) -> Episode:  # fmt: skip
    """One episode of the agent ``factory`` builds, the model answering from ``scripts`` (:func:`role_script`)."""
    env = StrandsEnv({"prompt": "Count up from 0."}, tools=[add], reward_fn=reward or (lambda task, e: 1.0))
    settings = RolloutSettings(budget=budget, train_aux_calls=train_aux_calls)
    backend = ScriptedBackend(role_script(template, scripts))
    return asyncio.run(run_episode(env, StrandsAgent(factory), backend, template, settings))


def make_multi_trajectory_episodes(template: ChatTemplate) -> list[Episode]:
    """Three episodes of several trajectories (tests/test_multi_trajectory.py checks them token by token):

    * ``window:0``: an agent with a hostile name under a sliding window of 4 messages, 6 tool calls: 6
      trajectories, each re-opened on the trimmed history, a hostile final answer;
    * ``pair:0``: an agent using another as a tool (``main`` and ``helper``, role rewards 1 and 0.5);
    * ``summary:0``: a summarising manager whose summary the policy writes, left out of training
      (``train_aux_calls=False``): an ``aux`` trajectory that is not trained."""
    from strands.agent.conversation_manager import SlidingWindowConversationManager, SummarizingConversationManager

    hermes = template.parser.name

    def add_call(k: int) -> str:
        return calls_text(hermes, [("add", {"a": k, "b": 1})])

    def windowed(*, model, tools, task, **defaults):
        window = SlidingWindowConversationManager(window_size=4, per_turn=True)
        return Agent(model=model, tools=tools, name=f"adder{HOSTILE}", system_prompt="ROLE=main. Add one.",
                     conversation_manager=window, callback_handler=None)  # fmt: skip

    window = run_agent(template, windowed, {"main": lambda k: add_call(k) if k < 6 else f"6 {HOSTILE}"},
                       budget=Budget(max_turns=20))  # fmt: skip

    def pair(*, model, tools, task, **defaults):
        helper = Agent(model=model.sibling(), tools=[add], name="helper", system_prompt="ROLE=helper. Add.",
                       callback_handler=None)  # fmt: skip
        return Agent(model=model, tools=[helper.as_tool()], name="main", system_prompt="ROLE=main. Delegate.",
                     **defaults)  # fmt: skip

    pair_episode = run_agent(template, pair, {
        "main": lambda k: calls_text(hermes, [("helper", {"input": "add 0 and 1"})]) if k == 0 else "It is 1.",
        "helper": lambda k: add_call(0) if k == 0 else "1",
    }, budget=Budget(max_turns=10), reward=lambda task, e: RewardOutput(1.0, role_rewards={"helper": 0.5}))  # fmt: skip

    def summarising(*, model, tools, task, **defaults):
        manager = SummarizingConversationManager(summary_ratio=0.5, preserve_recent_messages=2)
        return Agent(model=model, tools=tools, name="main", system_prompt="ROLE=main. Add one, eight times.",
                     conversation_manager=manager, callback_handler=None)  # fmt: skip

    summary = run_agent(template, summarising, {
        "main": lambda k: add_call(k) if k < 8 else "8", "summarizer": lambda k: f"* summary {k}: numbers were added",
    }, budget=Budget(max_turns=30, max_total_tokens=600, min_call_tokens=90), train_aux_calls=False)  # fmt: skip
    episodes = [window, pair_episode, summary]
    for episode, name in zip(episodes, ["window", "pair", "summary"], strict=True):
        episode.id, episode.task_id = f"{name}:0", name
    return episodes


def write_jsonl(path: Path, episodes: list[Episode], *, extra_lines: list[str] = ()) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for episode in episodes:
            fh.write(episode.to_json() + "\n")
        for line in extra_lines:
            fh.write(line)
    return path
