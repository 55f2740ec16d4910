"""Corpus files (``.jsonl`` of ``{"id", "title", "text"}``) and the on-disk document store of an index.

The Wikipedia dumps of FlashRAG / Search-R1 (``{"id", "contents": "\\"Title\\"\\ntext"}``) are read as they are,
gzipped or not.

:class:`DocStore` reads documents straight from an index's ``docs.jsonl`` through a memory map and a
byte-offset table (``offsets.npy``), so a server over millions of passages does not hold them all as
Python objects.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

SHIPPED_CORPUS = Path(__file__).with_name("data") / "corpus.jsonl"
SAMPLE_QUESTIONS = SHIPPED_CORPUS.with_name("sample_questions.jsonl")

Doc = dict[str, str]


class Docs(Protocol):
    """Documents by row number: a ``list`` or a :class:`DocStore`."""

    def __len__(self) -> int: ...

    def __getitem__(self, row: int) -> Doc: ...


def split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG / Search-R1 ``contents`` (``"Title"\\ntext``) -> ``(title, text)``."""
    head, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    return head.strip().strip('"'), rest


def parse_doc(line: str, where: str) -> Doc:
    """One corpus line -> ``{"id", "title", "text"}`` (``ValueError`` naming ``where`` if malformed).

    Accepts ``{"id", "title", "text"}`` and the FlashRAG / Search-R1 Wikipedia dumps' ``{"id", "contents"}``.
    """
    try:
        row = json.loads(line)
        if "text" not in row and isinstance(row.get("contents"), str):
            title, text = split_contents(row["contents"])
            row = {"id": row["id"], "title": title, "text": text}
        doc = {"id": str(row["id"]), "title": str(row.get("title") or ""), "text": str(row["text"])}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{where}: a corpus line needs a JSON object with 'id' and 'text' ({exc!r})") from None
    if not doc["id"] or not doc["text"].strip():
        raise ValueError(f"{where}: empty 'id' or 'text'")
    return doc


def iter_corpus(path: str | Path) -> Iterator[Doc]:
    """Stream the documents of a corpus file (``.jsonl`` or ``.jsonl.gz``), refusing malformed lines and
    duplicate ids."""
    seen: set[str] = set()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            doc = parse_doc(line, f"{path}:{lineno}")
            if doc["id"] in seen:
                raise ValueError(f"{path}:{lineno}: duplicate document id {doc['id']!r}")
            seen.add(doc["id"])
            yield doc


def read_corpus(path: str | Path) -> list[Doc]:
    """All documents of a (small) corpus file."""
    docs = list(iter_corpus(path))
    if not docs:
        raise ValueError(f"{path}: empty corpus")
    return docs


def count_docs(path: str | Path) -> int:
    """Number of non-empty lines (documents) of a corpus file, without parsing them."""
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


class CorpusHasher:
    """Order-sensitive sha256 over documents (the same corpus -> the same digest, whatever its file layout)."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def update(self, doc: Doc) -> None:
        self._digest.update(json.dumps(doc, sort_keys=True, ensure_ascii=False).encode() + b"\n")

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def corpus_sha256(docs: Iterator[Doc] | list[Doc]) -> str:
    hasher = CorpusHasher()
    for doc in docs:
        hasher.update(doc)
    return hasher.hexdigest()


def doc_text(doc: Doc) -> str:
    """The text that gets embedded: ``title: text``."""
    return f"{doc['title']}: {doc['text']}" if doc.get("title") else doc["text"]


class DocStore:
    """Read-only random access to the documents of ``docs.jsonl`` by row number (thread-safe)."""

    def __init__(self, docs_path: str | Path, offsets_path: str | Path) -> None:
        self.path = Path(docs_path)
        self.offsets = np.load(offsets_path, mmap_mode="r")
        if self.offsets.ndim != 1 or len(self.offsets) < 1:
            raise ValueError(f"{offsets_path}: not an offset table")
        with open(self.path, "rb") as fh:
            size = fh.seek(0, 2)
            if int(self.offsets[-1]) != size:
                raise ValueError(f"{self.path}: {size} bytes, the offset table expects {int(self.offsets[-1])}")
            self._map: Any = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> Doc:
        if not 0 <= row < len(self):
            raise IndexError(row)
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        return json.loads(self._map[start:end])

    def __iter__(self) -> Iterator[Doc]:
        return (self[i] for i in range(len(self)))

    def close(self) -> None:
        if isinstance(self._map, mmap.mmap):
            self._map.close()
