"""Training on episodes of several trajectories: every trajectory of an episode gets the episode's GRPO
advantage (computed over the episodes of its group, not over rows), the loss weighs an episode by its
model tokens however it is split, role rewards give an agent its own advantage, and the rLLM route
refuses such episodes clearly."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

import pytest
from strands.hooks import AfterModelCallEvent

torch = pytest.importorskip("torch")

from agentboost.batch import episodes_to_batch, row_advantages  # noqa: E402
from agentboost.episode import Episode, ModelCall, Segment, SegmentKind, TrajectoryInfo, token_digest  # noqa: E402
from agentboost.train import trainer as trainer_module  # noqa: E402
from agentboost.train.grpo import policy_loss  # noqa: E402
from agentboost.train.trainer import GRPOTrainer, TrainConfig  # noqa: E402
from agentboost.types import Termination  # noqa: E402

VOCAB = 64


def make_episode(
    episode_id: str, group: str, reward: float, shapes: list[list[tuple[int, int]]], *, agents: list[str] | None = None,
    masked: bool = False, seed: int = 0,
) -> Episode:  # fmt: skip
    """An episode whose trajectory ``t`` has calls of (new prompt tokens, response tokens) ``shapes[t]``;
    the trajectories' calls interleave round-robin, as concurrent agents' would."""
    rng = random.Random(seed)
    episode = Episode(id=episode_id, termination=Termination.COMPLETED, reward=reward, masked=masked)
    episode.metadata["group_id"] = group
    contexts: dict[int, list[int]] = {}
    queues = [list(enumerate(calls)) for calls in shapes]
    while any(queues):
        for t, queue in enumerate(queues):
            if not queue:
                continue
            k, (n_new, n_out) = queue.pop(0)
            new = [rng.randrange(1, VOCAB) for _ in range(n_new)]
            out = [rng.randrange(1, VOCAB) for _ in range(n_out)]
            opening = k == 0
            context = contexts.setdefault(t, [])
            index = len(episode.calls)
            call = ModelCall(index, len(context) + n_new, n_new, n_out, 99, "stop", token_digest(context + new),
                             trajectory=len(episode.trajectory_info) if opening else _position(episode, t))  # fmt: skip
            info = TrajectoryInfo(agent=(agents or ["agent"] * len(shapes))[t]) if opening else None
            kind = SegmentKind.PROMPT if opening else SegmentKind.ENV
            if opening:
                episode.metadata.setdefault("order", []).append(t)
            episode.commit_call(info, Segment(kind, new, index),
                                Segment(SegmentKind.MODEL, out, index, [-0.5] * n_out), call)  # fmt: skip
            context.extend(new + out)
    episode.check_invariants()
    return episode


def _position(episode: Episode, t: int) -> int:
    return episode.metadata["order"].index(t)


def formula(episodes: list[Episode], eps: float = 1e-6) -> dict[str, float]:
    """GRPO advantage of each episode: (r - mean) / (std + eps) over the unmasked episodes of its group;
    0 when masked or alone."""
    groups: dict[str, list[Episode]] = {}
    for e in episodes:
        if not e.masked:
            groups.setdefault(e.metadata["group_id"], []).append(e)
    out = {e.id: 0.0 for e in episodes}
    for members in groups.values():
        if len(members) < 2:
            continue
        rewards = torch.tensor([e.reward for e in members])
        std = rewards.std(unbiased=True)
        for e, r in zip(members, rewards, strict=True):
            out[e.id] = float((r - rewards.mean()) / (std + eps))
    return out


@pytest.fixture
def episodes() -> list[Episode]:
    return [
        make_episode("a0", "A", 1.0, [[(5, 3), (2, 4)], [(6, 2)]], seed=1),
        make_episode("a1", "A", 0.0, [[(5, 6)]], seed=2),
        make_episode("a2", "A", 1.0, [[(4, 2)], [(7, 3), (1, 2)], [(3, 5)]], seed=3),
        make_episode("a3", "A", 0.0, [[(5, 4), (3, 3)]], seed=4),
        make_episode("b0", "B", 1.0, [[(5, 3)], [(8, 2)]], seed=5),
        make_episode("b1", "B", 0.0, [[(5, 7)]], seed=6),
        make_episode("b2", "B", 1.0, [[(5, 2)], [(4, 4)]], masked=True, seed=7),  # out of B's baseline
        make_episode("c0", "C", 1.0, [[(5, 3)], [(2, 2)]], seed=8),  # alone: no baseline
    ]


def test_rows_are_trajectories_and_advantages_are_the_episodes(episodes) -> None:
    batch = episodes_to_batch(episodes, pad_token_id=0)
    assert len(batch) == sum(e.num_trajectories for e in episodes) == 14
    expected = formula(episodes)
    advantages = row_advantages(batch)
    for i, e_index in enumerate(batch.row_episode):
        episode = episodes[e_index]
        assert advantages[i].item() == pytest.approx(expected[episode.id], abs=1e-6)
        trajectory = episode.trajectories[batch.row_trajectory[i]]
        real = int(batch.attention_mask[i, batch.prompt_length :].sum())
        assert batch.responses[i, :real].tolist() == trajectory.response_ids
        assert batch.response_mask[i, :real].tolist() == ([0] * real if episode.masked else trajectory.response_mask)
    # An episode counts once in its group: with rows as members, a0 (2 rows) and a2 (3 rows) would
    # outweigh a1 and a3 and the advantages would differ.
    naive = torch.tensor([episodes[e].reward for e in batch.row_episode])
    from agentboost.train.grpo import group_advantages

    per_row = group_advantages(naive, batch.group_ids, batch.masked)
    assert not torch.allclose(per_row, advantages)


def test_the_trainers_per_token_advantages_equal_the_formula(episodes, tmp_path, monkeypatch) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=128,
        )
    )
    template = SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0))
    config = TrainConfig(run_dir=str(tmp_path), wandb_project=None, logprob_gap_alarm=None, minibatches=1,
                         ppo_epochs=1, micro_batch_tokens=None)  # fmt: skip
    trainer = GRPOTrainer(model, template, [{"prompt": "x"}], config=config)  # type: ignore[arg-type]
    seen: dict[str, Any] = {}
    real_select, real_loss = trainer_module.select_rows, trainer_module.policy_loss

    def select(batch, idx):
        seen.setdefault("batch", batch)
        seen["rows"] = list(idx)
        return real_select(batch, idx)

    def loss(new, old, adv, mask, **kwargs):
        seen["per_token"] = (adv.unsqueeze(-1) * mask).detach().cpu()
        return real_loss(new, old, adv, mask, **kwargs)

    monkeypatch.setattr(trainer_module, "select_rows", select)
    monkeypatch.setattr(trainer_module, "policy_loss", loss)
    metrics = trainer.update(episodes)
    assert metrics["skipped_update"] == 0.0
    expected = formula(episodes)
    batch, rows, per_token = seen["batch"], seen["rows"], seen["per_token"]
    assert sorted(rows) == list(range(14))
    for position, i in enumerate(rows):
        episode = episodes[batch.row_episode[i]]
        trajectory = episode.trajectories[batch.row_trajectory[i]]
        want = [0.0 if episode.masked else expected[episode.id] * bit for bit in trajectory.response_mask]
        got = per_token[position, : len(want)].tolist()
        assert got == pytest.approx(want, abs=1e-6), (episode.id, trajectory.index)
        assert not any(per_token[position, len(want) :].tolist())


def test_splitting_an_episode_into_trajectories_leaves_its_weight_in_the_loss() -> None:
    """The loss is the token-mean over every model token of the batch: an episode weighs its model tokens,
    whether they are one row or several (the choice stated in docs/multi-agent.md)."""
    torch.manual_seed(0)
    new = torch.randn(1, 10)
    old = new + 0.1 * torch.randn(1, 10)
    adv = torch.tensor([0.7])
    mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1, 1, 0]])
    whole, _ = policy_loss(new, old, adv, mask)
    split, _ = policy_loss(  # the same tokens as two rows (two trajectories of the episode)
        torch.cat([new[:, :5], new[:, 5:]]), torch.cat([old[:, :5], old[:, 5:]]), adv.repeat(2),
        torch.cat([mask[:, :5], mask[:, 5:]]),
    )  # fmt: skip
    assert split.item() == pytest.approx(whole.item(), abs=1e-7)
    # ... and next to another episode, an episode of three trajectories weighs as one of one trajectory
    # with the same number of model tokens.
    a = make_episode("many", "G", 1.0, [[(3, 4)], [(2, 4)], [(2, 4)]])
    b = make_episode("one", "G", 0.0, [[(3, 12)]])
    batch = episodes_to_batch([a, b], pad_token_id=0)
    weight = {e.id: 0 for e in (a, b)}
    for i, e in enumerate(batch.row_episode):
        weight[[a, b][e].id] += int(batch.response_mask[i].sum())
    assert weight["many"] == weight["one"] == 12


def test_role_rewards_give_each_agent_its_own_advantage() -> None:
    group = [
        make_episode(f"e{k}", "G", reward, [[(4, 3)], [(4, 3)]], agents=["planner", "solver"], seed=k)
        for k, reward in enumerate([1.0, 0.0, 1.0, 0.0])
    ]
    for episode, planner in zip(group, [0.0, 1.0, 1.0, 1.0], strict=True):
        episode.role_rewards = {"planner": planner}
    batch = episodes_to_batch(group, pad_token_id=0)
    advantages = row_advantages(batch)
    solver = {group[e].id: float(a) for a, e, agent in zip(advantages, batch.row_episode, batch.row_agent,
                                                             strict=True) if agent == "solver"}  # fmt: skip
    planner = {group[e].id: float(a) for a, e, agent in zip(advantages, batch.row_episode, batch.row_agent,
                                                              strict=True) if agent == "planner"}  # fmt: skip
    assert solver["e0"] > 0 > solver["e1"]  # the episode's reward
    assert planner["e0"] < 0 < planner["e1"]  # the planner's own
    assert batch.rewards.tolist() == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]


def test_the_rllm_route_keeps_multi_trajectory_episodes_as_masked_rows_that_say_why(qwen25_template) -> None:
    from strands import Agent

    from agentboost.agents.strands_agent import StrandsAgent
    from agentboost.backends.scripted import ScriptedBackend, text_script
    from agentboost.environments.strands_env import StrandsEnv
    from agentboost.integration.rollouts import run_batch
    from agentboost.rollout import RolloutSettings

    retried: list[bool] = []

    def retry_once(event: AfterModelCallEvent) -> None:  # a completed call retried: two trajectories
        if event.stop_response is not None and not retried:
            retried.append(True)
            event.retry = True

    def factory(*, model, tools, task, **defaults):
        return Agent(model=model, tools=tools, hooks=[retry_once], **defaults)

    envs = [StrandsEnv({"prompt": "q", "task_id": "t"}, tools=[], reward_fn=lambda t, e: 1.0) for _ in range(2)]
    agents = [StrandsAgent(factory) for _ in range(2)]
    backend = ScriptedBackend(text_script(qwen25_template, ["a", "b", "c"]))
    episodes = asyncio.run(
        run_batch(envs, agents, backend, qwen25_template, RolloutSettings(), group_size=2, concurrency=1)
    )
    refused = [e for e in episodes if "rLLM route trains one trajectory" in e.termination_detail]
    assert len(refused) == 1
    episode = refused[0]
    assert episode.termination is Termination.INFRA_ERROR and episode.masked and not episode.segments
    assert len(episode.metadata["refused_trajectories"]) == 2 and episode.messages
    batch = episodes_to_batch(episodes, pad_token_id=0)
    assert len(batch) == 2  # one row per task sample, as rLLM's trainer needs
