"""Unbiased pass@k and pass^k estimators from n samples with c successes.

* pass@k (Chen et al., 2021, "Evaluating Large Language Models Trained on Code"): the probability
  that at least one of k samples drawn without replacement from the n is correct,
  ``1 - C(n-c, k) / C(n, k)``.
* pass^k (Yao et al., 2024, tau-bench): the probability that all k drawn samples are correct,
  ``C(c, k) / C(n, k)``.

Both are computed as running products (no huge binomials, exact for any n).
"""

from __future__ import annotations


def _check(n: int, c: int, k: int) -> None:
    if n < 1 or k < 1:
        raise ValueError(f"need n >= 1 and k >= 1, got n={n}, k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k for one task with ``c`` correct out of ``n`` samples."""
    _check(n, c, k)
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):  # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
        miss *= 1.0 - k / i
    return 1.0 - miss


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass^k (all k samples correct) for one task."""
    _check(n, c, k)
    if c < k:
        return 0.0
    hit = 1.0
    for i in range(k):  # C(c, k) / C(n, k) = prod_{i<k} (c - i) / (n - i)
        hit *= (c - i) / (n - i)
    return hit


def default_ks(n: int) -> list[int]:
    """The k reported by default for n samples per task: 1, 2, 4, ... up to n, and n."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return sorted({*ks, n})
