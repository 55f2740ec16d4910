"""A deterministic backend that replays scripted completions: for tests, debugging an environment
without a model, and benchmarks that need an instant backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from .base import FINISH_LENGTH, FINISH_STOP, GenerationRequest, GenerationResult

Script = Callable[[GenerationRequest, int], Sequence[int]]


class ScriptedBackend:
    """Answer call ``k`` of request id ``r`` with ``script(request, k)`` (or ``completions[k]``).

    A completion longer than ``max_tokens`` is cut there (finish reason ``length``), like a server.
    A completion that ends with one of the request's stop tokens finishes with ``stop``; one that ends
    otherwise finishes with ``stop`` only if ``require_stop_token`` is False. Logprobs are a fixed
    value per token. ``latency_s`` simulates generation time.
    """

    def __init__(
        self,
        script: Script | Sequence[Sequence[int]],
        *,
        logprob: float = -0.25,
        latency_s: float = 0.0,
        echo_prompt: bool = True,
    ) -> None:
        if callable(script):
            self._script: Script = script
        else:
            completions = [list(c) for c in script]

            def by_index(request: GenerationRequest, k: int) -> Sequence[int]:
                if k >= len(completions):
                    raise IndexError(f"script has {len(completions)} completions, call {k} asked")
                return completions[k]

            self._script = by_index
        self.logprob = logprob
        self.latency_s = latency_s
        self.echo_prompt = echo_prompt
        self.calls: dict[str, int] = {}
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        k = self.calls.get(request.request_id, 0)
        self.calls[request.request_id] = k + 1
        self.requests.append(request)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        ids = list(self._script(request, k))
        finish = FINISH_STOP
        if len(ids) > request.max_tokens:
            ids, finish = ids[: request.max_tokens], FINISH_LENGTH
        elif not ids or ids[-1] not in request.stop_token_ids:
            finish = FINISH_LENGTH if len(ids) == request.max_tokens else FINISH_STOP
        return GenerationResult(
            token_ids=ids,
            logprobs=[self.logprob] * len(ids) if request.sampling.logprobs else None,
            finish_reason=finish,
            prompt_token_ids=list(request.prompt_ids) if self.echo_prompt else None,
            server="scripted",
        )

    def describe(self) -> str:
        return "scripted"


def text_script(template: Any, texts: Sequence[str], *, eot: bool = True) -> list[list[int]]:
    """Encode assistant texts the way a model would emit them (canonical BPE + end-of-turn token)."""
    out = []
    for text in texts:
        ids = template.encode(text)
        if eot:
            ids.append(template.info.eot_token_id)
        out.append(ids)
    return out
