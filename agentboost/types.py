"""Small value types shared by every layer: termination reasons, sampling parameters, budgets."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Termination(str, Enum):
    """Why an episode ended. Every episode ends with exactly one of these.

    One rule decides what is trained on (docs/masking.md, "What is trained on"): endings the policy caused
    keep a reward (the reward function decides; agentboost's rewards give 0 to anything but
    ``completed``) and stay in their GRPO group; endings it did not cause are masked (reward 0, loss
    mask 0, out of their group).
    """

    COMPLETED = "completed"
    """The agent finished on its own (final answer without tool calls)."""
    MAX_TURNS = "max_turns"
    """The model-call budget was used up (policy). The last call's tool calls are not executed."""
    MAX_TOKENS = "max_tokens"
    """The token budget ran out after the policy acted (policy): a generation was cut by
    ``max_tokens``, or the next prompt (the policy's turns plus tool results / user turns) leaves no
    room under the budget or the server's context window."""
    CONTEXT_OVERFLOW = "context_overflow"
    """The task's initial prompt alone does not fit the prompt/total budget or the server (data or
    configuration, not the policy): masked."""
    TIMEOUT = "timeout"
    """The wall-clock budget ran out while the agent was acting: running the tools it called or
    between calls (policy). Running out while waiting for the server or the environment is
    ``infra_error``."""
    TOOL_ERROR = "tool_error"
    """More failed or invalid tool calls than ``Budget.max_tool_errors``, or a tool ended the episode
    with ``ToolFatalError(caused_by_policy=True)`` (policy)."""
    INFRA_ERROR = "infra_error"
    """Anything that is not the policy's doing: server errors and aborted generations, waiting on the
    server or environment past the deadline, worker crashes, reward-function failures, tool
    infrastructure failures (``ToolFatalError``), broken invariants. Masked."""

    @property
    def is_failure(self) -> bool:
        """Endings the policy did not cause (masked by default): they say nothing about its quality."""
        return self in _FAILURES

    @property
    def is_truncation(self) -> bool:
        """Endings ``mask_truncated`` (DAPO-style overlong filtering) masks on request."""
        return self in (Termination.MAX_TOKENS, Termination.MAX_TURNS)


_FAILURES = frozenset({Termination.CONTEXT_OVERFLOW, Termination.INFRA_ERROR})

DEFAULT_MASKED_TERMINATIONS: frozenset[Termination] = _FAILURES
"""Episodes ending like this get reward 0 and an all-zero loss mask (they stay in the batch)."""


def _replace(obj: Any, **changes: Any) -> Any:
    unknown = set(changes) - {f.name for f in dataclasses.fields(obj)}
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field(s) {sorted(unknown)}")
    return dataclasses.replace(obj, **changes)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings sent with every generation request of an episode.

    ``logprobs`` asks the backend for the log-probability of each sampled token (vLLM's default
    semantics: log-softmax of the raw logits, before temperature/top-p processing). ``seed`` is the
    episode's: each model call of the episode is sent its own seed, :func:`call_seed` of it and the
    call's number.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    logprobs: bool = True
    max_tokens_per_call: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.max_tokens_per_call is not None and self.max_tokens_per_call < 1:
            raise ValueError("max_tokens_per_call must be >= 1")

    def replace(self, **changes: Any) -> SamplingParams:
        return _replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SamplingParams:
        return cls(**(data or {}))


def call_seed(seed: int, call: int) -> int:
    """The seed sent with request ``call`` (0, 1, ...) of an episode seeded ``seed``. A backend seeds a
    request by its seed alone (vLLM does): calls sharing the episode's seed would draw the same numbers,
    and calls whose prompts are equal (a sliding window) the same sample. In ``[0, 2**63)`` (vLLM's int64)."""
    digest = hashlib.blake2b(f"{seed}:{call}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass(frozen=True)
class Budget:
    """Per-episode limits. Every wait and every length is capped.

    * ``max_turns``: model calls per episode (every agent's, every trajectory's).
    * ``max_total_tokens``: prompt + response tokens of a trajectory (the context window the trainer and
      the server must hold; an episode of one trajectory is that trajectory). Each call's ``max_tokens``
      is what its trajectory has left.
    * ``max_prompt_tokens``: cap on a trajectory's prompt (rLLM's ``data.max_prompt_length``).
    * ``max_response_tokens``: cap on everything after a trajectory's prompt, model and tool tokens
      together (rLLM's ``data.max_response_length``).
    * ``min_call_tokens``: a call is made only if its trajectory has room for this many new tokens;
      otherwise the context is full (a conversation manager may reduce the history and go on in a new
      trajectory, else the episode ends ``max_tokens``). Set it to the longest reply you expect when
      the agent trims or summarises its history, so that happens before a reply is cut.
    * ``wall_clock_s``: the whole episode, tools included. ``reward_timeout_s``: the reward function.
    * ``max_tool_errors``: failed tool calls (incl. unparseable calls) before ``tool_error``.
    * ``tool_timeout_s``: one tool call; a call past it returns an error result to the agent.
    * ``max_tool_output_chars``: text kept of one tool result (the rest is cut with a marker).
    """

    max_turns: int = 16
    max_total_tokens: int = 32768
    max_prompt_tokens: int | None = None
    max_response_tokens: int | None = None
    wall_clock_s: float = 600.0
    reward_timeout_s: float = 60.0
    max_tool_errors: int | None = None
    tool_timeout_s: float | None = 120.0
    max_tool_output_chars: int | None = 32_768
    min_call_tokens: int = 1

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        if self.max_total_tokens < 2:
            raise ValueError("max_total_tokens must be >= 2")
        if self.min_call_tokens < 1:
            raise ValueError("min_call_tokens must be >= 1")
        for name in ("max_prompt_tokens", "max_response_tokens", "max_tool_errors", "max_tool_output_chars"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "max_tool_errors" else 1):
                raise ValueError(f"{name} must be positive, got {value}")
        if self.wall_clock_s <= 0 or self.reward_timeout_s <= 0 or (self.tool_timeout_s or 1) <= 0:
            raise ValueError("timeouts must be positive")

    def replace(self, **changes: Any) -> Budget:
        return _replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Budget:
        return cls(**(data or {}))


@dataclass(frozen=True)
class RewardOutput:
    """What a reward function returns (a bare float is accepted too)."""

    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    is_correct: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)
    role_rewards: dict[str, float] = field(default_factory=dict)
    """Rewards per agent (by the agent's Strands ``name``, ``aux`` for calls without an agent) in a
    multi-agent episode; an agent not named gets ``reward``. Each agent's advantage is computed on its
    own reward within the task's group."""
