"""Agents that rewrite their history and agents made of several agents, against a real HTTP server that
speaks vLLM's completions protocol, with real tokenizers (Qwen2.5, Qwen3, Llama 3.1): every episode is
checked trajectory by trajectory against what the server was sent and returned, and each trajectory's
prompt against the chat template's render of the history its first call was given."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import pytest
from strands import Agent, tool
from strands.agent.conversation_manager import (
    SlidingWindowConversationManager,
    SummarizingConversationManager,
)
from strands.hooks import AfterModelCallEvent

from agentboost.agents.strands_agent import StrandsAgent
from agentboost.backends.vllm_http import VLLMCompletionsBackend
from agentboost.chat.messages import strands_to_hf, system_message, tool_specs_to_openai
from agentboost.chat.template import ChatTemplate
from agentboost.environments.strands_env import StrandsEnv
from agentboost.episode import Episode, SegmentKind
from agentboost.rollout import RolloutSettings, run_episode
from agentboost.testing.fake_vllm import FakeVLLMServer
from agentboost.types import Budget, RewardOutput, Termination

from .conftest import template_for
from .helpers import calls_text

FAMILIES = ["qwen2.5", "qwen3-thinking", "llama3.1"]


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


class Policy:
    """A scripted 'model' behind the fake server: each role (found by a marker in its system prompt) has
    its own script of replies; every request and reply is logged."""

    def __init__(self, template: ChatTemplate, scripts: dict[str, Any]) -> None:
        self.template = template
        self.scripts = scripts
        self.counts: dict[str, int] = {}
        self.log: list[tuple[str, list[int], list[int]]] = []
        self.lock = threading.Lock()

    def role_of(self, text: str) -> str:
        if "conversation summarizer" in text:
            return "summarizer"
        found = re.search(r"ROLE=(\w+)", text)
        return found.group(1) if found else "?"

    def __call__(self, prompt_ids: list[int]) -> list[int]:
        text = self.template.decode(prompt_ids)
        role = self.role_of(text)
        with self.lock:
            k = self.counts.get(role, 0)
            self.counts[role] = k + 1
        reply = self.scripts[role](k, text)
        if self.template.info.has_reasoning and not self.template.info.reasoning_prefilled:
            reply = f"<think>\nstep {k}\n</think>\n\n{reply}"
        out = [*self.template.encode(reply), self.template.info.eot_token_id]
        with self.lock:
            self.log.append((role, list(prompt_ids), out))
        return out


def tool_call(template: ChatTemplate, name: str, arguments: dict[str, Any]) -> str:
    return calls_text(template.parser.name, [(name, arguments)])


def check_token_exact(episode: Episode, policy: Policy) -> None:
    """Every call's context (its trajectory's tokens before its response) is a prompt the server was sent,
    and its response is exactly what the server returned for it."""
    episode.check_invariants()
    sent = {tuple(prompt): out for _, prompt, out in policy.log}
    assert len(policy.log) == len(episode.calls)
    for trajectory in episode.trajectories:
        context: list[int] = []
        for seg in trajectory.segments:
            if seg.kind is SegmentKind.MODEL:
                assert tuple(context) in sent, f"trajectory {trajectory.index}: a context the server never got"
                assert seg.token_ids == sent[tuple(context)], f"trajectory {trajectory.index}: not the reply"
            context.extend(seg.token_ids)


def check_prompts_render_history(episode: Episode, template: ChatTemplate, systems: dict[str, str],
                                 tools: dict[str, Any]) -> None:  # fmt: skip
    """Each trajectory's prompt is the template's render of the history its first call was given."""
    for trajectory in episode.trajectories:
        first = trajectory.calls[0]
        history = episode.messages_of(trajectory.index)[: first.message_index]
        agent = trajectory.info.agent
        hf = system_message(systems[agent]) + strands_to_hf(history)
        specs = tool_specs_to_openai(tools.get(agent))
        assert trajectory.prompt_ids == template.initial_prompt(hf, specs), f"trajectory {trajectory.index}"


def check_transcript(episode: Episode, *, calls: int) -> None:
    """The whole conversation, once, in order, although the final history lost its start: the task, then
    every tool call followed by its result, then the answer (and no summary)."""
    transcript = episode.transcript()
    assert transcript[0]["role"] == "user" and transcript[0]["content"][0]["text"] == "go"
    uses = [b["toolUse"] for m in transcript for b in m["content"] if "toolUse" in b]
    results = [b["toolResult"] for m in transcript for b in m["content"] if "toolResult" in b]
    assert [u["input"]["a"] for u in uses] == list(range(calls))
    assert [r["toolUseId"] for r in results] == [u["toolUseId"] for u in uses]
    assert not any("summary" in str(m) for m in transcript)
    assert transcript[-1]["role"] == "assistant" and transcript[-1]["content"] == episode.messages[-1]["content"]
    assert len(transcript) == 2 + 2 * calls


def run(template: ChatTemplate, policy: Policy, factory: Any, *, budget: Budget, task: str = "go",
        reward: Any = None, settings: RolloutSettings | None = None) -> Episode:  # fmt: skip
    with FakeVLLMServer(policy, vocab_size=len(template.tokenizer)) as server:
        backend = VLLMCompletionsBackend(server.url)
        env = StrandsEnv({"prompt": task}, tools=[add], reward_fn=reward or (lambda t, e: 1.0))
        settings = settings or RolloutSettings(budget=budget)
        episode = asyncio.run(run_episode(env, StrandsAgent(factory), backend, template, settings))
        assert len(server.requests) == len(episode.calls)
    return episode


# -- a sliding window of 4 messages over 20 tool calls ---------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_sliding_window_over_a_20_tool_call_episode(family: str) -> None:
    template = template_for(family)
    system = "ROLE=main. Add one, twenty times."
    policy = Policy(template, {"main": lambda k, _: tool_call(template, "add", {"a": k, "b": 1}) if k < 20 else "20"})
    pin = family != "qwen2.5"  # Llama 3.1's template needs the user turn to put the tools in; keep the task

    def factory(*, model, tools, task, **defaults):
        window = SlidingWindowConversationManager(window_size=4, per_turn=True, pin_first=1 if pin else None)
        return Agent(model=model, tools=tools, name="main", system_prompt=system, conversation_manager=window,
                     callback_handler=None)  # fmt: skip

    episode = run(template, policy, factory, budget=Budget(max_turns=30, max_total_tokens=4096))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert len(episode.calls) == 21 and episode.tools["add"].calls == 20
    assert episode.final_text.strip() == "20"
    infos = episode.trajectory_info
    assert len(infos) >= 10, [i.opened_by for i in infos]
    assert infos[0].opened_by == "start"
    assert all(info.opened_by == "history_rewritten" and info.rerendered_tokens > 0 for info in infos[1:])
    for trajectory in episode.trajectories:  # the window never holds more than 4 messages (+ the pinned task)
        history = episode.messages_of(trajectory.index)[: trajectory.calls[0].message_index]
        assert len(history) <= 4 + int(pin)
    check_token_exact(episode, policy)
    check_prompts_render_history(episode, template, {"main": system}, {"main": [add.tool_spec]})
    check_transcript(episode, calls=20)
    # The record and its JSON agree, trajectories included.
    assert Episode.from_json(episode.to_json()).to_dict() == episode.to_dict()


def test_without_a_window_the_same_episode_ends_at_the_context_limit() -> None:
    template = template_for("qwen2.5")
    policy = Policy(template, {"main": lambda k, _: tool_call(template, "add", {"a": k, "b": 1}) if k < 20 else "20"})

    def factory(*, model, tools, task, **defaults):
        return Agent(model=model, tools=tools, name="main", system_prompt="ROLE=main.", **defaults)

    def windowed(*, model, tools, task, **defaults):
        window = SlidingWindowConversationManager(window_size=4)
        return Agent(model=model, tools=tools, name="main", system_prompt="ROLE=main.", conversation_manager=window,
                     callback_handler=None)  # fmt: skip

    budget = Budget(max_turns=30, max_total_tokens=600, min_call_tokens=40)
    plain = run(template, policy, factory, budget=budget)
    assert plain.termination is Termination.MAX_TOKENS and plain.num_trajectories == 1
    assert "token budget used up" in plain.termination_detail
    policy = Policy(template, policy.scripts)
    split = run(template, policy, windowed, budget=budget)  # reduces the history when the context is full
    assert split.termination is Termination.COMPLETED, split.termination_detail
    assert split.num_trajectories > 1 and all(len(t.prompt_ids) + len(t.response_ids) <= 600
                                              for t in split.trajectories)  # fmt: skip
    check_token_exact(split, policy)


def test_a_window_that_trims_only_after_the_last_call_keeps_one_trajectory_and_its_history() -> None:
    """Strands applies the window once more when the invocation ends: the episode is one trajectory, and
    its record keeps the history its calls were given (Episode.messages is the trimmed final one)."""
    template = template_for("qwen2.5")
    policy = Policy(template, {"main": lambda k, _: tool_call(template, "add", {"a": k, "b": 1}) if k < 3 else "3"})

    def factory(*, model, tools, task, **defaults):
        window = SlidingWindowConversationManager(window_size=4)  # reactive, and at the end of the invocation
        return Agent(model=model, tools=tools, name="main", system_prompt="ROLE=main.", conversation_manager=window,
                     callback_handler=None)  # fmt: skip

    episode = run(template, policy, factory, budget=Budget(max_turns=10))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert episode.num_trajectories == 1 and len(episode.calls) == 4
    assert len(episode.messages) <= 4 and episode.final_text == "3"  # trimmed after the last call
    history = episode.messages_of(0)
    assert len(history) == 8 and history[0]["content"][0]["text"] == "go"
    check_transcript(episode, calls=3)
    check_token_exact(episode, policy)
    check_prompts_render_history(episode, template, {"main": "ROLE=main."}, {"main": [add.tool_spec]})


# -- a summarising manager whose summary is generated by the policy ---------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("train_aux", [True, False])
def test_summarising_manager_with_the_policy_as_summariser(family: str, train_aux: bool) -> None:
    template = template_for(family)
    system = "ROLE=main. Add one, twelve times."

    def main(k: int, text: str) -> str:
        return tool_call(template, "add", {"a": k, "b": 1}) if k < 12 else "12"

    policy = Policy(template, {"main": main, "summarizer": lambda k, _: f"* summary {k}: numbers were added"})

    def factory(*, model, tools, task, **defaults):
        manager = SummarizingConversationManager(summary_ratio=0.5, preserve_recent_messages=2)
        return Agent(model=model, tools=tools, name="main", system_prompt=system, conversation_manager=manager,
                     callback_handler=None)  # fmt: skip

    first_prompt = template.initial_prompt(
        system_message(system) + strands_to_hf([{"role": "user", "content": [{"text": "go"}]}]),
        tool_specs_to_openai([add.tool_spec]),
    )
    budget = Budget(max_turns=40, max_total_tokens=len(first_prompt) + 420, min_call_tokens=90)
    settings = RolloutSettings(budget=budget, train_aux_calls=train_aux)
    episode = run(template, policy, factory, budget=budget, settings=settings)
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert episode.final_text.strip() == "12"
    check_transcript(episode, calls=12)
    agents = [info.agent for info in episode.trajectory_info]
    assert "aux" in agents and agents[0] == "main"
    for trajectory in episode.trajectories:
        if trajectory.info.agent == "aux":  # the policy wrote the summary: its own trajectory
            assert trajectory.info.opened_by == "new_agent" or trajectory.info.opened_by == "history_rewritten"
            assert "conversation summarizer" in template.decode(trajectory.prompt_ids)
            assert trajectory.info.trained is train_aux
        elif trajectory.index:  # later main trajectories hold a summary instead of the oldest turns
            assert "numbers were added" in template.decode(trajectory.prompt_ids)
    check_token_exact(episode, policy)
    from agentboost.batch import episodes_to_batch

    batch = episodes_to_batch([episode], pad_token_id=0)
    assert ("aux" in batch.row_agent) is train_aux
    assert len(batch) == sum(1 for info in episode.trajectory_info if info.trained)


# -- an agent used as a tool --------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_agent_as_tool_pair(family: str) -> None:
    template = template_for(family)
    systems = {"main": "ROLE=main. Delegate sums.", "helper": "ROLE=helper. Add with the tool."}

    def main(k: int, text: str) -> str:
        return tool_call(template, "helper", {"input": "add 2 and 3"}) if k == 0 else "The answer is 5."

    def helper(k: int, text: str) -> str:
        return tool_call(template, "add", {"a": 2, "b": 3}) if k == 0 else "5"

    policy = Policy(template, {"main": main, "helper": helper})
    holder: dict[str, Any] = {}

    def factory(*, model, tools, task, **defaults):
        sub = Agent(model=model.sibling(), tools=[add], name="helper", system_prompt=systems["helper"],
                    callback_handler=None)  # fmt: skip
        holder["helper"] = sub
        return Agent(model=model, tools=[sub.as_tool()], name="main", system_prompt=systems["main"], **defaults)

    episode = run(template, policy, factory, budget=Budget(max_turns=10))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert episode.final_text.strip() == "The answer is 5."
    assert [(i.agent, i.opened_by) for i in episode.trajectory_info] == [("main", "start"), ("helper", "new_agent")]
    main_t, helper_t = episode.trajectories
    assert len(main_t.calls) == 2 and len(helper_t.calls) == 2
    assert [c.index for c in main_t.calls] == [0, 3] and [c.index for c in helper_t.calls] == [1, 2]
    assert episode.tools["add"].calls == 1 and episode.tools["helper"].calls == 1  # hooks on both agents
    check_token_exact(episode, policy)
    tools = {"main": [holder["helper"].as_tool().tool_spec], "helper": [add.tool_spec]}
    check_prompts_render_history(episode, template, systems, tools)


# -- a two-agent Swarm and a two-node Graph --------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_two_agent_swarm(family: str) -> None:
    from strands.multiagent import Swarm

    template = template_for(family)

    def planner(k: int, text: str) -> str:
        if k == 0:
            return tool_call(template, "handoff_to_agent", {"agent_name": "solver", "message": "add 2 and 3"})
        return "Handed off."

    def solver(k: int, text: str) -> str:
        return tool_call(template, "add", {"a": 2, "b": 3}) if k == 0 else "5"

    policy = Policy(template, {"planner": planner, "solver": solver})

    def factory(*, model, tools, task, **defaults):
        plan = Agent(model=model, name="planner", system_prompt="ROLE=planner. Hand off.", **defaults)
        solve = Agent(model=model, tools=[add], name="solver", system_prompt="ROLE=solver. Add.", **defaults)
        return Swarm([plan, solve], entry_point=plan, max_handoffs=4, max_iterations=4)

    def reward(task: dict, episode: Episode) -> RewardOutput:
        return RewardOutput(1.0, role_rewards={"planner": 0.5})

    episode = run(template, policy, factory, budget=Budget(max_turns=10), reward=reward)
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert episode.final_text.strip() == "5"
    assert [(i.agent, i.opened_by) for i in episode.trajectory_info] == [("planner", "start"), ("solver", "new_agent")]
    assert [len(t.calls) for t in episode.trajectories] == [2, 2]
    assert episode.reward_of("planner") == 0.5 and episode.reward_of("solver") == 1.0
    check_token_exact(episode, policy)


@pytest.mark.parametrize("family", FAMILIES)
def test_two_node_graph(family: str) -> None:
    from strands.multiagent import GraphBuilder

    template = template_for(family)
    policy = Policy(template, {
        "draft": lambda k, _: "Draft: 2 + 3",
        "check": lambda k, text: tool_call(template, "add", {"a": 2, "b": 3}) if k == 0 else "Checked: 5",
    })  # fmt: skip

    def factory(*, model, tools, task, **defaults):
        draft = Agent(model=model, name="draft", system_prompt="ROLE=draft. Write the sum.", **defaults)
        check = Agent(model=model, tools=[add], name="check", system_prompt="ROLE=check. Verify.", **defaults)
        builder = GraphBuilder()
        builder.add_node(draft, "draft")
        builder.add_node(check, "check")
        builder.add_edge("draft", "check")
        builder.set_entry_point("draft")
        return builder.build()

    episode = run(template, policy, factory, budget=Budget(max_turns=10))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert episode.final_text.strip() == "Checked: 5"
    assert [(i.agent, i.opened_by) for i in episode.trajectory_info] == [("draft", "start"), ("check", "new_agent")]
    # The second node's prompt carries the first node's answer (Strands hands it over as its input).
    assert "Draft: 2 + 3" in template.decode(episode.trajectories[1].prompt_ids)
    check_token_exact(episode, policy)


# -- a server failure is infra_error wherever it happens ---------------------------------------------
class _FailingFor:
    """A scripted backend that fails (HTTP 503) every call whose prompt names ``role`` or is call ``at``."""

    def __init__(self, template: ChatTemplate, script: Any, *, role: str | None = None, at: int | None = None):
        from agentboost.backends.scripted import ScriptedBackend

        self.template, self.role, self.at, self.k = template, role, at, 0
        self.inner = ScriptedBackend(lambda request, k: [*template.encode(script(k)), template.info.eot_token_id])

    async def generate(self, request: Any) -> Any:
        from agentboost.errors import BackendError

        k, self.k = self.k, self.k + 1
        if k == self.at or (self.role and f"ROLE={self.role}" in self.template.decode(request.prompt_ids)):
            raise BackendError("HTTP 503 from the inference server")
        return await self.inner.generate(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _run_direct(template: ChatTemplate, backend: Any, factory: Any, budget: Budget) -> Episode:
    env = StrandsEnv({"prompt": "go"}, tools=[add], reward_fn=lambda t, e: 1.0)
    return asyncio.run(run_episode(env, StrandsAgent(factory), backend, template, RolloutSettings(budget=budget)))


def test_a_server_failure_after_the_window_trimmed_is_infra_error_not_max_tokens() -> None:
    # Strands retries inside its except block after a context overflow: every later error carries the
    # recovered overflow as its context, which read as max_tokens (trained on with reward 1)
    template = template_for("qwen2.5")

    def windowed(*, model, tools, task, **defaults):
        return Agent(model=model, tools=tools, name="main", system_prompt="ROLE=main.", callback_handler=None,
                     conversation_manager=SlidingWindowConversationManager(window_size=4))  # fmt: skip

    budget = Budget(max_turns=30, max_total_tokens=600, min_call_tokens=40)
    for at in (3, 15):  # before the first trim, and after one
        backend = _FailingFor(template, lambda k: tool_call(template, "add", {"a": k, "b": 1}), at=at)
        episode = _run_direct(template, backend, windowed, budget)
        assert episode.termination is Termination.INFRA_ERROR and episode.masked, (at, episode.termination_detail)
        assert "503" in episode.termination_detail
    assert episode.num_trajectories >= 2  # the failure came after the window trimmed


def test_a_server_failure_in_an_agent_used_as_a_tool_ends_the_episode_infra_error() -> None:
    template = template_for("qwen2.5")
    script = lambda k: tool_call(template, "helper", {"input": "add 2 and 3"}) if k == 0 else "The answer is 5."  # noqa: E731

    def factory(*, model, tools, task, **defaults):
        sub = Agent(model=model.sibling(), tools=[add], name="helper", system_prompt="ROLE=helper.",
                    callback_handler=None)  # fmt: skip
        return Agent(model=model, tools=[sub.as_tool()], name="main", system_prompt="ROLE=main.", **defaults)

    episode = _run_direct(template, _FailingFor(template, script, role="helper"), factory, Budget(max_turns=10))
    # (Strands made the helper's error the tool's result; the main agent would have answered "5")
    assert episode.termination is Termination.INFRA_ERROR and episode.masked, episode.termination_detail
    assert "503" in episode.termination_detail and episode.reward == 0.0


def test_a_server_failure_in_a_swarm_node_ends_the_episode_infra_error() -> None:
    from strands.multiagent import Swarm

    template = template_for("qwen2.5")
    handoff = {"agent_name": "solver", "message": "add 2 and 3"}
    script = lambda k: tool_call(template, "handoff_to_agent", handoff) if k == 0 else "Handed off."  # noqa: E731

    def factory(*, model, tools, task, **defaults):
        plan = Agent(model=model, name="planner", system_prompt="ROLE=planner. Hand off.", **defaults)
        solve = Agent(model=model, tools=[add], name="solver", system_prompt="ROLE=solver. Add.", **defaults)
        return Swarm([plan, solve], entry_point=plan, max_handoffs=4, max_iterations=4)

    episode = _run_direct(template, _FailingFor(template, script, role="solver"), factory, Budget(max_turns=10))
    # (a failed node ends a Swarm with status FAILED and no exception: it read as max_turns, trained on)
    assert episode.termination is Termination.INFRA_ERROR and episode.masked, episode.termination_detail


def test_agents_a_sync_tool_builds_record_their_calls_safely_beside_the_main_loops(monkeypatch) -> None:
    # a sync @tool runs on a worker thread and Strands' sync Agent.__call__ on a loop of its own: their
    # calls are prepared and committed on the same episode record as the main loop's agents
    import collections
    import time

    from strands import tool as strands_tool

    from agentboost.backends.base import GenerationResult

    template = template_for("qwen2.5")
    eot = template.info.eot_token_id
    slow = Episode.commit_call

    def commit_slowly(self, *args, **kwargs):
        time.sleep(0.002)  # widens the window between reading the record and appending to it
        return slow(self, *args, **kwargs)

    monkeypatch.setattr(Episode, "commit_call", commit_slowly)

    class Backend:
        def __init__(self) -> None:
            self.counts: collections.Counter[str] = collections.Counter()

        async def generate(self, request):
            role = re.search(r"ROLE=(\w+)", template.decode(request.prompt_ids[:40])).group(1)
            k, self.counts[role] = self.counts[role], self.counts[role] + 1
            if role == "main":
                calls = [("helper", {"input": "x"}), ("research", {"q": "y"})]
                out = calls_text(template.parser.name, calls) if k == 0 else "done"
            else:
                out = calls_text(template.parser.name, [("add", {"a": k, "b": 1})]) if k < 6 else "ok"
            ids = [*template.encode(out), eot]
            await asyncio.sleep(0)
            return GenerationResult(token_ids=ids, finish_reason="stop", logprobs=[-0.1] * len(ids))

    def factory(*, model, tools, task, **defaults):
        helper = Agent(model=model.sibling(), tools=[add], name="helper", system_prompt="ROLE=helper.",
                       callback_handler=None)  # fmt: skip

        @strands_tool
        def research(q: str) -> str:
            """Research a question.

            Args:
                q: the question
            """
            sub = Agent(model=model.sibling(), tools=[add], name="research", system_prompt="ROLE=research.",
                        callback_handler=None)  # fmt: skip
            return str(sub("go"))

        return Agent(model=model, tools=[helper.as_tool(), research], name="main", system_prompt="ROLE=main.",
                     **defaults)  # fmt: skip

    for _ in range(4):
        env = StrandsEnv({"prompt": "go"}, tools=[add], reward_fn=lambda t, e: 1.0)
        settings = RolloutSettings(budget=Budget(max_turns=100))
        episode = asyncio.run(run_episode(env, StrandsAgent(factory), Backend(), template, settings))
        assert episode.termination is Termination.COMPLETED, episode.termination_detail
        assert len(episode.calls) == 16  # main 2, helper 7, research 7: none lost
        episode.check_invariants()
        assert sorted(i.agent for i in episode.trajectory_info) == ["helper", "main", "research"]


def test_parallel_graph_nodes_keep_their_own_agent_names_and_role_rewards() -> None:
    # a Graph hands its parallel nodes one invocation state, each node writing itself there: a node whose
    # first call came after an await read the other node's name (and got its role reward)
    from strands.hooks import BeforeModelCallEvent
    from strands.multiagent import GraphBuilder

    template = template_for("qwen2.5")
    policy = Policy(template, {
        "alpha": lambda k, t: tool_call(template, "add", {"a": 2, "b": 3}) if k == 0 else "alpha done",
        "beta": lambda k, t: "beta done",
    })  # fmt: skip

    class Slow:
        def register_hooks(self, registry, **kwargs):
            async def wait(event):
                await asyncio.sleep(0.2)

            registry.add_callback(BeforeModelCallEvent, wait)

    def factory(*, model, tools, task, **defaults):
        a = Agent(model=model, tools=[add], name="alpha", system_prompt="ROLE=alpha.", hooks=[Slow()], **defaults)
        b = Agent(model=model, name="beta", system_prompt="ROLE=beta.", **defaults)
        builder = GraphBuilder()
        builder.add_node(a, "alpha")
        builder.add_node(b, "beta")
        builder.set_entry_point("alpha")
        builder.set_entry_point("beta")
        return builder.build()

    def reward(task: dict, episode: Episode) -> RewardOutput:
        return RewardOutput(1.0, role_rewards={"alpha": 0.0})

    episode = run(template, policy, factory, budget=Budget(max_turns=10), reward=reward)
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    for trajectory in episode.trajectories:
        role = re.search(r"ROLE=(\w+)", template.decode(trajectory.prompt_ids)).group(1)
        assert trajectory.info.agent == role, (trajectory.index, trajectory.info.agent, role)
    assert sorted(len(t.calls) for t in episode.trajectories) == [1, 2]
    assert episode.reward_of("alpha") == 0.0 and episode.reward_of("beta") == 1.0
    check_token_exact(episode, policy)


def test_a_sibling_that_samples_differently_is_recorded_but_not_trained() -> None:
    # a trainer scores every row at the policy's temperature from its sampling log-probs: a sub-agent's
    # samples at another temperature (or without log-probs) are not its data
    from agentboost.backends.base import GenerationResult
    from agentboost.batch import episode_rows
    from agentboost.types import SamplingParams

    template = template_for("qwen2.5")

    class Backend:
        def __init__(self) -> None:
            self.main = 0

        async def generate(self, request):
            if "ROLE=helper" in template.decode(request.prompt_ids):
                text = "5"
            else:
                text = tool_call(template, "helper", {"input": "add 2 and 3"}) if self.main == 0 else "It is 5."
                self.main += 1
            ids = [*template.encode(text), template.info.eot_token_id]
            return GenerationResult(token_ids=ids, finish_reason="stop", logprobs=[-0.1] * len(ids))

    for sampling, trained in ((None, True), (SamplingParams(temperature=0.3), False),
                              (SamplingParams(logprobs=False), False)):  # fmt: skip

        def factory(*, model, tools, task, sampling=sampling, **defaults):
            sub = Agent(model=model.sibling(sampling=sampling), tools=[add], name="helper",
                        system_prompt="ROLE=helper.", callback_handler=None)  # fmt: skip
            return Agent(model=model, tools=[sub.as_tool()], name="main", system_prompt="ROLE=main.", **defaults)

        episode = _run_direct(template, Backend(), factory, Budget(max_turns=10))
        assert episode.termination is Termination.COMPLETED, episode.termination_detail
        helper = [t for t in episode.trajectories if t.info.agent == "helper"]
        assert len(helper) == 1 and helper[0].info.trained is trained, helper[0].info
        assert all(t.info.trained for t in episode.trajectories if t.info.agent == "main")
        assert len(episode_rows(episode)) == (2 if trained else 1)


def test_a_call_sampled_otherwise_than_its_trajectory_opens_an_untrained_one() -> None:
    # Issue 38 (2): a hook changing the model's sampling between two calls of one agent kept one trained
    # trajectory whose second call was sampled at 0.2 (a trainer scores its tokens at the policy's 1.0)
    from strands.hooks import BeforeModelCallEvent

    from agentboost.backends.base import GenerationResult
    from agentboost.batch import episode_rows

    template = template_for("qwen2.5")
    temperatures: list[float] = []

    class Backend:
        async def generate(self, request):
            k = len(temperatures)
            temperatures.append(request.sampling.temperature)
            text = tool_call(template, "add", {"a": k, "b": 1}) if k < 3 else "done"
            ids = [*template.encode(text), template.info.eot_token_id]
            return GenerationResult(token_ids=ids, finish_reason="stop", logprobs=[-0.1] * len(ids))

    class Cool:  # before call 1: temperature 0.2; before call 2: the policy's again
        def register_hooks(self, registry, **kwargs):
            def before(event):
                calls = len(temperatures)
                if calls in (1, 2):
                    event.agent.model.update_config(temperature=0.2 if calls == 1 else 1.0)

            registry.add_callback(BeforeModelCallEvent, before)

    def factory(*, model, tools, task, **defaults):
        return Agent(model=model, tools=[add], name="main", system_prompt="ROLE=main.", hooks=[Cool()], **defaults)

    episode = _run_direct(template, Backend(), factory, Budget(max_turns=10))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert temperatures == [1.0, 0.2, 1.0, 1.0]
    infos = episode.trajectory_info
    assert [(i.opened_by, i.trained) for i in infos] == [
        ("start", True), ("sampling_changed", False), ("sampling_changed", True)
    ], infos  # fmt: skip
    assert "temperature 1.0 -> 0.2" in infos[1].detail
    assert [[c.index for c in t.calls] for t in episode.trajectories] == [[0], [1], [2, 3]]
    episode.check_invariants()
    rows = episode_rows(episode)
    trained = {t.index for t in episode.trajectories if t.trained}
    assert len(rows) == len(trained) == 2
    for trajectory in episode.trajectories:  # every loss token was sampled at the policy's temperature
        if trajectory.index in trained:
            assert {temperatures[c.index] for c in trajectory.calls} == {1.0}


def test_a_revisited_graph_node_beside_a_parallel_node_keeps_its_name_and_reopens_its_own_conversation() -> None:
    # Issue 38 (5): Strands' GraphNode copies the agent's model state when the graph is built and
    # reset_on_revisit restores that copy: the revisited node's call fell back on the graph's shared invocation
    # state, which the node running beside it had just written (its name, its role reward), and opened as
    # another agent's first call (new_agent)
    from strands.hooks import BeforeModelCallEvent
    from strands.multiagent import GraphBuilder

    template = template_for("qwen2.5")
    policy = Policy(template, {
        "alpha": lambda k, t: f"alpha answer {k}",
        "beta": lambda k, t: "beta done",
        "gamma": lambda k, t: tool_call(template, "add", {"a": 2, "b": 3}) if k == 0 else "gamma done",
    })  # fmt: skip
    calls: dict[str, int] = {}
    gamma_again: list[asyncio.Event] = []

    class Order:  # alpha's revisit calls the model once gamma's second cycle has started beside it
        def __init__(self, name: str) -> None:
            self.name = name

        def register_hooks(self, registry, **kwargs):
            async def before(event):
                k = calls[self.name] = calls.get(self.name, 0) + 1
                if not gamma_again:
                    gamma_again.append(asyncio.Event())
                if self.name == "gamma" and k == 2:
                    gamma_again[0].set()
                if self.name == "alpha" and k == 2:
                    await asyncio.wait_for(gamma_again[0].wait(), 120)

            registry.add_callback(BeforeModelCallEvent, before)

    def factory(*, model, tools, task, **defaults):
        agents = {name: Agent(model=model, tools=[add] if name == "gamma" else [], name=name,
                              system_prompt=f"ROLE={name}.", hooks=[Order(name)], **defaults)
                  for name in ("alpha", "beta", "gamma")}  # fmt: skip
        builder = GraphBuilder()
        for name, agent in agents.items():
            builder.add_node(agent, name)
        builder.add_edge("beta", "alpha")  # alpha again (reset), beside gamma
        builder.add_edge("beta", "gamma")
        builder.set_entry_point("alpha")
        builder.set_entry_point("beta")
        builder.reset_on_revisit(True)
        builder.set_max_node_executions(10)
        return builder.build()

    def reward(task: dict, episode: Episode) -> RewardOutput:
        return RewardOutput(1.0, role_rewards={"gamma": 0.0})

    episode = run(template, policy, factory, budget=Budget(max_turns=10), reward=reward)
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert calls == {"alpha": 2, "beta": 1, "gamma": 2}
    for trajectory in episode.trajectories:
        role = re.search(r"ROLE=(\w+)", template.decode(trajectory.prompt_ids)).group(1)
        assert trajectory.info.agent == role, (trajectory.index, trajectory.info.agent, role)
    alpha = [t for t in episode.trajectories if t.info.agent == "alpha"]
    assert len(alpha) == 2 and alpha[0].info.opened_by in ("start", "new_agent")
    # the same agent, its history reset: what docs/multi-agent.md calls history_rewritten
    assert alpha[1].info.opened_by == "history_rewritten", alpha[1].info
    assert alpha[1].info.rerendered_tokens == len(alpha[1].prompt_ids)
    assert [episode.reward_of(t.info.agent) for t in alpha] == [1.0, 1.0]
    check_token_exact(episode, policy)


def test_a_swarm_node_run_again_and_an_agent_used_as_a_tool_again_reopen_their_conversation_alike() -> None:
    # Issue 38 (5): both reset the agent's history before it runs again; a Swarm node opened as new_agent (its
    # model state reset too), an agent used as a tool as history_rewritten
    from strands.multiagent import Swarm

    template = template_for("qwen2.5")

    def planner(k: int, text: str) -> str:  # (an agent answers once more after its handoff)
        if k == 0:
            return tool_call(template, "handoff_to_agent", {"agent_name": "solver", "message": "add 2 and 3"})
        return "Handed off." if k == 1 else "The sum is 5."

    def solver(k: int, text: str) -> str:
        if k == 0:
            return tool_call(template, "add", {"a": 2, "b": 3})
        if k == 1:
            return tool_call(template, "handoff_to_agent", {"agent_name": "planner", "message": "it is 5"})
        return "Handed back."

    policy = Policy(template, {"planner": planner, "solver": solver})

    def swarm(*, model, tools, task, **defaults):
        plan = Agent(model=model, name="planner", system_prompt="ROLE=planner. Hand off.", **defaults)
        solve = Agent(model=model, tools=[add], name="solver", system_prompt="ROLE=solver. Add.", **defaults)
        return Swarm([plan, solve], entry_point=plan, max_handoffs=4, max_iterations=6)

    episode = run(template, policy, swarm, budget=Budget(max_turns=10))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    opened = [(i.agent, i.opened_by) for i in episode.trajectory_info]
    assert opened == [("planner", "start"), ("solver", "new_agent"), ("planner", "history_rewritten")], opened
    assert episode.trajectory_info[2].rerendered_tokens == len(episode.trajectories[2].prompt_ids)

    def main(k: int, text: str) -> str:
        return tool_call(template, "helper", {"input": f"add {k} and 3"}) if k < 2 else "Done."

    def helper(k: int, text: str) -> str:
        return tool_call(template, "add", {"a": k // 2, "b": 3}) if k % 2 == 0 else "ok"

    policy = Policy(template, {"main": main, "helper": helper})

    def team(*, model, tools, task, **defaults):
        sub = Agent(model=model.sibling(), tools=[add], name="helper", system_prompt="ROLE=helper.",
                    callback_handler=None)  # fmt: skip
        return Agent(model=model, tools=[sub.as_tool()], name="main", system_prompt="ROLE=main.", **defaults)

    episode = run(template, policy, team, budget=Budget(max_turns=10))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    opened = [(i.agent, i.opened_by) for i in episode.trajectory_info]
    assert opened == [("main", "start"), ("helper", "new_agent"), ("helper", "history_rewritten")], opened
    assert episode.trajectory_info[2].rerendered_tokens == len(episode.trajectories[2].prompt_ids)


@pytest.mark.parametrize("retried", [0, 1])
def test_a_reply_strands_discarded_is_kept_in_the_record_but_not_trained(retried: int) -> None:
    # Issue 38 (6): a hook retrying a completed call discards its reply (the agent never acts on it): it stayed
    # trained with the episode's advantage. Kept, marked, loss mask 0; a trajectory of discarded replies only
    # is not a row.
    from agentboost.batch import episode_rows, episodes_to_batch

    template = template_for("qwen2.5")
    script = [tool_call(template, "add", {"a": 2, "b": 3}), "It is 5 (first try).", "It is 5.", "It is 5."]
    script = script[1:] if retried == 0 else script
    policy = Policy(template, {"main": lambda k, _: script[k]})
    done: list[int] = []

    def retry_once(event: AfterModelCallEvent) -> None:
        calls = len(policy.log)
        if event.stop_response is not None and calls == retried + 1 and not done:
            done.append(calls)
            event.retry = True

    def factory(*, model, tools, task, **defaults):
        return Agent(model=model, tools=[add], name="main", system_prompt="ROLE=main.", hooks=[retry_once], **defaults)

    episode = run(template, policy, factory, budget=Budget(max_turns=10))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert done and episode.final_text.strip() == "It is 5."
    assert [c.index for c in episode.calls if c.discarded] == [retried]
    first, second = episode.trajectories
    assert second.info.opened_by == "history_rewritten" and "discarded" in second.info.detail
    assert first.info.trained is (retried > 0)  # a trajectory of discarded replies only is not trained
    episode.check_invariants()
    assert [episode.segments[2 * i + 1].token_ids for i in range(len(episode.calls))] == [o for _, _, o in policy.log]
    for trajectory in episode.trajectories:  # the discarded reply is in the record, with loss mask 0
        mask = dict.fromkeys(range(len(episode.calls)), 0)
        position = 0
        for seg in trajectory.segments[1:]:
            mask[seg.call] += sum(trajectory.response_mask[position : position + len(seg.token_ids)])
            position += len(seg.token_ids)
        for call in trajectory.calls:
            model_tokens = len(episode.segments[2 * call.index + 1].token_ids)
            assert mask[call.index] == (0 if call.discarded else model_tokens), (trajectory.index, call.index)
    rows = episode_rows(episode)
    assert len(rows) == (2 if retried else 1)
    batch = episodes_to_batch([episode], pad_token_id=0)
    kept = sum(len(episode.segments[2 * c.index + 1].token_ids) for c in episode.calls if not c.discarded)
    assert int(batch.response_mask.sum()) == kept


def test_a_retried_call_that_the_turn_limit_refuses_leaves_its_discarded_reply_untrained() -> None:
    template = template_for("qwen2.5")
    policy = Policy(template, {"main": lambda k, _: tool_call(template, "add", {"a": k, "b": 1}) if k == 0 else "6"})

    def retry_second(event: AfterModelCallEvent) -> None:
        if event.stop_response is not None and len(policy.log) == 2:
            event.retry = True

    def factory(*, model, tools, task, **defaults):
        return Agent(model=model, tools=[add], name="main", system_prompt="ROLE=main.", hooks=[retry_second],
                     **defaults)  # fmt: skip

    episode = run(template, policy, factory, budget=Budget(max_turns=2))
    assert episode.termination is Termination.MAX_TURNS, episode.termination_detail
    assert [c.discarded for c in episode.calls] == [False, True]
    assert episode.num_trajectories == 1
    model_tokens = [len(episode.segments[2 * c.index + 1].token_ids) for c in episode.calls]
    assert sum(episode.response_mask) == model_tokens[0]


def test_an_agent_reset_and_given_the_same_history_again_keeps_its_reply_trained() -> None:
    # an agent used as a tool is reset before each use: called twice with the same input, its second call is
    # given exactly what its first saw, as a retried call is; but it acted on its first reply (its tool result)
    template = template_for("qwen2.5")

    def main(k: int, text: str) -> str:
        return tool_call(template, "helper", {"input": "add 2 and 3"}) if k < 2 else "Done."

    policy = Policy(template, {"main": main, "helper": lambda k, _: "5"})

    def team(*, model, tools, task, **defaults):
        sub = Agent(model=model.sibling(), name="helper", system_prompt="ROLE=helper.", callback_handler=None)
        return Agent(model=model, tools=[sub.as_tool()], name="main", system_prompt="ROLE=main.", **defaults)

    episode = run(template, policy, team, budget=Budget(max_turns=10))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    helper = [t for t in episode.trajectories if t.info.agent == "helper"]
    assert [t.info.opened_by for t in helper] == ["new_agent", "history_rewritten"]
    assert "reset" in helper[1].info.detail and helper[0].prompt_ids == helper[1].prompt_ids
    assert not any(c.discarded for c in episode.calls) and all(t.info.trained for t in episode.trajectories)
