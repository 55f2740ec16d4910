"""Mini-batches of whole episodes for verl 0.9's V1 trainer (agentboost.integration.verl_minibatch): the layout
verl's workers then cut, read back the way they cut it (contiguous chunk per data-parallel rank, contiguous
mini-batches within it), and the adapter's wiring into a trainer class. verl's real trainer runs it in
tests/test_verl_cpu_e2e.py (the multi-trajectory run)."""

from __future__ import annotations

import copy
import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from agentboost.integration import verl_minibatch
from agentboost.integration.verl_minibatch import MiniBatchPlan, _PinnedInfo, episode_of, plan_mini_batches

PAD = 128


def balance(lens: list[int], k: int) -> list[list[int]]:
    """Equal-size parts, longest rows dealt first to the lightest part (what verl's balancing aims at)."""
    parts: list[list[int]] = [[] for _ in range(k)]
    size = len(lens) // k
    for i in sorted(range(len(lens)), key=lambda i: -lens[i]):
        open_parts = [p for p in parts if len(p) < size]
        min(open_parts, key=lambda p: sum(lens[j] for j in p)).append(i)
    return parts


def keys_of(rows_per_episode: dict[str, list[int]]) -> list[str]:
    """``{uid: [rows of session 0, rows of session 1, ...]}`` -> V1 keys, group by group."""
    return [f"{uid}_{s}_{i}" for uid, sessions in rows_per_episode.items() for s, n in enumerate(sessions)
            for i in range(n)]  # fmt: skip


def as_verl_cuts_it(plan: MiniBatchPlan, dp: int) -> list[set[int]]:
    """The global mini-batches verl's workers train: rank r gets the r-th contiguous chunk of the ordered batch
    (``KVBatchMeta.chunk``) and cuts it into contiguous mini-batches of rows_per_mini_batch / dp rows
    (``make_iterator``, no shuffle)."""
    per_rank = plan.total_rows // dp
    local = plan.rows_per_mini_batch // dp
    chunks = [plan.order[r * per_rank : (r + 1) * per_rank] for r in range(dp)]
    return [{row for chunk in chunks for row in chunk[k * local : (k + 1) * local]}
            for k in range(per_rank // local)]  # fmt: skip


def test_one_mini_batch_holds_the_whole_batch_whatever_the_trajectories() -> None:
    # 2 prompts x 4 samples, episodes of 1 and 3 trajectories: 14 rows, MINI = TRAIN = 2 prompts
    keys = keys_of({"u": [1, 3, 1, 3], "v": [3, 1, 1, 1]})
    plan = plan_mini_batches(keys, [40 + i for i in range(len(keys))], groups_per_mini_batch=2, dp_size=1,
                             pad_seq_len=PAD, balance=balance)  # fmt: skip
    assert plan.real_rows == plan.total_rows == 14 and plan.padding == 0
    assert plan.order == list(range(14)) and plan.rows_per_mini_batch == 14  # one optimizer step, nothing moved
    assert plan.largest_episode == 3
    assert as_verl_cuts_it(plan, 1) == [set(range(14))]


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_mini_batches_are_whole_prompt_groups_on_every_rank(dp: int) -> None:
    # 4 prompts, MINI = 2 prompts: 2 mini-batches (optimizer steps), each two whole groups, however many rows
    shape = {"a": [1, 3, 1, 1], "b": [3, 3, 3, 1], "c": [1, 1, 1, 1], "d": [2, 1, 1, 10]}
    keys = keys_of(shape)
    lens = [50 + 7 * i for i in range(len(keys))]
    plan = plan_mini_batches(keys, lens, groups_per_mini_batch=2, dp_size=dp, pad_seq_len=PAD, balance=balance)
    rows_of = {uid: {i for i, k in enumerate(keys) if episode_of(k)[0] == uid} for uid in shape}
    cut = as_verl_cuts_it(plan, dp)
    assert len(cut) == len(plan.mini_batches) == 2
    real = [{row for row in rows if row < plan.real_rows} for rows in cut]
    assert real == [rows_of["a"] | rows_of["b"], rows_of["c"] | rows_of["d"]]
    assert [set(m) for m in plan.mini_batches] == cut
    # every rank the same number of rows per mini-batch (what verl's dispatch and iterator require), the
    # no-op rows only where a mini-batch has fewer rows than the largest one
    assert plan.total_rows == 2 * plan.rows_per_mini_batch and plan.rows_per_mini_batch % dp == 0
    assert sorted(plan.order) == list(range(plan.total_rows))
    largest = max(len(rows_of["a"] | rows_of["b"]), len(rows_of["c"] | rows_of["d"]))
    assert plan.rows_per_mini_batch == -(-largest // dp) * dp
    assert [len(rank) for rank in plan.ranks] == [plan.total_rows // dp] * dp


def test_shuffle_moves_whole_groups_only() -> None:
    shape = {g: [1, 3] for g in "abcdef"}
    keys = keys_of(shape)
    plans = [plan_mini_batches(keys, [60] * len(keys), groups_per_mini_batch=2, dp_size=1, pad_seq_len=PAD,
                               balance=balance, shuffle_seed=seed) for seed in range(6)]  # fmt: skip
    assert len({tuple(p.order) for p in plans}) > 1  # the seed reorders ...
    for plan in plans:
        for mini in plan.mini_batches:  # ... groups, never splitting one
            groups = {episode_of(keys[row])[0] for row in mini if row < plan.real_rows}
            assert len(groups) == 2 and len(mini) == 8


def test_keys_that_are_not_v1_keys_are_episodes_of_their_own() -> None:
    assert episode_of("9f1c-aa_3_0") == ("9f1c-aa", "9f1c-aa_3")
    assert episode_of("with_underscores_in_uid_2_11") == ("with_underscores_in_uid", "with_underscores_in_uid_2")
    assert episode_of("plain") == ("plain", "plain") and episode_of("a_b_c") == ("a_b_c", "a_b_c")
    plan = plan_mini_batches(["x", "y_0_0", "y_0_1"], [10, 10, 10], groups_per_mini_batch=1, dp_size=1,
                             pad_seq_len=PAD, balance=balance)  # fmt: skip
    assert [sorted(m) for m in plan.mini_batches] == [[0, 3], [1, 2]] and plan.padding == 1  # row 3: no-op
    with pytest.raises(ValueError, match="one per row"):
        plan_mini_batches([], [], groups_per_mini_batch=1, dp_size=1, pad_seq_len=PAD, balance=balance)
    with pytest.raises(RuntimeError, match="balancing"):
        plan_mini_batches(["a_0_0", "a_0_1"], [1, 2], groups_per_mini_batch=1, dp_size=2, pad_seq_len=PAD,
                          balance=lambda lens, k: [list(range(len(lens)))] + [[]] * (k - 1))  # fmt: skip


def test_pinned_entries_outlive_verls_update_and_travel_as_a_plain_dict() -> None:
    info = _PinnedInfo({"temperature": 1.0}, {"mini_batch_size": 14, "dataloader_kwargs": {"shuffle": False}})
    info.update({"mini_batch_size": 8, "global_batch_size": 8, "dataloader_kwargs": {"shuffle": True}})
    assert info["mini_batch_size"] == 14 and info["global_batch_size"] == 8 and info["temperature"] == 1.0
    assert info["dataloader_kwargs"] == {"shuffle": False}
    for copied in (copy.deepcopy(info), pickle.loads(pickle.dumps(info))):  # KVBatchMeta.chunk, Ray
        assert type(copied) is dict and copied == dict(info)


class FakeTrainer:
    """The three methods of verl 0.9.1's PPOTrainer the adapter wraps, with what their bodies do to the batch."""

    def __init__(self, mini: int = 2, n: int = 4, epochs: int = 1) -> None:
        actor = SimpleNamespace(ppo_mini_batch_size=mini, ppo_epochs=epochs)
        self.config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(actor=actor, rollout=SimpleNamespace(n=n)),
                                      critic=SimpleNamespace(ppo_mini_batch_size=mini))  # fmt: skip
        self.sent: list[dict[str, Any]] = []

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        raise AssertionError("replaced")

    def _update(self, batch: Any, mini: int) -> Any:
        rows = mini * self.config.actor_rollout_ref.rollout.n
        batch.extra_info.update({"global_batch_size": rows, "mini_batch_size": rows, "epochs": 1})
        self.sent.append(copy.deepcopy(batch.extra_info))  # what the dispatch sends the workers
        return batch

    def _update_actor(self, batch: Any, metrics: dict[str, Any]) -> Any:
        return self._update(batch, self.config.actor_rollout_ref.actor.ppo_mini_batch_size)

    def _update_critic(self, batch: Any, metrics: dict[str, Any]) -> Any:
        return self._update(batch, self.config.critic.ppo_mini_batch_size)


def test_install_wraps_the_trainer_once_and_pins_the_workers_mini_batch(monkeypatch) -> None:
    cls = type("Trainer", (FakeTrainer,), {})
    assert verl_minibatch.install(cls) is True and verl_minibatch.install(cls) is False
    plan = plan_mini_batches(keys_of({"u": [1, 3, 1, 3], "v": [1, 1, 1, 1]}), [30] * 12, groups_per_mini_batch=2,
                             dp_size=1, pad_seq_len=PAD, balance=balance)  # fmt: skip
    seen: list[Any] = []

    def balance_episodes(trainer, batch, metrics, logging_prefix="global_seqlen"):
        seen.append(logging_prefix)
        setattr(trainer, verl_minibatch._PLAN, (list(batch.keys), plan))
        return batch

    monkeypatch.setattr(verl_minibatch, "balance_episodes", balance_episodes)
    trainer = cls(epochs=2)
    batch = SimpleNamespace(keys=[f"k{i}" for i in range(12)], extra_info={"temperature": 1.0})
    metrics: dict[str, Any] = {}
    with pytest.raises(RuntimeError, match="without the episode-aligned"):
        trainer._update_actor(batch, metrics)
    assert trainer._balance_batch(batch, metrics) is batch and seen == ["global_seqlen"]
    trainer._update_critic(batch, metrics)
    trainer._update_actor(batch, metrics)
    for sent in trainer.sent:  # the whole batch in one mini-batch, not 2 x 4 rows
        assert sent["mini_batch_size"] == 12 and sent["global_batch_size"] == 8
        assert sent["dataloader_kwargs"] == {"shuffle": False} and sent["temperature"] == 1.0
    assert type(batch.extra_info) is dict
    assert metrics[verl_minibatch.METRIC_STEPS] == 2  # 1 mini-batch x 2 epochs
    batch.keys = batch.keys[::-1]  # a batch reordered after the layout is refused, not trained as planned
    with pytest.raises(RuntimeError, match="without the episode-aligned"):
        trainer._update_actor(batch, metrics)
    broken = type("Broken", (), {"_balance_batch": FakeTrainer._balance_batch})
    with pytest.raises(RuntimeError, match="_update_actor, _update_critic"):
        verl_minibatch.install(broken)


def test_the_cpu_runs_factory_mixes_episodes_of_one_and_three_trained_trajectories(qwen25_template) -> None:
    """agentboost.testing.agents.one_or_three_trajectories, which the verl CPU run trains on: alternate episodes
    of 1 and 3 trajectories, every one trained, whatever the model answers (here: cut by max_tokens)."""
    import asyncio

    from agentboost.agents.strands_agent import StrandsAgent
    from agentboost.backends.scripted import ScriptedBackend, text_script
    from agentboost.batch import episode_rows
    from agentboost.environments.strands_env import StrandsEnv
    from agentboost.rollout import RolloutSettings, run_episode
    from agentboost.testing.agents import one_or_three_trajectories
    from agentboost.types import Budget, Termination

    settings = RolloutSettings(budget=Budget(max_turns=3, max_response_tokens=4))
    episodes = []
    for _ in range(2):
        backend = ScriptedBackend(text_script(qwen25_template, ["one two three four five six"] * 3, eot=False))
        env = StrandsEnv(task={"prompt": "What is 2 + 2?"}, tools=[], reward_fn=lambda task, episode: 0.5)
        agent = StrandsAgent(one_or_three_trajectories)
        episodes.append(asyncio.run(run_episode(env, agent, backend, qwen25_template, settings)))
    assert sorted(e.num_trajectories for e in episodes) == [1, 3]
    three = max(episodes, key=lambda e: e.num_trajectories)
    assert [i.opened_by for i in three.trajectory_info] == ["start", "new_agent", "new_agent"]
    assert all(i.trained for i in three.trajectory_info) and len(episode_rows(three)) == 3
    assert all(e.termination == Termination.MAX_TOKENS and not e.masked for e in episodes)


def _verl_version() -> str:
    import importlib.util

    if importlib.util.find_spec("verl") is None:
        return ""
    import verl

    return str(verl.__version__)


@pytest.mark.skipif(not _verl_version().startswith("0.9."), reason="needs verl 0.9 (its own environment)")
def test_verls_own_padding_balancing_and_update_carry_the_plan(monkeypatch) -> None:
    """On verl 0.9.1's own code: its no-op rows (padding_utils, TransferQueue stood in), its balancing over 2
    ranks, KVBatchMeta's reorder and chunk, and PPOTrainer._update_actor's body: the workers get mini-batches
    of whole prompt groups, as many as TRAIN / MINI."""
    import torch
    from omegaconf import OmegaConf
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo import padding_utils
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    shape = {"a": [1, 3, 1, 1], "b": [3, 1, 1, 1], "c": [1, 1, 1, 1], "d": [3, 3, 1, 3]}
    keys = keys_of(shape)
    put: list[Any] = []
    sample = {"prompts": torch.ones(5, dtype=torch.int64), "responses": torch.ones(3, dtype=torch.int64),
              "input_ids": torch.ones(8, dtype=torch.int64), "attention_mask": torch.ones(8, dtype=torch.int64),
              "position_ids": torch.arange(8), "response_mask": torch.ones(3, dtype=torch.int64)}  # fmt: skip
    monkeypatch.setattr(padding_utils, "tq", SimpleNamespace(kv_batch_get=lambda **kw: [dict(sample)],
                                                             kv_batch_put=lambda **kw: put.append(kw)))  # fmt: skip
    config = OmegaConf.create({
        "actor_rollout_ref": {
            "actor": {"ppo_mini_batch_size": 2, "ppo_epochs": 1, "shuffle": False, "data_loader_seed": 42,
                      "loss_agg_mode": "token-mean", "calculate_entropy": False, "entropy_coeff": 0.0},
            "rollout": {"n": 4, "temperature": 1.0},
        },
        "critic": {"ppo_mini_batch_size": 2},
    })  # fmt: skip
    sent: list[Any] = []

    def update_actor(batch: Any) -> dict[str, Any]:
        sent.append(batch)
        return {"metrics": {"mfu": 0.0, "pg_loss": [0.0]}}

    group = SimpleNamespace(_dispatch_info={"actor": [0, 1]}, update_actor=update_actor)
    trainer = SimpleNamespace(config=config, use_critic=False, global_steps=1, actor_rollout_wg=group,
                              tokenizer=SimpleNamespace(eos_token_id=7))  # fmt: skip
    batch = KVBatchMeta(keys=keys, tags=[{"seq_len": 40 + 3 * i} for i in range(len(keys))], partition_id="train")
    metrics: dict[str, Any] = {}
    padded = verl_minibatch.balance_episodes(trainer, batch, metrics)
    # a: 6 rows, b: 6, c: 4, d: 10 -> mini-batches {a, b} (12 rows) and {c, d} (14): 7 rows per rank each
    assert len(padded) == 28 and metrics[verl_minibatch.METRIC_PADDING] == 2 and len(put[0]["keys"]) == 2
    assert metrics["global_seqlen/balanced_max"] >= metrics["global_seqlen/balanced_min"] > 0
    original = getattr(PPOTrainer._update_actor, "__wrapped__", PPOTrainer._update_actor)
    verl_minibatch._pinned_update(original, "actor")(trainer, padded, metrics)
    [handed] = sent
    assert metrics[verl_minibatch.METRIC_STEPS] == 2
    rows = handed.extra_info["mini_batch_size"] // 2  # per rank
    mini_batches: list[set[str]] = [set(), set()]
    for chunk in handed.chunk(2):  # what each rank gets, cut as its make_iterator cuts it
        assert chunk.extra_info["mini_batch_size"] == 14 and chunk.extra_info["dataloader_kwargs"]["shuffle"] is False
        for k in range(2):
            mini_batches[k] |= {episode_of(key)[0] for key in chunk.keys[k * rows : (k + 1) * rows]}
    assert [m - {put[0]["keys"][0].rsplit("_", 2)[0]} for m in mini_batches] == [{"a", "b"}, {"c", "d"}]
