"""agentboost's GRPO masking rule as a verl >= 0.9 advantage estimator (``algorithm.adv_estimator=agentboost_grpo``).

verl's own GRPO keeps every row in its prompt's group: a masked (failed) episode's reward 0 would drag
the baseline of its siblings, and a group with one usable sample gives that sample its raw reward as
advantage (mean 0, std 1). agentboost's rule, shared with the built-in trainer
(:func:`agentboost.train.grpo.group_advantages`), leaves masked rows out of the group statistics and
gives advantage 0 to a row with fewer than 2 usable rows in its group.

verl hands a registered estimator only tensors (``verl/trainer/ppo/ray_trainer.py``,
``compute_advantage``: ``token_level_rewards``, ``response_mask``, ``config``, ``index`` = the prompt
``uid``), so "masked" is read from the loss mask: **a row with no loss token is out of its group**.
That covers every masked Strands episode (its ``response_mask`` is all zero, its reward 0) and verl's
own synthetic padding rows (``padding_utils.construct_minimal_padding_template``: mask 0, reward 0). It
also covers the one unmasked ending that can have no model token (a policy ``timeout`` before the first
model call), which the 0.6.1 route would have kept in the baseline with its reward; it carries no
gradient either way.

The estimator is registered by :func:`register` through verl's ``register_adv_est``, in every process
that imports :mod:`agentboost.integration.verl_plugin`: the Hydra override
``actor_rollout_ref.model.external_lib=agentboost.integration.verl_plugin`` makes verl import it in every
process that builds the model config, the trainer's included.
"""

from __future__ import annotations

from typing import Any

from ..train.grpo import group_advantages

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
        groups = [str(uid) for uid in (index.tolist() if hasattr(index, "tolist") else list(index))]
        advantages = group_advantages(
            scores, groups, masked, eps=epsilon, normalize_std=bool(_option(config, "norm_adv_by_std_in_grpo", True))
        )
        advantages = advantages.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
    return advantages, advantages


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
