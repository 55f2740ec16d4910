"""GRPO pieces: group-normalised advantages, the clipped policy-gradient loss, KL to a reference.

Conventions (those of veRL's GRPO with ``loss_agg_mode=token-mean``):

* advantage of an episode = (reward - mean of its group) / (std of its group + eps), broadcast to
  every loss token of the episode; groups are the ``n`` samples of one prompt;
* masked episodes (failures) are excluded from their group's statistics and get advantage 0: an
  infrastructure failure must not make its siblings look better or worse;
* loss = - mean over all loss tokens of the batch of min(ratio * A, clip(ratio, 1-eps_low, 1+eps_high) * A),
  plus ``kl_coef`` * the k3 estimator of KL(policy || reference) on the same tokens.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def group_advantages(
    rewards: Any, group_ids: list[str], masked: list[bool], *, eps: float = 1e-6, normalize_std: bool = True
) -> Any:
    import torch

    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    members: dict[str, list[int]] = defaultdict(list)
    for i, (group, is_masked) in enumerate(zip(group_ids, masked, strict=True)):
        if not is_masked:
            members[group].append(i)
    for indices in members.values():
        values = rewards[indices].float()
        if len(indices) == 1:
            continue  # a lone sample has no baseline: no signal
        centered = values - values.mean()
        if normalize_std:
            centered = centered / (values.std(unbiased=True) + eps)
        advantages[indices] = centered
    return advantages


def policy_loss(
    logprobs: Any,
    old_logprobs: Any,
    advantages: Any,
    mask: Any,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_logprobs: Any = None,
    kl_coef: float = 0.0,
) -> tuple[Any, dict[str, float]]:
    """Token-mean clipped PG loss. ``logprobs``/``old_logprobs``/``mask`` are [B, T]; ``advantages`` [B]."""
    import torch

    mask = mask.float()
    n_tokens = mask.sum().clamp(min=1.0)
    adv = advantages.unsqueeze(-1).float()
    log_ratio = (logprobs - old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    pg = -torch.minimum(unclipped, clipped)
    loss = (pg * mask).sum() / n_tokens
    metrics = {
        "pg_loss": float(loss.detach()),
        "clip_frac": float(
            (((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float() * mask).sum().detach() / n_tokens
        ),
        "approx_kl_old": float(((ratio - 1 - log_ratio).detach() * mask).sum() / n_tokens),
        "loss_tokens": float(n_tokens),
    }
    if ref_logprobs is not None and kl_coef > 0:
        delta = (ref_logprobs - logprobs) * mask
        kl = (torch.exp(delta) - delta - 1) * mask  # k3 estimator, >= 0
        kl_mean = kl.sum() / n_tokens
        loss = loss + kl_coef * kl_mean
        metrics["kl_ref"] = float(kl_mean.detach())
    metrics["loss"] = float(loss.detach())
    return loss, metrics
