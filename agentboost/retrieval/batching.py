"""Auto-batching of retrieval requests: the queries of concurrent callers share one encoder call.

The first request that arrives opens a batch; further requests join it for up to ``max_wait_ms`` or
until it holds ``max_batch`` queries. The batch is embedded in one ``encoder.encode`` call and
searched in one ``index.search`` call (both in a worker thread, so the event loop keeps accepting
requests), then every caller gets its own rows back.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


class Overloaded(RuntimeError):
    """More queries are waiting than the retriever accepts (the server answers 503)."""


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future[list[list[dict[str, Any]]]] = field(repr=False)


class Retriever:
    """Batches the queries of concurrent :meth:`retrieve` calls into one encoder call.

    Args:
        encoder: ``encode(texts) -> (n, dim) array``.
        index: ``search(vectors, k) -> list[list[hit]]`` and ``manifest``.
        max_batch: most queries per encoder call (a single larger request still goes in one call).
        max_wait_ms: how long an open batch waits for more requests.
        max_pending: most queries waiting at once; beyond it :meth:`retrieve` raises :class:`Overloaded`.
    """

    def __init__(
        self, encoder: Any, index: Any, *, max_batch: int = 256, max_wait_ms: float = 2.0, max_pending: int = 8192
    ) -> None:
        if max_batch < 1 or max_wait_ms < 0 or max_pending < 1:
            raise ValueError("max_batch and max_pending must be >= 1, max_wait_ms >= 0")
        self.encoder, self.index = encoder, index
        self.max_batch, self.max_wait_s, self.max_pending = max_batch, max_wait_ms / 1000, max_pending
        self.batches = 0  # encoder calls made
        self.requests = 0  # requests answered
        self.queries = 0  # queries answered
        self.pending = 0  # queries waiting or in flight
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._carry: _Pending | None = None  # a request that did not fit the last batch: it opens the next

    def start(self) -> None:
        """Start the batching loop on the running event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="retrieval-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        waiting = [self._carry] if self._carry is not None else []
        self._carry = None
        while not self._queue.empty():
            waiting.append(self._queue.get_nowait())
        for item in waiting:  # nobody will answer them now
            if not item.future.done():
                item.future.set_exception(RuntimeError("retriever stopped"))

    def stats(self) -> dict[str, int]:
        return {"batches": self.batches, "requests": self.requests, "queries": self.queries, "pending": self.pending}

    async def retrieve(self, queries: list[str], k: int) -> list[list[dict[str, Any]]]:
        """The ``k`` best hits for each query (input already validated by the caller)."""
        if self.pending + len(queries) > self.max_pending:
            raise Overloaded(f"{self.pending} queries already waiting")
        self.start()
        future: asyncio.Future[list[list[dict[str, Any]]]] = asyncio.get_running_loop().create_future()
        self.pending += len(queries)
        try:
            self._queue.put_nowait(_Pending(queries, k, future))
            return await future
        finally:
            self.pending -= len(queries)

    async def _collect(self) -> list[_Pending]:
        loop = asyncio.get_running_loop()
        first, self._carry = self._carry, None
        batch = [first if first is not None else await self._queue.get()]
        size = len(batch[0].queries)
        deadline = loop.time() + self.max_wait_s
        while size < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), timeout)
                except (TimeoutError, asyncio.TimeoutError):
                    break
            if size + len(item.queries) > self.max_batch:
                self._carry = item
                break
            batch.append(item)
            size += len(item.queries)
        return batch

    async def _loop(self) -> None:
        while True:
            batch = [item for item in await self._collect() if not item.future.done()]  # drop cancelled callers
            if not batch:
                continue
            texts = [q for item in batch for q in item.queries]
            try:
                vectors = await asyncio.to_thread(self.encoder.encode, texts)
                hits = await asyncio.to_thread(self.index.search, vectors, max(item.k for item in batch))
            except Exception as exc:  # every waiting caller gets the error; the loop survives
                logger.exception("retrieval batch of %d queries failed", len(texts))
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                continue
            self.batches += 1
            self.requests += len(batch)
            self.queries += len(texts)
            offset = 0
            for item in batch:
                rows = hits[offset : offset + len(item.queries)]
                offset += len(item.queries)
                if not item.future.done():
                    item.future.set_result([row[: item.k] for row in rows])
