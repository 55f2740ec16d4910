"""``strands_agent``: a verl agent loop that runs Strands episodes, for verl 0.9 (tested: 0.9.1).

No verl file is patched. The route is wired by Hydra overrides of ``python -m verl.trainer.main_ppo``::

    actor_rollout_ref.rollout.agent.agent_loop_config_path=<AGENT_LOOP_CONFIG>   # the shipped YAML
    actor_rollout_ref.rollout.agent.default_agent_loop=strands_agent             # or an agent_name column
    actor_rollout_ref.model.external_lib=agentboost.integration.verl_plugin      # registers the estimator
    algorithm.adv_estimator=agentboost_grpo                                      # the masking rule
    actor_rollout_ref.rollout.calculate_log_probs=true                           # rollout log-probs
    +strands.env_class=agentboost.environments.math_env:MathEnv                  # agentboost options

For every dataset row verl calls ``StrandsAgentLoop.run(sampling_params, **row)`` (one instance per
row, ``verl/experimental/agent_loop/agent_loop.py``, ``AgentLoopWorker._run_agent_loop``). The loop
builds the :class:`~agentboost.StrandsEnv` from the row (``env_class.from_dict({**extra_info,
**env_args})``, as rLLM does; the user turn comes from ``raw_prompt`` when the task has none) and a
:class:`~agentboost.StrandsAgent` from the options, runs :func:`agentboost.rollout.run_episode`
token-in/token-out through verl's server manager (:class:`~agentboost.backends.verl_llm_client.
VerlLLMClientBackend`; ``request_id`` = episode id, so verl's load balancer keeps the episode on one
replica) and returns an ``AgentLoopOutput`` that is exactly the episode's row of
:func:`agentboost.batch.episodes_to_batch` (same ids, loss mask, rollout log-probs, reward; a row longer
than ``rollout.prompt_length``/``response_length`` is cut and masked by the same rule).

Sampling is verl's (``sampling_params``: training or ``val_kwargs``); budgets are
``rollout.prompt_length`` / ``response_length`` (per episode, tool tokens included) and the options.

The masking rule (:class:`~agentboost.types.Termination`) through verl's own mechanisms:

* a masked episode's ``response_mask`` is all 0 (verl's loss, ``agg_loss``, sees no token of it) and
  its ``reward_score`` is 0.0 (verl writes it as ``rm_scores`` on the last response token and skips its
  own reward function for rows that carry a score; ``critic/score/*`` counts it as 0);
* ``algorithm.adv_estimator=agentboost_grpo`` (:mod:`.verl_advantage`, registered through
  ``register_adv_est``) leaves rows without loss tokens out of their group's baseline and gives 0 to
  a row with fewer than 2 usable rows in its group; verl's ``grpo`` counts the masked zeros in the
  group's mean and std (a survivor "beats" failures it did not cause) and gives a row alone in its group
  its raw reward.

Strands metrics: ``extra_fields["reward_extra_info"]`` holds fixed numeric per-episode keys
(``strands_masked``, ``strands_termination_<reason>``, model and tool calls, tool errors, parse errors,
episode, model and tool seconds...). verl's V1 ``_validate`` logs them as ``val-aux/<data_source>/<key>/*``
(and writes them to ``validation_data_dir``); at training steps agentboost's replay buffer
(:mod:`.verl_sampler`, wired by the launch scripts) reports them as ``strands/*``, the rLLM route's keys.
``extra_fields["strands"]`` keeps the episode id, termination and its detail with the row;
``AgentLoopOutput.metrics`` carries model, tool and reward seconds (the legacy trainer logs them as
``agent_loop/*``). verl does not tell an agent loop whether it is validating, so ``env.validation``
stays False on this route.

Synchronous tools run on their own bounded threads, their timeout counting from the moment they start
(:mod:`agentboost.tool_executor`, installed on the worker's event loop with the first episode); the time
an episode waits on verl's servers (queueing, generation, the weight updates of the async modes) is off
its wall clock (:class:`~agentboost.backends.verl_llm_client.VerlLLMClientBackend`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..agents.strands_agent import StrandsAgent
from ..backends.verl_llm_client import VerlLLMClientBackend
from ..batch import episode_rows, episodes_to_batch, row_tokens
from ..chat.template import ChatTemplate
from ..environments.strands_env import PROMPT_KEYS, StrandsEnv
from ..episode import Episode
from ..rollout import RolloutSettings, run_episode
from ..tool_executor import DEFAULT_MAX_HUNG, DEFAULT_TOOL_THREADS
from ..tool_executor import install as install_tool_executor
from ..types import Budget, SamplingParams, Termination
from ..utils.refs import resolve
from . import verl_advantage, verl_minibatch
from .config import DEFAULT_EPISODE_TIMEOUT_S, cfg_get
from .rollouts import single_trajectory

LEGACY_SINGLE_ROW = (
    "this episode has {n} trajectories (its agent rewrote its history, or several agents ran): verl's legacy "
    "trainer (trainer.use_v1=false) takes one output per sample; the V1 trainer (the default) trains each "
    "trajectory as its own row"
)

logger = logging.getLogger(__name__)

AGENT_LOOP_NAME = "strands_agent"
ADV_ESTIMATOR = verl_advantage.ADV_ESTIMATOR
AGENT_LOOP_CONFIG = Path(__file__).with_name("verl_agent_loop.yaml")
"""The agent-loop config file for ``actor_rollout_ref.rollout.agent.agent_loop_config_path``."""
SUPPORTED_VERL = ">=0.9.1,<0.10"
TESTED_VERL = ("0.9.1",)
EXTRA_KEY = "strands"
SUMMARY_EVERY_S = 30.0


class UnsupportedVerl(RuntimeError):
    """The installed verl is not one this agent loop was written and tested against."""


def check_verl_version(version: str) -> None:
    """Refuse verl versions outside :data:`SUPPORTED_VERL`, naming the supported ones."""
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(version)
    except InvalidVersion:
        parsed = None
    if parsed is None or not (Version("0.9.1") <= Version(parsed.base_version) < Version("0.10")):
        raise UnsupportedVerl(
            f"agentboost's strands_agent loop supports verl {SUPPORTED_VERL} (tested: {', '.join(TESTED_VERL)}); "
            f"installed: verl {version}. For verl 0.6.1 use the rLLM route (apply_patches.py)."
        )


# -- options ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StrandsLoopOptions:
    """agentboost's options on this route: ``+strands.<name>=...`` (Hydra) or extra keys of the loop's
    entry in the agent-loop YAML (those win)."""

    env_class: Any = "agentboost.environments.strands_env:StrandsEnv"
    """``StrandsEnv`` subclass (or ``"module:attr"``) built per row with ``from_dict``."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Merged over every row's task (``tools``, ``reward_fn``, anything the env reads)."""
    agent_class: Any = "agentboost.agents.strands_agent:StrandsAgent"
    agent_args: dict[str, Any] = field(default_factory=dict)
    """``StrandsAgent`` arguments (``agent_factory``, ``system_prompt``, Strands ``Agent`` kwargs)."""
    budget: dict[str, Any] = field(default_factory=dict)
    """Any :class:`~agentboost.types.Budget` field; lengths default to the rollout's."""
    max_turns: int | None = None
    """Model calls per episode (default: ``rollout.multi_turn.max_assistant_turns``, else 16)."""
    wall_clock_s: float = DEFAULT_EPISODE_TIMEOUT_S
    mask_truncated: bool = False
    train_aux_calls: bool = True
    """Train the calls made without an agent (a summariser calling the model): :class:`RolloutSettings`."""
    masked_terminations: tuple[str, ...] | None = None
    tool_parser: str | None = None
    request_timeout_s: float = 1800.0
    """Cap on one call to verl's servers (those waits are off the episode's wall clock)."""
    tool_threads: int = DEFAULT_TOOL_THREADS
    """Threads for synchronous tools per agent-loop worker (:mod:`agentboost.tool_executor`)."""
    max_hung_tools: int = DEFAULT_MAX_HUNG
    """Timed-out synchronous tool calls a worker keeps running before new tool calls fail (infra_error)."""

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> StrandsLoopOptions:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown strands option(s) {sorted(unknown)}; known: {sorted(known)}")
        bad = set(data.get("budget") or {}) - {f.name for f in fields(Budget)}
        if bad:
            raise ValueError(f"unknown strands.budget field(s) {sorted(bad)}")
        values = dict(data)
        if values.get("masked_terminations") is not None:
            values["masked_terminations"] = tuple(Termination(t).value for t in values["masked_terminations"])
        for key in ("env_args", "agent_args", "budget"):
            values[key] = dict(values.get(key) or {})
        return cls(**values)


def _plain(value: Any) -> Any:
    """OmegaConf nodes (verl's config, Hydra-instantiated kwargs), numpy arrays and tensors (verl's
    non-tensor batch columns) -> plain dicts, lists and scalars."""
    if hasattr(value, "items") and callable(value.items):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays/scalars, torch tensors
        return _plain(value.tolist())
    return value


def sampling_from_verl(sampling_params: dict[str, Any]) -> tuple[SamplingParams, dict[str, Any]]:
    """verl's per-request sampling dict -> (agentboost sampling, keys agentboost passes through as is)."""
    modelled = {"temperature", "top_p", "top_k", "repetition_penalty", "logprobs", "min_p", "seed", "max_tokens"}
    top_k = int(sampling_params.get("top_k", -1) or -1)
    sampling = SamplingParams(
        temperature=float(sampling_params.get("temperature", 1.0)),
        top_p=float(sampling_params.get("top_p", 1.0)),
        top_k=-1 if top_k <= 0 else top_k,
        min_p=float(sampling_params.get("min_p", 0.0) or 0.0),
        repetition_penalty=float(sampling_params.get("repetition_penalty", 1.0)),
        seed=sampling_params.get("seed"),
        logprobs=bool(sampling_params.get("logprobs", False)),
    )
    return sampling, {k: v for k, v in sampling_params.items() if k not in modelled}


# -- one row ------------------------------------------------------------------------------------
def row_task(row: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(task, system prompt of ``raw_prompt``) of a verl dataset row. The task is ``extra_info`` (where
    rLLM-style data keeps it); without a prompt field it takes the single user turn of ``raw_prompt``."""
    extra = row.get("extra_info")
    task = dict(_plain(extra) or {}) if extra is not None else {}
    raw = _plain(row.get("raw_prompt")) or []
    messages = [m for m in raw if isinstance(m, dict)]
    system = next((m.get("content") for m in messages if m.get("role") == "system"), None)
    if not any(isinstance(task.get(k), str) and task.get(k) for k in PROMPT_KEYS):
        users = [m.get("content") for m in messages if m.get("role") == "user"]
        if len(users) != 1 or not isinstance(users[0], str):
            raise ValueError(
                f"the row's extra_info has no prompt field {list(PROMPT_KEYS)} and raw_prompt has "
                f"{len(users)} user message(s); the Strands loop needs exactly one text user turn"
            )
        task["prompt"] = users[0]
    if "data_source" in row and "data_source" not in task:
        task["data_source"] = _plain(row["data_source"])
    return task, system if isinstance(system, str) else None


_TEMPLATES: list[tuple[Any, str, ChatTemplate]] = []


def shared_template(tokenizer: Any, template_kwargs: dict[str, Any], tool_parser: str | None) -> ChatTemplate:
    """One probed :class:`ChatTemplate` per tokenizer and settings in this process (verl builds a new
    agent-loop object for every row)."""
    key = repr((sorted(template_kwargs.items()), tool_parser))
    for known, known_key, template in _TEMPLATES:
        if known is tokenizer and known_key == key:
            return template
    template = ChatTemplate(tokenizer, template_kwargs=template_kwargs, tool_parser=tool_parser)
    _TEMPLATES.append((tokenizer, key, template))
    return template


def strands_row_metrics(episode: Episode) -> dict[str, float]:
    """Per-episode numbers with the same keys for every row (verl stacks them per key)."""
    out = {f"strands_termination_{t.value}": float(episode.termination is t) for t in Termination}
    out.update(
        strands_masked=float(episode.masked),
        strands_batch_cut=float("batch_cut" in episode.metadata),
        strands_model_calls=float(len(episode.calls)),
        strands_tool_calls=float(episode.tool_calls),
        strands_tool_errors=float(episode.tool_errors),
        strands_parse_errors=float(episode.parse_errors),
        strands_unknown_tool_calls=float(episode.unknown_tool_calls),
        strands_latency_s=float(episode.timings.get("wall_s", 0.0)),
        strands_model_s=float(episode.timings.get("model_s", 0.0)),
        strands_tool_s=float(episode.timings.get("tool_s", 0.0)),
        strands_model_tokens=float(episode.num_model_tokens),
        strands_trajectories=float(episode.num_trajectories),
        strands_rerendered_tokens=float(episode.rerendered_tokens),
    )
    return out


def server_context(config: Any) -> int | None:
    """The rollout servers' context window as verl's servers set it: ``rollout.max_model_len``, else the
    model's ``max_position_embeddings`` (``vLLMHttpServer._validate_configs``; SGLang alike). None when
    neither can be read (the budget then relies on the prompt and response lengths alone)."""
    rollout = cfg_get(config, "actor_rollout_ref.rollout")
    configured = cfg_get(rollout, "max_model_len")
    if configured:
        return int(configured)
    path = cfg_get(config, "actor_rollout_ref.model.path", None)
    if not path:
        return None
    try:
        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(str(path), trust_remote_code=bool(
            cfg_get(config, "actor_rollout_ref.model.trust_remote_code", False)))  # fmt: skip
    except Exception as exc:  # hub id not cached here, unknown architecture...
        logger.warning("cannot read the model config at %s (%s): budget from the rollout lengths only", path, exc)
        return None
    text = getattr(hf, "text_config", None) or hf
    value = getattr(text, "max_position_embeddings", None) or getattr(hf, "max_position_embeddings", None)
    return int(value) if value else None


class _Summary:
    """Counts of this process's episodes, logged every :data:`SUMMARY_EVERY_S` seconds."""

    def __init__(self) -> None:
        self.terminations: Counter[str] = Counter()
        self.masked = self.tool_calls = self.tool_errors = self.parse_errors = 0
        self.last = time.monotonic()

    def add(self, episode: Episode) -> None:
        self.terminations[episode.termination.value] += 1
        self.masked += int(episode.masked)
        self.tool_calls += episode.tool_calls
        self.tool_errors += episode.tool_errors
        self.parse_errors += episode.parse_errors
        now = time.monotonic()
        if now - self.last >= SUMMARY_EVERY_S:
            self.last = now
            n = sum(self.terminations.values())
            logger.info(
                "strands episodes so far: %d (%s), masked %.1f%%, tool calls/episode %.2f, tool errors %d, "
                "parse errors %d", n, dict(self.terminations), 100.0 * self.masked / n, self.tool_calls / n,
                self.tool_errors, self.parse_errors,
            )  # fmt: skip


_SUMMARY = _Summary()


class StrandsRowRunner:
    """Runs one verl row as a Strands episode and turns it into ``AgentLoopOutput`` fields."""

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        options: StrandsLoopOptions,
        *,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        rollout = cfg_get(config, "actor_rollout_ref.rollout")
        self.options = options
        self.tokenizer = tokenizer
        self.template = shared_template(tokenizer, dict(template_kwargs or {}), options.tool_parser)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (tokenizer.eos_token_id or 0))
        self.prompt_length = int(cfg_get(rollout, "prompt_length"))
        self.response_length = int(cfg_get(rollout, "response_length"))
        self.full_determinism = bool(cfg_get(rollout, "full_determinism", False))
        total = self.prompt_length + self.response_length
        self.max_model_len = server_context(config)
        if self.max_model_len:
            total = min(total, self.max_model_len)
        turns = options.max_turns or cfg_get(rollout, "multi_turn.max_assistant_turns") or 16
        self.budget = Budget(
            max_turns=int(turns),
            max_prompt_tokens=self.prompt_length,
            max_response_tokens=self.response_length,
            max_total_tokens=total,
            wall_clock_s=float(options.wall_clock_s),
        ).replace(**options.budget)
        self._settings: dict[SamplingParams, RolloutSettings] = {}
        self.env_class = resolve(options.env_class)
        self.agent_class = resolve(options.agent_class)
        if not (isinstance(self.env_class, type) and issubclass(self.env_class, StrandsEnv)):
            raise TypeError(f"strands.env_class must be a StrandsEnv subclass, got {options.env_class!r}")
        if not (isinstance(self.agent_class, type) and issubclass(self.agent_class, StrandsAgent)):
            raise TypeError(f"strands.agent_class must be a StrandsAgent subclass, got {options.agent_class!r}")

    def settings(self, sampling: SamplingParams) -> RolloutSettings:
        cached = self._settings.get(sampling)
        if cached is not None:
            return cached
        data: dict[str, Any] = {
            "sampling": sampling.to_dict(),
            "budget": self.budget.to_dict(),
            "mask_truncated": self.options.mask_truncated,
            "train_aux_calls": self.options.train_aux_calls,
        }
        if self.options.masked_terminations is not None:
            data["masked_terminations"] = list(self.options.masked_terminations)
        self._settings[sampling] = RolloutSettings.from_dict(data)
        return self._settings[sampling]

    def episode_id(self, row: dict[str, Any]) -> str:
        if not self.full_determinism:
            return uuid.uuid4().hex
        # verl passes request ids straight to vLLM then (and its load balancer is sticky by them): the same
        # id on every run, but one per episode. ToolAgentLoop's det-<priority> is det-0 for every row of the
        # V1 trainer (no priority column): every episode on one replica.
        if row.get("priority") is not None:
            return f"det-{int(_plain(row['priority']))}"
        parts = [_plain(row.get(k)) for k in ("global_steps", "index", "session_id")]
        return "det-" + "-".join("x" if p is None else str(p) for p in parts)

    async def run(
        self, sampling_params: dict[str, Any], row: dict[str, Any], server_manager: Any
    ) -> tuple[Episode, VerlLLMClientBackend]:
        """(episode, backend) for one row. Never raises except on cancellation: a row that cannot be
        turned into an episode is an ``infra_error`` episode (masked)."""
        started = time.monotonic()
        episode_id = self.episode_id(row)
        uid = _plain(row.get("uid"))
        group_id = str(uid) if uid is not None else None
        sampling, passthrough = sampling_from_verl(sampling_params)
        install_tool_executor(max_tool_threads=self.options.tool_threads, max_hung=self.options.max_hung_tools)
        backend = VerlLLMClientBackend(
            server_manager,
            passthrough=passthrough,
            request_timeout_s=self.options.request_timeout_s,
            max_model_len=self.max_model_len,
        )
        try:
            task, system = row_task(row)
            env = self.env_class.from_dict({**task, **self.options.env_args})
            agent_args = dict(self.options.agent_args)
            if system and "agent_factory" not in agent_args and agent_args.get("system_prompt") is None:
                agent_args["system_prompt"] = system
            agent = self.agent_class(**agent_args)
        except Exception as exc:
            logger.warning("row %s: cannot build the Strands env/agent: %s", group_id, exc)
            episode = Episode.failed(
                episode_id,
                Termination.INFRA_ERROR,
                f"cannot build the Strands env/agent from the row: {type(exc).__name__}: {exc}",
                timings={"wall_s": time.monotonic() - started},
                metadata={"group_id": group_id},
            )
            return episode, backend
        task_id = next((str(task[k]) for k in ("task_id", "id", "uid", "problem_id") if task.get(k) is not None), None)
        try:
            episode = await run_episode(
                env, agent, backend, self.template, self.settings(sampling),
                episode_id=episode_id, group_id=group_id, task_id=task_id,
            )  # fmt: skip
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # run_episode does not raise; a bug must not lose the row
            logger.exception("episode %s escaped the runner", episode_id)
            episode = Episode.failed(
                episode_id,
                Termination.INFRA_ERROR,
                f"runner error: {type(exc).__name__}: {exc}",
                task_id=task_id,
                timings={"wall_s": time.monotonic() - started},
            )
        episode.metadata.setdefault("group_id", group_id)
        return episode, backend

    def output_rows(
        self, episode: Episode, backend: VerlLLMClientBackend, row: dict[str, Any], *, logprobs: bool,
        several: bool = True,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """``AgentLoopOutput`` keyword arguments, one per row :func:`episodes_to_batch` makes of the episode
        (one per trainable trajectory; unpadded, cut and masked by the same rule). ``logprobs``: whether the
        batch asked for them (verl stacks them only if every row has them). ``several``: whether the trainer
        takes several outputs per sample (verl's V1 trainer); otherwise an episode of several trajectories
        is one masked ``infra_error`` row that says so."""
        if not several:
            episode = single_trajectory(episode, LEGACY_SINGLE_ROW)
        if episode.num_trajectories > 1 and episode.role_rewards:
            _warn_role_rewards_once()
        tokens = self._row_tokens(episode)
        fallback = _plain(row.get("global_steps"))
        steps = backend.global_steps or ([int(fallback)] if isinstance(fallback, int | float) else [])
        timings = episode.timings
        metrics = {**strands_row_metrics(episode), "strands_rows": float(len(tokens))}
        outputs = []
        for prompt, response, mask, lps, trajectory, agent in tokens:
            extra: dict[str, Any] = {
                "reward_extra_info": dict(metrics),
                EXTRA_KEY: {
                    "episode_id": episode.id,
                    "task_id": episode.task_id,
                    "termination": episode.termination.value,
                    "detail": episode.termination_detail[:500],
                    "masked": episode.masked,
                    "batch_cut": episode.metadata.get("batch_cut"),
                    "reward": float(episode.reward),
                    "reward_metrics": dict(episode.reward_metrics),
                    "trajectory": trajectory,
                    "trajectories": episode.num_trajectories,
                    "agent": agent,
                },
                "turn_scores": [],
                "tool_rewards": [],
                "min_global_steps": min(steps) if steps else None,
                "max_global_steps": max(steps) if steps else None,
            }
            outputs.append({
                "prompt_ids": prompt,
                "response_ids": response,
                "response_mask": mask,
                "response_logprobs": lps if logprobs else None,
                # every row of an episode carries the episode's reward (verl copies the last one's to the
                # others; agentboost_grpo computes one advantage per episode from it)
                "reward_score": 0.0 if episode.masked else float(episode.reward),
                "num_turns": len(episode.messages_of(trajectory)) if episode.num_trajectories else 0,
                "metrics": {
                    "generate_sequences": float(timings.get("model_s", 0.0)),
                    "tool_calls": float(timings.get("tool_s", 0.0)),
                    "compute_score": float(timings.get("reward_s", 0.0)),
                    "num_preempted": -1 if backend.preempted is None else backend.preempted,
                },
                "extra_fields": extra,
            })  # fmt: skip
        return outputs

    def _row_tokens(self, episode: Episode) -> list[tuple[list[int], list[int], list[int], list[float], int, str]]:
        """(prompt, response, loss mask, log-probs, trajectory, agent) of each row of ``episode``: the rows of
        :func:`episodes_to_batch`, cut to verl's lengths by its rule, unpadded. An episode of one row that
        fits is read directly (no tensors: the common case, on the rollout's hot path)."""
        rows = episode_rows(episode)
        if len(rows) == 1:
            prompt, response, mask, lps = row_tokens(rows[0], self.pad_token_id)
            if len(prompt) <= self.prompt_length and len(response) <= self.response_length:
                agent = episode.trajectory_info[0].agent if episode.trajectory_info else ""
                return [([int(x) for x in prompt], [int(x) for x in response], [int(x) for x in mask],
                         [float(x) for x in lps], 0, agent)]  # fmt: skip
        batch = episodes_to_batch(
            [episode],
            pad_token_id=self.pad_token_id,
            max_prompt_length=self.prompt_length,
            max_response_length=self.response_length,
        )
        out = []
        for i in range(len(batch)):
            prompt_len = int(batch.attention_mask[i, : self.prompt_length].sum())
            response_len = int(batch.attention_mask[i, self.prompt_length :].sum())
            out.append((
                batch.prompts[i, self.prompt_length - prompt_len :].tolist(),
                batch.responses[i, :response_len].tolist(),
                batch.response_mask[i, :response_len].tolist(),
                batch.rollout_log_probs[i, :response_len].tolist(),
                batch.row_trajectory[i],
                batch.row_agent[i],
            ))  # fmt: skip
        return out

    def output_fields(
        self, episode: Episode, backend: VerlLLMClientBackend, row: dict[str, Any], *, logprobs: bool
    ) -> dict[str, Any]:
        """The one ``AgentLoopOutput`` of an episode for a trainer that takes one per sample (an episode of
        several trajectories becomes a masked row saying so; see :meth:`output_rows`)."""
        return self.output_rows(episode, backend, row, logprobs=logprobs, several=False)[0]


_role_rewards_warned = False


def _warn_role_rewards_once() -> None:
    global _role_rewards_warned
    if not _role_rewards_warned:
        _role_rewards_warned = True
        logger.warning(
            "role rewards are not applied on the verl route: every trajectory of an episode gets the episode's "
            "reward and advantage (verl gives a sample's outputs its last output's score); the built-in trainer "
            "applies them"
        )


_RUNNERS: list[tuple[Any, Any, str, StrandsRowRunner]] = []


def shared_runner(config: Any, tokenizer: Any, overrides: dict[str, Any], template_kwargs: dict[str, Any]) -> Any:
    """The runner for this worker's config, tokenizer and loop options (built once per process)."""
    options = {**(_plain(cfg_get(config, EXTRA_KEY, {})) or {}), **_plain(overrides)}
    key = repr((sorted(options.items()), sorted(template_kwargs.items())))
    for known_config, known_tokenizer, known_key, runner in _RUNNERS:
        if known_config is config and known_tokenizer is tokenizer and known_key == key:
            return runner
    runner = StrandsRowRunner(
        config, tokenizer, StrandsLoopOptions.from_mapping(options), template_kwargs=template_kwargs
    )
    _RUNNERS.append((config, tokenizer, key, runner))
    return runner


# -- the verl class -----------------------------------------------------------------------------
def build_loop_class(agent_loop_base: type, agent_loop_output: type) -> type:
    """``StrandsAgentLoop``: a subclass of verl's ``AgentLoopBase`` returning ``agent_loop_output``."""

    class StrandsAgentLoop(agent_loop_base):  # type: ignore[misc, valid-type]
        """verl agent loop that runs one Strands episode per row (see the module docstring)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)  # the YAML entry's own name
            kwargs.pop("tools", None)  # verl's tool list: Strands agents bring their own tools
            options = {k: kwargs.pop(k) for k in list(kwargs) if k not in _VERL_KWARGS}  # the YAML entry's keys
            super().__init__(*args, **kwargs)
            template_kwargs = _plain(getattr(self, "apply_chat_template_kwargs", None) or {})
            self.runner = shared_runner(self.config, self.tokenizer, options, template_kwargs)

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            episode, backend = await self.runner.run(sampling_params, kwargs, self.server_manager)
            logprobs = bool(sampling_params.get("logprobs", False))
            several = bool(cfg_get(self.config, "trainer.use_v1", True))  # V1 takes a list of outputs per sample
            rows = self.runner.output_rows(episode, backend, kwargs, logprobs=logprobs, several=several)
            _SUMMARY.add(episode)
            outputs = [agent_loop_output(**fields) for fields in rows]
            return outputs[0] if len(outputs) == 1 else outputs

    StrandsAgentLoop.__module__ = __name__
    StrandsAgentLoop.__qualname__ = StrandsAgentLoop.__name__ = "StrandsAgentLoop"
    return StrandsAgentLoop


_VERL_KWARGS = frozenset(
    {"trainer_config", "server_manager", "tokenizer", "processor", "dataset_cls", "data_config", "hf_model_type"}
)
"""What verl 0.9.1's ``AgentLoopWorker._run_agent_loop`` passes to every agent loop (besides ``tools``)."""
_INSTALLED: dict[str, Any] = {}


def install(agent_loop_module: Any = None, core_algos: Any = None, version: str | None = None) -> type:
    """Register with verl: the ``strands_agent`` loop and the ``agentboost_grpo`` estimator. Checks
    the verl version first; idempotent. The modules default to the installed verl's."""
    if "class" in _INSTALLED and agent_loop_module is None:
        return _INSTALLED["class"]
    installed_verl = agent_loop_module is None
    if version is None:
        import verl

        version = str(verl.__version__)
    check_verl_version(version)
    if agent_loop_module is None:
        from verl.experimental.agent_loop import agent_loop as agent_loop_module
    if core_algos is None:
        from verl.trainer.ppo import core_algos
    verl_advantage.register(core_algos)
    if installed_verl:  # the installed verl: its V1 trainer's multi-output advantages and mini-batches too
        verl_advantage.install_multi_trajectory()
        verl_minibatch.install()
    cls = build_loop_class(agent_loop_module.AgentLoopBase, agent_loop_module.AgentLoopOutput)
    agent_loop_module.register(AGENT_LOOP_NAME)(cls)
    if agent_loop_module is sys.modules.get("verl.experimental.agent_loop.agent_loop"):
        _INSTALLED["class"] = cls
    logger.info("agentboost: %s agent loop and %s estimator registered with verl %s",
                AGENT_LOOP_NAME, ADV_ESTIMATOR, version)  # fmt: skip
    return cls


def __getattr__(name: str) -> Any:
    # Hydra resolves the YAML's _target_ with getattr on this module: the class exists once verl does.
    if name == "StrandsAgentLoop":
        return install()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
