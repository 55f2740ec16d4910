"""A dense vector index: exact inner-product search (FAISS ``IndexFlatIP``) over unit-length embeddings.

On disk, one directory:

* ``vectors.npy``: float32 ``(count, dim)`` embeddings, row ``i`` = document ``i``;
* ``docs.jsonl`` + ``offsets.npy``: the documents (``id``, ``title``, ``text``) and their byte offsets,
  read on demand (:class:`~agentboost.retrieval.corpus.DocStore`);
* ``manifest.json``: encoder, dimension, count, corpus sha256. Written last: a directory with a
  manifest is complete.

:func:`build_index` streams the corpus (constant memory apart from the output vectors, which go to a
memory-mapped file). Without the ``faiss`` package the same exact search runs in NumPy, in chunks
(slower on large corpora; logged at WARNING).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .corpus import SHIPPED_CORPUS, CorpusHasher, Doc, Docs, DocStore, count_docs, doc_text, iter_corpus, read_corpus

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
_ADD_CHUNK = 1 << 16  # rows handed to FAISS / multiplied in NumPy at a time
_NUMPY_CHUNK = 1 << 18


def load_faiss() -> Any:
    """The ``faiss`` module, or None when it is not installed."""
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def cache_root() -> Path:
    """``$AGENTBOOST_CACHE``, else ``~/.cache/agentboost``."""
    return Path(os.environ.get("AGENTBOOST_CACHE") or Path.home() / ".cache" / "agentboost")


def _batched(items: Iterable[Doc], size: int) -> Iterator[list[Doc]]:
    batch: list[Doc] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _numpy_top_k(queries: np.ndarray, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k inner products, scanning ``vectors`` in chunks (works on a memory map)."""
    scores = np.empty((len(queries), 0), dtype=np.float32)
    ids = np.empty((len(queries), 0), dtype=np.int64)
    for start in range(0, len(vectors), _NUMPY_CHUNK):
        sims = queries @ np.asarray(vectors[start : start + _NUMPY_CHUNK], dtype=np.float32).T
        keep = min(k, sims.shape[1])
        part = np.argpartition(-sims, keep - 1, axis=1)[:, :keep]
        scores = np.concatenate([scores, np.take_along_axis(sims, part, axis=1)], axis=1)
        ids = np.concatenate([ids, part + start], axis=1)
        order = np.lexsort((ids, -scores), axis=1)[:, :k]  # best score first, lower row on ties
        scores, ids = np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)
    return scores, ids


class VectorIndex:
    """Exact nearest-neighbour search by inner product over the rows of ``vectors``.

    Args:
        vectors: ``(count, dim)`` float32 unit vectors (an array or a memory map).
        docs: the documents, ``docs[i]`` for row ``i`` (a list or a :class:`DocStore`).
        manifest: what built the index (``model``, ``dim``, ``count``, ``corpus_sha256``...).
    """

    def __init__(self, vectors: np.ndarray, docs: Docs, manifest: dict[str, Any]) -> None:
        if vectors.ndim != 2 or len(vectors) != len(docs) or len(docs) == 0:
            raise ValueError(f"{vectors.shape} vectors for {len(docs)} documents")
        self.docs, self.manifest = docs, manifest
        self.dim = int(vectors.shape[1])
        faiss = load_faiss()
        if faiss is None:
            logger.warning("faiss is not importable: exact search in NumPy (pip install faiss-cpu for speed)")
            self.backend = "numpy"
            self._vectors: np.ndarray | None = vectors
            self._faiss_index: Any = None
        else:
            self.backend = "faiss"
            self._vectors = None  # FAISS holds its own copy; the memory map is dropped
            self._faiss_index = faiss.IndexFlatIP(self.dim)
            for start in range(0, len(vectors), _ADD_CHUNK):
                chunk = np.ascontiguousarray(vectors[start : start + _ADD_CHUNK], dtype=np.float32)
                self._faiss_index.add(chunk)

    def __len__(self) -> int:
        return len(self.docs)

    def search(self, queries: np.ndarray, k: int) -> list[list[dict[str, Any]]]:
        """For each query vector, its ``k`` best documents (``id``, ``title``, ``text``, ``score``), best first."""
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        k = max(1, min(int(k), len(self.docs)))
        if self._faiss_index is not None:
            scores, ids = self._faiss_index.search(queries, k)
        else:
            assert self._vectors is not None
            scores, ids = _numpy_top_k(queries, self._vectors, k)
        return [
            [{**self.docs[int(i)], "score": float(s)} for i, s in zip(row_ids, row_scores, strict=True) if i >= 0]
            for row_ids, row_scores in zip(ids, scores, strict=True)
        ]

    @classmethod
    def load(cls, directory: str | Path) -> VectorIndex:
        """Open an index directory written by :func:`build_index`."""
        src = Path(directory)
        if not (src / "manifest.json").exists():
            raise FileNotFoundError(f"{src} is not a built index (no manifest.json); build one with build_index")
        manifest = json.loads((src / "manifest.json").read_text())
        if manifest.get("format") != FORMAT_VERSION:
            raise ValueError(f"{src}: index format {manifest.get('format')}, expected {FORMAT_VERSION}; rebuild it")
        docs = DocStore(src / "docs.jsonl", src / "offsets.npy")
        vectors = np.load(src / "vectors.npy", mmap_mode="r")
        if len(docs) != manifest["count"] or vectors.shape != (manifest["count"], manifest["dim"]):
            raise ValueError(f"{src}: index files do not match its manifest")
        return cls(vectors, docs, manifest)


def build_index(
    corpus: str | Path, out: str | Path, encoder: Any, *, batch_size: int = 1024, progress: bool = True
) -> dict[str, Any]:
    """Embed every document of ``corpus`` into the index directory ``out``; returns its manifest.

    ``encoder`` needs ``encode(texts) -> (n, dim) array``, ``dim`` and ``describe() -> dict``.
    """
    from tqdm import tqdm

    started = time.monotonic()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)  # the directory is incomplete until the end
    total = count_docs(corpus)
    if total == 0:
        raise ValueError(f"{corpus}: empty corpus")
    vectors = np.lib.format.open_memmap(out / "vectors.npy", mode="w+", dtype=np.float32, shape=(total, encoder.dim))
    offsets = np.zeros(total + 1, dtype=np.int64)
    hasher, row = CorpusHasher(), 0
    with (
        open(out / "docs.jsonl", "wb") as docs_fh,
        tqdm(total=total, desc="embedding", unit="doc", disable=not progress) as bar,
    ):
        for batch in _batched(iter_corpus(corpus), batch_size):
            if row + len(batch) > total:
                raise ValueError(f"{corpus} changed while it was being indexed")
            for i, doc in enumerate(batch, row):
                line = (json.dumps(doc, ensure_ascii=False) + "\n").encode()
                docs_fh.write(line)
                offsets[i + 1] = offsets[i] + len(line)
                hasher.update(doc)
            vectors[row : row + len(batch)] = encoder.encode([doc_text(d) for d in batch])
            row += len(batch)
            bar.update(len(batch))
    if row != total:
        raise ValueError(f"{corpus}: {total} non-empty lines but {row} documents")
    vectors.flush()
    del vectors
    np.save(out / "offsets.npy", offsets)
    manifest = {
        **encoder.describe(),
        "format": FORMAT_VERSION,
        "count": total,
        "corpus": str(corpus),
        "corpus_sha256": hasher.hexdigest(),
        "build_seconds": round(time.monotonic() - started, 3),
    }
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, out / "manifest.json")
    logger.info("indexed %d documents into %s in %.1f s", total, out, manifest["build_seconds"])
    return manifest


def default_index(encoder: Any, cache_dir: str | Path | None = None) -> VectorIndex:
    """The index over the shipped corpus, built once per corpus and encoder and cached.

    Safe when several processes start at once: each builds into its own temporary directory and the
    first to finish publishes it with an atomic rename.
    """
    key = hashlib.sha256()
    for part in (SHIPPED_CORPUS.read_bytes(), json.dumps(encoder.describe(), sort_keys=True).encode()):
        key.update(part)
    key.update(str(FORMAT_VERSION).encode())
    read_corpus(SHIPPED_CORPUS)  # validate before anything is written
    directory = Path(cache_dir or cache_root()) / "retrieval" / f"default-{key.hexdigest()[:16]}"
    if not (directory / "manifest.json").exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        build_index(SHIPPED_CORPUS, tmp, encoder, progress=False)
        try:
            os.rename(tmp, directory)
        except OSError:  # another process published it first
            shutil.rmtree(tmp, ignore_errors=True)
    return VectorIndex.load(directory)
