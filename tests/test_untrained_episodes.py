"""One rule on every route for an episode with no loss token (README "What is trained on: one masking rule"):
none of its trajectories trained (a re-sampled sibling's, aux calls with train_aux_calls off) or no model token
at all. It is out of its group's baseline and gets advantage 0 in the built-in trainer, on the rLLM route and
under verl's advantage hook alike; its record keeps its reward and termination. A step without any loss token
is warned about on both trainers."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from agentboost.batch import episodes_to_batch, row_advantages  # noqa: E402
from agentboost.integration import verl_advantage  # noqa: E402
from agentboost.integration.verl_batch import MASKED_KEY, episodes_to_verl  # noqa: E402
from agentboost.train.trainer import GRPOTrainer, TrainConfig  # noqa: E402

from .test_multi_trajectory_training import VOCAB, make_episode  # noqa: E402

# rewards [1, 0, 0, 1 (untrained)]: the untrained episode out of the baseline, as verl's hook always had it
EXPECTED = [1.1547, -0.5774, -0.5774, 0.0]


def untrained(episode):
    for info in episode.trajectory_info:
        info.trained = False
    return episode


@pytest.fixture
def group() -> list:
    return [
        make_episode("e0", "G", 1.0, [[(5, 3)]], seed=1),
        make_episode("e1", "G", 0.0, [[(5, 4)], [(2, 3)]], seed=2),
        make_episode("e2", "G", 0.0, [[(6, 2)]], seed=3),
        untrained(make_episode("e3", "G", 1.0, [[(5, 5)]], seed=4)),
    ]


def test_the_built_in_trainer_leaves_an_untrained_episode_out_of_its_groups_baseline(group) -> None:
    batch = episodes_to_batch(group, pad_token_id=0)
    advantages = row_advantages(batch)
    per_episode = {group[e].id: float(a) for a, e in zip(advantages, batch.row_episode, strict=True)}
    assert [per_episode[e.id] for e in group] == pytest.approx(EXPECTED, abs=1e-4)
    assert batch.episode_masked == [False, False, False, True] and batch.masked[-1]
    # the record is untouched: not a failure, its reward kept
    assert not group[3].masked and group[3].reward == 1.0
    # several trajectories, none trained: the same
    many = untrained(make_episode("e3", "G", 1.0, [[(5, 5)], [(3, 3)]], seed=4))
    again = row_advantages(episodes_to_batch([*group[:3], many], pad_token_id=0))
    assert again[:4].tolist() == pytest.approx([EXPECTED[0], EXPECTED[1], EXPECTED[1], EXPECTED[2]], abs=1e-4)


def per_row(advantages, mask) -> list[float]:
    return [float(row[m.bool()].mean()) if m.any() else 0.0 for row, m in zip(advantages, mask, strict=True)]


def test_verls_hook_and_the_rllm_route_apply_the_same_rule(group) -> None:
    batch = episodes_to_batch(group, pad_token_id=0)
    built_in = row_advantages(batch)
    # V1 trainer: keys {uid}_{session}_{output}, one session per episode (e1 is two outputs)
    keys = [f"G_{e}_{sum(1 for r in batch.row_episode[:i] if r == e)}" for i, e in enumerate(batch.row_episode)]
    v1 = verl_advantage.session_advantages(batch.token_level_scores, batch.response_mask, keys)
    assert per_row(v1, batch.response_mask) == pytest.approx(built_in.tolist(), abs=1e-4)
    # legacy trainer: one row per episode
    single = [group[0], make_episode("e1", "G", 0.0, [[(5, 4)]], seed=2), *group[2:]]
    batch = episodes_to_batch(single, pad_token_id=0)
    legacy, _ = verl_advantage.masked_grpo_advantage(batch.token_level_scores, batch.response_mask, ["G"] * 4)
    assert per_row(legacy, batch.response_mask) == pytest.approx(EXPECTED, abs=1e-4)
    assert row_advantages(batch).tolist() == pytest.approx(EXPECTED, abs=1e-4)
    # the rLLM route reads the batch's flag (isolated_masked_uids, zero_lone_survivors)
    _, non_tensors = episodes_to_verl(single, pad_token_id=0, max_prompt_length=16, max_response_length=16)
    assert non_tensors[MASKED_KEY].tolist() == batch.masked


def test_an_episode_without_a_model_token_is_out_too() -> None:
    from agentboost.episode import Episode
    from agentboost.types import Termination

    early = Episode(id="t", termination=Termination.TIMEOUT, reward=0.0)  # a policy timeout before its first call
    early.metadata["group_id"] = "G"
    episodes = [make_episode("a", "G", 1.0, [[(4, 3)]], seed=1), make_episode("b", "G", 0.0, [[(4, 3)]], seed=2),
                make_episode("c", "G", 1.0, [[(4, 3)]], seed=3), early]  # fmt: skip
    advantages = row_advantages(episodes_to_batch(episodes, pad_token_id=0))
    assert advantages.tolist() == pytest.approx([0.5774, -1.1547, 0.5774, 0.0], abs=1e-4)


def test_verls_hook_warns_when_a_batch_has_no_loss_token(caplog) -> None:
    rewards = torch.zeros(3, 4)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 1.0])
    mask = torch.zeros(3, 4)
    with caplog.at_level(logging.WARNING, logger=verl_advantage.__name__):
        verl_advantage.masked_grpo_advantage(rewards, mask, ["a", "a", "b"])
        verl_advantage.session_advantages(rewards, mask, ["a_0_0", "a_1_0", "b_0_0"])
    assert sum("no loss token" in r.getMessage() for r in caplog.records) == 2
    caplog.clear()
    mask[0, 0] = 1
    with caplog.at_level(logging.WARNING, logger=verl_advantage.__name__):
        verl_advantage.masked_grpo_advantage(rewards, mask, ["a", "a", "b"])
    assert not caplog.records


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_the_built_in_trainer_warns_about_a_step_without_a_loss_token(tmp_path, caplog, kl_coef: float) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    shape = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, max_position_embeddings=64, num_key_value_heads=1, **shape))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    template = SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0))
    config = TrainConfig(run_dir=str(tmp_path), wandb_project=None, logprob_gap_alarm=None, kl_coef=kl_coef,
                         micro_batch_tokens=None)  # fmt: skip
    trainer = GRPOTrainer(model, template, [{"prompt": "x"}], config=config)  # type: ignore[arg-type]
    episodes = [untrained(make_episode(f"e{k}", "G", float(k % 2), [[(4, 3)]], seed=k)) for k in range(4)]
    with caplog.at_level(logging.WARNING, logger="agentboost.train.trainer"):
        metrics = trainer.update(episodes)
    assert metrics["skipped_update"] == 1.0 and metrics["loss_tokens"] == 0
    assert any("no loss token" in r.getMessage() for r in caplog.records)
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())
