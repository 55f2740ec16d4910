"""``StrandsEnv``: an rLLM ``BaseEnv`` built from a dataset row: the task, its tools and its reward.

From rLLM's point of view a Strands episode is one macro step: ``reset()`` hands the task to the
agent, the Strands agent loop runs (calling the env's tools itself, exactly as the user's agent
would), and ``step(episode)`` scores the finished :class:`~agentboost.episode.Episode`.

A row (``extra_info`` of rLLM's verl parquet, merged with ``env_args``) may carry:

* ``tools``: a list of Strands tools or ``"module:attr"`` references to them, **or** a single factory
  (callable or reference) ``factory(task) -> list[tool]`` called at every ``reset()`` so that tools
  with state (a sandbox, a database) are fresh per episode;
* ``reward_fn``: ``reward_fn(task, episode) -> float | RewardOutput`` (sync or async), or a reference;
* ``prompt_key``: which task field holds the user prompt (default: the first of ``prompt``,
  ``question``, ``instruction``, ``query`` that is present);
* ``followups``: further user turns, sent one by one each time the agent finishes its turn
  (subclasses can instead implement :meth:`StrandsEnv.next_user_message`, e.g. a user simulator).

Everything else is the task and is passed to the tools factory, the agent factory and the reward.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from ..compat.rllm import BaseEnv
from ..episode import Episode
from ..types import RewardOutput
from ..utils.refs import resolve

logger = logging.getLogger(__name__)

PROMPT_KEYS = ("prompt", "question", "instruction", "query")
_RESERVED = ("tools", "reward_fn", "prompt_key", "validation")

RewardFn = Callable[[dict[str, Any], Episode], Any]


def _is_tool(obj: Any) -> bool:
    from strands.types.tools import AgentTool

    return isinstance(obj, AgentTool) or hasattr(obj, "TOOL_SPEC")


class StrandsEnv(BaseEnv):
    """A task plus the tools and reward of one Strands episode.

    Args:
        task: the dataset row (minus the reserved keys).
        tools: list of tools / references, or a factory ``(task) -> list[tool]`` (see module doc).
        reward_fn: ``(task, episode) -> float | RewardOutput`` (sync or async) or a reference.
        prompt_key: task field with the user prompt.
        validation: True for validation rollouts (rewards may behave differently).
    """

    def __init__(
        self,
        task: dict[str, Any] | None = None,
        tools: Any = None,
        reward_fn: RewardFn | str | None = None,
        *,
        prompt_key: str | None = None,
        validation: bool = False,
    ) -> None:
        self.task: dict[str, Any] = dict(task or {})
        self._tools_spec = tools
        self.reward_fn: RewardFn | None = resolve(reward_fn) if reward_fn is not None else None
        self.prompt_key = prompt_key
        self.validation = bool(validation)
        self.tools: list[Any] = []
        self._followups: list[str] = []

    @classmethod
    def from_dict(cls, info: dict[str, Any]) -> StrandsEnv:  # type: ignore[override]
        row = dict(info)
        kwargs = {key: row.pop(key) for key in _RESERVED if key in row}
        return cls(task=row, **kwargs)

    # -- per-episode -------------------------------------------------------------------------
    def make_tools(self) -> list[Any]:
        spec = self._tools_spec
        if spec is None:
            return []
        if isinstance(spec, list | tuple):
            tools = [resolve(t) for t in spec]
        else:
            factory = resolve(spec)
            if _is_tool(factory):
                tools = [factory]
            elif callable(factory):
                tools = list(factory(self.task))
            else:
                raise TypeError(
                    f"tools must be a list of tools or a factory(task) -> list, got {type(factory).__name__}"
                )
        for tool in tools:
            if not (_is_tool(tool) or inspect.ismodule(tool)):
                raise TypeError(
                    f"{tool!r} is not a Strands tool (decorate functions with @strands.tool or give a module tool)"
                )
        return tools

    def initial_prompt(self) -> str:
        """The user turn that starts the episode."""
        keys = (self.prompt_key,) if self.prompt_key else PROMPT_KEYS
        for key in keys:
            value = self.task.get(key)
            if isinstance(value, str) and value:
                return value
        raise KeyError(f"task has no prompt field (looked for {list(keys)}); set prompt_key")

    def reset(self) -> tuple[dict[str, Any], dict[str, Any]]:
        self.tools = self.make_tools()
        followups = self.task.get("followups") or []
        if not isinstance(followups, list) or not all(isinstance(f, str) for f in followups):
            raise TypeError("task field 'followups' must be a list of strings")
        self._followups = list(followups)
        observation = dict(self.task)
        observation.setdefault("prompt", self.initial_prompt())
        return observation, {"validation": self.validation}

    async def next_user_message(self, messages: list[dict[str, Any]]) -> str | None:
        """The next user turn after the agent finished its turn, or None to end the episode."""
        return self._followups.pop(0) if self._followups else None

    async def compute_reward(self, episode: Episode) -> RewardOutput:
        """Score a finished episode (the runner applies the timeout and handles errors)."""
        if self.reward_fn is None:
            return RewardOutput(0.0)
        value = self.reward_fn(self.task, episode)
        if inspect.isawaitable(value):
            value = await value
        return as_reward_output(value)

    def step(self, action: Any) -> tuple[Any, float, bool, dict[str, Any]]:
        """rLLM contract: the action is the finished :class:`Episode`; returns its reward, done=True."""
        if not isinstance(action, Episode):
            raise TypeError(f"StrandsEnv.step expects the finished Episode, got {type(action).__name__}")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            output = asyncio.run(self.compute_reward(action))
        else:
            raise RuntimeError("StrandsEnv.step was called on an event loop thread; await env.compute_reward()")
        return None, output.reward, True, {"reward_metrics": output.metrics, "is_correct": output.is_correct}

    def close(self) -> None:
        """Release per-episode resources (override in subclasses that hold sandboxes, databases...)."""
        self.tools = []

    @staticmethod
    def is_multithread_safe() -> bool:
        return True


def as_reward_output(value: Any) -> RewardOutput:
    if isinstance(value, RewardOutput):
        return value
    if isinstance(value, bool):
        return RewardOutput(float(value), is_correct=value)
    if isinstance(value, int | float):
        return RewardOutput(float(value))
    reward = getattr(value, "reward", None)  # rLLM's RewardOutput(reward, metadata, is_correct)
    if isinstance(reward, int | float):
        return RewardOutput(
            float(reward),
            is_correct=getattr(value, "is_correct", None),
            info=dict(getattr(value, "metadata", {}) or {}),
        )
    raise TypeError(f"a reward function must return a float or RewardOutput, got {type(value).__name__}")
