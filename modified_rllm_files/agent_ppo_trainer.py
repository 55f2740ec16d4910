"""Adapter for ``rllm/trainer/verl/agent_ppo_trainer.py`` of rLLM v0.2.1.post1 and v0.3.0-pre.

``apply_patches.py`` appends a marked block to that module that calls :func:`install` with the
module's globals. :func:`install` replaces the module's ``AgentPPOTrainer`` (the name rLLM's
``TaskRunner`` imports) with a subclass, and wraps two functions the upstream ``fit_agent`` calls by
their module-level names. rLLM's loop itself is not copied or rewritten. For Strands batches:

* ``generate_agent_trajectory`` runs the episodes through the adapted execution engine and builds the
  batch with :func:`agentboost.integration.verl_batch.episodes_to_verl` (the same conversion the
  single-machine trainer uses): token-exact prompts/responses, loss mask, rewards and
  ``rollout_log_probs``; failed episodes stay as masked zero-reward rows;
* ``_pad_dataproto_to_world_size`` pads as upstream (copies of real rows) and zeroes the copies' loss
  mask, scores and advantages, so groups stay complete and nothing is trained twice;
* ``compute_advantage`` (module function, wrapped): masked rows get a uid of their own while GRPO
  statistics are computed, so a crashed episode does not count as a failed sample of its group; with
  a group estimator (GRPO, RLOO, ...) a row left without an unmasked sibling gets advantage 0 (veRL
  would use its raw reward: a group of one has mean 0 and std 1 there);
* ``compute_data_metrics`` (module function, wrapped): adds the rollout-vs-trainer log-prob gap over
  model tokens and applies the stale-rollout alarm (``+rllm.strands.logprob_gap_alarm``);
* a step whose rows are all masked (a server or sandbox outage) skips the actor/critic update with a
  warning and ``strands/update_skipped=1`` instead of crashing veRL's metrics (and instead of an
  optimizer step on stale momentum); the run carries on;
* Strands metrics (terminations, tool calls/errors, per-tool usage, parse errors, latency) are logged
  for training (``strands/...``) and validation (``val/strands/...``). Validation rewards of failed
  episodes are 0 and count in rLLM's ``val/test_score`` denominators. Each validation also logs a
  W&B table of sample trajectories (``val/strands/trajectories``) when the run logs to W&B.

Any other agent class goes through rLLM's own code paths unchanged.

What this adapter touches is the same in both releases (the class and its ``init_workers``,
``generate_agent_trajectory``, ``_validate_agent``, ``_pad_dataproto_to_world_size``; the module names
``compute_advantage``, ``compute_data_metrics``, ``DataProto``; ``actor_rollout_wg.update_actor``), so
there is no version branch. v0.3.0-pre's ``fit_agent`` no longer pops ``input_ids``/``attention_mask``/
``position_ids`` from the data batch before its union with ours: veRL 0.7.1's dataset yields only a
``dummy_tensor``, so the union holds; it syncs weights with ``checkpoint_manager.update_weights`` after
the update (also after a skipped one: the same weights again).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections import Counter
from types import SimpleNamespace
from typing import Any

logger = logging.getLogger("agentboost.rllm_trainer")

MARK = "_agentboost_installed"


def run_coroutine(coro: Any) -> Any:
    """Run ``coro`` to completion on a fresh event loop in a helper thread (as rLLM's trainer does)."""
    box: dict[str, Any] = {}

    def runner() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=runner, name="agentboost-rollouts", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _termination_summary(batch: Any) -> str:
    from agentboost.integration.verl_batch import TERMINATION_KEY

    ends = batch.non_tensor_batch.get(TERMINATION_KEY)
    return ", ".join(f"{k}: {v}" for k, v in Counter(ends.tolist()).most_common()) if ends is not None else "?"


def check_config(config: Any) -> None:
    """Refuse rLLM options that contradict whole-episode Strands trajectories; warn on risky ones."""
    from agentboost.integration.config import cfg_get
    from agentboost.integration.verl_batch import GROUP_ESTIMATORS

    if cfg_get(config, "rllm.stepwise_advantage.enable", False):
        raise ValueError(
            "Strands agents produce one token-exact trajectory per episode; set rllm.stepwise_advantage.enable=false"
        )
    if cfg_get(config, "rllm.rejection_sample.enable", False):
        logger.warning(
            "rllm.rejection_sample.enable drops all-solved/all-failed groups and then truncates the batch to a "
            "multiple of the world size, which can cut a GRPO group; agentboost keeps groups whole only without it"
        )
    estimator = cfg_get(config, "algorithm.adv_estimator", "")
    estimator = str(getattr(estimator, "value", estimator))
    if estimator in GROUP_ESTIMATORS and int(cfg_get(config, "actor_rollout_ref.rollout.n", 1)) < 2:
        logger.warning(
            "algorithm.adv_estimator=%s compares the samples of a prompt, but actor_rollout_ref.rollout.n < 2: "
            "every row is its group's only member and gets advantage 0 (agentboost gives no baseline-free signal)",
            estimator,
        )
    if cfg_get(config, "rllm.mask_truncated_samples", False):
        logger.warning(
            "rllm.mask_truncated_samples drops rows whose response fills max_response_length after advantages "
            "were computed; prefer +rllm.strands.mask_truncated=true, which keeps the rows and masks them"
        )


def install(ns: dict[str, Any]) -> bool:
    """Replace ``AgentPPOTrainer`` and wrap ``compute_advantage``/``compute_data_metrics`` in ``ns``. Idempotent."""
    missing = [n for n in ("AgentPPOTrainer", "compute_advantage", "compute_data_metrics", "DataProto") if n not in ns]
    if missing:
        raise RuntimeError(
            f"agentboost: rLLM's agent_ppo_trainer lacks {missing}; this adapter targets rLLM v0.2.1.post1 / "
            "v0.3.0-pre (run `python apply_patches.py --revert`)"
        )
    base = ns["AgentPPOTrainer"]
    if getattr(base, MARK, False):
        return False
    from agentboost.integration.config import cfg_get
    from agentboost.integration.metrics import (
        LogprobGapAlarm,
        episode_metrics,
        log_validation_trajectories,
        logprob_gap_metrics,
    )
    from agentboost.integration.verl_batch import (
        GROUP_ESTIMATORS,
        MASKED_KEY,
        episodes_to_verl,
        isolated_masked_uids,
        mask_padding_rows,
        zero_lone_survivors,
    )

    upstream_compute_advantage = ns["compute_advantage"]
    upstream_compute_data_metrics = ns["compute_data_metrics"]
    DataProto = ns["DataProto"]
    state: dict[str, Any] = {"alarm": LogprobGapAlarm(None)}

    def compute_advantage(data: Any, *args: Any, **kwargs: Any) -> Any:
        non_tensor = getattr(data, "non_tensor_batch", {})
        uids = non_tensor["uid"].copy() if "uid" in non_tensor else None
        with isolated_masked_uids(data) as isolated:
            out = upstream_compute_advantage(data, *args, **kwargs)
        if isolated and out is not data and uids is not None:
            out.non_tensor_batch["uid"] = data.non_tensor_batch["uid"]
        estimator = kwargs.get("adv_estimator", args[0] if args else None)
        if uids is not None and str(getattr(estimator, "value", estimator)) in GROUP_ESTIMATORS:
            zero_lone_survivors(out, uids)
        return out

    def compute_data_metrics(batch: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        tensors = batch.batch
        if MASKED_KEY in batch.non_tensor_batch and not bool(tensors["response_mask"].any()):
            # Every row masked: veRL's metrics take max/min over an empty selection. Nothing was trained.
            return {
                "strands/update_skipped": 1.0,
                "response_length/mean": float(tensors["attention_mask"].sum(-1).float().mean()),
            }
        metrics = upstream_compute_data_metrics(batch, *args, **kwargs)
        keys = set(tensors.keys())  # TensorDict refuses `in`
        if MASKED_KEY in batch.non_tensor_batch:
            metrics["strands/update_skipped"] = 0.0
            if {"rollout_log_probs", "old_log_probs"} <= keys:
                gap = logprob_gap_metrics(
                    tensors["rollout_log_probs"], tensors["old_log_probs"], tensors["response_mask"]
                )
                state["alarm"].update(gap)
                metrics.update(gap)
        return metrics

    def skip_when_nothing_to_learn(update: Any, role: str) -> Any:
        """``update_actor``/``update_critic`` of a worker group, skipped for a batch without loss tokens."""

        def guarded(batch: Any, *args: Any, **kwargs: Any) -> Any:
            if MASKED_KEY in getattr(batch, "non_tensor_batch", {}) and not bool(batch.batch["response_mask"].any()):
                logger.warning(
                    "agentboost: every row of this step is masked (%s): skipping the %s update",
                    _termination_summary(batch), role,
                )  # fmt: skip
                return SimpleNamespace(meta_info={"metrics": {f"strands/{role}_update_skipped": [1.0]}})
            return update(batch, *args, **kwargs)

        guarded.__wrapped__ = update  # type: ignore[attr-defined]
        return guarded

    class StrandsAwarePPOTrainer(base):  # type: ignore[misc, valid-type]
        """rLLM's agent PPO trainer that also trains Strands agents on token-exact episodes."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            from modified_rllm_files.agent_execution_engine import is_strands

            self._strands = is_strands(self.agent_class, self.env_class)
            self._strands_val_episodes: list[Any] = []
            if self._strands:
                from agentboost.integration.config import options_from_config

                check_config(self.config)
                options = options_from_config(self.config)
                state["alarm"] = LogprobGapAlarm(options.logprob_gap_alarm, options.logprob_gap_patience)

        def init_workers(self) -> None:
            super().init_workers()
            if self._strands:
                self._guard_updates()

        def _guard_updates(self) -> None:
            for group_name, method, role in (("actor_rollout_wg", "update_actor", "actor"),
                                             ("critic_wg", "update_critic", "critic")):  # fmt: skip
                group = getattr(self, group_name, None)
                update = getattr(group, method, None)
                if update is not None and not hasattr(update, "__wrapped__"):
                    setattr(group, method, skip_when_nothing_to_learn(update, role))

        def generate_agent_trajectory(self, timing_raw: Any = None, meta_info: Any = None) -> Any:
            if not self._strands:
                return super().generate_agent_trajectory(timing_raw=timing_raw, meta_info=meta_info)
            validate = bool((meta_info or {}).get("validate", False))
            engine = self.agent_execution_engine
            episodes = run_coroutine(engine.run_strands_episodes(validate=validate))
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            tensors, non_tensors = episodes_to_verl(
                episodes,
                pad_token_id=pad,
                max_prompt_length=int(cfg_get(self.config, "data.max_prompt_length")),
                max_response_length=int(cfg_get(self.config, "data.max_response_length")),
            )
            if validate:
                self._strands_val_episodes.extend(episodes)
                metrics: dict[str, Any] = {}
            else:
                metrics = episode_metrics(episodes)
                self._save_episodes(episodes)
            return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors), metrics

        def _save_episodes(self, episodes: list[Any]) -> None:
            directory = os.path.join(str(cfg_get(self.config, "trainer.default_local_dir", ".")), "episodes")
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, f"{self.global_steps}.jsonl")
            with open(path, "w", encoding="utf-8") as fh:
                for episode in episodes:
                    fh.write(json.dumps(episode.to_dict()) + "\n")

        def _validate_agent(self) -> dict[str, Any]:
            self._strands_val_episodes = []
            metrics = super()._validate_agent()
            if self._strands and self._strands_val_episodes:
                metrics.update(episode_metrics(self._strands_val_episodes, prefix="val/strands"))
                # veRL's Tracking logs `metrics` at self.global_steps; the table goes to the same step
                log_validation_trajectories(self._strands_val_episodes, step=self.global_steps)
            return metrics

        def _pad_dataproto_to_world_size(self, batch: Any) -> Any:
            original = len(batch)
            padded = super()._pad_dataproto_to_world_size(batch)
            if self._strands:
                mask_padding_rows(padded, original)
            return padded

    StrandsAwarePPOTrainer.__name__ = StrandsAwarePPOTrainer.__qualname__ = "AgentPPOTrainer"
    StrandsAwarePPOTrainer.__module__ = base.__module__
    setattr(StrandsAwarePPOTrainer, MARK, True)
    ns["UpstreamAgentPPOTrainer"] = base
    ns["AgentPPOTrainer"] = StrandsAwarePPOTrainer
    ns["compute_advantage"] = compute_advantage
    ns["compute_data_metrics"] = compute_data_metrics
    logger.info("agentboost: rLLM PPO trainer adapted for Strands agents")
    return True
