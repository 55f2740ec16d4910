"""agentboost's GRPO masking rule as a verl >= 0.9 advantage estimator (``algorithm.adv_estimator=agentboost_grpo``).

verl's own GRPO keeps every row in its prompt's group: a masked (failed) episode's reward 0 would drag
the baseline of its siblings, and a group with one usable sample gives that sample its raw reward as
advantage (mean 0, std 1). agentboost's rule, shared with the built-in trainer
(:func:`agentboost.train.grpo.group_advantages`), leaves masked rows out of the group statistics and
gives advantage 0 to a row with fewer than 2 usable rows in its group.

verl hands a registered estimator only tensors (``verl/trainer/ppo/ray_trainer.py``,
``compute_advantage``: ``token_level_rewards``, ``response_mask``, ``config``, ``index`` = the prompt
``uid``), so "masked" is read from the loss mask: **a row with no loss token is out of its group**.
That covers every masked Strands episode (its ``response_mask`` is all zero, its reward 0), verl's own
synthetic padding rows (``padding_utils.construct_minimal_padding_template``: mask 0, reward 0), an episode
none of whose trajectories is trained (its one placeholder row keeps its reward, mask 0) and one without a
model token (a policy ``timeout`` before the first call): the rule of the built-in trainer and the rLLM
route too (:attr:`agentboost.batch.Batch.episode_masked`). A batch without any loss token is warned about.

The estimator is registered by :func:`register` through verl's ``register_adv_est``, in every process
that imports :mod:`agentboost.integration.verl_plugin`: the Hydra override
``actor_rollout_ref.model.external_lib=agentboost.integration.verl_plugin`` makes verl import it in every
process that builds the model config, the trainer's included.

Episodes of several trajectories (docs/multi-agent.md, "Agents that rewrite their history, and multi-agent runs")
reach verl 0.9's V1 trainer as several outputs of one sample, stored under keys
``{uid}_{session_id}_{index}``. verl's ``compute_advantage_for_multi_trajectories``
(``trainer/ppo/v1/utils.py``) computes one advantage per session for its own ``grpo`` only and hands
every other estimator all rows, which would count each trajectory as a member of the group. So
:func:`install_multi_trajectory` wraps that function as imported by the V1 trainer
(``trainer/ppo/v1/trainer_base.py``) for ``agentboost_grpo`` alone: one member per session (the episode:
its outputs all carry the episode's score), the masking rule over sessions, the session's advantage on
every loss token of every one of its rows (:func:`session_advantages`). Any other estimator goes to
verl's function unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from ..train.grpo import group_advantages

logger = logging.getLogger(__name__)

ADV_ESTIMATOR = "agentboost_grpo"


def _option(config: Any, name: str, default: Any) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)
    value = getter(name, default) if callable(getter) else getattr(config, name, default)
    return default if value is None else value


def masked_grpo_advantage(
    token_level_rewards: Any,
    response_mask: Any,
    index: Any,
    epsilon: float = 1e-6,
    config: Any = None,
    **_: Any,
) -> tuple[Any, Any]:
    """(advantages, returns) with verl's estimator signature: per-row GRPO advantage over the rows of
    the same ``index`` that have loss tokens, broadcast over the row's loss tokens; 0 elsewhere.
    ``config.norm_adv_by_std_in_grpo`` (verl's ``AlgoConfig``) turns the std division off (Dr.GRPO)."""
    import torch

    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        masked = (response_mask.sum(dim=-1) == 0).tolist()
        warn_if_nothing_trains(masked)
        groups = [str(uid) for uid in (index.tolist() if hasattr(index, "tolist") else list(index))]
        advantages = group_advantages(
            scores, groups, masked, eps=epsilon, normalize_std=bool(_option(config, "norm_adv_by_std_in_grpo", True))
        )
        advantages = advantages.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
    return advantages, advantages


def warn_if_nothing_trains(masked: list[bool]) -> bool:
    """Warn when no row (session) of the batch has a loss token; whether it warned. verl would still run the
    update: its token-mean divides by zero loss tokens, and the non-finite gradient norm makes it skip the step."""
    if masked and all(masked):
        logger.warning("no loss token in this training batch (every episode masked or without a trained "
                       "trajectory): the step trains nothing")  # fmt: skip
        return True
    return False


def session_advantages(
    token_level_rewards: Any, response_mask: Any, keys: list[str], epsilon: float = 1e-6, config: Any = None
) -> Any:
    """Advantages of rows keyed ``{uid}_{session_id}_{index}``: one GRPO member per session (its score: the
    last output's), over the sessions of each ``uid`` with loss tokens in some row; each session's advantage
    on every loss token of its rows."""
    import torch

    with torch.no_grad():
        sessions: dict[str, list[int]] = {}
        uids: dict[str, str] = {}
        last: dict[str, tuple[int, int]] = {}  # session -> (its highest output index, that row)
        for row, key in enumerate(keys):
            uid, session, index = _split_key(key)
            name = f"{uid}_{session}"
            sessions.setdefault(name, []).append(row)
            uids[name] = uid
            if name not in last or index > last[name][0]:
                last[name] = (index, row)
        names = list(sessions)
        scores = token_level_rewards.sum(dim=-1)
        session_scores = torch.stack([scores[last[n][1]] for n in names])
        tokens = response_mask.sum(dim=-1)
        masked = [bool(sum(float(tokens[r]) for r in sessions[n]) == 0) for n in names]
        warn_if_nothing_trains(masked)
        values = group_advantages(
            session_scores, [uids[n] for n in names], masked, eps=epsilon,
            normalize_std=bool(_option(config, "norm_adv_by_std_in_grpo", True)),
        )  # fmt: skip
        per_row = torch.zeros(len(keys), dtype=torch.float32)
        for n, value in zip(names, values, strict=True):
            per_row[sessions[n]] = value
        advantages = per_row.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
    return advantages


def _split_key(key: str) -> tuple[str, str, int]:
    parts = str(key).rsplit("_", 2)
    if len(parts) != 3 or not parts[2].isdigit():
        raise ValueError(f"unexpected TransferQueue key {key!r} (expected uid_session_index)")
    return parts[0], parts[1], int(parts[2])


_MULTI_MARK = "_agentboost_sessions"
_announced = False


def install_multi_trajectory(trainer_base: Any = None) -> bool:
    """Wrap ``compute_advantage_for_multi_trajectories`` in verl's V1 trainer module so that
    ``agentboost_grpo`` gets one member per session (module doc). Idempotent; returns whether it wrapped
    now. ``trainer_base`` defaults to the installed ``verl.trainer.ppo.v1.trainer_base``."""
    if trainer_base is None:
        try:
            from verl.trainer.ppo.v1 import trainer_base
        except ImportError:  # a verl without the V1 trainer: nothing to wrap
            return False
    original = getattr(trainer_base, "compute_advantage_for_multi_trajectories", None)
    if original is None:
        raise RuntimeError(
            "verl's V1 trainer has no compute_advantage_for_multi_trajectories: this verl is not one agentboost "
            "was written against (verl 0.9.1)"
        )
    if getattr(original, _MULTI_MARK, False):
        return False

    def compute_advantage_for_multi_trajectories(data: Any, batch_keys: list[str], adv_estimator: Any,
                                                 *args: Any, **kwargs: Any) -> Any:  # fmt: skip
        if str(getattr(adv_estimator, "value", adv_estimator)) != ADV_ESTIMATOR:
            return original(data, batch_keys, adv_estimator, *args, **kwargs)
        global _announced
        if not _announced:
            _announced = True
            logger.warning("agentboost_grpo: one advantage per episode (session) over %d rows", len(batch_keys))
        advantages = session_advantages(
            data.batch["token_level_rewards"], data.batch["response_mask"], list(batch_keys),
            config=kwargs.get("config"),
        )  # fmt: skip
        data.batch["advantages"] = advantages
        data.batch["returns"] = advantages
        return data

    setattr(compute_advantage_for_multi_trajectories, _MULTI_MARK, True)
    compute_advantage_for_multi_trajectories.__wrapped__ = original  # type: ignore[attr-defined]
    trainer_base.compute_advantage_for_multi_trajectories = compute_advantage_for_multi_trajectories
    return True


def register(core_algos: Any) -> bool:
    """Register :func:`masked_grpo_advantage` as ``agentboost_grpo`` in verl's ``core_algos`` registry.
    Idempotent (also across a reload of this module); returns whether it registered now."""
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    existing = registry.get(ADV_ESTIMATOR)
    if existing is not None:
        if (
            getattr(existing, "__qualname__", None) == masked_grpo_advantage.__qualname__
            and getattr(existing, "__module__", None) == masked_grpo_advantage.__module__
        ):
            return False
        raise ValueError(f"verl advantage estimator {ADV_ESTIMATOR!r} is already registered to {existing!r}")
    core_algos.register_adv_est(ADV_ESTIMATOR)(masked_grpo_advantage)
    return True
