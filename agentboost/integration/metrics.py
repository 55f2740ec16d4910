"""Strands metrics for W&B, and the alarm that stops training on stale rollouts.

:func:`episode_metrics` (keys under ``strands/``): termination reasons (fractions), masked fraction
(failures and rows cut by the batch's length limits; ``batch_cut_fraction`` the latter alone),
model calls, tool calls and tool errors per episode, tool error rate, per-tool calls and error rate,
parse errors and unknown-tool calls per episode, episode latency (mean/p50/p90/max), response and
model tokens, reward.

:func:`logprob_gap_metrics` (keys under ``strands/logprob_gap/``): compares the log-probs the rollout
server sampled with (``rollout_log_probs``) and the ones the trainer recomputes before the update
(``old_log_probs``) over model tokens only (``response_mask``; rLLM's own
``training/rollout_probs_diff_*`` averages over every response token, tool outputs included). In
on-policy training the two differ only by numerics (bf16, kernels); a large mean gap means the
rollouts did not come from the weights being trained (weights not synced, wrong model, wrong
template). vLLM reports log-probs before temperature scaling, so the gap is meaningful at
temperature 1 and inflated otherwise.

:func:`log_validation_trajectories` (key ``val/strands/trajectories``): a W&B table of sample
validation trajectories (prompt, response text with tool calls and results, reward, termination, tool
calls) on the W&B run of this process (veRL's ``Tracking`` starts it in the trainer's driver); no
table, and no error, without wandb or without a run. The rLLM route calls it from ``_validate_agent``.
On the verl 0.9 agent-loop route the episodes live in ``AgentLoopWorker`` Ray actors, which have no
W&B run, and the driver only receives token batches: no trajectory table there; veRL's own
``trainer.log_val_generations=N`` logs N decoded validation samples (input, output, score) instead.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ..episode import Episode
from ..types import Termination
from ..viewer.rows import log_trajectory_table

VAL_TRAJECTORIES = "val/strands/trajectories"


class StaleRolloutError(RuntimeError):
    """The rollout-vs-trainer log-prob gap stayed above the alarm threshold."""


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def episode_metrics(episodes: list[Episode], prefix: str = "strands") -> dict[str, float]:
    n = len(episodes)
    if n == 0:
        return {}
    out: dict[str, float] = {}
    terminations = Counter(e.termination.value for e in episodes)
    for reason in Termination:
        out[f"{prefix}/termination/{reason.value}"] = terminations.get(reason.value, 0) / n
    out[f"{prefix}/masked_fraction"] = sum(e.masked for e in episodes) / n
    out[f"{prefix}/batch_cut_fraction"] = sum("batch_cut" in e.metadata for e in episodes) / n
    calls = sum(e.tool_calls for e in episodes)
    errors = sum(e.tool_errors for e in episodes)
    out[f"{prefix}/model_calls_per_episode"] = sum(len(e.calls) for e in episodes) / n
    out[f"{prefix}/tool_calls_per_episode"] = calls / n
    out[f"{prefix}/tool_errors_per_episode"] = errors / n
    out[f"{prefix}/tool_error_rate"] = errors / calls if calls else 0.0
    out[f"{prefix}/parse_errors_per_episode"] = sum(e.parse_errors for e in episodes) / n
    out[f"{prefix}/unknown_tool_calls_per_episode"] = sum(e.unknown_tool_calls for e in episodes) / n
    per_tool: dict[str, list[int]] = {}
    for e in episodes:
        for name, stats in e.tools.items():
            acc = per_tool.setdefault(name, [0, 0, 0])
            acc[0] += stats.calls
            acc[1] += stats.errors
            acc[2] += stats.timeouts
    for name, (tool_calls, tool_errors, timeouts) in sorted(per_tool.items()):
        out[f"{prefix}/tool/{name}/calls_per_episode"] = tool_calls / n
        out[f"{prefix}/tool/{name}/error_rate"] = tool_errors / tool_calls if tool_calls else 0.0
        out[f"{prefix}/tool/{name}/timeouts"] = float(timeouts)
    latency = [float(e.timings.get("wall_s", 0.0)) for e in episodes]
    out[f"{prefix}/latency_s/mean"] = sum(latency) / n
    out[f"{prefix}/latency_s/p50"] = _quantile(latency, 0.5)
    out[f"{prefix}/latency_s/p90"] = _quantile(latency, 0.9)
    out[f"{prefix}/latency_s/max"] = max(latency)
    out[f"{prefix}/response_tokens_mean"] = sum(e.num_response_tokens for e in episodes) / n
    out[f"{prefix}/model_tokens_mean"] = sum(e.num_model_tokens for e in episodes) / n
    out[f"{prefix}/trajectories_per_episode"] = sum(e.num_trajectories for e in episodes) / n
    out[f"{prefix}/rerendered_tokens_per_episode"] = sum(e.rerendered_tokens for e in episodes) / n
    out[f"{prefix}/reward_mean"] = sum(0.0 if e.masked else e.reward for e in episodes) / n
    return out


def log_validation_trajectories(episodes: list[Episode], *, step: int) -> bool:
    """Log a table of sample validation trajectories at ``step`` on this process's W&B run, if any."""
    return log_trajectory_table(VAL_TRAJECTORIES, episodes, step=step)


def logprob_gap_metrics(rollout_log_probs: Any, old_log_probs: Any, response_mask: Any) -> dict[str, float]:
    """Gap between sampling and trainer log-probs over ``response_mask`` tokens (torch tensors)."""
    import torch

    mask = response_mask.bool()
    if not bool(mask.any()):
        return {}
    diff = (rollout_log_probs.float() - old_log_probs.float())[mask]
    abs_diff = diff.abs()
    prob_diff = (rollout_log_probs.float().exp() - old_log_probs.float().exp())[mask].abs()
    return {
        "strands/logprob_gap/mean_abs": float(abs_diff.mean()),
        "strands/logprob_gap/max_abs": float(abs_diff.max()),
        "strands/logprob_gap/mean": float(diff.mean()),
        "strands/logprob_gap/prob_diff_mean": float(prob_diff.mean()),
        "strands/logprob_gap/tokens": float(mask.sum()),
        # k3 estimator of KL(rollout || trainer): always >= 0, 0 when identical.
        "strands/logprob_gap/kl_k3": float(torch.expm1(-diff).add(diff).mean()),
    }


class LogprobGapAlarm:
    """Raise :class:`StaleRolloutError` after ``patience`` consecutive steps with a mean gap above ``threshold``."""

    def __init__(self, threshold: float | None, patience: int = 3) -> None:
        if threshold is not None and threshold <= 0:
            raise ValueError("the log-prob gap alarm threshold must be > 0")
        if patience < 1:
            raise ValueError("patience must be >= 1")
        self.threshold = threshold
        self.patience = patience
        self.strikes = 0

    def update(self, metrics: dict[str, float]) -> None:
        gap = metrics.get("strands/logprob_gap/mean_abs")
        if self.threshold is None or gap is None:
            return
        self.strikes = self.strikes + 1 if gap > self.threshold else 0
        metrics["strands/logprob_gap/alarm_strikes"] = float(self.strikes)
        if self.strikes >= self.patience:
            raise StaleRolloutError(
                f"mean |rollout - trainer| log-prob gap {gap:.3f} > {self.threshold} for {self.strikes} steps in a "
                "row: rollouts do not come from the weights being trained (weight sync, model path, chat template "
                "or sampling settings). Raise +rllm.strands.logprob_gap_alarm or fix the setup."
            )
