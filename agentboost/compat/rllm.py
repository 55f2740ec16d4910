"""rLLM's agent/environment contracts, from rLLM when it is installed, otherwise a faithful local protocol.

agentboost must import and be fully testable without rLLM (rLLM is not on PyPI). When rLLM
v0.2.1.post1 or v0.3.0-pre is importable, ``BaseAgent``, ``BaseEnv``, ``Step``, ``Trajectory`` and
``Action`` are rLLM's own classes, so ``StrandsAgent``/``StrandsEnv`` pass rLLM's ``isinstance``
checks. Otherwise the local classes below implement the same contract as rLLM v0.2.1.post1
(``rllm/agents/agent.py`` and ``rllm/environments/base/base_env.py``): same names, fields, defaults and
method semantics.

Set ``AGENTBOOST_RLLM=local`` to force the local protocol even when rLLM is installed.
"""

from __future__ import annotations

import logging
import os
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

SUPPORTED_RLLM = ("0.2.1", "0.3.0rc0")
"""rLLM releases whose agent/env contract agentboost works with (v0.2.1.post1 reports 0.2.1, v0.3.0-pre 0.3.0rc0;
the local protocol below mirrors v0.2.1.post1)."""


def _rllm_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("rllm")
    except PackageNotFoundError:
        return None


RLLM_VERSION = _rllm_version()
RLLM_AVAILABLE = False

if RLLM_VERSION is not None and os.environ.get("AGENTBOOST_RLLM", "").lower() != "local":
    try:
        from rllm.agents.agent import Action, BaseAgent, Step, Trajectory
        from rllm.environments.base.base_env import BaseEnv

        RLLM_AVAILABLE = True
        if not RLLM_VERSION.startswith(SUPPORTED_RLLM):
            logger.warning(
                "rLLM %s is installed; agentboost's agent/env contract targets rLLM %s",
                RLLM_VERSION, "/".join(SUPPORTED_RLLM),
            )  # fmt: skip
    except ImportError as exc:
        logger.warning("rLLM %s is installed but its agent/env contract failed to import (%s); "
                       "using agentboost's local protocol", RLLM_VERSION, exc)  # fmt: skip

if not RLLM_AVAILABLE:

    @dataclass
    class Step:  # type: ignore[no-redef]
        """One agent step (rLLM v0.2.1 ``Step``)."""

        prompt_ids: list[int] = field(default_factory=list)
        response_ids: list[int] = field(default_factory=list)
        logprobs: list[float] = field(default_factory=list)
        chat_completions: list[dict[str, str]] = field(default_factory=list)
        observation: Any = None
        thought: str = ""
        action: Any = None
        model_response: str = ""
        model_output: Any = None
        info: dict = field(default_factory=dict)
        reward: float = 0.0
        done: bool = False
        mc_return: float = 0.0

        def to_dict(self) -> dict[str, Any]:
            return {
                "prompt_ids": self.prompt_ids,
                "response_ids": self.response_ids,
                "logprobs": self.logprobs,
                "chat_completions": self.chat_completions,
                "observation": self.observation,
                "thought": self.thought,
                "action": self.action.action if isinstance(self.action, Action) else self.action,
                "model_response": self.model_response,
                "model_output": None,
                "info": self.info,
                "reward": self.reward,
                "done": self.done,
                "mc_return": self.mc_return,
            }

    @dataclass
    class Action:  # type: ignore[no-redef]
        action: Any = None

    @dataclass
    class Trajectory:  # type: ignore[no-redef]
        """A list of steps with a trajectory-level reward (rLLM v0.2.1 ``Trajectory``)."""

        uid: str = field(default_factory=lambda: str(uuid.uuid4()))
        name: str = "agent"
        task: Any = None
        steps: list[Step] = field(default_factory=list)
        reward: float = 0.0
        info: dict = field(default_factory=dict)

        def to_dict(self) -> dict[str, Any]:
            task = self.task
            if isinstance(task, dict):
                task = {k: v for k, v in task.items() if k not in ("image", "images")}
            return {
                "uid": self.uid,
                "name": self.name,
                "task": task,
                "steps": [s.to_dict() for s in self.steps],
                "reward": float(self.reward),
                "info": self.info,
            }

        def is_cumulative(self) -> bool:
            previous: list[dict[str, str]] | None = None
            for step in self.steps:
                current = step.chat_completions
                if previous is not None and current[: len(previous)] != previous:
                    return False
                previous = current
            return True

    class BaseAgent(ABC):  # type: ignore[no-redef]
        """rLLM v0.2.1 agent contract: ``reset`` is abstract; ``update_from_env`` /
        ``update_from_model`` raise unless the engine that drives the agent needs them."""

        @property
        def chat_completions(self) -> list[dict[str, str]]:
            return []

        @property
        def trajectory(self) -> Trajectory:
            return Trajectory()

        def update_from_env(self, observation: Any, reward: float, done: bool, info: dict, **kwargs: Any) -> None:
            raise NotImplementedError("Subclasses must implement this method if using AgentExecutionEngine")

        def update_from_model(self, response: str, **kwargs: Any) -> Action:
            raise NotImplementedError("Subclasses must implement this method if using AgentExecutionEngine")

        @abstractmethod
        def reset(self) -> None:
            return None

        def get_current_state(self) -> Step | None:
            if not self.trajectory.steps:
                return None
            return self.trajectory.steps[-1]

    class BaseEnv(ABC):  # type: ignore[no-redef]
        """rLLM v0.2.1 environment contract (gym-style ``reset``/``step`` + ``from_dict``)."""

        @property
        def idx(self) -> Any:
            return getattr(self, "_idx", None)

        @idx.setter
        def idx(self, value: Any) -> None:
            self._idx = value

        @abstractmethod
        def reset(self) -> tuple[dict, dict]: ...

        @abstractmethod
        def step(self, action: Any) -> tuple[Any, float, bool, dict]: ...

        def close(self) -> None:
            return None

        @staticmethod
        @abstractmethod
        def from_dict(info: dict) -> BaseEnv:
            raise NotImplementedError("Subclasses must implement the 'from_dict' static method.")

        @staticmethod
        def is_multithread_safe() -> bool:
            return True


__all__ = ["RLLM_AVAILABLE", "RLLM_VERSION", "Action", "BaseAgent", "BaseEnv", "Step", "Trajectory"]
