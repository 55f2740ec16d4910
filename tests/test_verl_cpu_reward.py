"""The reward of verl's CPU smoke runs (tests/test_verl_cpu_e2e.py) must split every GRPO group: those runs
assert that step 1 moved the weights (grad norm > 0), and a group whose rewards all tie has no advantage."""

from __future__ import annotations

import random
from types import SimpleNamespace

from agentboost.integration.verl_cpu_run import SMOKE_REWARD, token_hash_reward


def episode(model_tokens: list[int], tool_tokens: list[int]) -> SimpleNamespace:
    segment = lambda kind, ids: SimpleNamespace(kind=SimpleNamespace(value=kind), token_ids=ids)  # noqa: E731
    return SimpleNamespace(segments=[segment("template", [1, 2]), segment("model", model_tokens),
                                     segment("tool", tool_tokens)])  # fmt: skip


def test_smoke_reward_never_ties_a_group_of_distinct_samples() -> None:
    """4,000 groups of 4 sampled episodes (the smoke runs' group size): every reward differs. A binary reward
    (the old parity reward) fails at once; in the runs it tied whole batches of 2 groups 1 time in 64, CI's
    grad-norm-0 failure."""
    assert SMOKE_REWARD.endswith(":token_hash_reward")
    rng = random.Random(0)
    for _ in range(4000):
        samples = [[rng.randrange(151_000) for _ in range(rng.randint(1, 40))] for _ in range(4)]
        rewards = {token_hash_reward({}, episode(tokens, [])).reward for tokens in samples}
        assert len(rewards) == len({tuple(t) for t in samples}) and all(0.0 <= r < 1.0 for r in rewards)


def test_smoke_reward_depends_only_on_the_model_tokens() -> None:
    first = token_hash_reward({}, episode([5, 7, 11], [3])).reward
    assert token_hash_reward({"id": 1}, episode([5, 7, 11], [99, 100])).reward == first  # tool tokens: no say
    assert token_hash_reward({}, episode([7, 5, 11], [3])).reward != first  # the order of the tokens counts
