"""What a loss token weighs under verl 0.9.1's V1 mini-batching when episodes split into several trajectories (rows),
with verl alone and with agentboost's mini-batches of whole episodes (``agentboost.integration.verl_minibatch``).

Both sides run verl's own code on the same rows. verl alone: the padding multiple of ``_balance_batch``
(``PPOTrainer._get_required_batch_multiple``, called on a stand-in trainer), verl's no-op row length, its
data-parallel balancing (``calculate_workload`` + ``get_seqlen_balanced_partitions``, the batch reordered rank by
rank), each rank's contiguous chunk cut by the workers' ``make_iterator`` into mini-batches of
``ppo_mini_batch_size * n / dp`` rows. agentboost: :func:`~agentboost.integration.verl_minibatch.plan_mini_batches`
with the same balancing, read back the same way. Each mini-batch is one optimizer step whose loss is a token-mean
(``loss_agg_mode=token-mean``, the launch scripts'), so a loss token of mini-batch k weighs 1 / (loss tokens of k).
The table gives that weight relative to 1 / (loss tokens of the whole batch): what every token weighs when
``MINI_BATCH_SIZE = TRAIN_BATCH_SIZE`` is one step, as configured.

The batch: ``TRAIN_BATCH_SIZE`` 64 prompts x ``ROLLOUT_N`` 8 = 512 episodes on 8 ranks, rows in the order the
replay buffer hands them (prompt group by prompt group, each episode's outputs in order); each episode has
200-2000 loss tokens (uniform, seeded), shared equally by its trajectories, and each row a 512-token prompt plus
1.5 x its loss tokens of response; ``--equal-rows`` gives every row 1000 loss tokens instead (a split episode
then has more tokens than an unsplit one: the issue's back-of-the-envelope figures). Which episodes split is
drawn with the same seed::

    python benchmarks/verl_minibatch_weights.py [--dp 8] [--seed 0] [--equal-rows] [--json PATH]

Needs verl 0.9.1 (its own environment, ``constraints/verl09.txt``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agentboost.integration.verl_minibatch import _verl_balance, plan_mini_batches

logger = logging.getLogger("verl_minibatch_weights")

PROMPTS, N = 64, 8


@dataclass(frozen=True)
class Scenario:
    name: str
    splits: dict[int, int]
    """episode index -> its trajectories (the others: 1)."""
    mini: int = PROMPTS


def scenarios(seed: int) -> list[Scenario]:
    rng = random.Random(seed)
    episodes = PROMPTS * N
    ten = rng.sample(range(episodes), 56)
    half = rng.sample(range(episodes), episodes // 2)
    return [
        Scenario("56 of 512 episodes (~10%) in 2 trajectories", dict.fromkeys(ten, 2)),
        Scenario("256 of 512 episodes (50%) in 2 trajectories", dict.fromkeys(half, 2)),
        Scenario("1 of 512 episodes in 10 trajectories", {rng.randrange(episodes): 10}),
        Scenario("56 of 512 in 2 trajectories, MINI_BATCH_SIZE = 16", dict.fromkeys(ten, 2), mini=16),
    ]


def rows_of(scenario: Scenario, seed: int, equal_rows: bool = False) -> tuple[list[str], list[int], list[int]]:
    """(V1 keys, sequence lengths, loss tokens) of the batch's rows."""
    rng = random.Random(seed + 1)
    keys, lens, tokens = [], [], []
    for episode in range(PROMPTS * N):
        group, session = divmod(episode, N)
        total = rng.randint(200, 2000)
        parts = scenario.splits.get(episode, 1)
        for index in range(parts):
            loss = 1000 if equal_rows else total // parts + (1 if index < total % parts else 0)
            keys.append(f"g{group}_{session}_{index}")
            lens.append(512 + math.ceil(1.5 * loss))
            tokens.append(loss)
    return keys, lens, tokens


def verl_alone(lens: list[int], mini: int, dp: int) -> list[list[int]]:
    """The global mini-batches (row indices, no-op rows past the real ones) verl 0.9.1 trains."""
    import torch
    from tensordict import TensorDict
    from verl.trainer.ppo.padding_utils import SYNTHETIC_PADDING_SEQ_LEN
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions
    from verl.utils.tensordict_utils import make_iterator

    actor, rollout = SimpleNamespace(ppo_mini_batch_size=mini), SimpleNamespace(n=N)
    config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(actor=actor, rollout=rollout),
                             trainer=SimpleNamespace(critic_warmup=0))  # fmt: skip
    trainer = SimpleNamespace(config=config, use_critic=False, global_steps=1)
    multiple = PPOTrainer._get_required_batch_multiple(trainer, dp)
    padded = lens + [SYNTHETIC_PADDING_SEQ_LEN] * (-len(lens) % multiple)
    workloads = calculate_workload(torch.tensor(padded, dtype=torch.int64))
    parts = get_seqlen_balanced_partitions(workloads, k_partitions=dp, equal_size=True)
    order = torch.tensor([row for part in parts for row in part])
    per_rank = len(order) // dp
    mini_batches: list[list[int]] = []
    for rank in range(dp):
        chunk = TensorDict({"row": order[rank * per_rank : (rank + 1) * per_rank]}, batch_size=[per_rank])
        batches = make_iterator(chunk, mini_batch_size=mini * N // dp, epochs=1, seed=42 + rank,
                                dataloader_kwargs={"shuffle": False})  # fmt: skip
        for k, batch in enumerate(batches):
            if k == len(mini_batches):
                mini_batches.append([])
            mini_batches[k] += batch["row"].tolist()
    return mini_batches


def agentboost(keys: list[str], lens: list[int], mini: int, dp: int) -> list[list[int]]:
    from verl.trainer.ppo.padding_utils import SYNTHETIC_PADDING_SEQ_LEN

    plan = plan_mini_batches(keys, lens, groups_per_mini_batch=mini, dp_size=dp,
                             pad_seq_len=SYNTHETIC_PADDING_SEQ_LEN, balance=_verl_balance)  # fmt: skip
    return plan.mini_batches


def weights(mini_batches: list[list[int]], tokens: list[int]) -> list[dict[str, Any]]:
    total = sum(tokens)
    out = []
    for rows in mini_batches:
        real = [row for row in rows if row < len(tokens)]
        loss = sum(tokens[row] for row in real)
        out.append({"rows": len(rows), "real_rows": len(real), "loss_tokens": loss,
                    "token_weight": round(total / loss, 3) if loss else None})  # fmt: skip
    return out


def measure(scenario: Scenario, seed: int, dp: int, equal_rows: bool = False) -> dict[str, Any]:
    keys, lens, tokens = rows_of(scenario, seed, equal_rows)
    result: dict[str, Any] = {
        "scenario": scenario.name, "episodes": PROMPTS * N, "rows": len(keys), "mini_batch_size": scenario.mini,
        "configured_steps": PROMPTS // scenario.mini,
    }  # fmt: skip
    for side, mini_batches in (("verl", verl_alone(lens, scenario.mini, dp)),
                               ("agentboost", agentboost(keys, lens, scenario.mini, dp))):  # fmt: skip
        steps = weights(mini_batches, tokens)
        assert sorted(r for rows in mini_batches for r in rows if r < len(keys)) == list(range(len(keys)))
        result[side] = {"optimizer_steps": len(steps), "padded_rows": sum(s["rows"] for s in steps), "steps": steps}
    return result


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| batch | rows | optimizer steps (configured) | verl 0.9.1 alone: token weight per step | "
             "with agentboost |", "|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        cells = []
        for side in ("verl", "agentboost"):
            w = [s["token_weight"] for s in r[side]["steps"]]
            spread = max(w) / min(w)
            cells.append(" / ".join(f"{x:.2f}x" for x in w) + (f" (last/first {spread:.1f}x)" if len(w) > 1 else ""))
        steps = f"{r['verl']['optimizer_steps']} -> {r['agentboost']['optimizer_steps']} ({r['configured_steps']})"
        lines.append(f"| {r['scenario']} | {r['rows']} (padded {r['verl']['padded_rows']} -> "
                     f"{r['agentboost']['padded_rows']}) | {steps} | {cells[0]} | {cells[1]} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--equal-rows", action="store_true", help="every row 1000 loss tokens")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = [measure(s, args.seed, args.dp, args.equal_rows) for s in scenarios(args.seed)]
    logger.info("%s", table(results))
    if args.json:
        summary = {"dp": args.dp, "seed": args.seed, "equal_rows": args.equal_rows, "results": results}
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
