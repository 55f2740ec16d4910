"""``--sft-data``: which episodes a warm start trains on, and how.

* this model's successful rollouts (its tokenizer, its template) are used as they are, token for token;
* another tokenizer's rollouts and a frontier model's episodes (no tokens) are rendered through this model's
  chat template, replayed through the environment and agent, and marked as distillation data;
* failed episodes and episodes of held-out tasks are never trained on; every drop is counted;
* distillation episodes are warm-start rows only: no GRPO batch ever holds one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentboost.agents.strands_agent import StrandsAgent  # noqa: E402
from agentboost.chat.template import ChatTemplate  # noqa: E402
from agentboost.cli.main import main  # noqa: E402
from agentboost.environments.arithmetic import SYSTEM_PROMPT, make_tasks  # noqa: E402
from agentboost.episode import Episode, SegmentKind  # noqa: E402
from agentboost.train.sft_data import DISTILLATION, assistant_turn_ids, build_sft_data, read_episodes  # noqa: E402
from agentboost.types import Budget  # noqa: E402

from .tiny_model_dir import save_tiny_model  # noqa: E402

ENV = "agentboost.environments.arithmetic:ArithmeticEnv"
INSTANT = "py:agentboost.testing.instant:instant_backend"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def template(model_dir) -> ChatTemplate:
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True))


def _rollout(tmp_path: Path, name: str, tokenizer: str) -> tuple[Path, list[dict]]:
    """Instant-policy episodes (a correct calculator call, then the tool's number) of 4 arithmetic tasks."""
    out = tmp_path / name
    code = main(["rollout", "--example", "arithmetic", "--limit", "4", "--n", "2", "--backend", INSTANT,
                 "--tokenizer", tokenizer, "--out", str(out)])  # fmt: skip
    assert code == 0
    return out / "episodes.jsonl", make_tasks(4, seed=0, split="rollout")


def _build(paths, template, rows, eval_rows=()):
    return build_sft_data(
        [str(p) for p in paths], template=template, train_rows=list(rows), eval_rows=list(eval_rows), env=ENV,
        env_args={}, agent=StrandsAgent(system_prompt=SYSTEM_PROMPT), budget=Budget(max_turns=4, max_total_tokens=1024),
        max_tokens_per_call=96,
    )  # fmt: skip


def test_this_models_own_successful_rollouts_are_used_as_they_are(tmp_path, model_dir, template) -> None:
    path, rows = _rollout(tmp_path, "own", str(model_dir))
    data = _build([path], template, rows)
    assert data.sources["token_exact"] == 8 and data.sources["distilled"] == 0 and data.sources["dropped"] == {}
    originals = read_episodes([path])
    for used, original in zip(data.episodes, originals, strict=True):
        assert [s.token_ids for s in used.segments] == [s.token_ids for s in original.segments]
        assert used.metadata["sft_source"] == "token-exact" and DISTILLATION not in used.metadata


def test_other_tokenizers_episodes_are_replayed_through_this_models_template(tmp_path, template) -> None:
    path, rows = _rollout(tmp_path, "other", "offline:qwen2.5")  # the real Qwen2.5 vocabulary: other token ids
    data = _build([path], template, rows)
    assert data.sources["token_exact"] == 0 and data.sources["distilled"] == 8
    for episode, original in zip(data.episodes, read_episodes([path]), strict=True):
        episode.check_invariants()
        assert episode.metadata[DISTILLATION] == {"teacher": "instant", "source_episode": original.id}
        assert episode.reward == 1.0 and not episode.masked
        turns = [template.decode(s.token_ids) for s in episode.segments if s.kind is SegmentKind.MODEL]
        said = [m for m in original.messages if m["role"] == "assistant"]
        assert len(turns) == len(said) == 2
        assert turns[-1] == f"{original.final_text}<|im_end|>"  # the answer, closed by this template's end of turn
        call = said[0]["content"][0]["toolUse"]
        assert json.loads(turns[0].split("<tool_call>\n")[1].split("\n</tool_call>")[0]) == {
            "name": "calculator", "arguments": call["input"]}  # fmt: skip


def test_a_tool_call_is_written_as_the_template_writes_an_assistant_turn(template) -> None:
    message = {"role": "assistant", "content": [{"text": "Let me compute."},
               {"toolUse": {"toolUseId": "t1", "name": "calculator", "input": {"expression": "7*8"}}}]}  # fmt: skip
    text = template.decode(assistant_turn_ids(template, message))
    call = '{"name": "calculator", "arguments": {"expression": "7*8"}}'
    assert text == f"Let me compute.\n<tool_call>\n{call}\n</tool_call><|im_end|>"


def test_failed_and_held_out_episodes_are_never_trained_on(tmp_path, template) -> None:
    path, rows = _rollout(tmp_path, "mixed", "offline:qwen2.5")
    episodes = read_episodes([path])
    wrong = next(e for e in episodes if e.task_id == rows[1]["task_id"])
    wrong.reward, wrong.is_correct = 0.0, False  # a wrong answer to a training task
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(e.to_json() + "\n" for e in episodes))
    data = _build([mixed], template, rows[1:], eval_rows=rows[:1])  # task 0 is held out
    assert data.sources["dropped"] == {"held-out task": 2, "not successful": 1}
    assert data.sources["distilled"] == 5 and wrong.id not in {e.metadata[DISTILLATION]["source_episode"] for e in
                                                                 data.episodes}  # fmt: skip
    assert {e.task_id for e in data.episodes} == {r["task_id"] for r in rows[1:]}


def test_distilled_episodes_never_reach_a_grpo_batch(tmp_path, model_dir, monkeypatch, capsys) -> None:
    from agentboost.train.trainer import GRPOTrainer

    path, rows = _rollout(tmp_path, "teacher", "offline:qwen2.5")
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    batches: list[list[Episode]] = []
    update = GRPOTrainer.update
    monkeypatch.setattr(
        GRPOTrainer, "update", lambda self, episodes: batches.append(episodes) or update(self, episodes)
    )
    argv = ["train", "--data", str(data), "--env", ENV, "--model", str(model_dir), "--sft-data", str(path),
            "--steps", "2", "--prompts-per-step", "2", "--group-size", "2", "--max-tokens-per-call", "48",
            "--eval-fraction", "0", "--no-wandb", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["warm_start"]["sources"]["distilled"] == 8 and summary["warm_start"]["steps"] == 3
    assert len(batches) == 2 and all(len(b) == 4 for b in batches)
    assert not [e for b in batches for e in b if DISTILLATION in e.metadata or e.id.startswith("distilled:")]


def test_episodes_of_several_trajectories_are_used_as_they_are(tmp_path, model_dir, template) -> None:
    """A sliding-window agent's rollouts are two trajectories each (the final history no longer holds the
    calculator call): used token for token, every trajectory a warm-start row."""
    from agentboost.batch import episodes_to_batch

    out = tmp_path / "windowed"
    code = main(["rollout", "--example", "arithmetic", "--limit", "4", "--n", "2", "--backend", INSTANT,
                 "--tokenizer", str(model_dir), "--agent", "agentboost.environments.arithmetic:windowed_agent",
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    rows = make_tasks(4, seed=0, split="rollout")
    data = _build([out / "episodes.jsonl"], template, rows)
    assert data.sources["token_exact"] == 8 and data.sources["distilled"] == 0, data.sources
    assert all(e.num_trajectories == 2 for e in data.episodes)
    assert len(episodes_to_batch(data.episodes, pad_token_id=0)) == 16
