"""Generation through verl >= 0.9's server manager (``LLMServerClient``), token ids in and out.

Inside a verl agent loop the rollout servers are reached through ``AgentLoopBase.server_manager``:
``await server_manager.generate(request_id, prompt_ids=, sampling_params=) -> TokenOutput``
(``verl/workers/rollout/llm_server.py``). Its global load balancer keeps every call with the same
``request_id`` on the same replica (sticky sessions, prefix cache), so this backend passes the
episode id as ``request_id`` and leaves routing to verl.

What verl 0.9.1 reports and how it is read (``vllm_async_server.py``, ``vLLMHttpServer.generate``):

* ``stop_reason`` is ``"completed"`` for both of vLLM's ``stop`` and ``length``, ``"aborted"`` for an
  aborted request (weight sync, preemption, shutdown; often with no tokens at all), ``None`` when
  unknown; the fully-async client (``ASYNC=1``/``separate``) reports ``"length"`` whenever its
  cumulative tokens reach ``max_tokens``, also when the last of them is the end-of-turn token.
  ``stop``/``length`` are therefore derived from the tokens
  (:func:`~agentboost.backends.verl_server.derive_finish_reason`: a reply that ends with a stop token
  stopped; one that filled its limit without one was cut); an abort is an infrastructure error, never a
  finished turn.
* ``max_tokens`` is honoured, clamped by the server to ``max_model_len - len(prompt)``; the limit a reply
  is judged against is the smaller of the two (``max_model_len``: the server's effective context, the
  rollout config's or the model's ``max_position_embeddings``). A prompt that leaves no room raises
  ``ValueError("... leaves no room to generate ...")``: a context overflow.
* The time a call waits on verl's servers (their queue, the generation, and in the async trainer modes
  the weight updates during which the servers are paused) does not count against the episode's wall
  clock (``server_time_off_clock``); ``request_timeout_s`` bounds each call.
* ``extra_fields["global_steps"]`` is the weight version that served the call (kept per call, and the
  episode's min/max travel to the trainer for verl's staleness control).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from ..errors import BackendContextOverflow, BackendError, BackendTimeout
from .base import GenerationRequest, GenerationResult
from .verl_server import derive_finish_reason

_CONTEXT_MARKERS = ("leaves no room", "maximum context length", "maximum model length", "max_model_len", "too long")
_DERIVED = ("completed", "length")
"""verl's ``completed`` (vLLM's stop *or* length) and the fully-async client's ``length`` (set on the cumulative
token count, stop token or not) say nothing reliable about which: derived from the tokens."""


class VerlLLMClientBackend:
    """A :class:`~agentboost.backends.base.GenerationBackend` over verl's ``LLMServerClient``.

    Args:
        client: the agent loop's ``server_manager``.
        passthrough: verl sampling keys agentboost does not model (sent unchanged with every call).
        request_timeout_s: cap on one call (off the episode's clock, see the module docstring).
        max_model_len: the servers' context window (verl clamps ``max_tokens`` to the room left in it).
    """

    server_time_off_clock = True
    """Waits on verl's servers do not count against the episode's wall clock (TokenModel.deadline)."""

    def __init__(
        self,
        client: Any,
        *,
        passthrough: dict[str, Any] | None = None,
        request_timeout_s: float = 1800.0,
        max_model_len: int | None = None,
    ) -> None:
        self.client = client
        self.passthrough = dict(passthrough or {})
        self.request_timeout_s = request_timeout_s
        self.max_model_len = max_model_len
        self.global_steps: list[int] = []
        """Weight versions (verl ``global_steps``) that served this backend's calls (min/max matter)."""
        self.preempted: int | None = None
        """Times verl reports this backend's requests were preempted (None: never reported)."""

    def describe(self) -> str:
        return "verl-llm-client"

    def sampling_params(self, request: GenerationRequest) -> dict[str, Any]:
        """A fresh dict per call: verl's server pops keys from the one it is given."""
        s = request.sampling
        params: dict[str, Any] = {
            **self.passthrough,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "repetition_penalty": s.repetition_penalty,
            "logprobs": bool(s.logprobs),
            "max_tokens": request.max_tokens,
        }
        if s.min_p:
            params["min_p"] = s.min_p
        if s.seed is not None:
            params["seed"] = s.seed
        stops = {int(t) for t in self.passthrough.get("stop_token_ids") or ()} | set(request.stop_token_ids)
        if stops:
            params["stop_token_ids"] = sorted(stops)
        return params

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        timeout = min(request.timeout_s or self.request_timeout_s, self.request_timeout_s)
        try:
            output = await asyncio.wait_for(
                self.client.generate(
                    request.request_id,
                    prompt_ids=list(request.prompt_ids),
                    sampling_params=self.sampling_params(request),
                ),
                timeout=timeout,
            )
        except (TimeoutError, asyncio.TimeoutError):
            raise BackendTimeout(f"verl's rollout servers did not answer within {timeout:.0f}s") from None
        except (asyncio.CancelledError, BackendError):
            raise
        except Exception as exc:
            message = str(exc)
            if any(marker in message.lower() for marker in _CONTEXT_MARKERS):
                raise BackendContextOverflow(message[:500]) from exc
            raise BackendError(f"verl rollout server failed: {type(exc).__name__}: {message[:500]}") from exc
        token_ids = [int(t) for t in output.token_ids]
        if len(token_ids) > request.max_tokens:
            raise BackendError(f"verl returned {len(token_ids)} tokens for max_tokens={request.max_tokens}")
        reported = getattr(output, "stop_reason", None)
        limit = request.max_tokens
        if self.max_model_len:
            limit = max(1, min(limit, self.max_model_len - len(request.prompt_ids)))
        judged = request if limit == request.max_tokens else dataclasses.replace(request, max_tokens=limit)
        finish = derive_finish_reason(
            None if reported in _DERIVED else reported, token_ids, judged, where="verl rollout server"
        )
        extra = dict(getattr(output, "extra_fields", None) or {})
        version = extra.get("global_steps")
        # A resumed partial rollout (fully-async client) spans versions: min/max_global_steps say which.
        for key in ("min_global_steps", "global_steps", "max_global_steps"):
            if extra.get(key) is not None:
                self.global_steps.append(int(extra[key]))
        preempted = getattr(output, "num_preempted", None)
        if preempted is not None:
            self.preempted = (self.preempted or 0) + int(preempted)
        log_probs = getattr(output, "log_probs", None)
        return GenerationResult(
            token_ids=token_ids,
            logprobs=[float(x) for x in log_probs] if log_probs is not None else None,
            finish_reason=finish,
            stop_reason=reported,
            weight_version=version,
        )
