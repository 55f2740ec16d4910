"""Auto-batching HTTP retrieval server.

``POST /retrieve`` with ``{"queries": ["..."], "k": 3}`` returns ``{"results": [[{"id", "title",
"text", "score"}, ...], ...]}`` (one list per query); ``GET /health`` returns the index manifest.
Queries of concurrent requests are collected for up to ``max_wait_ms`` (or until ``max_batch``
queries) and embedded in one encoder call, so many agents retrieving at once cost one forward pass.
Bad input gets a 400 with the reason; every size is capped.

    python -m agentboost.retrieval.server                       # the shipped corpus, default index
    python -m agentboost.retrieval.server --index /data/wiki18-minilm --port 8010
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

MAX_QUERIES = 64
MAX_QUERY_CHARS = 2000
MAX_K = 50
MAX_BODY_BYTES = 1 << 20


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)


class Retriever:
    """Batches queries from concurrent callers into one encoder call."""

    def __init__(self, encoder: Any, index: Any, *, max_batch: int = 256, max_wait_ms: float = 5.0) -> None:
        self.encoder, self.index = encoder, index
        self.max_batch, self.max_wait_s = max_batch, max_wait_ms / 1000
        self.batches = 0
        self.queries = 0
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def retrieve(self, queries: list[str], k: int) -> list[list[dict[str, Any]]]:
        self.start()
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(queries, k, future))
        return await future

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            size = len(batch[0].queries)
            deadline = loop.time() + self.max_wait_s
            while size < self.max_batch:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), timeout)
                except (TimeoutError, asyncio.TimeoutError):
                    break
                batch.append(item)
                size += len(item.queries)
            texts = [q for item in batch for q in item.queries]
            try:
                vectors = await asyncio.to_thread(self.encoder.encode, texts)
                hits = await asyncio.to_thread(self.index.search, vectors, max(item.k for item in batch))
            except Exception as exc:  # every waiting caller gets the error
                logger.exception("retrieval batch failed")
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                continue
            self.batches += 1
            self.queries += len(texts)
            offset = 0
            for item in batch:
                rows = hits[offset : offset + len(item.queries)]
                offset += len(item.queries)
                if not item.future.done():
                    item.future.set_result([row[: item.k] for row in rows])


def _bad(reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=400)


def make_app(retriever: Retriever) -> web.Application:
    async def retrieve(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except Exception:  # any undecodable body is the client error
            return _bad("body must be JSON")
        if not isinstance(body, dict):
            return _bad("body must be a JSON object")
        queries, k = body.get("queries"), body.get("k", 3)
        if isinstance(body.get("query"), str) and queries is None:
            queries = [body["query"]]
        if not isinstance(queries, list) or not queries or not all(isinstance(q, str) and q.strip() for q in queries):
            return _bad("'queries' must be a non-empty list of non-empty strings")
        if len(queries) > MAX_QUERIES:
            return _bad(f"at most {MAX_QUERIES} queries per request")
        if any(len(q) > MAX_QUERY_CHARS for q in queries):
            return _bad(f"a query may have at most {MAX_QUERY_CHARS} characters")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            return _bad(f"'k' must be an integer in 1..{MAX_K}")
        results = await retriever.retrieve(queries, k)
        return web.json_response({"results": results})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "index": retriever.index.manifest,
                                  "batches": retriever.batches, "queries": retriever.queries})  # fmt: skip

    async def on_cleanup(app: web.Application) -> None:
        await retriever.stop()

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/retrieve", retrieve)
    app.router.add_get("/health", health)
    app.on_cleanup.append(on_cleanup)
    return app


def main(argv: list[str] | None = None) -> int:
    from .encoder import Encoder
    from .index import VectorIndex, default_index

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", default=None, help="a directory built by agentboost.retrieval.build_index")
    parser.add_argument("--model", default=None, help="encoder directory (default: the offline MiniLM)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8010)
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    encoder = Encoder(args.model, device=args.device)
    index = VectorIndex.load(args.index) if args.index else default_index(encoder)
    if index.manifest.get("model") != encoder.name:
        raise SystemExit(f"the index was built with {index.manifest.get('model')!r}, the encoder is {encoder.name!r}")
    logger.info("serving %d documents on http://%s:%d", len(index.docs), args.host, args.port)
    web.run_app(make_app(Retriever(encoder, index, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms)),
                host=args.host, port=args.port, print=None)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
