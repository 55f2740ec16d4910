"""A Strands ``retrieve`` tool backed by the retrieval server (:mod:`agentboost.retrieval.server`).

The tool never raises into the agent loop: bad arguments, an unreachable or failing server and
malformed answers come back as tool errors the model can read. Transient failures (connection
errors, timeouts, 429 and 5xx answers) are retried a capped number of times within one overall
time budget; the passages returned are capped in length.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import httpx
from strands import tool

logger = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8010"
URL_ENV = "AGENTBOOST_RETRIEVAL_URL"
MAX_K = 10
MAX_QUERY_CHARS = 500
MAX_OUTPUT_CHARS = 4000
ATTEMPTS = 3
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


def retrieval_url(task: dict[str, Any] | None = None) -> str:
    """Server URL: task field ``retrieval_url``, else ``$AGENTBOOST_RETRIEVAL_URL``, else the default."""
    return str((task or {}).get("retrieval_url") or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


def _error(text: str) -> dict[str, Any]:
    return {"status": "error", "content": [{"text": f"Error: {text}"}]}


def format_hits(hits: list[dict[str, Any]], limit: int = MAX_OUTPUT_CHARS) -> str:
    """Numbered ``[i] title`` + text blocks, cut at ``limit`` characters."""
    parts = [f"[{i}] {h.get('title', '')}\n{h.get('text', '')}" for i, h in enumerate(hits, 1)]
    text = "\n\n".join(parts) or "(no documents found)"
    return text if len(text) <= limit else text[:limit] + f"\n... [{len(text) - limit} more characters cut]"


async def fetch_hits(
    base: str, query: str, k: int, *, timeout_s: float, attempts: int = ATTEMPTS
) -> list[dict[str, Any]]:
    """The server's hits for one query; ``RuntimeError`` with a model-readable reason on failure."""
    deadline = time.monotonic() + timeout_s
    payload = {"queries": [query], "k": k}
    reason = "no attempt made"
    async with httpx.AsyncClient() as client:
        for attempt in range(attempts):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = f"retrieval timed out after {timeout_s:g}s"
                break
            try:
                response = await client.post(f"{base}/retrieve", json=payload, timeout=remaining)
            except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
                raise RuntimeError(f"bad retrieval server URL {base!r} ({exc})") from None
            except httpx.TimeoutException:
                reason = f"retrieval timed out after {timeout_s:g}s"
                break
            except httpx.TransportError as exc:  # server restarting: retry, capped
                reason = f"retrieval server unreachable ({type(exc).__name__})"
            else:
                if response.status_code == 200:
                    try:
                        hits = response.json()["results"][0]
                    except (ValueError, KeyError, IndexError, TypeError):
                        raise RuntimeError("malformed answer from the retrieval server") from None
                    if not isinstance(hits, list) or not all(isinstance(h, dict) for h in hits):
                        raise RuntimeError("malformed answer from the retrieval server")
                    return hits
                reason = f"retrieval server answered {response.status_code}: {response.text[:200]}"
                if response.status_code not in _RETRY_STATUS:
                    break
            if attempt + 1 < attempts:
                await asyncio.sleep(min(0.2 * 2**attempt, max(0.0, deadline - time.monotonic())))
    logger.warning("retrieve failed: %s (%s)", reason, base)
    raise RuntimeError(reason)


def make_retrieve_tool(url: str | None = None, *, timeout_s: float = 10.0, name: str = "retrieve") -> Any:
    """``retrieve(query, k)``: the ``k`` most relevant passages (title + text) from the server at ``url``.

    Args:
        url: server base URL (default: :func:`retrieval_url`).
        timeout_s: overall time budget of one call, retries included.
        name: tool name shown to the model.
    """
    base = (url or retrieval_url()).rstrip("/")

    @tool(name=name)
    async def retrieve(query: str, k: int = 3) -> dict[str, Any]:
        """Search the document collection and return the most relevant passages.

        Args:
            query: what to search for (a short, specific phrase works best).
            k: how many passages to return (1-10).
        """
        if not isinstance(query, str) or not query.strip():
            return _error("`query` must be a non-empty string.")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            return _error(f"`k` must be an integer between 1 and {MAX_K}.")
        try:
            hits = await fetch_hits(base, query.strip()[:MAX_QUERY_CHARS], k, timeout_s=timeout_s)
        except RuntimeError as exc:
            return _error(str(exc))
        return {"status": "success", "content": [{"text": format_hits(hits)}]}

    return retrieve
