"""A Strands ``retrieve`` tool backed by the retrieval server (:mod:`agentboost.retrieval.server`)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
from strands import tool

DEFAULT_URL = "http://127.0.0.1:8010"
URL_ENV = "AGENTBOOST_RETRIEVAL_URL"
MAX_K = 10
MAX_QUERY_CHARS = 500
MAX_OUTPUT_CHARS = 4000
ATTEMPTS = 3


def retrieval_url(task: dict[str, Any] | None = None) -> str:
    return str((task or {}).get("retrieval_url") or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


def _error(text: str) -> dict[str, Any]:
    return {"status": "error", "content": [{"text": f"Error: {text}"}]}


def format_hits(hits: list[dict[str, Any]], limit: int = MAX_OUTPUT_CHARS) -> str:
    parts = [f"[{i}] {h.get('title', '')}\n{h.get('text', '')}" for i, h in enumerate(hits, 1)]
    text = "\n\n".join(parts) or "(no documents found)"
    return text if len(text) <= limit else text[:limit] + f"\n... [{len(text) - limit} more characters cut]"


def make_retrieve_tool(url: str | None = None, *, timeout_s: float = 10.0) -> Any:
    """``retrieve(query, k)``: the k most relevant passages (title + text) from the server at ``url``."""
    base = (url or retrieval_url()).rstrip("/")

    @tool
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
        payload = {"queries": [query[:MAX_QUERY_CHARS]], "k": k}
        last = ""
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            for attempt in range(ATTEMPTS):
                try:
                    response = await client.post(f"{base}/retrieve", json=payload)
                except httpx.TransportError as exc:  # server restarting / overloaded: retry, capped
                    last = f"retrieval server unreachable ({type(exc).__name__})"
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                if response.status_code != 200:
                    return _error(f"retrieval server answered {response.status_code}: {response.text[:200]}")
                try:
                    hits = response.json()["results"][0]
                except (ValueError, KeyError, IndexError, TypeError):
                    return _error("malformed answer from the retrieval server")
                return {"status": "success", "content": [{"text": format_hits(hits)}]}
        return _error(last)

    return retrieve
