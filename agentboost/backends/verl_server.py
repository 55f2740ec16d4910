"""Generation on veRL's rollout servers during RL training, token ids in and out.

verl 0.6.1 runs one ``vLLMHttpServer`` Ray actor per rollout replica; each has an async
``generate(prompt_ids, sampling_params, request_id, image_data)`` method returning a ``TokenOutput``.
This backend calls it directly through the Ray actor handles (no HTTP, no re-tokenisation).

Upstream 0.6.1 ``generate`` ignores the requested ``max_tokens`` (it always generates up to
``max_model_len - len(prompt)``) and reports no finish reason; ``modified_verl_files/vllm_async_server.py``
(installed by ``apply_patches.py``) fixes both and adds the weight version that served the request.
Against an unpatched server this backend refuses over-long replies instead of silently cutting them.

verl 0.7.1 (rLLM v0.3.0-pre's pin) is used unpatched: its ``generate`` honours ``max_tokens`` (clamped
to the room left), reports ``stop_reason`` ``"completed"`` for both of vLLM's ``stop`` and ``length``
(so those are derived from the tokens) and ``"aborted"`` for an abort (an infrastructure error), and
the weights' ``global_steps`` in ``extra_fields`` (the weight version).

Routing: every call of an episode goes to the same replica (its prefix is cached there); a new
episode joins its GRPO group's replica unless that one is overloaded, else the least-loaded one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from ..errors import BackendContextOverflow, BackendError, BackendTimeout
from .base import FINISH_LENGTH, FINISH_STOP, GenerationRequest, GenerationResult
from .routing import StickyRouter

logger = logging.getLogger(__name__)

_CONTEXT_MARKERS = ("maximum model length", "max_model_len", "context length", "longer than", "too long",
                    "max_tokens must be at least 1")  # fmt: skip
"""verl 0.7.1 clamps max_tokens to the room left: a prompt that fills the context asks vLLM for 0 tokens."""
VERL_COMPLETED = "completed"
"""verl >= 0.7's ``TokenOutput.stop_reason`` for both of vLLM's ``stop`` and ``length``: says nothing about which."""


class VerlServerBackend:
    """Token-in/token-out generation through veRL rollout-server actor handles.

    Args:
        server_handles: the replicas' server actor handles (``AgentLoopManager.server_handles``).
        request_timeout_s: cap on one call (the episode deadline may be shorter).
    """

    def __init__(self, server_handles: list[Any], *, request_timeout_s: float = 1800.0) -> None:
        if not server_handles:
            raise ValueError("no rollout servers")
        self.handles = list(server_handles)
        self.request_timeout_s = request_timeout_s
        self.router = StickyRouter(len(self.handles))
        self._counter = itertools.count()

    def describe(self) -> str:
        return f"verl-servers({len(self.handles)})"

    def sampling_params(self, request: GenerationRequest) -> dict[str, Any]:
        s = request.sampling
        params: dict[str, Any] = {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "min_p": s.min_p,
            "repetition_penalty": s.repetition_penalty,
            "logprobs": bool(s.logprobs),
            "max_tokens": request.max_tokens,
        }
        if request.stop_token_ids:
            params["stop_token_ids"] = list(request.stop_token_ids)
        if s.seed is not None:
            params["seed"] = s.seed
        return params

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        server = self.router.acquire(request.request_id, request.group_id)
        timeout = min(request.timeout_s or self.request_timeout_s, self.request_timeout_s)
        # vLLM needs unique ids for requests in flight; calls of one episode are sequential.
        request_id = f"{request.request_id}-{next(self._counter)}"
        try:
            ref = self.handles[server].generate.remote(
                prompt_ids=list(request.prompt_ids),
                sampling_params=self.sampling_params(request),
                request_id=request_id,
            )
            try:
                output = await asyncio.wait_for(_awaitable(ref), timeout=timeout)
            except (TimeoutError, asyncio.TimeoutError):
                _cancel(ref)
                raise BackendTimeout(f"rollout server {server} did not answer within {timeout:.0f}s") from None
        except (BackendTimeout, asyncio.CancelledError):
            raise
        except Exception as exc:
            message = str(exc)
            if isinstance(exc, TypeError) and "max_tokens" in message:
                raise BackendError(
                    f"rollout server {server} does not accept max_tokens ({message[:200]}): verl 0.6.1's server "
                    "is not adapted; run `python apply_patches.py`"
                ) from exc
            if any(marker in message.lower() for marker in _CONTEXT_MARKERS):
                raise BackendContextOverflow(message[:500]) from exc
            raise BackendError(f"rollout server {server} failed: {type(exc).__name__}: {message[:500]}") from exc
        finally:
            self.router.release(server)
        token_ids = [int(t) for t in output.token_ids]
        if len(token_ids) > request.max_tokens:
            raise BackendError(
                f"the rollout server returned {len(token_ids)} tokens for max_tokens={request.max_tokens}: "
                "verl 0.6.1's server ignores max_tokens; run `python apply_patches.py`"
            )
        reported, stop_reason, weight_version = server_report(output)
        finish = derive_finish_reason(reported, token_ids, request, where=f"rollout server {server}")
        log_probs = getattr(output, "log_probs", None)
        return GenerationResult(
            token_ids=token_ids,
            logprobs=[float(x) for x in log_probs] if log_probs is not None else None,
            finish_reason=finish,
            stop_reason=stop_reason,
            server=f"replica-{server}",
            weight_version=weight_version,
        )


def server_report(output: Any) -> tuple[Any, Any, Any]:
    """(finish reason, vLLM stop reason, weight version) of a server's ``TokenOutput``.

    verl 0.6.1 adapted by agentboost reports vLLM's own finish/stop reasons and a wake-up count; verl 0.7.1
    sums the finish up in ``stop_reason`` and names the weights by ``extra_fields["global_steps"]``;
    unadapted 0.6.1 reports none of them (the finish is then derived from the tokens).
    """
    if hasattr(output, "finish_reason"):
        return output.finish_reason, getattr(output, "stop_reason", None), getattr(output, "weight_version", None)
    verl_stop = getattr(output, "stop_reason", None)
    extra = getattr(output, "extra_fields", None) or {}
    return (None if verl_stop == VERL_COMPLETED else verl_stop), None, extra.get("global_steps")


def derive_finish_reason(reported: Any, token_ids: list[int], request: GenerationRequest, *, where: str) -> str:
    """``stop`` or ``length`` for a reply, never a guess that hides a failure.

    An aborted generation (vLLM's ``abort``: preempted, cancelled, the engine shutting down) is an
    infrastructure failure, not a finished turn, whatever its length. A server that reports nothing
    (verl's unadapted server) gets the reason derived from the tokens: a reply that filled its
    ``max_tokens`` was cut (``length``) unless it ends with a stop token; a shorter one stopped.
    """
    if reported in (FINISH_STOP, FINISH_LENGTH):
        return str(reported)
    if reported is not None:
        raise BackendError(f"{where}: generation ended with finish_reason={reported!r} after {len(token_ids)} tokens")
    if token_ids and token_ids[-1] in request.stop_token_ids:
        return FINISH_STOP
    return FINISH_LENGTH if len(token_ids) >= request.max_tokens else FINISH_STOP


async def _awaitable(ref: Any) -> Any:
    return await ref


def _cancel(ref: Any) -> None:
    try:
        import ray

        ray.cancel(ref)
    except Exception:  # not a Ray ref (tests) or already done
        cancel = getattr(ref, "cancel", None)
        if callable(cancel):
            cancel()
