"""Shared plumbing of the examples' ``prepare_*_data.py`` scripts.

Each script turns a source dataset into rows that :meth:`StrandsEnv.from_dict` reads, then
:func:`write_dataset` writes every split as ``<out>/<split>.jsonl`` (lossless for nested fields) and
registers it with rLLM's ``DatasetRegistry`` when rLLM is installed (what the ``train_*.py`` scripts
load). Sources are Hugging Face datasets (``--cache-dir``; ``--limit`` streams only the rows needed)
or, with ``--sample``, the small raw files shipped next to the script, in the hub rows' format (math,
DeepCoder), so the conversion code that runs offline is the one that runs on the real data. The RAG
sample is the exception: its questions name supporting passages of the shipped corpus by id.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

Converter = Callable[[dict[str, Any], int], dict[str, Any] | None]


def add_common_arguments(parser: argparse.ArgumentParser, *, default_out: str) -> None:
    parser.add_argument("--out-dir", default=default_out, help=f"where the split files go (default {default_out})")
    parser.add_argument("--limit", type=int, default=None,
                        help="keep at most N rows per source split (streamed: only those rows are read)")  # fmt: skip
    parser.add_argument("--cache-dir", default=None, help="Hugging Face datasets cache directory")
    parser.add_argument("--sample", action="store_true", help="use the small raw sample shipped with the example")
    parser.add_argument("--register", choices=["auto", "yes", "no"], default="auto",
                        help="register with rLLM's DatasetRegistry (auto: when rLLM is installed)")  # fmt: skip


def hub_rows(
    name: str, *, split: str, config: str | None = None, cache_dir: str | None = None, limit: int | None = None
) -> Iterable[dict]:
    """Rows of a Hugging Face dataset: the whole split downloaded once into the datasets cache, or, with
    ``limit``, streamed (only the rows the conversion reads are fetched; nothing is cached)."""
    from datasets import load_dataset

    if limit is not None:
        return load_dataset(name, config, split=split, streaming=True)
    return load_dataset(name, config, split=split, cache_dir=cache_dir)


def file_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None


def convert_rows(
    source: Iterable[dict[str, Any]], convert: Converter, *, limit: int | None = None, desc: str = "rows"
) -> list[dict[str, Any]]:
    """Convert raw rows (dropping the ones ``convert`` rejects, counted and logged) with a progress bar."""
    from tqdm import tqdm

    out: list[dict[str, Any]] = []
    rejected = 0
    for index, raw in enumerate(tqdm(source, desc=desc, unit="row", leave=False)):
        if limit is not None and len(out) >= limit:
            break
        row = convert(raw, index)
        if row is None:
            rejected += 1
        else:
            out.append(row)
    if rejected:
        logger.warning("%s: %d rows rejected by the conversion (kept %d)", desc, rejected, len(out))
    logger.info("%s: %d rows", desc, len(out))
    return out


def write_dataset(name: str, splits: dict[str, list[dict[str, Any]]], out_dir: str | Path, *,
                  register: str = "auto") -> dict[str, Path]:  # fmt: skip
    """Write ``<out_dir>/<split>.jsonl`` per split and register them with rLLM (see module doc)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, rows in splits.items():
        if not rows:
            raise ValueError(f"{name}/{split}: no rows survived the conversion")
        path = out / f"{split}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        tmp.replace(path)
        written[split] = path
        logger.info("wrote %s (%d rows)", path, len(rows))
    if register == "no":
        return written
    try:
        from rllm.data.dataset import DatasetRegistry
    except ImportError:
        if register == "yes":
            raise SystemExit("--register yes: rLLM is not installed (see README 'Training on GPUs')") from None
        logger.info("rLLM is not installed: not registered (the .jsonl files work with `agentboost eval`)")
        return written
    for split, rows in splits.items():
        DatasetRegistry.register_dataset(name, rows, split)
        logger.info("registered %s/%s with rLLM's DatasetRegistry", name, split)
    return written
