"""A dense vector index over a document collection: exact inner-product search with FAISS.

On disk (``save``/``load``): ``index.faiss`` (or ``vectors.npy``), ``docs.jsonl`` (``id``, ``title``,
``text``) and ``manifest.json`` (encoder, dimension, count, corpus sha256). Without the ``faiss``
package the same exact search runs in NumPy (slower on large corpora; logged).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

SHIPPED_CORPUS = Path(__file__).with_name("data") / "corpus.jsonl"


def read_corpus(path: str | Path) -> list[dict[str, str]]:
    docs, seen = [], set()
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                doc = {"id": str(row["id"]), "title": str(row.get("title", "")), "text": str(row["text"])}
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: a corpus line needs JSON with 'id' and 'text' ({exc})") from None
            if doc["id"] in seen:
                raise ValueError(f"{path}:{lineno}: duplicate document id {doc['id']!r}")
            seen.add(doc["id"])
            docs.append(doc)
    if not docs:
        raise ValueError(f"{path}: empty corpus")
    return docs


def corpus_sha256(docs: Iterable[dict[str, str]]) -> str:
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(json.dumps(doc, sort_keys=True).encode() + b"\n")
    return digest.hexdigest()


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def doc_text(doc: dict[str, str]) -> str:
    return f"{doc['title']}: {doc['text']}" if doc.get("title") else doc["text"]


class VectorIndex:
    def __init__(self, vectors: np.ndarray, docs: list[dict[str, str]], manifest: dict[str, Any]) -> None:
        if len(vectors) != len(docs):
            raise ValueError(f"{len(vectors)} vectors for {len(docs)} documents")
        self.docs, self.manifest = docs, manifest
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        faiss = _faiss()
        if faiss is None:
            logger.warning("faiss is not installed: exact search in NumPy (pip install faiss-cpu for speed)")
            self._faiss_index = None
        else:
            self._faiss_index = faiss.IndexFlatIP(self.vectors.shape[1])
            self._faiss_index.add(self.vectors)

    @classmethod
    def build(cls, docs: list[dict[str, str]], encoder: Any, *, batch_size: int = 256,
              progress: bool = True) -> VectorIndex:  # fmt: skip
        from tqdm import tqdm

        chunks = []
        for start in tqdm(range(0, len(docs), batch_size), desc="embedding", unit="batch", disable=not progress):
            chunks.append(encoder.encode([doc_text(d) for d in docs[start : start + batch_size]]))
        manifest = {**encoder.describe(), "count": len(docs), "corpus_sha256": corpus_sha256(docs)}
        return cls(np.concatenate(chunks), docs, manifest)

    def search(self, queries: np.ndarray, k: int) -> list[list[dict[str, Any]]]:
        k = max(1, min(k, len(self.docs)))
        if self._faiss_index is not None:
            scores, ids = self._faiss_index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        else:
            sims = queries @ self.vectors.T
            ids = np.argsort(-sims, axis=1, kind="stable")[:, :k]
            scores = np.take_along_axis(sims, ids, axis=1)
        return [
            [{**self.docs[i], "score": float(s)} for i, s in zip(row_ids, row_scores, strict=True) if i >= 0]
            for row_ids, row_scores in zip(ids, scores, strict=True)
        ]

    def save(self, directory: str | Path) -> None:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "vectors.npy", self.vectors)
        with open(out / "docs.jsonl", "w", encoding="utf-8") as fh:
            for doc in self.docs:
                fh.write(json.dumps(doc, ensure_ascii=False) + "\n")
        tmp = out / "manifest.json.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=2))
        os.replace(tmp, out / "manifest.json")  # last: a directory with a manifest is complete

    @classmethod
    def load(cls, directory: str | Path) -> VectorIndex:
        src = Path(directory)
        if not (src / "manifest.json").exists():
            raise FileNotFoundError(f"{src} is not a built index (no manifest.json); build one with build_index")
        manifest = json.loads((src / "manifest.json").read_text())
        docs = read_corpus(src / "docs.jsonl")
        vectors = np.load(src / "vectors.npy")
        if len(docs) != manifest["count"] or vectors.shape != (manifest["count"], manifest["dim"]):
            raise ValueError(f"{src}: index files do not match its manifest")
        return cls(vectors, docs, manifest)


def default_index(encoder: Any, cache_dir: str | Path | None = None) -> VectorIndex:
    """The index over the shipped corpus, built once and cached (keyed by corpus and encoder)."""
    docs = read_corpus(SHIPPED_CORPUS)
    root = Path(cache_dir or os.environ.get("AGENTBOOST_CACHE") or Path.home() / ".cache" / "agentboost")
    key = hashlib.sha256((corpus_sha256(docs) + json.dumps(encoder.describe(), sort_keys=True)).encode())
    directory = root / "retrieval" / f"default-{key.hexdigest()[:16]}"
    if (directory / "manifest.json").exists():
        return VectorIndex.load(directory)
    index = VectorIndex.build(docs, encoder, progress=False)
    index.save(directory)
    return index
