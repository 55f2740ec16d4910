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

``defaults`` carries ``conversation_manager=NullConversationManager()`` and ``callback_handler=None``.
Without a factory, ``Agent(model, tools, system_prompt, **agent_kwargs, **defaults)`` is built.
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

logger = logging.getLogger(__name__)

AgentFactory = Callable[..., Any]


def agent_defaults() -> dict[str, Any]:
    """Strands ``Agent`` settings every RL episode needs (pass them on in custom factories)."""
    from strands.agent.conversation_manager import NullConversationManager

    return {"conversation_manager": NullConversationManager(), "callback_handler": None}


def check_agent(agent: Any, model: Any) -> None:
    """Refuse Strands agents whose features would make the token trajectory lie."""
    from strands import Agent
    from strands.agent.conversation_manager import NullConversationManager
    from strands.handlers.callback_handler import PrintingCallbackHandler

    if not isinstance(agent, Agent):
        raise TypeError(f"the agent factory must return a strands.Agent, got {type(agent).__name__}")
    if agent.model is not model:
        raise ValueError("the agent factory must build the Agent with the `model` it was given (the TokenModel)")
    if not isinstance(agent.conversation_manager, NullConversationManager):
        raise ValueError(
            f"the Agent uses {type(agent.conversation_manager).__name__}: conversation managers that trim or "
            "summarise history break token-exact trajectories. Build it with **agent_defaults() "
            "(conversation_manager=NullConversationManager())."
        )
    if getattr(agent, "_context_manager", None) is not None:
        raise ValueError(
            "Agent(context_manager=...) rewrites history with an auxiliary model; not allowed in RL rollouts"
        )
    if getattr(agent, "_memory_manager", None) is not None:
        raise ValueError("Agent(memory_manager=...) makes side model calls; not allowed in RL rollouts")
    if isinstance(agent.callback_handler, PrintingCallbackHandler):
        from strands.handlers.callback_handler import null_callback_handler

        agent.callback_handler = null_callback_handler


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
        check_agent(agent, model)
        adapt_agent(agent)  # flat per-call cost in long episodes; never changes what the agent does
        hooks = getattr(model, "hooks", None)
        if hooks is not None:
            agent.hooks.add_hook(hooks)
        budget = getattr(model, "budget", None)
        if budget is not None and (budget.tool_timeout_s or budget.max_tool_output_chars):
            from strands.middleware import ExecuteToolStage

            from ..model import tool_limits_middleware

            agent.add_middleware(ExecuteToolStage, tool_limits_middleware(model))
        return agent

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
        context: list[int] = []
        calls = iter(episode.calls)
        for seg in episode.segments:
            if seg.kind is not SegmentKind.MODEL:
                context.extend(seg.token_ids)
                continue
            call = next(calls)
            in_range = 0 <= call.message_index < len(episode.messages)
            message = episode.messages[call.message_index] if in_range else {}
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
            step.info = {"finish_reason": call.finish_reason, "call": call.index}
            trajectory.steps.append(step)
            context.extend(seg.token_ids)
        if trajectory.steps:
            trajectory.steps[-1].reward = episode.reward
            trajectory.steps[-1].done = True
        trajectory.reward = episode.reward
        trajectory.info = {"termination": episode.termination.value, "episode_id": episode.id}
        return trajectory
