"""τ²-bench's domain side, shared by the environment (:mod:`agentboost.environments.tau2_env`) and the
reward (:mod:`agentboost.rewards.tau2`): the domains, tau2's protocol constants, fresh domain
environments with a task's initial state, and the record of one tool call. Depends on neither of them,
so they import it rather than each other."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DOMAINS = ("airline", "retail")
STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
AGENT_STOP_TOKEN = "###STOP###"
FIRST_AGENT_MESSAGE = "Hi! How can I help you today?"  # what tau2's orchestrator has the agent say first


def tau2_modules() -> tuple[Any, Any]:
    """tau2's task and message data models (quietly: tau2's loguru DEBUG logs are disabled; should LiteLLM
    be imported later, by tau2's full evaluator, it uses its bundled model-cost map instead of fetching it)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        from loguru import logger as loguru_logger

        loguru_logger.disable("tau2")
        from tau2.data_model import message, tasks
    except ImportError as exc:
        raise ImportError(f"the tau2 example needs tau2-bench: pip install 'agentboost[tau2]' ({exc})") from exc
    return tasks, message


def environment_constructor(domain: str) -> Callable[..., Any]:
    """tau2's ``get_environment`` of ``domain`` (what tau2's registry returns, without importing it)."""
    if domain not in DOMAINS:
        raise ValueError(f"unsupported tau2 domain {domain!r} (supported: {', '.join(DOMAINS)})")
    tau2_modules()
    return importlib.import_module(f"tau2.domains.{domain}.environment").get_environment


def new_domain_environment(domain: str, task: dict[str, Any]) -> Any:
    """A fresh tau2 environment of ``domain`` with the task's initial state applied (as tau2's orchestrator)."""
    env = environment_constructor(domain)()
    tasks, _ = tau2_modules()
    initial = tasks.Task.model_validate(task).initial_state
    if initial is not None:
        env.set_state(
            initialization_data=initial.initialization_data,
            initialization_actions=initial.initialization_actions,
            message_history=list(initial.message_history or []),
        )
    return env


@dataclass
class ToolRecord:
    """One tool call the agent made and what the domain answered."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    content: str
    error: bool
