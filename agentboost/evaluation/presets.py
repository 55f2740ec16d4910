"""Named example environments for ``agentboost eval --example NAME`` (environment + system prompt)."""

from __future__ import annotations

from dataclasses import dataclass

from ..utils.refs import resolve


@dataclass(frozen=True)
class Preset:
    env: str
    system_prompt: str | None = None
    """Reference to the example's system prompt constant (``module:ATTR``)."""
    agent_factory: str | None = None
    needs_data: bool = True
    tasks: str | None = None
    """Reference to ``make_tasks(n, *, seed, split)`` generating the embedded tasks (when no --data)."""

    def resolved_system_prompt(self) -> str | None:
        return resolve(self.system_prompt) if self.system_prompt else None


PRESETS: dict[str, Preset] = {
    "arithmetic": Preset(
        "agentboost.environments.arithmetic:ArithmeticEnv",
        "agentboost.environments.arithmetic:SYSTEM_PROMPT",
        needs_data=False,
        tasks="agentboost.environments.arithmetic:make_tasks",
    ),
    "capitals": Preset(  # strands-agents-evals evaluators as the reward (pip install 'agentboost[evals]')
        "agentboost.environments.capitals_env:CapitalsEnv",
        "agentboost.environments.capitals_env:SYSTEM_PROMPT",
        needs_data=False,
        tasks="agentboost.environments.capitals_env:make_tasks",
    ),
    "math": Preset("agentboost.environments.math_env:MathEnv", "agentboost.environments.math_env:SYSTEM_PROMPT"),
    "code": Preset("agentboost.environments.code_env:CodeEnv", "agentboost.environments.code_env:SYSTEM_PROMPT"),
    "tau2": Preset(
        "agentboost.environments.tau2_env:Tau2Env", agent_factory="agentboost.environments.tau2_env:tau2_agent"
    ),  # policy per domain
    "rag": Preset("agentboost.environments.rag_env:RagEnv", "agentboost.environments.rag_env:SYSTEM_PROMPT"),
}
