"""``StrandsAgent``: an rLLM ``BaseAgent`` that runs an ordinary Strands ``Agent``.

The user's Strands agent runs its own loop (``invoke_async``) with a :class:`~agentboost.TokenModel`;
rLLM sees the result through the ``BaseAgent`` contract: ``chat_completions`` (the conversation in
OpenAI format), ``trajectory`` (one rLLM ``Step`` per model call, with the exact ``prompt_ids`` /
``response_ids`` / ``logprobs`` of that call) and ``get_current_state()``.

Because the Strands loop, not rLLM's engine, decides when to call the model and the tools,
``update_from_model`` is not part of how a Strands agent is driven: agentboost's engine adapter
(installed by ``apply_patches.py``) runs episodes through :func:`agentboost.rollout.run_episode`.
Calling it raises a ``TypeError`` that says so, instead of silently re-tokenising text.

The agent itself is built fresh for every episode by a factory::

    def make_agent(*, model, tools, task, **defaults):
        return Agent(model=model, tools=tools, system_prompt=SYSTEM, hooks=[MyHook()], **defaults)

``defaults`` carries ``conversation_manager=NullConversationManager()`` and ``callback_handler=None``
(the history is never trimmed unless you choose a conversation manager). Any conversation or context
manager works; so do agents used as tools and ``Swarm`` / ``Graph`` orchestrators returned by the
factory, when their agents are built with ``model`` (or ``model.sibling(...)``): each agent's calls
become their own trajectories (:mod:`agentboost.episode`). Without a factory,
``Agent(model, tools, system_prompt, **agent_kwargs, **defaults)`` is built.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

from ..chat.messages import strands_to_hf, system_message
from ..compat.rllm import Action, BaseAgent, Step, Trajectory
from ..episode import Episode, SegmentKind
from ..strands_patches import adapt_agent
from ..utils.refs import resolve
from .multiagent import agents_in, is_multiagent

logger = logging.getLogger(__name__)

AgentFactory = Callable[..., Any]


def agent_defaults() -> dict[str, Any]:
    """Strands ``Agent`` settings agentboost suggests for RL episodes (no history trimming, no console
    output); pass them on in custom factories or override them."""
    from strands.agent.conversation_manager import NullConversationManager

    return {"conversation_manager": NullConversationManager(), "callback_handler": None}


def check_agent(agent: Any, model: Any) -> list[Any]:
    """Check what a factory built and return the agents whose calls record into the episode.

    ``agent`` is a ``strands.Agent`` built with ``model``, or a ``Swarm``/``Graph`` whose agents (some at
    least) are. Agents reachable from it whose model is another provider run as ordinary tools would:
    their calls are not recorded or trained. Console callback handlers are silenced."""
    from strands import Agent
    from strands.handlers.callback_handler import PrintingCallbackHandler, null_callback_handler

    if not isinstance(agent, Agent) and not is_multiagent(agent):
        raise TypeError(f"the agent factory must return a strands.Agent, Swarm or Graph, got {type(agent).__name__}")
    records = _records_into(model)
    if isinstance(agent, Agent) and not records(agent.model):
        raise ValueError(
            "the agent factory must build the Agent with the `model` it was given (the TokenModel), or with "
            "model.sibling(...)"
        )
    recorded = []
    for found in agents_in(agent):
        if isinstance(found.callback_handler, PrintingCallbackHandler):
            found.callback_handler = null_callback_handler
        if records(found.model):
            recorded.append(found)
        else:
            logger.info("agent %r uses %s: its calls are not part of the episode's trajectories",
                        getattr(found, "name", "?"), type(found.model).__name__)  # fmt: skip
    if not recorded:
        raise ValueError(
            f"no agent of the {type(agent).__name__} is built with the `model` it was given (the TokenModel): "
            "nothing would be recorded"
        )
    return recorded


def _records_into(model: Any) -> Callable[[Any], bool]:
    shares = getattr(model, "shares_episode", None)
    return lambda other: other is model or (callable(shares) and bool(shares(other)))


class StrandsAgent(BaseAgent):
    """rLLM agent wrapper around a per-episode Strands ``Agent``.

    Args:
        agent_factory: ``factory(*, model, tools, task, **defaults) -> strands.Agent`` or a
            ``"module:attr"`` reference to one. Optional.
        system_prompt: used when no factory is given; a string or ``(task) -> str``.
        **agent_kwargs: extra ``strands.Agent`` keyword arguments when no factory is given.
    """

    def __init__(
        self,
        agent_factory: AgentFactory | str | None = None,
        system_prompt: str | Callable[[dict[str, Any]], str] | None = None,
        **agent_kwargs: Any,
    ) -> None:
        self.agent_factory: AgentFactory | None = resolve(agent_factory) if agent_factory is not None else None
        self.system_prompt = system_prompt
        self.agent_kwargs = agent_kwargs
        self.reset()

    # -- building the Strands agent -----------------------------------------------------------
    def build_agent(self, model: Any, tools: list[Any], task: dict[str, Any]) -> Any:
        """A fresh Strands ``Agent`` for one episode, checked and wired to the model's hooks."""
        defaults = agent_defaults()
        if self.agent_factory is not None:
            agent = self.agent_factory(model=model, tools=tools, task=task, **defaults)
        else:
            from strands import Agent

            prompt = self.system_prompt(task) if callable(self.system_prompt) else self.system_prompt
            agent = Agent(model=model, tools=tools, system_prompt=prompt, **{**defaults, **self.agent_kwargs})
        for recorded in check_agent(agent, model):
            self._wire(recorded, model)
        return agent

    @staticmethod
    def _wire(agent: Any, model: Any) -> None:
        """The episode's hooks, tool limits and the long-episode adapter on one recorded agent."""
        adapt_agent(agent)  # flat per-call cost in long episodes; never changes what the agent does
        hooks = getattr(model, "hooks", None)  # (they also name each call's agent and conversation)
        if hooks is not None:
            agent.hooks.add_hook(hooks)
        budget = getattr(model, "budget", None)
        if budget is not None and (budget.tool_timeout_s or budget.max_tool_output_chars):
            from strands.middleware import ExecuteToolStage

            from ..model import tool_limits_middleware

            agent.add_middleware(ExecuteToolStage, tool_limits_middleware(model))

    # -- rLLM BaseAgent contract ----------------------------------------------------------------
    def reset(self) -> None:
        self._task: Any = None
        self._episode: Episode | None = None
        self._system_prompt: str | None = None
        self._trajectory: Trajectory | None = None

    def update_from_env(self, observation: Any, reward: float, done: bool, info: dict, **kwargs: Any) -> None:
        if self._episode is None:
            self._task = observation
            return
        step = self.get_current_state()
        if step is not None:
            step.reward, step.done = reward, done
            step.info.update(info or {})

    def update_from_model(self, response: str, **kwargs: Any) -> Action:
        raise TypeError(
            "StrandsAgent runs its own Strands loop and never consumes text responses: run episodes with "
            "agentboost.rollout.run_episode (installed into rLLM's engine by apply_patches.py)"
        )

    def record(self, episode: Episode, system_prompt: str | None = None) -> None:
        """Attach the finished episode; ``trajectory``/``chat_completions`` are derived from it."""
        self._episode = episode
        self._system_prompt = system_prompt
        self._trajectory = None

    @property
    def episode(self) -> Episode | None:
        return self._episode

    @property
    def chat_completions(self) -> list[dict[str, Any]]:
        if self._episode is None:
            if isinstance(self._task, dict) and isinstance(self._task.get("prompt"), str):
                return [*system_message(self._system_prompt), {"role": "user", "content": self._task["prompt"]}]
            return []
        return system_message(self._system_prompt) + strands_to_hf(self._episode.messages)

    @property
    def trajectory(self) -> Trajectory:
        if self._trajectory is None:
            self._trajectory = self._build_trajectory()
        return self._trajectory

    def _build_trajectory(self) -> Trajectory:
        episode = self._episode
        trajectory = Trajectory(task=self._task)
        if episode is None:
            return trajectory
        contexts: dict[int, list[int]] = {}  # per trajectory: a step's prompt is its own trajectory's context
        calls = iter(episode.calls)
        context: list[int] = []
        for seg in episode.segments:
            if seg.kind is not SegmentKind.MODEL:
                context = contexts.setdefault(episode.calls[seg.call].trajectory, [])
                context.extend(seg.token_ids)
                continue
            call = next(calls)
            history = episode.messages_of(call.trajectory)
            in_range = 0 <= call.message_index < len(history)
            message = history[call.message_index] if in_range else {}
            text = "".join(b.get("text", "") for b in message.get("content", []) if isinstance(b, dict))
            actions = [b["toolUse"] for b in message.get("content", []) if isinstance(b, dict) and "toolUse" in b]
            step = Step(
                prompt_ids=list(context),
                response_ids=list(seg.token_ids),
                logprobs=list(seg.logprobs or []),
                model_response=text,
                action=copy.deepcopy(actions) or None,
            )
            # assigned, not passed: rLLM v0.3.0-pre's pydantic Step has ``info`` as a property and drops the kwarg
            step.info = {"finish_reason": call.finish_reason, "call": call.index, "trajectory": call.trajectory}
            trajectory.steps.append(step)
            context.extend(seg.token_ids)
        if trajectory.steps:
            trajectory.steps[-1].reward = episode.reward
            trajectory.steps[-1].done = True
        trajectory.reward = episode.reward
        trajectory.info = {"termination": episode.termination.value, "episode_id": episode.id}
        return trajectory
