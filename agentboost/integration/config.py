"""Rollout settings for Strands episodes from an rLLM v0.2.1 / veRL 0.6.1 training config.

Sampling is never hard-coded: training rollouts use ``actor_rollout_ref.rollout.{temperature, top_p,
top_k, do_sample}``, validation rollouts ``actor_rollout_ref.rollout.val_kwargs`` (``do_sample=False``
means greedy), exactly as rLLM's own ``VerlEngine`` reads them. Budgets come from ``data.max_prompt_length``,
``data.max_response_length``, ``rllm.agent.max_steps`` and ``rllm.agent.trajectory_timeout``.

agentboost's own options live under ``rllm.strands`` (add them with Hydra's ``+`` prefix)::

    +rllm.strands.budget.tool_timeout_s=60          # any Budget field
    +rllm.strands.mask_truncated=true               # also mask max_tokens / max_turns episodes
    +rllm.strands.concurrency=512                   # episodes in flight (default: the batch)
    +rllm.strands.logprob_gap_alarm=0.5             # stop training when rollouts look stale
    +rllm.strands.logprob_gap_patience=3
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..rollout import RolloutSettings
from ..types import Budget, SamplingParams

DEFAULT_EPISODE_TIMEOUT_S = 3600.0


def cfg_get(config: Any, path: str, default: Any = None) -> Any:
    """``config.a.b.c`` for OmegaConf configs, dataclasses and plain mappings; ``default`` if absent or None."""
    node = config
    for key in path.split("."):
        if node is None:
            return default
        if isinstance(node, Mapping) or (hasattr(node, "get") and not dataclasses.is_dataclass(node)):
            try:
                node = node.get(key)
            except Exception:  # OmegaConf raises on missing keys of struct configs in some modes
                node = getattr(node, key, None)
        else:
            node = getattr(node, key, None)
    return default if node is None else node


def _plain(value: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, DictConfig | ListConfig):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        pass
    return value


def _sampling(node: Any) -> SamplingParams:
    do_sample = cfg_get(node, "do_sample", True)
    temperature = float(cfg_get(node, "temperature", 1.0))
    top_k = int(cfg_get(node, "top_k", -1))
    return SamplingParams(
        temperature=0.0 if do_sample is False else temperature,
        top_p=float(cfg_get(node, "top_p", 1.0)),
        top_k=-1 if top_k <= 0 else top_k,  # veRL and vLLM: 0 or -1 both mean "off"
        logprobs=True,
    )


@dataclass(frozen=True)
class StrandsTrainingOptions:
    """Everything the rLLM adapters need to know, read once from the config."""

    train: RolloutSettings
    validate: RolloutSettings
    group_size: int
    val_group_size: int
    concurrency: int | None = None
    logprob_gap_alarm: float | None = None
    """Mean |rollout - trainer| log-prob over model tokens above which a step counts as stale."""
    logprob_gap_patience: int = 3
    """Consecutive stale steps before training stops."""

    def settings(self, *, validate: bool) -> RolloutSettings:
        return self.validate if validate else self.train


def options_from_config(config: Any) -> StrandsTrainingOptions:
    rollout = cfg_get(config, "actor_rollout_ref.rollout")
    max_prompt = cfg_get(config, "data.max_prompt_length")
    max_response = cfg_get(config, "data.max_response_length")
    if max_prompt is None or max_response is None:
        raise ValueError("the config needs data.max_prompt_length and data.max_response_length")
    strands = _plain(cfg_get(config, "rllm.strands", {})) or {}
    unknown = set(strands) - {
        "budget", "mask_truncated", "concurrency", "logprob_gap_alarm", "logprob_gap_patience", "masked_terminations"
    }  # fmt: skip
    if unknown:
        raise ValueError(f"unknown rllm.strands option(s): {sorted(unknown)}")
    budget_overrides = dict(strands.get("budget") or {})
    fields = {f.name for f in dataclasses.fields(Budget)}
    bad = set(budget_overrides) - fields
    if bad:
        raise ValueError(f"unknown rllm.strands.budget field(s) {sorted(bad)}; known: {sorted(fields)}")
    timeout = cfg_get(config, "rllm.agent.trajectory_timeout")
    budget = Budget(
        max_turns=int(cfg_get(config, "rllm.agent.max_steps", 16)),
        max_prompt_tokens=int(max_prompt),
        max_response_tokens=int(max_response),
        max_total_tokens=int(max_prompt) + int(max_response),
        wall_clock_s=float(timeout) if timeout else DEFAULT_EPISODE_TIMEOUT_S,
    ).replace(**budget_overrides)
    common: dict[str, Any] = {"budget": budget, "mask_truncated": bool(strands.get("mask_truncated", False))}
    if strands.get("masked_terminations") is not None:
        common["masked_terminations"] = list(strands["masked_terminations"])
    train = RolloutSettings.from_dict({"sampling": _sampling(rollout).to_dict(), **_settings_dict(common)})
    val = RolloutSettings.from_dict(
        {"sampling": _sampling(cfg_get(rollout, "val_kwargs")).to_dict(), **_settings_dict(common)}
    )
    alarm = strands.get("logprob_gap_alarm")
    return StrandsTrainingOptions(
        train=train,
        validate=val,
        group_size=int(cfg_get(rollout, "n", 1)),
        val_group_size=int(cfg_get(rollout, "val_kwargs.n", 1)),
        concurrency=int(strands["concurrency"]) if strands.get("concurrency") else None,
        logprob_gap_alarm=float(alarm) if alarm is not None else None,
        logprob_gap_patience=int(strands.get("logprob_gap_patience", 3)),
    )


def _settings_dict(common: dict[str, Any]) -> dict[str, Any]:
    out = {"budget": common["budget"].to_dict(), "mask_truncated": common["mask_truncated"]}
    if "masked_terminations" in common:
        out["masked_terminations"] = common["masked_terminations"]
    return out
