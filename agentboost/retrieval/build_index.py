"""Build a retrieval index from a corpus (``.jsonl`` of ``{"id", "title", "text"}``).

python -m agentboost.retrieval.build_index --corpus wiki18.jsonl --out /data/wiki18-minilm --device cuda
"""

from __future__ import annotations

import argparse
import logging
import time

from .encoder import Encoder
from .index import SHIPPED_CORPUS, VectorIndex, read_corpus

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(SHIPPED_CORPUS), help="corpus .jsonl (default: the shipped one)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default=None, help="encoder directory (default: the offline MiniLM)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.monotonic()
    docs = read_corpus(args.corpus)
    index = VectorIndex.build(docs, Encoder(args.model, device=args.device), batch_size=args.batch_size)
    index.save(args.out)
    logger.info("indexed %d documents into %s in %.1f s", len(docs), args.out, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
