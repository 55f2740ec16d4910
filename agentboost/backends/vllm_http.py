"""Generation against any vLLM-compatible ``/v1/completions`` server, token ids in and out.

The request carries the prompt as a list of token ids, ``return_token_ids`` (sampled ids come back
in ``choices[0].token_ids``), ``logprobs`` with ``return_tokens_as_token_ids`` (a cross-check of the
ids and the sampling logprobs), the stop token ids of the chat template and an explicit
``max_tokens`` (vLLM's default is 16). Nothing is ever re-tokenised.

One pooled ``httpx.AsyncClient`` per event loop (per process in a worker). Several servers can be
given; episodes stick to one server and new ones go to the least-loaded (``StickyRouter``).
Transient failures (connection errors, 5xx, 429, aborted generations) are retried a bounded number of
times within the request's deadline; a prompt that does not fit the server's context window is
reported as :class:`~agentboost.errors.BackendContextOverflow` and never retried or truncated.

The server's context window (``max_model_len``, which vLLM lists in ``/v1/models``) bounds each call: a
prompt that leaves no room is refused before it is sent, and ``max_tokens`` is cut to the room left, so a
budget larger than the window ends the generation at the window (``finish_reason: length``), as every vLLM
version then agrees (vLLM 0.32 refuses ``max_tokens > max_model_len`` and shortens a ``max_tokens`` the
prompt leaves no room for; 0.10-0.11 refuse ``prompt + max_tokens > max_model_len``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import weakref
from typing import Any

import httpx

from ..errors import BackendContextOverflow, BackendError, BackendTimeout
from .base import FINISH_LENGTH, FINISH_STOP, GenerationRequest, GenerationResult
from .routing import StickyRouter

logger = logging.getLogger(__name__)

_CONTEXT_MARKERS = ("maximum context length", "context length", "is too long", "max_model_len", "too many tokens")
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_TOKEN_ID_PREFIX = "token_id:"


class VLLMCompletionsBackend:
    """Token-in/token-out client for vLLM's OpenAI-compatible completions endpoint.

    Args:
        base_url: server root(s), e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is accepted).
        model: served model name; discovered from ``/v1/models`` when omitted.
        api_key: sent as a bearer token when given.
        request_timeout_s: cap on one HTTP request (the episode deadline may be shorter).
        max_retries: retries of transient failures per request.
        max_connections: connection pool size per event loop.
        max_model_len: the servers' context window (prompt + completion tokens); read from each server's
            ``/v1/models`` when omitted (a server that does not list it is left to refuse what does not fit).
    """

    def __init__(
        self,
        base_url: str | list[str],
        *,
        model: str | None = None,
        api_key: str | None = None,
        request_timeout_s: float = 900.0,
        max_retries: int = 3,
        max_connections: int = 1024,
        max_model_len: int | None = None,
    ) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("no server URL given")
        self.base_urls = [_root(u) for u in urls]
        self.model = model
        self.api_key = api_key
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.max_connections = max_connections
        self.max_model_len = max_model_len
        self.router = StickyRouter(len(self.base_urls))
        self._windows: dict[int, int | None] = {}
        """Each server's context window, once its ``/v1/models`` was read (None: it lists none)."""
        # Per event loop, weakly (a summariser's short-lived loop takes its client with it).
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )
        self._model_lock: asyncio.Lock | None = None

    def describe(self) -> str:
        return f"vllm-completions({', '.join(self.base_urls)})"

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            client = httpx.AsyncClient(
                headers=headers,
                timeout=httpx.Timeout(self.request_timeout_s, connect=30.0),
                limits=httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=64,
                                    keepalive_expiry=30.0),
            )  # fmt: skip
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        clients = list(self._clients.values())
        self._clients = weakref.WeakKeyDictionary()
        for client in clients:
            with contextlib.suppress(RuntimeError):  # a client bound to a loop that is already closed
                await client.aclose()

    async def served_model(self) -> str:
        if self.model:
            return self.model
        if self._model_lock is None:
            self._model_lock = asyncio.Lock()
        async with self._model_lock:
            if self.model is None:
                models = await self._models(0)
                if not models:
                    raise BackendError(f"{self.base_urls[0]} serves no model")
                self.model = str(models[0]["id"])
        return self.model

    async def _models(self, server: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        response = await self._client().get(f"{self.base_urls[server]}/v1/models", timeout=timeout_s)
        response.raise_for_status()
        models = response.json().get("data", [])
        return [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []

    async def context_window(self, server: int, model: str, timeout_s: float = 10.0) -> int | None:
        """Server ``server``'s ``max_model_len`` for ``model`` (given, or read once from its ``/v1/models``
        within ``timeout_s``; None when it lists none or cannot be asked now)."""
        if self.max_model_len is not None:
            return self.max_model_len
        if server not in self._windows:
            try:
                models = await self._models(server, timeout_s)
            except (httpx.HTTPError, ValueError) as exc:
                logger.debug("cannot read %s/v1/models (%s): its context window is unknown for now",
                             self.base_urls[server], exc)  # fmt: skip
                return None
            listed = [m.get("max_model_len") for m in models if m.get("id") == model]
            self._windows[server] = int(listed[0]) if listed and isinstance(listed[0], int) else None
        return self._windows[server]

    def payload(self, request: GenerationRequest, model: str, window: int | None = None) -> dict[str, Any]:
        """The request body; ``max_tokens`` is what ``window`` (the server's context window) leaves, if less."""
        s = request.sampling
        max_tokens = request.max_tokens if window is None else min(request.max_tokens, window - len(request.prompt_ids))
        body: dict[str, Any] = {
            "model": model,
            "prompt": request.prompt_ids,
            "max_tokens": max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "min_p": s.min_p,
            "repetition_penalty": s.repetition_penalty,
            "n": 1,
            "stream": False,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": list(request.stop_token_ids),
        }
        if s.seed is not None:
            body["seed"] = s.seed
        if s.logprobs:
            body["logprobs"] = 1
            body["return_tokens_as_token_ids"] = True
        return body

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        deadline = time.monotonic() + (request.timeout_s if request.timeout_s is not None else self.request_timeout_s)
        model = await self.served_model()
        server = self.router.acquire(request.request_id, request.group_id)
        url = f"{self.base_urls[server]}/v1/completions"
        try:
            window = await self.context_window(server, model, min(10.0, max(0.001, deadline - time.monotonic())))
            if window is not None and len(request.prompt_ids) >= window:
                raise BackendContextOverflow(
                    f"the prompt of {len(request.prompt_ids)} tokens leaves no room in the server's context window "
                    f"(max_model_len={window} at {self.base_urls[server]})"
                )
            body = self.payload(request, model, window)
            attempt = 0
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BackendTimeout(f"no answer from {url} within the episode deadline")
                try:
                    response = await self._client().post(url, json=body, timeout=min(remaining, self.request_timeout_s))
                except httpx.TimeoutException as exc:
                    if deadline - time.monotonic() <= 0:
                        raise BackendTimeout(f"{url} did not answer within the episode deadline") from exc
                    error: Exception = exc
                except httpx.TransportError as exc:
                    error = exc
                else:
                    outcome = self._parse(response, request, url)
                    if isinstance(outcome, GenerationResult):
                        return outcome
                    error = outcome
                attempt += 1
                if attempt > self.max_retries:
                    raise BackendError(f"{url} failed after {self.max_retries} retries: {error}") from error
                delay = min(0.5 * 2 ** (attempt - 1), 8.0) * (0.5 + random.random())
                logger.debug("retrying %s in %.2fs after %s", url, delay, error)
                await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        finally:
            self.router.release(server)

    def _parse(self, response: httpx.Response, request: GenerationRequest, url: str) -> GenerationResult | BackendError:
        """The result, or the error of a retryable failure (its status and the server's message, so a
        persistent one says why); raises for permanent ones."""
        if response.status_code in _RETRY_STATUS:
            message = _server_message(response)
            logger.warning("%s answered HTTP %d: %s", url, response.status_code, message)
            return BackendError(f"{url} answered HTTP {response.status_code}: {message}")
        try:
            data = response.json()
        except ValueError as exc:
            raise BackendError(f"{url} answered HTTP {response.status_code} with non-JSON") from exc
        if response.status_code >= 400 or data.get("object") == "error":
            message = _server_message(response)
            if response.status_code == 400 and any(m in message.lower() for m in _CONTEXT_MARKERS):
                raise BackendContextOverflow(message)
            raise BackendError(f"{url} answered HTTP {response.status_code}: {message}")
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError) as exc:
            raise BackendError(f"{url}: reply has no choices") from exc
        finish = choice.get("finish_reason")
        if finish == "abort":  # preempted or cancelled by the server: retried, never a finished turn
            return BackendError(f"{url} aborted the generation (finish_reason='abort')")
        if finish not in (FINISH_STOP, FINISH_LENGTH):
            raise BackendError(f"{url}: unexpected finish_reason {finish!r}")
        logprob_block = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        tokens = logprob_block.get("tokens")
        if tokens is not None:
            from_logprobs = [_token_id(t, url) for t in tokens]
            if ids is None:
                ids = from_logprobs
            elif list(ids) != from_logprobs:
                raise BackendError(f"{url}: token_ids and logprob tokens disagree")
        if ids is None:
            raise BackendError(
                f"{url}: reply carries no token ids (the server must support return_token_ids or "
                "return_tokens_as_token_ids); agentboost never re-tokenises text"
            )
        logprobs = None
        if request.sampling.logprobs:
            raw = logprob_block.get("token_logprobs")
            if raw is None or len(raw) != len(ids) or any(x is None for x in raw):
                raise BackendError(f"{url}: missing or misaligned token_logprobs")
            logprobs = [float(x) for x in raw]
        prompt_ids = choice.get("prompt_token_ids", data.get("prompt_token_ids"))
        return GenerationResult(
            token_ids=[int(t) for t in ids],
            logprobs=logprobs,
            finish_reason=finish,
            stop_reason=choice.get("stop_reason"),
            prompt_token_ids=[int(t) for t in prompt_ids] if prompt_ids is not None else None,
            server=url,
            weight_version=response.headers.get("x-weight-version"),
        )


def _server_message(response: httpx.Response, limit: int = 500) -> str:
    """The error message of a failed reply (vLLM's ``{"error": {"message": ...}}``, older versions'
    ``{"object": "error", "message": ...}``, or the raw body), capped."""
    try:
        data = response.json()
    except ValueError:
        text = response.text
    else:
        if isinstance(data, dict):
            error = data.get("error")
            text = str(data.get("message") or (error.get("message") if isinstance(error, dict) else error) or data)
        else:
            text = str(data)
    text = " ".join(text.split())
    return (text[:limit] + "...") if len(text) > limit else (text or "(empty body)")


def _root(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url


def _token_id(token: Any, url: str) -> int:
    if isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX):
        try:
            return int(token[len(_TOKEN_ID_PREFIX) :])
        except ValueError:
            pass
    raise BackendError(f"{url}: logprob token {token!r} is not in 'token_id:N' form")
