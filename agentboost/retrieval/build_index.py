"""Build a retrieval index from a corpus (``.jsonl``, one ``{"id", "title", "text"}`` object per line).

    python -m agentboost.retrieval.build_index --out /tmp/sample-index                 # the shipped corpus
    python -m agentboost.retrieval.build_index --corpus wiki18.jsonl --out /data/wiki18-minilm --device cuda --fp16

Serve the result with ``python -m agentboost.retrieval.server --index DIR`` (same ``--model``).
"""

from __future__ import annotations

import argparse
import logging

from .corpus import SHIPPED_CORPUS
from .encoder import Encoder
from .index import build_index

logger = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(SHIPPED_CORPUS), help="corpus .jsonl (default: the shipped one)")
    parser.add_argument("--out", required=True, help="index directory to write")
    parser.add_argument("--model", default=None, help="local encoder directory (default: the offline MiniLM)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1...")
    parser.add_argument("--fp16", action="store_true", help="half-precision encoder (GPU)")
    parser.add_argument("--batch-size", type=int, default=1024, help="documents read and embedded per step")
    parser.add_argument("--encoder-batch-size", type=int, default=64, help="texts per forward pass")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    encoder = Encoder(args.model, device=args.device, batch_size=args.encoder_batch_size, fp16=args.fp16)
    manifest = build_index(args.corpus, args.out, encoder, batch_size=args.batch_size)
    logger.info("done: %d documents, %s", manifest["count"], args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
