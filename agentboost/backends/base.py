"""The one small interface every generation backend implements.

    prompt token ids + sampling params + max_tokens + request id  ->  completion ids, logprobs, finish reason

Backends never see text and never re-tokenize. ``request_id`` identifies the episode: backends that
route across several servers keep all calls of one request id on the same server (prefix cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..types import SamplingParams

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    request_id: str
    stop_token_ids: tuple[int, ...] = ()
    timeout_s: float | None = None
    """Hard limit for this request (the episode's remaining wall-clock budget)."""
    group_id: str | None = None
    """Optional routing hint: requests of one GRPO group share a prompt (prefix cache)."""


@dataclass
class GenerationResult:
    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    """``"stop"`` (a stop token ended it) or ``"length"`` (``max_tokens`` reached)."""
    stop_reason: str | int | None = None
    prompt_token_ids: list[int] | None = None
    """What the server says it was given, when it echoes it (checked against what was sent)."""
    server: str | None = None
    weight_version: str | int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class GenerationBackend(Protocol):
    """Anything with ``async generate(request) -> GenerationResult``.

    Errors are raised as :class:`agentboost.errors.BackendError` subclasses:
    ``BackendContextOverflow`` when the prompt does not fit, ``BackendTimeout`` past
    ``request.timeout_s``, ``BackendError`` for the rest (after the backend's own bounded retries).
    """

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...


def describe_backend(backend: Any) -> str:
    describe = getattr(backend, "describe", None)
    return str(describe()) if callable(describe) else type(backend).__name__
