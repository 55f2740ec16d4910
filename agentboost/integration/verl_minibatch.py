"""Mini-batches of whole episodes under verl 0.9's V1 trainer: as many optimizer steps as configured, whatever
the number of trajectories per episode.

verl 0.9.1 counts a mini-batch in rows (``verl/trainer/ppo/v1/trainer_base.py``): ``_balance_batch`` pads the
batch with no-op rows to a multiple of ``lcm(dp, ppo_mini_batch_size * rollout.n)`` and ``_update_actor`` asks
the workers for mini-batches of ``ppo_mini_batch_size * rollout.n`` rows, one optimizer step each, the loss a
token-mean within each (``workers/engine_workers.py``, ``train_mini_batch``). An episode of several
trajectories is several rows, so a batch of episodes that split outgrows its mini-batches: with the launch
scripts' ``MINI_BATCH_SIZE = TRAIN_BATCH_SIZE``, 512 episodes of which 56 split in two are 568 rows, padded
to 1024, trained in two optimizer steps, the second of 56 rows whose tokens weigh 9-10 times those of the
first (``benchmarks/verl_minibatch_weights.py``).

:func:`install` wraps three methods of verl's ``PPOTrainer``, which every V1 trainer mode inherits:

* ``_balance_batch``: :func:`plan_mini_batches` cuts the sampled prompt groups, in order, into
  ``ceil(groups / ppo_mini_batch_size)`` mini-batches of whole groups (so of whole episodes; the groups are
  shuffled first, by a seed, when ``actor.shuffle`` is set), spreads each mini-batch's rows over the
  data-parallel ranks with verl's own balancing (``get_seqlen_balanced_partitions`` over
  ``calculate_workload``) and fills every (mini-batch, rank) cell up to the same number of rows with verl's own
  no-op rows (``upsample_batch_to_divisible_size``: loss mask 0, reward 0). Rows go rank by rank, mini-batch
  by mini-batch: verl hands each rank a contiguous chunk and each rank cuts it into contiguous mini-batches.
* ``_update_actor`` / ``_update_critic``: the workers' ``mini_batch_size`` becomes the rows of one such
  mini-batch (and their shuffle off: rows never move between mini-batches). ``global_batch_size`` stays verl's
  ``ppo_mini_batch_size * rollout.n``, the episodes of a mini-batch, what the ``seq-mean-token-sum`` modes
  divide by.

So a training step takes ``train_batch_size / ppo_mini_batch_size * ppo_epochs`` optimizer steps, as
configured; with ``MINI_BATCH_SIZE = TRAIN_BATCH_SIZE`` one step over the whole batch, every loss token
weighing the same. ``loss_agg_mode``: ``token-mean`` (the launch scripts'), ``token-sum`` and
``seq-mean-token-sum(-norm)`` weigh a token the same whether its episode is one row or several;
``seq-mean-token-mean`` gives every row the same weight, so an episode of k trajectories would weigh k times
one of one trajectory: a batch holding an episode of several rows is refused under it, before any update.

Metrics, per training step (summed over ``parameter_sync_step``): ``strands/optimizer_steps_total``,
``strands/update_rows_total`` (rows the update saw, no-op rows included) and ``strands/padding_rows_total``.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

SPLIT_UNSAFE_LOSS_AGG = "seq-mean-token-mean"
"""The ``loss_agg_mode`` under which an episode's weight grows with its number of rows."""
METRIC_STEPS = "strands/optimizer_steps_total"
METRIC_ROWS = "strands/update_rows_total"
METRIC_PADDING = "strands/padding_rows_total"
_MARK = "_agentboost_episode_mini_batches"
_PLAN = "_agentboost_mini_batch_plan"

Balance = Callable[[list[int], int], list[list[int]]]
"""``(sequence lengths, k) -> k lists of indices of equal size``."""


@dataclass(frozen=True)
class MiniBatchPlan:
    """Where every row goes. Rows ``0 .. real_rows - 1`` are the batch's, the rest the no-op rows to add."""

    order: list[int]
    """The rows in their new order: rank by rank, each rank's rows mini-batch by mini-batch."""
    mini_batches: list[list[int]]
    """Per mini-batch, its rows (all ranks)."""
    ranks: list[list[int]]
    """Per data-parallel rank, its rows."""
    real_rows: int
    rows_per_mini_batch: int
    """Rows of one mini-batch, all ranks together: the workers' ``mini_batch_size``."""
    largest_episode: int
    """Rows of the episode with the most rows."""

    @property
    def total_rows(self) -> int:
        return len(self.order)

    @property
    def padding(self) -> int:
        return self.total_rows - self.real_rows


def episode_of(key: str) -> tuple[str, str]:
    """(prompt group, episode) of a V1 TransferQueue key ``{uid}_{session}_{index}`` (one key per output of an
    agent loop: session = the sample, index = the output); a key of another shape is an episode of its own."""
    parts = str(key).rsplit("_", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], f"{parts[0]}_{parts[1]}"
    return str(key), str(key)


def plan_mini_batches(
    keys: Sequence[str],
    seq_lens: Sequence[int],
    *,
    groups_per_mini_batch: int,
    dp_size: int,
    pad_seq_len: int,
    balance: Balance,
    shuffle_seed: int | None = None,
) -> MiniBatchPlan:
    """Mini-batches of ``groups_per_mini_batch`` whole prompt groups (the last may hold fewer), each spread over
    ``dp_size`` ranks by ``balance`` and filled with no-op rows of ``pad_seq_len`` tokens up to the largest
    one's rows per rank (module doc)."""
    if groups_per_mini_batch < 1 or dp_size < 1:
        raise ValueError(f"groups_per_mini_batch ({groups_per_mini_batch}) and dp_size ({dp_size}) must be >= 1")
    if len(keys) != len(seq_lens) or not keys:
        raise ValueError(f"{len(keys)} keys and {len(seq_lens)} sequence lengths: need one per row, at least one")
    groups: dict[str, list[int]] = {}
    episodes: dict[str, int] = {}
    for row, key in enumerate(keys):
        group, episode = episode_of(key)
        groups.setdefault(group, []).append(row)
        episodes[episode] = episodes.get(episode, 0) + 1
    names = list(groups)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(names)
    chunks = [
        [row for name in names[start : start + groups_per_mini_batch] for row in groups[name]]
        for start in range(0, len(names), groups_per_mini_batch)
    ]
    per_rank = max(math.ceil(len(chunk) / dp_size) for chunk in chunks)
    lens = [int(n) for n in seq_lens]
    cells: list[list[list[int]]] = []  # [mini-batch][rank] -> rows
    for chunk in chunks:
        pads = list(range(len(lens), len(lens) + per_rank * dp_size - len(chunk)))
        lens += [pad_seq_len] * len(pads)
        members = chunk + pads
        parts = balance([lens[row] for row in members], dp_size) if dp_size > 1 else [list(range(len(members)))]
        if len(parts) != dp_size or any(len(part) != per_rank for part in parts):
            raise RuntimeError(f"balancing {len(members)} rows over {dp_size} ranks gave parts of "
                               f"{[len(p) for p in parts]} rows, not {per_rank} each")  # fmt: skip
        cells.append([sorted(members[i] for i in part) for part in parts])
    ranks = [[row for cell in cells for row in cell[rank]] for rank in range(dp_size)]
    return MiniBatchPlan(
        order=[row for rank_rows in ranks for row in rank_rows],
        mini_batches=[[row for part in cell for row in part] for cell in cells],
        ranks=ranks,
        real_rows=len(keys),
        rows_per_mini_batch=per_rank * dp_size,
        largest_episode=max(episodes.values()),
    )


# -- the adapter into verl's V1 trainer -------------------------------------------------------------------
class _PinnedInfo(dict):  # type: ignore[type-arg]
    """A batch's ``extra_info`` whose pinned entries outlive verl's ``batch.extra_info.update(...)`` (what
    ``_update_actor`` / ``_update_critic`` do right before they call the workers)."""

    def __init__(self, base: dict[str, Any] | None, pinned: dict[str, Any]) -> None:
        super().__init__(base or {})
        self.pinned = dict(pinned)
        super().update(self.pinned)

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super().update(*args, **kwargs)
        super().update(self.pinned)

    def __reduce__(self) -> tuple[Any, ...]:  # copies (KVBatchMeta.chunk) and Ray's pickling: a plain dict
        return dict, (dict(self),)


def _verl_balance(lens: list[int], k: int) -> list[list[int]]:
    import torch
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions

    workloads = calculate_workload(torch.tensor(lens, dtype=torch.int64)).tolist()
    return get_seqlen_balanced_partitions(workloads, k_partitions=k, equal_size=True)


def _dp_size(trainer: Any) -> int:
    """The actor's data-parallel size, read as verl's ``_balance_batch`` reads it."""
    group = trainer.actor_rollout_wg
    if "actor" not in group._dispatch_info:
        group._dispatch_info["actor"] = group._query_dispatch_info("actor")
    return max(group._dispatch_info["actor"]) + 1


def balance_episodes(trainer: Any, batch: Any, metrics: dict[str, Any], logging_prefix: str = "global_seqlen") -> Any:
    """What replaces ``PPOTrainer._balance_batch``: the batch padded and ordered by :func:`plan_mini_batches`."""
    from verl.trainer.ppo.padding_utils import SYNTHETIC_PADDING_SEQ_LEN, upsample_batch_to_divisible_size
    from verl.utils.seqlen_balancing import log_seqlen_unbalance

    config = trainer.config
    actor = config.actor_rollout_ref.actor
    mini = int(actor.ppo_mini_batch_size)
    if trainer.use_critic and int(config.critic.ppo_mini_batch_size) != mini:
        raise ValueError(f"critic.ppo_mini_batch_size ({config.critic.ppo_mini_batch_size}) differs from the actor's "
                         f"({mini}): agentboost cuts one set of episode-aligned mini-batches for both")  # fmt: skip
    shuffle = bool(actor.get("shuffle", False))
    seed = int(actor.get("data_loader_seed", 0) or 0) + int(trainer.global_steps) if shuffle else None
    plan = plan_mini_batches(
        batch.keys, [int(tag["seq_len"]) for tag in batch.tags], groups_per_mini_batch=mini,
        dp_size=_dp_size(trainer), pad_seq_len=SYNTHETIC_PADDING_SEQ_LEN, balance=_verl_balance, shuffle_seed=seed,
    )  # fmt: skip
    if plan.largest_episode > 1 and str(actor.loss_agg_mode) == SPLIT_UNSAFE_LOSS_AGG:
        raise ValueError(
            f"actor.loss_agg_mode={SPLIT_UNSAFE_LOSS_AGG} gives every row (trajectory) the same weight: this batch "
            f"holds an episode of {plan.largest_episode} trajectories, which would weigh {plan.largest_episode} "
            "times an episode of one. Use token-mean (the launch scripts'), token-sum or seq-mean-token-sum(-norm)"
        )
    padded = upsample_batch_to_divisible_size(batch, plan.total_rows, trainer.tokenizer.eos_token_id)
    lens = [int(tag["seq_len"]) for tag in padded.tags]
    if len(padded) != plan.total_rows or any(n != SYNTHETIC_PADDING_SEQ_LEN for n in lens[plan.real_rows :]):
        raise RuntimeError(
            f"verl padded {len(batch)} rows to {len(padded)} (planned {plan.total_rows}, no-op rows of "
            f"{SYNTHETIC_PADDING_SEQ_LEN} tokens): not the verl agentboost was written for"
        )
    metrics.update(log_seqlen_unbalance(seqlen_list=lens, partitions=plan.ranks, prefix=logging_prefix))
    padded.reorder(plan.order)
    metrics[METRIC_ROWS] = plan.total_rows
    metrics[METRIC_PADDING] = plan.padding
    setattr(trainer, _PLAN, (list(padded.keys), plan))
    return padded


def _pinned_update(original: Callable[..., Any], role: str) -> Callable[..., Any]:
    def update(self: Any, batch: Any, metrics: dict[str, Any]) -> Any:
        keys, plan = getattr(self, _PLAN, (None, None))
        if plan is None or list(batch.keys) != keys:
            raise RuntimeError(f"agentboost: the batch reached _update_{role} without the episode-aligned mini-batch "
                               "layout of _balance_batch (a verl that steps otherwise than 0.9.1)")  # fmt: skip
        base = batch.extra_info
        batch.extra_info = _PinnedInfo(base, {"mini_batch_size": plan.rows_per_mini_batch,
                                              "dataloader_kwargs": {"shuffle": False}})  # fmt: skip
        try:
            result = original(self, batch, metrics)
        finally:
            batch.extra_info = dict(batch.extra_info)
        if role == "actor":
            epochs = int(self.config.actor_rollout_ref.actor.ppo_epochs)
            metrics[METRIC_STEPS] = len(plan.mini_batches) * epochs
        return result

    update.__name__ = update.__qualname__ = f"_update_{role}"
    update.__wrapped__ = original  # type: ignore[attr-defined]
    return update


def install(trainer_cls: Any = None) -> bool:
    """Give verl's V1 ``PPOTrainer`` episode-aligned mini-batches (module doc). Idempotent; returns whether it
    installed now. ``trainer_cls`` defaults to the installed ``verl.trainer.ppo.v1.trainer_base.PPOTrainer``; a
    verl without the V1 trainer is left alone, one without the three methods is refused."""
    if trainer_cls is None:
        try:
            from verl.trainer.ppo.v1.trainer_base import PPOTrainer as trainer_cls
        except ImportError:  # a verl without the V1 trainer: nothing to adapt
            return False
    names = ("_balance_batch", "_update_actor", "_update_critic")
    missing = [name for name in names if not callable(getattr(trainer_cls, name, None))]
    if missing:
        raise RuntimeError(f"verl's V1 PPOTrainer has no {', '.join(missing)}: this verl is not one agentboost was "
                           "written against (verl 0.9.1)")  # fmt: skip
    if getattr(trainer_cls._balance_batch, _MARK, False):
        return False

    def _balance_batch(self: Any, batch: Any, metrics: dict[str, Any], logging_prefix: str = "global_seqlen",
                       keep_minibatch: bool = False) -> Any:  # fmt: skip
        return balance_episodes(self, batch, metrics, logging_prefix)

    _balance_batch.__wrapped__ = trainer_cls._balance_batch  # type: ignore[attr-defined]
    updates = {name: _pinned_update(getattr(trainer_cls, name), name.rsplit("_", 1)[1]) for name in names[1:]}
    for function in (_balance_batch, *updates.values()):
        setattr(function, _MARK, True)
    trainer_cls._balance_batch = _balance_batch
    for name, function in updates.items():
        setattr(trainer_cls, name, function)
    logger.info("agentboost: verl's V1 trainer cuts mini-batches of whole episodes")
    return True
