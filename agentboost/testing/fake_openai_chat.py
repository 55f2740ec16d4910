"""A real HTTP server speaking the OpenAI chat-completions protocol, with scripted replies.

For tests without network and for trying an environment against a "frontier model" or an LLM judge
offline: each request's reply is decided by a ``responder(body) -> ChatReply`` function that sees the
whole request (messages, tools, parameters). It answers what the ``openai`` client (and so Strands'
``OpenAIModel``) expects from OpenAI, vLLM's chat API or Ollama's ``/v1``: ``POST /v1/chat/completions``
streamed as server-sent events (role delta, text deltas, tool-call deltas with index/id/name/argument
pieces, a final chunk with ``finish_reason``, a usage chunk when ``stream_options.include_usage``,
``[DONE]``) or as one ``chat.completion`` object; ``GET /v1/models``; error objects with the status.
Fault injection (``fail_next``, ``delay_s``) and an optional bearer key check exercise clients.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class ChatReply:
    """One assistant turn: text and/or tool calls (``{"name": ..., "arguments": dict | str}``)."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    """Default: ``tool_calls`` when there are tool calls, else ``stop``."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


Responder = Callable[[dict[str, Any]], ChatReply]


class FakeOpenAIChatServer:
    def __init__(
        self,
        responder: Responder,
        *,
        model: str = "fake-chat-model",
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.responder = responder
        self.model = model
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.fail_next: list[int] = []
        """HTTP status codes to answer the next requests with (consumed in order)."""
        self.delay_s = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        """Most chat requests being answered at once (concurrency checks)."""
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as ``base_url``."""
        return f"{self.url}/v1"

    def start(self) -> FakeOpenAIChatServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-openai-chat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAIChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- protocol ---------------------------------------------------------------------------
    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | ChatReply]:
        """The status and either an error payload or the scripted reply for ``body``."""
        with self._lock:
            self.requests.append(body)
            if self.fail_next:
                status = self.fail_next.pop(0)
                return status, _error(f"injected failure {status}", "server_error", status)
        if body.get("model") != self.model:
            return 404, _error(f"The model `{body.get('model')}` does not exist.", "invalid_request_error", 404)
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return 400, _error("messages must be a non-empty list", "invalid_request_error", 400)
        return 200, self.responder(body)

    def completion(self, reply: ChatReply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": _call_id(i), "type": "function",
                 "function": {"name": call["name"], "arguments": _arguments(call)}}
                for i, call in enumerate(reply.tool_calls)
            ]  # fmt: skip
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": _finish(reply)}],
            "usage": _usage(reply),
        }

    def chunks(self, reply: ChatReply, include_usage: bool) -> list[dict[str, Any]]:
        """The streamed form of ``reply``: what OpenAI sends, split into small pieces."""
        base = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": self.model}  # fmt: skip

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        out = [chunk({"role": "assistant", "content": ""})]
        text = reply.content or ""
        out += [chunk({"content": text[i : i + 7]}) for i in range(0, len(text), 7)]
        for i, call in enumerate(reply.tool_calls):
            arguments = _arguments(call)
            out.append(chunk({"tool_calls": [{"index": i, "id": _call_id(i), "type": "function",
                                              "function": {"name": call["name"], "arguments": ""}}]}))  # fmt: skip
            out += [
                chunk({"tool_calls": [{"index": i, "function": {"arguments": arguments[j : j + 9]}}]})
                for j in range(0, len(arguments), 9)
            ]
        out.append(chunk({}, _finish(reply)))
        if include_usage:
            out.append({**base, "choices": [], "usage": _usage(reply)})
        return out

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

            def _authorised(self) -> bool:
                if server.api_key is None:
                    return True
                if self.headers.get("Authorization") == f"Bearer {server.api_key}":
                    return True
                self._send(401, _error("Incorrect API key provided", "invalid_request_error", 401))
                return False

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
                else:
                    self._send(404, _error("not found", "invalid_request_error", 404))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length) if length else b""
                if not self._authorised():
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._send(400, _error("invalid JSON", "invalid_request_error", 400))
                    return
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, _error("not found", "invalid_request_error", 404))
                    return
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if server.delay_s:
                        time.sleep(server.delay_s)
                    status, result = server.reply(body)
                finally:
                    with server._lock:
                        server.in_flight -= 1
                if not isinstance(result, ChatReply):
                    self._send(status, result)
                    return
                if not body.get("stream"):
                    self._send(200, server.completion(result))
                    return
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                for payload in server.chunks(result, include_usage):
                    self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        return Handler


def _call_id(index: int) -> str:
    return f"call_{index}"


def _arguments(call: dict[str, Any]) -> str:
    arguments = call.get("arguments", {})
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _finish(reply: ChatReply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def _usage(reply: ChatReply) -> dict[str, int]:
    prompt = reply.prompt_tokens if reply.prompt_tokens is not None else 10
    completion = reply.completion_tokens
    if completion is None:
        completion = max(1, len(reply.content or "") // 4 + 5 * len(reply.tool_calls))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the request's last user message (helper for responders)."""
    for message in reversed(body.get("messages", [])):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))
    return ""


def tool_results(body: dict[str, Any]) -> list[str]:
    """The contents of the request's tool messages, in order (helper for responders)."""
    out = []
    for message in body.get("messages", []):
        if message.get("role") == "tool":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            out.append(str(content))
    return out
