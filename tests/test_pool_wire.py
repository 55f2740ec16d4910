"""Episodes on the pool's wire: segments' numbers packed, everything else as JSON; a record that does
not unpack is refused (the pool turns it into that episode's infra_error)."""

from __future__ import annotations

import base64
import json
import math

import pytest

from agentboost.episode import Episode, ModelCall, Segment, SegmentKind, ToolStats
from agentboost.pool.wire import TO_POOL, FrameDecoder, encode, pack_episode, unpack_episode
from agentboost.types import Termination


def _episode() -> Episode:
    return Episode(
        id="e1",
        task_id="t1",
        segments=[
            Segment(SegmentKind.PROMPT, [151644, 8948, 0, 2**40], 0),
            Segment(SegmentKind.MODEL, [1, 2, 3], 0, [-0.0, -1e-300, -12.345678901234567]),
            Segment(SegmentKind.ENV, [7, 8], 1),
            Segment(SegmentKind.MODEL, [9], 1, None),
        ],
        calls=[ModelCall(0, 4, 4, 3, 48, "stop", "abc", latency_s=0.25, stop_reason=151645, tool_calls=1)],
        messages=[{"role": "user", "content": [{"text": "What is 7 * 8?"}, {"image": {"bytes": b"\x00\xff"}}]}],
        tools={"calculator": ToolStats(calls=1, total_time_s=0.5)},
        termination=Termination.COMPLETED,
        reward=1.0,
        timings={"wall_s": 1.5},
        metadata={"group_id": "g", "nested": {"a": [1, 2.5, None]}},
    )


def test_a_packed_episode_comes_back_identical() -> None:
    episode = _episode()
    [message] = FrameDecoder(TO_POOL).feed(encode(["done", episode.id, pack_episode(episode)]))
    back = unpack_episode(message[2])
    assert back.to_dict() == episode.to_dict()
    assert back.segments[1].logprobs == [-0.0, -1e-300, -12.345678901234567]
    assert math.copysign(1.0, back.segments[1].logprobs[0]) == -1.0  # bit-exact, not printed and re-parsed
    assert back.segments[3].logprobs is None and back.messages[0]["content"][1]["image"]["bytes"] == b"\x00\xff"


def test_packed_numbers_are_smaller_than_json_lists() -> None:
    episode = _episode()
    episode.segments[0].token_ids = list(range(100_000, 100_300))
    packed = json.dumps(pack_episode(episode)["segments"])
    plain = json.dumps(episode.to_dict()["segments"])
    assert "100000" not in packed and len(packed) < 1.5 * len(plain)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: d.update(segments="AAAA"),
        lambda d: d["segments"].__setitem__(0, 7),
        lambda d: d["segments"][0].update(token_ids="not base64!"),
        lambda d: d["segments"][0].update(token_ids=base64.b64encode(b"\x00" * 7).decode()),  # not whole int64s
        lambda d: d["segments"][0].update(token_ids=[1, 2, 3]),  # an unpacked list is not accepted either
        lambda d: d["segments"][1].update(logprobs=base64.b64encode(b"\x00" * 8).decode()),  # 1 log-prob, 3 tokens
        lambda d: d["segments"][0].update(kind="weird"),
    ],
)
def test_a_record_that_does_not_unpack_is_refused(corrupt) -> None:
    data = json.loads(json.dumps(pack_episode(_episode())))
    corrupt(data)
    with pytest.raises((ValueError, TypeError, KeyError)):
        unpack_episode(data)
