"""The episode record: an append-only token trajectory plus everything needed to train on it and to
explain it afterwards.

Token layout of one episode with ``k`` model calls::

    prompt | model_0 | env_1 | model_1 | ... | env_{k-1} | model_{k-1}

``prompt`` is the first call's rendered prompt; ``env_i`` is what call ``i`` sent beyond the previous
context (tool results, user turns, turn separators, the generation prompt); ``model_i`` is exactly
what the server returned for call ``i``. The response (what the trainer optimises) is everything after
``prompt``; its loss mask is 1 on model tokens and 0 on env tokens.

Invariant (checked on every episode, :meth:`Episode.check_invariants`): for every call, the tokens
before its model segment are exactly the prompt that call sent (length and digest recorded at send
time), and its model segment is exactly what came back.
"""

from __future__ import annotations

import base64
import hashlib
import json
from array import array
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .types import Termination


class SegmentKind(str, Enum):
    PROMPT = "prompt"
    MODEL = "model"
    ENV = "env"


def token_digest(token_ids: list[int] | array) -> str:
    """Stable digest of a token sequence (recorded per call, checked by the invariant)."""
    buf = token_ids if isinstance(token_ids, array) else array("q", token_ids)
    return hashlib.blake2b(buf.tobytes(), digest_size=16).hexdigest()


@dataclass
class Segment:
    kind: SegmentKind
    token_ids: list[int]
    call: int
    """Index of the model call this segment belongs to (an env segment precedes its call)."""
    logprobs: list[float] | None = None
    """Sampling log-probabilities, model segments only (None when the backend gave none)."""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "token_ids": self.token_ids, "call": self.call, "logprobs": self.logprobs}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Segment:
        return cls(SegmentKind(data["kind"]), list(data["token_ids"]), int(data["call"]), data.get("logprobs"))


@dataclass
class ModelCall:
    """One generation request of the episode, as sent and as answered."""

    index: int
    context_tokens: int
    """Length of the prompt sent (all tokens before this call's model segment)."""
    new_tokens: int
    """Tokens this call added beyond the previous context (its prompt or env segment)."""
    completion_tokens: int
    max_tokens: int
    finish_reason: str
    sent_digest: str
    latency_s: float = 0.0
    request_id: str = ""
    stop_reason: str | int | None = None
    server: str | None = None
    weight_version: str | int | None = None
    tool_calls: int = 0
    parse_errors: int = 0
    reasoning_unclosed: bool = False
    message_index: int = -1
    """Position of this call's assistant message in ``Episode.messages``."""


@dataclass
class ToolStats:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    truncated: int = 0
    total_time_s: float = 0.0


@dataclass
class Episode:
    """One rollout: token trajectory, messages, tool statistics, termination, reward, timings."""

    id: str
    task_id: str | None = None
    segments: list[Segment] = field(default_factory=list)
    calls: list[ModelCall] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: dict[str, ToolStats] = field(default_factory=dict)
    parse_errors: int = 0
    unknown_tool_calls: int = 0
    termination: Termination = Termination.INFRA_ERROR
    termination_detail: str = ""
    reward: float = 0.0
    reward_metrics: dict[str, float] = field(default_factory=dict)
    is_correct: bool | None = None
    masked: bool = False
    """When True the loss mask is all zero (failure episodes stay in the batch but carry no gradient)."""
    timings: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(
        cls,
        episode_id: str,
        termination: Termination,
        detail: str,
        *,
        task_id: str | None = None,
        timings: dict[str, float] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Episode:
        """The record of an episode that could not run, or whose runner died: no tokens, reward 0, masked."""
        episode = cls(id=episode_id, task_id=task_id, termination=termination, termination_detail=detail[:2000])
        episode.masked = True
        episode.timings = dict(timings or {})
        episode.metadata = {**(metadata or {}), "failed_before_rollout": True}
        return episode

    # -- building (append-only) -------------------------------------------------------------
    def append(self, segment: Segment) -> None:
        if segment.kind is SegmentKind.PROMPT and self.segments:
            raise ValueError("the prompt segment must come first and only once")
        if segment.kind is not SegmentKind.PROMPT and not self.segments:
            raise ValueError("the first segment must be the prompt")
        if segment.kind is SegmentKind.MODEL:
            if segment.logprobs is not None and len(segment.logprobs) != len(segment.token_ids):
                raise ValueError("model segment: logprobs and token_ids differ in length")
        elif segment.logprobs is not None:
            raise ValueError("only model segments carry logprobs")
        self.segments.append(segment)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    # -- flattened views ------------------------------------------------------------------
    @property
    def prompt_ids(self) -> list[int]:
        if not self.segments:
            return []
        return list(self.segments[0].token_ids)

    @property
    def response_ids(self) -> list[int]:
        out: list[int] = []
        for seg in self.segments[1:]:
            out.extend(seg.token_ids)
        return out

    @property
    def response_mask(self) -> list[int]:
        out: list[int] = []
        for seg in self.segments[1:]:
            bit = 1 if seg.kind is SegmentKind.MODEL and not self.masked else 0
            out.extend([bit] * len(seg.token_ids))
        return out

    @property
    def response_logprobs(self) -> list[float]:
        """Sampling log-probabilities aligned with ``response_ids`` (0.0 on env tokens and where the
        backend returned none)."""
        out: list[float] = []
        for seg in self.segments[1:]:
            if seg.kind is SegmentKind.MODEL and seg.logprobs is not None:
                out.extend(float(x) for x in seg.logprobs)
            else:
                out.extend([0.0] * len(seg.token_ids))
        return out

    @property
    def has_logprobs(self) -> bool:
        return all(s.logprobs is not None for s in self.segments if s.kind is SegmentKind.MODEL)

    @property
    def num_model_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.kind is SegmentKind.MODEL)

    @property
    def tool_calls(self) -> int:
        return sum(t.calls for t in self.tools.values())

    @property
    def tool_errors(self) -> int:
        return sum(t.errors for t in self.tools.values())

    @property
    def final_text(self) -> str:
        """The text of the last assistant message (reasoning excluded), '' if none."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return "".join(b["text"] for b in message.get("content", []) if isinstance(b, dict) and "text" in b)
        return ""

    # -- invariant ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise ``ValueError`` unless the segments are exactly what each call sent and received."""
        if not self.segments:
            if self.calls:
                raise ValueError("calls recorded but no token segments")
            return
        if self.segments[0].kind is not SegmentKind.PROMPT:
            raise ValueError("first segment is not the prompt")
        flat = array("q")
        call_index = 0
        expected_kind = SegmentKind.PROMPT
        for pos, seg in enumerate(self.segments):
            if seg.kind is not expected_kind:
                raise ValueError(f"segment {pos}: expected {expected_kind.value}, found {seg.kind.value}")
            if seg.call != call_index:
                raise ValueError(f"segment {pos}: belongs to call {seg.call}, expected {call_index}")
            if seg.kind is SegmentKind.MODEL:
                if call_index >= len(self.calls):
                    raise ValueError(f"model segment {pos} has no call record")
                call = self.calls[call_index]
                if call.index != call_index:
                    raise ValueError(f"call record {call_index} is numbered {call.index}")
                if len(flat) != call.context_tokens:
                    raise ValueError(
                        f"call {call_index}: {len(flat)} tokens precede its response but "
                        f"{call.context_tokens} were sent"
                    )
                if token_digest(flat) != call.sent_digest:
                    raise ValueError(f"call {call_index}: the context differs from the prompt that was sent")
                if len(seg.token_ids) != call.completion_tokens:
                    raise ValueError(f"call {call_index}: response length differs from what the server returned")
                new = len(self.segments[pos - 1].token_ids)
                if new != call.new_tokens:
                    raise ValueError(f"call {call_index}: {new} new prompt tokens recorded, {call.new_tokens} sent")
                if seg.logprobs is not None and len(seg.logprobs) != len(seg.token_ids):
                    raise ValueError(f"call {call_index}: logprobs misaligned")
                call_index += 1
                expected_kind = SegmentKind.ENV
            else:
                expected_kind = SegmentKind.MODEL
            flat.extend(seg.token_ids)
        if call_index != len(self.calls):
            raise ValueError(f"{len(self.calls)} call records but {call_index} model segments")
        if expected_kind is SegmentKind.MODEL and len(self.segments) > 1:
            raise ValueError("trailing env segment without a model response")
        n_resp = len(flat) - len(self.segments[0].token_ids)
        if not (len(self.response_ids) == len(self.response_mask) == len(self.response_logprobs) == n_resp):
            raise ValueError("flattened views disagree in length")

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "task_id": self.task_id,
            "segments": [s.to_dict() for s in self.segments],
            "calls": [dict(vars(c)) for c in self.calls],  # flat records: no deep copy (asdict's)
            "messages": _jsonable(self.messages),
            "tools": {name: dict(vars(stats)) for name, stats in self.tools.items()},
            "parse_errors": self.parse_errors,
            "unknown_tool_calls": self.unknown_tool_calls,
            "termination": self.termination.value,
            "termination_detail": self.termination_detail,
            "reward": self.reward,
            "reward_metrics": self.reward_metrics,
            "is_correct": self.is_correct,
            "masked": self.masked,
            "timings": self.timings,
            "metadata": _jsonable(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        return cls(
            id=data["id"],
            task_id=data.get("task_id"),
            segments=[Segment.from_dict(s) for s in data.get("segments", [])],
            calls=[ModelCall(**c) for c in data.get("calls", [])],
            messages=_from_jsonable(data.get("messages", [])),
            tools={name: ToolStats(**stats) for name, stats in data.get("tools", {}).items()},
            parse_errors=int(data.get("parse_errors", 0)),
            unknown_tool_calls=int(data.get("unknown_tool_calls", 0)),
            termination=Termination(data["termination"]),
            termination_detail=data.get("termination_detail", ""),
            reward=float(data.get("reward", 0.0)),
            reward_metrics=dict(data.get("reward_metrics", {})),
            is_correct=data.get("is_correct"),
            masked=bool(data.get("masked", False)),
            timings=dict(data.get("timings", {})),
            metadata=_from_jsonable(data.get("metadata", {})),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Episode:
        return cls.from_dict(json.loads(text))

    def summary(self) -> dict[str, Any]:
        """One flat line for logs and tables."""
        return {
            "id": self.id,
            "termination": self.termination.value,
            "reward": self.reward,
            "turns": len(self.calls),
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "parse_errors": self.parse_errors,
            "prompt_tokens": len(self.prompt_ids),
            "response_tokens": len(self.response_ids),
            "model_tokens": self.num_model_tokens,
            "masked": self.masked,
            "wall_s": round(self.timings.get("wall_s", 0.0), 3),
        }


_BYTES_KEY = "__bytes_b64__"


def _jsonable(value: Any, _depth: int = 0) -> Any:
    """Make Strands messages JSON-safe without losing information (bytes are base64-tagged).

    Never raises: tool results are untrusted, so a value whose ``repr`` (or key's ``str``) raises,
    or a structure nested too deep (a cycle), becomes a placeholder naming its type."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value  # the common case first: an episode's messages are mostly strings
    try:
        if _depth > 200:
            return _placeholder(value, "nested too deep")
        if isinstance(value, bytes | bytearray):
            return {_BYTES_KEY: base64.b64encode(bytes(value)).decode("ascii")}
        if isinstance(value, dict):
            return {_key(k): _jsonable(v, _depth + 1) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [_jsonable(v, _depth + 1) for v in value]
        if isinstance(value, Enum):
            return _jsonable(value.value, _depth + 1)
        if value is None or isinstance(value, str | int | float | bool):
            return value
        return repr(value)
    except Exception:
        return _placeholder(value, "unrepresentable")


def _key(key: Any) -> str:
    try:
        return str(key)
    except Exception:
        return _placeholder(key, "unrepresentable key")


def _placeholder(value: Any, why: str) -> str:
    try:
        name = type(value).__qualname__
    except Exception:
        name = "object"
    return f"<{why} {name}>"


def _from_jsonable(value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if isinstance(value, dict):
        if set(value) == {_BYTES_KEY}:
            return base64.b64decode(value[_BYTES_KEY])
        return {k: _from_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_jsonable(v) for v in value]
    return value
