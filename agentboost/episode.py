"""The episode record: one or more append-only token trajectories plus everything needed to train on
them and to explain them afterwards.

Token layout of one trajectory with ``k`` model calls::

    prompt | model_0 | env_1 | model_1 | ... | env_{k-1} | model_{k-1}

``prompt`` is the trajectory's first call's rendered prompt; ``env_i`` is what call ``i`` sent beyond
the previous context (tool results, user turns, turn separators, the generation prompt); ``model_i``
is exactly what the server returned for call ``i``. The response (what the trainer optimises) is
everything after ``prompt``; its loss mask is 1 on model tokens and 0 on env tokens.

An episode is one trajectory as long as every model call sees an extension of what the previous call
of its agent saw. When it does not (a conversation manager trimmed or summarised the history, a hook
edited it, the system prompt or the tool list changed, another agent or a side call such as a
summariser used the model), the call opens a new trajectory whose prompt is the whole history the
model is given, rendered by the chat template (:class:`TrajectoryInfo` says which agent and why). The
episode keeps one termination and one reward; a trainer gives every trajectory of an episode the
episode's advantage (docs/multi-agent.md, "Agents that rewrite their history, and multi-agent runs").

``segments`` and ``calls`` are flat and in commit order: call ``c`` owns ``segments[2c]`` (its
trajectory's prompt, or its env segment) and ``segments[2c + 1]`` (its model segment), and names its
trajectory in ``ModelCall.trajectory``. :attr:`Episode.trajectories` gives each trajectory's own views.

Invariant (checked on every episode, :meth:`Episode.check_invariants`): for every call, the tokens of
its trajectory before its model segment are exactly the prompt that call sent (length and digest
recorded at send time), and its model segment is exactly what came back.
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
    """Position of this call's assistant message in its trajectory's messages (``Episode.messages`` when
    the episode is one trajectory, else :attr:`TrajectoryInfo.messages`)."""
    trajectory: int = 0
    """Index of the trajectory (``Episode.trajectory_info``) this call belongs to."""
    discarded: bool = False
    """Strands dropped this reply and the agent never acted on it (a hook retried the call): kept in the
    record, not trained (its model tokens have loss mask 0). Known when the agent's next call came."""


class MultiTrajectoryError(ValueError):
    """A single-trajectory view was asked of an episode made of several trajectories."""


@dataclass
class TrajectoryInfo:
    """What one trajectory of an episode is (its tokens are the segments of its calls)."""

    agent: str = "agent"
    """The agent whose calls these are (its Strands ``name``), ``aux`` for a call made without an agent
    (a conversation manager's summariser calling the model directly)."""
    opened_by: str = "start"
    """Why it opened: ``start`` (the episode's first call), ``new_agent`` (the first call of another
    agent or a side call), ``history_rewritten`` (its agent's history is no longer an extension of what
    the model saw: trimmed, summarised, edited, reset by Strands (a Swarm node run again, a Graph node
    revisited with ``reset_on_revisit``, an agent used as a tool called again), or a completed call
    retried), ``system_prompt_changed``, ``tools_changed``, ``sampling_changed`` (the call samples
    otherwise than its trajectory's earlier calls)."""
    detail: str = ""
    rerendered_tokens: int = 0
    """Prompt tokens that render again what an earlier trajectory of the same agent already held (the
    whole prompt of a trajectory that re-opens an agent's conversation; 0 for the first trajectory of
    an agent)."""
    trained: bool = True
    """False for calls sampled otherwise than the episode's policy, for the calls a setting leaves out of
    training (``RolloutSettings.train_aux_calls``) and for a trajectory whose every reply was discarded
    (``ModelCall.discarded``): kept in the record, never a training row."""
    messages: list[dict[str, Any]] | None = None
    """The messages this trajectory's calls were given, with its last response (Strands format). None
    for an episode of one trajectory of one agent, whose messages are ``Episode.messages``."""

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in vars(self).items() if k != "messages"}
        data["messages"] = None if self.messages is None else _jsonable(self.messages)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrajectoryInfo:
        values = dict(data)
        if values.get("messages") is not None:
            values["messages"] = _from_jsonable(values["messages"])
        return cls(**values)


class _TokenViews:
    """The flattened views of one trajectory's segments (the prompt segment first)."""

    segments: list[Segment]
    calls: list[ModelCall]
    masked: bool

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
        """1 on model tokens, 0 on the rest, on a masked episode and on discarded calls (``ModelCall.discarded``)."""
        out: list[int] = []
        discarded = {c.index for c in self.calls if c.discarded}
        for seg in self.segments[1:]:
            bit = 1 if seg.kind is SegmentKind.MODEL and not self.masked and seg.call not in discarded else 0
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


@dataclass
class TokenTrajectory(_TokenViews):
    """One trajectory of an episode: its segments (prompt first), its calls and what it is."""

    index: int
    info: TrajectoryInfo
    segments: list[Segment]
    calls: list[ModelCall]
    masked: bool
    """The episode's: a masked episode's trajectories carry no loss token."""

    @property
    def trained(self) -> bool:
        return self.info.trained

    @property
    def num_model_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.kind is SegmentKind.MODEL)


@dataclass
class ToolStats:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    truncated: int = 0
    total_time_s: float = 0.0


@dataclass
class Episode(_TokenViews):
    """One rollout: token trajectories, messages, tool statistics, termination, reward, timings.

    The flattened views (``prompt_ids``, ``response_ids``, ``response_mask``, ``response_logprobs``) are
    those of the episode's one trajectory; on an episode of several they raise
    :class:`MultiTrajectoryError` (use :attr:`trajectories`)."""

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
    trajectory_info: list[TrajectoryInfo] = field(default_factory=list)
    """One entry per trajectory, in the order they opened (empty when no call was made)."""
    role_rewards: dict[str, float] = field(default_factory=dict)
    """Rewards per agent (``TrajectoryInfo.agent``) set by the reward function; an agent not named here
    gets :attr:`reward`."""

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
        """Append one segment of a single-trajectory episode (its prompt first, once)."""
        if segment.kind is SegmentKind.PROMPT and self.segments:
            raise ValueError("the prompt segment must come first and only once")
        if segment.kind is not SegmentKind.PROMPT and not self.segments:
            raise ValueError("the first segment must be the prompt")
        self._check_segment(segment)
        self.segments.append(segment)

    def commit_call(self, info: TrajectoryInfo | None, sent: Segment, answer: Segment, call: ModelCall) -> None:
        """Record one complete model call: ``sent`` (the prompt of a new trajectory, described by
        ``info``, or the env segment of ``call.trajectory``) and ``answer`` (its model segment)."""
        if call.index != len(self.calls) or sent.call != call.index or answer.call != call.index:
            raise ValueError(f"call {call.index} committed out of order (expected {len(self.calls)})")
        opening = info is not None
        if opening and call.trajectory != len(self.trajectory_info):
            raise ValueError(f"trajectory {call.trajectory} opened out of order")
        if not opening and not 0 <= call.trajectory < len(self.trajectory_info):
            raise ValueError(f"call {call.index} continues unknown trajectory {call.trajectory}")
        if (sent.kind is SegmentKind.PROMPT) != opening or answer.kind is not SegmentKind.MODEL:
            raise ValueError("a call sends a prompt exactly when it opens a trajectory, then gets a model segment")
        self._check_segment(answer)
        if opening:
            self.trajectory_info.append(info)
        self.segments.append(sent)
        self.segments.append(answer)
        self.calls.append(call)

    @staticmethod
    def _check_segment(segment: Segment) -> None:
        if segment.kind is SegmentKind.MODEL:
            if segment.logprobs is not None and len(segment.logprobs) != len(segment.token_ids):
                raise ValueError("model segment: logprobs and token_ids differ in length")
        elif segment.logprobs is not None:
            raise ValueError("only model segments carry logprobs")

    # -- trajectories ------------------------------------------------------------------------
    @property
    def num_trajectories(self) -> int:
        if not self.segments:
            return 0
        return max(1, len(self.trajectory_info))

    @property
    def trajectories(self) -> list[TokenTrajectory]:
        """Each trajectory's segments (its prompt first), calls and description, in opening order."""
        if not self.segments:
            return []
        if len(self.trajectory_info) <= 1:
            info = self.trajectory_info[0] if self.trajectory_info else TrajectoryInfo()
            return [TokenTrajectory(0, info, list(self.segments), list(self.calls), self.masked)]
        out = [TokenTrajectory(i, info, [], [], self.masked) for i, info in enumerate(self.trajectory_info)]
        for call in self.calls:
            view = out[call.trajectory]
            view.segments.extend(self.segments[2 * call.index : 2 * call.index + 2])
            view.calls.append(call)
        return out

    def _single(self, what: str) -> None:
        if len(self.trajectory_info) > 1:
            raise MultiTrajectoryError(
                f"episode {self.id} has {len(self.trajectory_info)} trajectories: {what} is one trajectory's "
                "view; use episode.trajectories"
            )

    @property
    def prompt_ids(self) -> list[int]:
        self._single("prompt_ids")
        return _TokenViews.prompt_ids.fget(self)  # type: ignore[attr-defined]

    @property
    def response_ids(self) -> list[int]:
        self._single("response_ids")
        return _TokenViews.response_ids.fget(self)  # type: ignore[attr-defined]

    @property
    def response_mask(self) -> list[int]:
        self._single("response_mask")
        return _TokenViews.response_mask.fget(self)  # type: ignore[attr-defined]

    @property
    def response_logprobs(self) -> list[float]:
        self._single("response_logprobs")
        return _TokenViews.response_logprobs.fget(self)  # type: ignore[attr-defined]

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt tokens of every trajectory."""
        return sum(len(s.token_ids) for s in self.segments if s.kind is SegmentKind.PROMPT)

    @property
    def num_response_tokens(self) -> int:
        """Response tokens (model and env) of every trajectory."""
        return sum(len(s.token_ids) for s in self.segments if s.kind is not SegmentKind.PROMPT)

    @property
    def rerendered_tokens(self) -> int:
        return sum(info.rerendered_tokens for info in self.trajectory_info)

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

    def reward_of(self, agent: str) -> float:
        """The reward of ``agent``'s trajectories: its role reward, else the episode's (0 when masked)."""
        if self.masked:
            return 0.0
        return float(self.role_rewards.get(agent, self.reward))

    def messages_of(self, trajectory: int) -> list[dict[str, Any]]:
        """The messages the calls of ``trajectory`` were given (with its last response)."""
        infos = self.trajectory_info
        if 0 <= trajectory < len(infos) and infos[trajectory].messages is not None:
            return infos[trajectory].messages  # type: ignore[return-value]
        return self.messages if len(infos) <= 1 else []

    def transcript(self, agent: str | None = None) -> list[dict[str, Any]]:
        """Every message of ``agent``'s conversation (default: the episode's first agent) once, in the
        order it happened: each call's response and the messages that came before it since the previous
        response (tool results, user turns). ``Episode.messages`` is the agent's final history, which a
        conversation manager may have trimmed or summarised; a reward that reads the whole conversation
        (every tool call, every user turn) reads this. Summaries and re-rendered turns of a new
        trajectory's prompt are not events of the conversation and are left out."""
        infos = self.trajectory_info
        if not self.calls or (len(infos) <= 1 and (not infos or infos[0].messages is None)):
            return list(self.messages)
        agent = agent if agent is not None else (infos[0].agent if infos else "")
        out: list[dict[str, Any]] = []
        previous: dict[str, Any] | None = None
        for call in self.calls:
            if infos and infos[call.trajectory].agent != agent:
                continue
            history = self.messages_of(call.trajectory)
            if not 0 <= call.message_index < len(history):
                continue
            given = history[: call.message_index]
            start = 0
            if previous is not None:  # what came after the previous response (it is in a window or a summary's tail)
                found = [i for i, m in enumerate(given) if _same_turn(m, previous)]
                start = (
                    found[-1] + 1
                    if found
                    else next((i + 1 for i in range(len(given) - 1, -1, -1) if given[i].get("role") == "assistant"), 0)
                )
            out.extend(given[start:])
            previous = history[call.message_index]
            out.append(previous)
        if self.messages and previous is not None:  # what followed the last response (a last user turn)
            found = [i for i, m in enumerate(self.messages) if _same_turn(m, previous)]
            if found:
                out.extend(self.messages[found[-1] + 1 :])
        return out

    @property
    def final_text(self) -> str:
        """The text of the last assistant message (reasoning excluded), '' if none."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return "".join(b["text"] for b in message.get("content", []) if isinstance(b, dict) and "text" in b)
        return ""

    # -- invariant ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise ``ValueError`` unless every trajectory's segments are exactly what each of its calls sent
        and received."""
        if not self.segments:
            if self.calls:
                raise ValueError("calls recorded but no token segments")
            if len(self.trajectory_info) > 0:
                raise ValueError("trajectories recorded but no token segments")
            return
        if self.segments[0].kind is not SegmentKind.PROMPT:
            raise ValueError("first segment is not the prompt")
        n_traj = max(1, len(self.trajectory_info))
        contexts: dict[int, array] = {}
        hashes: dict[int, Any] = {}
        for pos, seg in enumerate(self.segments):
            call_index = pos // 2
            if call_index >= len(self.calls):
                raise ValueError(
                    f"segment {pos}: {len(self.calls)} call records but {len(self.segments)} segments"
                    if pos % 2 == 0
                    else f"model segment {pos} has no call record"
                )
            call = self.calls[call_index]
            if seg.call != call_index:
                raise ValueError(f"segment {pos}: belongs to call {seg.call}, expected {call_index}")
            if pos % 2 == 0:  # what call ``call_index`` sent beyond its trajectory's context
                opening = call.trajectory not in contexts
                if opening and call.trajectory != len(contexts):
                    raise ValueError(f"call {call_index}: trajectory {call.trajectory} opened out of order")
                if call.trajectory >= n_traj:
                    raise ValueError(f"call {call_index}: trajectory {call.trajectory} has no record")
                expected = SegmentKind.PROMPT if opening else SegmentKind.ENV
                if seg.kind is not expected:
                    raise ValueError(f"segment {pos}: expected {expected.value}, found {seg.kind.value}")
                if opening:
                    contexts[call.trajectory] = array("q")
                    hashes[call.trajectory] = hashlib.blake2b(digest_size=16)
                new = array("q", seg.token_ids)
                contexts[call.trajectory].extend(new)
                hashes[call.trajectory].update(new.tobytes())
                continue
            if seg.kind is not SegmentKind.MODEL:
                raise ValueError(f"segment {pos}: expected model, found {seg.kind.value}")
            if call.index != call_index:
                raise ValueError(f"call record {call_index} is numbered {call.index}")
            context = contexts[call.trajectory]
            if len(context) != call.context_tokens:
                raise ValueError(
                    f"call {call_index}: {len(context)} tokens precede its response but {call.context_tokens} were sent"
                )
            if hashes[call.trajectory].hexdigest() != call.sent_digest:
                raise ValueError(f"call {call_index}: the context differs from the prompt that was sent")
            if len(seg.token_ids) != call.completion_tokens:
                raise ValueError(f"call {call_index}: response length differs from what the server returned")
            new_tokens = len(self.segments[pos - 1].token_ids)
            if new_tokens != call.new_tokens:
                raise ValueError(f"call {call_index}: {new_tokens} new prompt tokens recorded, {call.new_tokens} sent")
            if seg.logprobs is not None and len(seg.logprobs) != len(seg.token_ids):
                raise ValueError(f"call {call_index}: logprobs misaligned")
            answer = array("q", seg.token_ids)
            context.extend(answer)
            hashes[call.trajectory].update(answer.tobytes())
        if len(self.segments) // 2 != len(self.calls):
            raise ValueError(f"{len(self.calls)} call records but {len(self.segments) // 2} model segments")
        if len(self.segments) % 2:
            raise ValueError("trailing env segment without a model response")
        if len(contexts) != n_traj:
            raise ValueError(f"{n_traj} trajectories recorded but {len(contexts)} have calls")
        for view in self.trajectories:
            n_resp = sum(len(s.token_ids) for s in view.segments[1:])
            if not (len(view.response_ids) == len(view.response_mask) == len(view.response_logprobs) == n_resp):
                raise ValueError(f"trajectory {view.index}: flattened views disagree in length")

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {
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
            "trajectories": [info.to_dict() for info in self.trajectory_info],
        }
        if self.role_rewards:
            data["role_rewards"] = dict(self.role_rewards)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        segments = [Segment.from_dict(s) for s in data.get("segments", [])]
        # Records from before trajectories were recorded have none: one trajectory, described by default.
        infos = [TrajectoryInfo.from_dict(t) for t in data.get("trajectories") or []]
        return cls(
            id=data["id"],
            task_id=data.get("task_id"),
            segments=segments,
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
            trajectory_info=infos,
            role_rewards={str(k): float(v) for k, v in (data.get("role_rewards") or {}).items()},
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
            "trajectories": self.num_trajectories,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "parse_errors": self.parse_errors,
            "prompt_tokens": self.num_prompt_tokens,
            "response_tokens": self.num_response_tokens,
            "model_tokens": self.num_model_tokens,
            "masked": self.masked,
            "wall_s": round(self.timings.get("wall_s", 0.0), 3),
        }


def _same_turn(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two messages are the same turn: role, text and tool use/result ids (one may carry Strands'
    metadata, or be agentboost's record of a response)."""

    def key(message: dict[str, Any]) -> tuple[Any, ...]:
        blocks = [x for x in message.get("content") or [] if isinstance(x, dict)]
        text = "".join(x["text"] for x in blocks if isinstance(x.get("text"), str)).strip()
        uses = [str(x["toolUse"].get("toolUseId")) for x in blocks if isinstance(x.get("toolUse"), dict)]
        results = [str(x["toolResult"].get("toolUseId")) for x in blocks if isinstance(x.get("toolResult"), dict)]
        return message.get("role"), text, uses, results

    return key(a) == key(b)


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
