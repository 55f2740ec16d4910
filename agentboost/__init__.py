"""agentboost: train unmodified Strands Agents with RL on token-exact trajectories.

Public names are imported lazily so that ``import agentboost`` stays light (no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "TokenModel": "agentboost.model",
    "Episode": "agentboost.episode",
    "StrandsAgent": "agentboost.agents.strands_agent",
    "StrandsEnv": "agentboost.environments.strands_env",
    "ChatTemplate": "agentboost.chat.template",
    "Termination": "agentboost.types",
    "SamplingParams": "agentboost.types",
    "Budget": "agentboost.types",
    "RewardOutput": "agentboost.types",
    "RolloutSettings": "agentboost.rollout",
    "run_episode": "agentboost.rollout",
}

__all__ = [
    "Budget",
    "ChatTemplate",
    "Episode",
    "RewardOutput",
    "RolloutSettings",
    "SamplingParams",
    "StrandsAgent",
    "StrandsEnv",
    "Termination",
    "TokenModel",
    "__version__",
    "run_episode",
]

if TYPE_CHECKING:  # pragma: no cover
    from .agents.strands_agent import StrandsAgent
    from .chat.template import ChatTemplate
    from .environments.strands_env import StrandsEnv
    from .episode import Episode
    from .model import TokenModel
    from .rollout import RolloutSettings, run_episode
    from .types import Budget, RewardOutput, SamplingParams, Termination


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentboost' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
