"""The episode record: views, the token invariant, lossless JSON."""

from __future__ import annotations

import copy
import math

import pytest

from agentboost.episode import Episode, ModelCall, Segment, SegmentKind, token_digest
from agentboost.types import Termination

from .helpers import add, calls_text, run


@pytest.fixture
def episode(qwen25_template) -> Episode:
    texts = [calls_text("hermes", [("add", {"a": 2, "b": 3})]), calls_text("hermes", [("mul", {"a": 5, "b": 4})]), "20"]
    ep, _ = run(qwen25_template, texts)
    assert ep.termination is Termination.COMPLETED
    return ep


def test_views(episode: Episode) -> None:
    kinds = [s.kind for s in episode.segments]
    assert kinds == [
        SegmentKind.PROMPT,
        SegmentKind.MODEL,
        SegmentKind.ENV,
        SegmentKind.MODEL,
        SegmentKind.ENV,
        SegmentKind.MODEL,
    ]
    assert episode.prompt_ids == episode.segments[0].token_ids
    assert len(episode.response_ids) == len(episode.response_mask) == len(episode.response_logprobs)
    pos = 0
    for seg in episode.segments[1:]:
        n = len(seg.token_ids)
        assert episode.response_ids[pos : pos + n] == seg.token_ids
        expected_mask = 1 if seg.kind is SegmentKind.MODEL else 0
        assert episode.response_mask[pos : pos + n] == [expected_mask] * n
        if seg.kind is SegmentKind.ENV:
            assert episode.response_logprobs[pos : pos + n] == [0.0] * n
        pos += n
    assert sum(episode.response_mask) == episode.num_model_tokens
    episode.masked = True
    assert sum(episode.response_mask) == 0


def test_json_round_trip_is_lossless(episode: Episode) -> None:
    episode.messages.append({"role": "user", "content": [{"image": {"source": {"bytes": b"\x89PNG\x00\xff"}}}]})
    episode.segments[1].logprobs[0] = -math.inf
    episode.reward_metrics = {"pass_rate": 0.25}
    again = Episode.from_json(episode.to_json())
    assert again.messages[-1]["content"][0]["image"]["source"]["bytes"] == b"\x89PNG\x00\xff"
    assert again.segments[1].logprobs[0] == -math.inf
    assert again.to_dict() == episode.to_dict()
    assert again.termination is episode.termination and again.tools == episode.tools
    assert again.response_ids == episode.response_ids and again.response_logprobs == episode.response_logprobs


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda e: e.segments[2].token_ids.__setitem__(0, 7), "differs from the prompt that was sent"),
        (lambda e: e.segments[0].token_ids.pop(), "were sent"),
        (lambda e: e.segments[1].token_ids.append(5), "differs from what the server returned|were sent"),
        (lambda e: setattr(e.segments[3], "logprobs", [0.0]), "misaligned"),
        (lambda e: e.segments.pop(), "call records"),
        (lambda e: e.segments.append(Segment(SegmentKind.ENV, [1, 2], 3)), "trailing env segment|call records"),
        (lambda e: e.segments.insert(2, Segment(SegmentKind.MODEL, [1], 1)), "expected env"),
        (lambda e: setattr(e.calls[1], "new_tokens", 1), "new prompt tokens"),
    ],
)
def test_invariant_detects_tampering(episode: Episode, tamper, message: str) -> None:
    episode.check_invariants()
    broken = copy.deepcopy(episode)
    tamper(broken)
    with pytest.raises(ValueError, match=message):
        broken.check_invariants()


def test_append_rules() -> None:
    ep = Episode(id="x")
    with pytest.raises(ValueError, match="first segment"):
        ep.append(Segment(SegmentKind.MODEL, [1], 0))
    ep.append(Segment(SegmentKind.PROMPT, [1, 2], 0))
    with pytest.raises(ValueError, match="only once"):
        ep.append(Segment(SegmentKind.PROMPT, [3], 0))
    with pytest.raises(ValueError, match="logprobs"):
        ep.append(Segment(SegmentKind.MODEL, [3, 4], 0, logprobs=[0.0]))
    with pytest.raises(ValueError, match="only model segments"):
        ep.append(Segment(SegmentKind.ENV, [3], 1, logprobs=[0.0]))


def test_hand_built_episode_checks() -> None:
    ep = Episode(id="manual")
    ep.append(Segment(SegmentKind.PROMPT, [1, 2, 3], 0))
    ep.append(Segment(SegmentKind.MODEL, [4, 5], 0, [-0.1, -0.2]))
    ep.calls.append(ModelCall(0, 3, 3, 2, 10, "stop", token_digest([1, 2, 3])))
    ep.check_invariants()
    assert ep.response_ids == [4, 5] and ep.response_logprobs == [-0.1, -0.2]


def test_tool_stats_and_summary(episode: Episode) -> None:
    assert episode.tools["add"].calls == 1 and episode.tools["mul"].calls == 1
    summary = episode.summary()
    assert summary["turns"] == 3 and summary["tool_calls"] == 2 and summary["termination"] == "completed"
    assert episode.final_text == "20"
    assert add.tool_name == "add"
