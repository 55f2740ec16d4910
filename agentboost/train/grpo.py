"""GRPO pieces: group-normalised advantages, the clipped policy-gradient loss, KL to a reference.

The formulas are veRL's (``core_algos``: GRPO outcome advantage, vanilla policy loss with dual clip,
``agg_loss`` token-mean, ``low_var_kl``), numerical guards included; ``tests/test_grpo_reference.py``
checks them against veRL's own functions where veRL is installed:

* advantage of an episode = (reward - mean of its group) / (std of its group + eps), broadcast to
  every loss token of the episode; groups are the ``n`` samples of one prompt. Masked episodes
  (failures the policy did not cause) are left out of their group's statistics and get advantage 0,
  and so does an episode with no unmasked sibling (no baseline: veRL would use its raw reward);
* loss = token-mean over the batch's loss tokens of the dual-clipped PPO objective: the log-ratio is
  clamped to [-20, 20]; for A >= 0 max(-A r, -A clip(r, 1-eps_low, 1+eps_high)); for A < 0 that,
  bounded by -A c (``clip_ratio_c``, 3 in veRL);
* plus ``kl_coef`` times the token-mean of the k3 estimator of KL(policy || reference), computed on a
  log-ratio clamped to [-20, 20] and clamped to [-10, 10] itself.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

LOG_RATIO_CLAMP = 20.0
KL_CLAMP = 10.0


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


def masked_mean(values: Any, mask: Any) -> Any:
    """veRL's ``masked_mean``: sum over the mask / (mask count + 1e-8) (0 for an empty mask)."""
    return (values * mask).sum() / (mask.sum() + 1e-8)


def low_var_kl(logprobs: Any, ref_logprobs: Any) -> Any:
    """Per-token k3 estimator of KL(policy || reference), >= 0, with veRL's clamps."""
    import torch

    log_ratio = torch.clamp(ref_logprobs - logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -KL_CLAMP, KL_CLAMP)


def policy_loss(
    logprobs: Any,
    old_logprobs: Any,
    advantages: Any,
    mask: Any,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_ratio_c: float = 3.0,
    ref_logprobs: Any = None,
    kl_coef: float = 0.0,
) -> tuple[Any, dict[str, float]]:
    """Token-mean dual-clipped PG loss (+ KL). ``logprobs``/``old_logprobs``/``mask`` are [B, T];
    ``advantages`` is [B] (one per episode) or [B, T]."""
    import torch

    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    mask = mask.float()
    adv = advantages.float()
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(mask)
    log_ratio = torch.clamp(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pessimistic = torch.maximum(unclipped, clipped)
    dual = torch.minimum(-adv * clip_ratio_c, pessimistic)
    per_token = torch.where(adv < 0, dual, pessimistic)
    loss = masked_mean(per_token, mask)
    metrics = {
        "pg_loss": float(loss.detach()),
        "clip_frac": float(masked_mean(torch.gt(clipped, unclipped).float(), mask).detach()),
        "clip_frac_lower": float(masked_mean((torch.gt(pessimistic, -adv * clip_ratio_c) & (adv < 0)).float(), mask)),
        "approx_kl_old": float(masked_mean(-log_ratio, mask).detach()),
        "loss_tokens": float(mask.sum()),
    }
    if ref_logprobs is not None and kl_coef > 0:
        kl_mean = masked_mean(low_var_kl(logprobs, ref_logprobs), mask)
        loss = loss + kl_coef * kl_mean
        metrics["kl_ref"] = float(kl_mean.detach())
    metrics["loss"] = float(loss.detach())
    return loss, metrics
