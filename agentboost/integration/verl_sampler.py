"""Strands metrics at every training step of verl 0.9's V1 trainer: a replay buffer that reports them.

verl 0.9.1's V1 trainer logs no per-row field of an agent loop's output at training steps:
``PPOTrainer._compute_metrics`` (``verl/trainer/ppo/v1/trainer_base.py:1868``) reads only the token
tensors, ``rm_scores``, ``num_turns`` and the speculative-decoding stats from TransferQueue. Its
documented extension point on that path is the replay buffer: ``trainer.v1.sampler.custom_sampler``
(``trainer_base.py:139-185``, ``replay_buffer.py:422-438``), whose ``sample()`` returns the batch *and*
"auxiliary metrics" that ``_step_once`` merges into the step's metrics (``trainer_base.py:567-572``,
aggregated over ``parameter_sync_step`` by ``MetricsAggregator`` and logged by ``Tracking``: console,
W&B, file...). :class:`StrandsReplayBuffer` is verl's own buffer (``ReplayBuffer`` in ``sync`` mode,
``ReplayBufferAsync`` otherwise) plus the Strands metrics of the rows it hands out, read from each
row's ``extra_fields["reward_extra_info"]`` (what the ``strands_agent`` loop writes,
:func:`agentboost.integration.verl_agent_loop.strands_row_metrics`), under the same ``strands/*`` keys
as the rLLM route (:func:`agentboost.integration.metrics.episode_metrics`).

Validation needs nothing extra: ``_validate`` (``trainer_base.py:1126-1139``) already turns every
``reward_extra_info`` key into ``val-aux/<data_source>/<key>/...``.

Wired by the launch scripts::

    trainer.v1.sampler.custom_sampler.path=pkg://agentboost.integration.verl_sampler
    trainer.v1.sampler.custom_sampler.name=StrandsReplayBuffer

verl hands a custom sampler only its base arguments (``trainer_base.py:160-167``), not the DAPO group
filter's: with this sampler ``algorithm.filter_groups`` has no effect (name them in
``trainer.v1.sampler.sampler_kwargs`` to pass them: ``filter_groups_metric``, ``gen_batch_size``...).
"""

from __future__ import annotations

import logging
import math
from typing import Any

logger = logging.getLogger(__name__)

PREFIX = "strands"
_COUNTS = {  # reward_extra_info key -> per-episode metric
    "strands_model_calls": "model_calls_per_episode",
    "strands_tool_calls": "tool_calls_per_episode",
    "strands_tool_errors": "tool_errors_per_episode",
    "strands_parse_errors": "parse_errors_per_episode",
    "strands_unknown_tool_calls": "unknown_tool_calls_per_episode",
}
_FORWARDED = ("filter_groups_metric", "train_batch_size", "gen_batch_size", "max_inflight_gen_batches",
              "sync_refill_failed_groups", "poll_interval")  # fmt: skip


def _quantile(values: list[float], weights: list[float], q: float) -> float:
    """Weighted ``q``-quantile (lower value at the crossing; the plain one for equal weights)."""
    ordered = sorted(zip(values, weights, strict=True))
    total = sum(weights)
    if all(w == ordered[0][1] for _, w in ordered):
        pos = q * (len(ordered) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return ordered[lo][0] + (ordered[hi][0] - ordered[lo][0]) * (pos - lo)
    seen = 0.0
    for value, weight in ordered:
        seen += weight
        if seen >= q * total:
            return value
    return ordered[-1][0]


def row_metrics(infos: list[dict[str, Any]], prefix: str = PREFIX) -> dict[str, float]:
    """``strands/*`` metrics of a batch from its rows' ``reward_extra_info`` (rows without it are skipped).

    An episode of several trajectories has one row per trained trajectory, each with the episode's numbers:
    each row weighs ``1 / strands_rows`` (its episode's rows; ``strands_trajectories`` for rows written
    before that was recorded), so every metric is per episode."""
    rows = [info for info in infos if isinstance(info, dict) and "strands_masked" in info]
    if not rows:
        return {}
    weights = [1.0 / max(1.0, float(r.get("strands_rows", r.get("strands_trajectories", 1.0)) or 1.0)) for r in rows]
    n = sum(weights)

    def mean(key: str) -> float:
        return sum(w * float(r.get(key, 0.0)) for w, r in zip(weights, rows, strict=True)) / n

    out: dict[str, float] = {f"{prefix}/episodes": round(n, 6), f"{prefix}/rows": float(len(rows))}
    for key in sorted({k for r in rows for k in r if k.startswith("strands_termination_")}):
        out[f"{prefix}/termination/{key.removeprefix('strands_termination_')}"] = mean(key)
    out[f"{prefix}/masked_fraction"] = mean("strands_masked")
    out[f"{prefix}/batch_cut_fraction"] = mean("strands_batch_cut")
    for key, name in _COUNTS.items():
        out[f"{prefix}/{name}"] = mean(key)
    calls = sum(w * float(r.get("strands_tool_calls", 0.0)) for w, r in zip(weights, rows, strict=True))
    errors = sum(w * float(r.get("strands_tool_errors", 0.0)) for w, r in zip(weights, rows, strict=True))
    out[f"{prefix}/tool_error_rate"] = errors / calls if calls else 0.0
    for key, name in (("strands_latency_s", "latency_s"), ("strands_model_s", "model_s"), ("strands_tool_s", "tool_s")):
        values = [float(r.get(key, 0.0)) for r in rows]
        out[f"{prefix}/{name}/mean"] = mean(key)
        out[f"{prefix}/{name}/p50"] = _quantile(values, weights, 0.5)
        out[f"{prefix}/{name}/p90"] = _quantile(values, weights, 0.9)
        out[f"{prefix}/{name}/max"] = max(values)
    out[f"{prefix}/model_tokens_mean"] = mean("strands_model_tokens")
    out[f"{prefix}/trajectories_per_episode"] = (
        mean("strands_trajectories") if "strands_trajectories" in rows[0] else 1.0
    )
    out[f"{prefix}/rows_per_episode"] = len(rows) / n
    out[f"{prefix}/rerendered_tokens_per_episode"] = mean("strands_rerendered_tokens")
    return out


def batch_infos(batch: Any, kv_batch_get: Any = None) -> list[dict[str, Any]]:
    """The ``reward_extra_info`` of every row of a sampled batch (``KVBatchMeta``), from TransferQueue."""
    if not getattr(batch, "keys", None):
        return []
    if kv_batch_get is None:
        import transfer_queue as tq

        kv_batch_get = tq.kv_batch_get
    data = kv_batch_get(keys=list(batch.keys), partition_id=batch.partition_id, select_fields=["extra_fields"])
    infos = []
    for value in list(data["extra_fields"]):
        extra = getattr(value, "data", value)
        infos.append(extra.get("reward_extra_info", {}) if isinstance(extra, dict) else {})
    return infos


class StrandsReplayBuffer:
    """verl's replay buffer for ``trainer_mode`` (same sampling, same metrics) whose training batches also
    report :func:`row_metrics`. With ``parameter_sync_step`` > 1 (separate_async) one step samples several
    mini-batches; their rows are pooled and the metrics reported once, with the step's last mini-batch
    (verl's aggregator would otherwise reduce keys with "min"/"max" in their name by min/max)."""

    def __init__(self, trainer_mode: str, trainer_config: Any, *args: Any, **kwargs: Any) -> None:
        from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

        sampler_kwargs = dict(kwargs.get("sampler_kwargs") or {})
        extra = {k: sampler_kwargs[k] for k in _FORWARDED if k in sampler_kwargs}
        base = ReplayBuffer if trainer_mode == "sync" else ReplayBufferAsync
        self.inner = base(trainer_mode, trainer_config, *args, **{**kwargs, **extra})
        getter = getattr(trainer_config, "get", None)
        self.sync_steps = int((getter("parameter_sync_step", 1) if callable(getter) else 1) or 1)
        self._pooled: list[dict[str, Any]] = []
        self._pooled_step: int | None = None
        self._calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        batch, metrics = self.inner.sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        if partition_id != "train":
            return batch, metrics
        try:
            infos = batch_infos(batch)
        except Exception:  # metrics must never stop training
            logger.exception("strands metrics: cannot read the batch's extra fields")
            return batch, metrics
        if self._pooled_step != global_steps:
            self._pooled, self._pooled_step, self._calls = [], global_steps, 0
        self._pooled.extend(infos)
        self._calls += 1
        if self._calls >= self.sync_steps:
            metrics = {**metrics, **row_metrics(self._pooled)}
            self._pooled, self._calls = [], 0
        return batch, metrics
