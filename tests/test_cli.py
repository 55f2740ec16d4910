"""``agentboost`` CLI on its embedded default (tiny local model, generated arithmetic tasks)."""

from __future__ import annotations

import json

import pytest

from agentboost.cli.main import main
from agentboost.episode import Episode


def test_rollout_embedded_default(tmp_path, capsys) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "run"
    assert main(["rollout", "--limit", "3", "--n", "2", "--max-tokens-per-call", "16", "--out", str(out)]) == 0
    episodes = [Episode.from_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 6
    for episode in episodes:
        episode.check_invariants()
        assert episode.calls and episode.calls[0].completion_tokens <= 16
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 6 and sum(summary["terminations"].values()) == 6
    assert "Rollout summary" in capsys.readouterr().out
    assert {e.task_id for e in episodes} == {f"arith-rollout-0-{i}" for i in range(3)}


def test_rollout_rejects_missing_data(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        main(["rollout", "--data", str(tmp_path / "missing.jsonl")])
