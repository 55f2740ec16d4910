"""The built-in trainer's GRPO maths equal veRL's own functions on the same random batches.

veRL's ``core_algos``: ``compute_grpo_outcome_advantage``, ``compute_policy_loss_vanilla`` (dual clip,
clamped log-ratio), ``agg_loss`` token-mean and ``kl_penalty("low_var_kl")``. Skipped without veRL
(CI); run where veRL is installed (checked with 0.6.1 and 0.7.1). One deliberate difference: a batch
with no loss token aggregates to 0 here (veRL 0.6.1 too); veRL 0.7.1 divides by zero there.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
core_algos = pytest.importorskip(
    "verl.trainer.ppo.core_algos", reason="veRL is not installed (pip install -c constraints/cpu.txt -e '.[verl]')"
)

from omegaconf import OmegaConf  # noqa: E402

from agentboost.train.grpo import group_advantages, masked_mean, policy_loss  # noqa: E402


def _batch(seed: int, rows: int = 24, width: int = 40, spread: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    mask[torch.rand(rows, width, generator=g) < 0.2] = 0  # tool tokens inside responses
    old = -torch.rand(rows, width, generator=g) * 4
    new = old + spread * torch.randn(rows, width, generator=g)
    ref = old + spread * torch.randn(rows, width, generator=g)
    new[0, 0], ref[1, 0] = old[0, 0] + 60.0, old[1, 0] - 60.0  # beyond the clamps
    return mask, old, new, ref, g


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("normalize", [True, False])
def test_grpo_advantages_equal_verls(seed: int, normalize: bool) -> None:
    mask, _, _, _, g = _batch(seed)
    rewards = torch.randint(0, 3, (24,), generator=g).float() / 2
    groups = [f"p{i // 4}" for i in range(24)]  # 6 prompts x 4 samples
    ours = group_advantages(rewards, groups, [False] * 24, normalize_std=normalize)
    scores = torch.zeros_like(mask)
    scores[torch.arange(24), mask.shape[1] - 1] = rewards  # the reward on one token, as veRL's batch holds it
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        scores, mask, np.array(groups, dtype=object), norm_adv_by_std_in_grpo=normalize
    )
    assert torch.allclose(ours[:, None] * mask, theirs, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_policy_loss_and_kl_equal_verls(seed: int) -> None:
    mask, old, new, ref, g = _batch(seed)
    adv = torch.randn(24, generator=g)
    adv_tokens = adv[:, None] * mask
    config = OmegaConf.create(
        {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
         "global_batch_info": {"dp_size": 1}}  # veRL >= 0.7 aggregates over the global batch (one rank here)
    )  # fmt: skip
    pg, pg_metrics = core_algos.compute_policy_loss_vanilla(old, new, adv_tokens, mask, "token-mean", config)
    ours, metrics = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0)
    assert torch.allclose(ours, pg, atol=1e-6, rtol=1e-5)
    assert metrics["clip_frac"] == pytest.approx(pg_metrics["actor/pg_clipfrac"], abs=1e-6)
    assert metrics["clip_frac_lower"] == pytest.approx(pg_metrics["actor/pg_clipfrac_lower"], abs=1e-6)
    assert metrics["approx_kl_old"] == pytest.approx(pg_metrics["actor/ppo_kl"], abs=1e-5)

    kl_tokens = core_algos.kl_penalty(new, ref, "low_var_kl")
    kl = core_algos.agg_loss(loss_mat=kl_tokens, loss_mask=mask, loss_agg_mode="token-mean")
    with_kl, metrics = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.28, ref_logprobs=ref, kl_coef=0.05)
    assert metrics["kl_ref"] == pytest.approx(float(kl), rel=1e-5)
    assert torch.allclose(with_kl, pg + 0.05 * kl, atol=1e-6, rtol=1e-5)  # veRL: pg_loss + kl_loss * kl_loss_coef


def test_token_mean_is_verls_agg_loss() -> None:
    mask, old, new, _, _ = _batch(7)
    values = new - old
    assert torch.allclose(
        masked_mean(values, mask), core_algos.agg_loss(loss_mat=values, loss_mask=mask, loss_agg_mode="token-mean")
    )
    empty = torch.zeros_like(mask)
    assert float(masked_mean(values, empty)) == 0.0
    theirs = float(core_algos.agg_loss(values, empty, "token-mean"))
    assert theirs == 0.0 or theirs != theirs  # 0.6.1: 0; 0.7.1: nan (0/0)
