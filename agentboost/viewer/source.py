"""Reading the episodes a page shows: an ``episodes.jsonl`` or an ``agentboost eval`` directory.

Two passes keep memory bounded whatever the file's size: the first parses every line once to count
terminations and find each episode's last record (an evaluation re-runs failed episodes under the
same id; the last record wins, as in :class:`~agentboost.evaluation.store.EpisodeStore`); the second
builds :class:`~agentboost.episode.Episode` objects for the first ``max_episodes`` only. Lines that
cannot be read are reported with their number and reason, never dropped silently; a line longer
than ``max_line_bytes`` is skipped without being held in memory.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..episode import Episode

logger = logging.getLogger(__name__)

EPISODES = "episodes.jsonl"
MANIFEST = "manifest.json"
MAX_LINE_BYTES = 64 << 20


@dataclass
class Skipped:
    """A line of the file the page could not show."""

    line: int
    reason: str


@dataclass
class Source:
    """What was read from one episodes file."""

    path: Path
    episodes: list[Episode] = field(default_factory=list)
    total: int = 0
    """Distinct episodes in the file (last record per id)."""
    terminations: Counter[str] = field(default_factory=Counter)
    """Over all ``total`` episodes, not only the embedded ones."""
    skipped: list[Skipped] = field(default_factory=list)
    replaced: int = 0
    """Records superseded by a later record of the same id (re-run episodes)."""
    manifest: dict[str, Any] | None = None


def episodes_path(path: str | Path) -> Path:
    """The episodes file of ``path`` (a JSONL file, or a directory holding ``episodes.jsonl``)."""
    path = Path(path)
    if path.is_dir():
        candidate = path / EPISODES
        if not candidate.is_file():
            raise FileNotFoundError(f"{path} holds no {EPISODES} (pass an episodes JSONL file or an eval directory)")
        return candidate
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    return path


def _lines(path: Path, max_line_bytes: int):
    """``(number, offset, bytes or None when too long)`` for every line, without reading a long one whole."""
    with open(path, "rb") as fh:
        number = 0
        while True:
            offset = fh.tell()
            line = fh.readline(max_line_bytes + 1)
            if not line:
                return
            number += 1
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # skip the rest of the line
                    line = fh.readline(1 << 20)
                yield number, offset, None
                continue
            yield number, offset, line


def load(
    path: str | Path, *, max_episodes: int = 500, max_line_bytes: int = MAX_LINE_BYTES, skip_records: int = 0
) -> Source:
    """Read ``path`` (see module doc); ``skip_records`` distinct episodes are passed over before embedding."""
    file = episodes_path(path)
    source = Source(path=file)
    manifest = file.parent / MANIFEST
    if manifest.is_file():
        try:
            source.manifest = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            logger.warning("%s is unreadable (%s): no tokenizer from the evaluation's settings", manifest, exc)
    last: dict[str, tuple[int, int]] = {}  # id -> (line number, offset) of its last record
    outcome: dict[str, str] = {}
    for number, offset, raw in _lines(file, max_line_bytes):
        if raw is None:
            source.skipped.append(Skipped(number, f"longer than {max_line_bytes} bytes"))
            continue
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            episode_id = str(record["id"])
            termination = str(record.get("termination", "?"))
        except (ValueError, KeyError, TypeError) as exc:
            torn = not raw.endswith(b"\n")
            why = "a partial last line (interrupted write)" if torn else f"not an episode record ({exc})"
            source.skipped.append(Skipped(number, why[:300]))
            continue
        if episode_id in last:
            source.replaced += 1
        last[episode_id] = (number, offset)
        outcome[episode_id] = termination
    source.total = len(last)
    source.terminations = Counter(outcome.values())
    chosen = list(last.items())[skip_records : skip_records + max_episodes]
    with open(file, "rb") as fh:
        for episode_id, (number, offset) in chosen:
            fh.seek(offset)
            raw = fh.readline(max_line_bytes + 1)
            try:
                source.episodes.append(Episode.from_dict(json.loads(raw)))
            except (ValueError, KeyError, TypeError) as exc:
                source.skipped.append(Skipped(number, f"episode {episode_id[:80]!r} is malformed ({exc})"[:300]))
    source.skipped.sort(key=lambda s: s.line)
    return source


def tokenizer_ref(source: Source) -> str | None:
    """The tokenizer an evaluation's episodes were made with, from its ``manifest.json`` (None: unknown)."""
    model = (source.manifest or {}).get("model")
    if not isinstance(model, dict):
        return None
    if model.get("tokenizer"):
        return str(model["tokenizer"])
    backend = str(model.get("backend") or "")
    if backend == "tiny" or backend.startswith("py:"):
        return "offline:qwen2.5"  # what agentboost.backends.factory pairs them with
    if backend.startswith("hf:"):
        return backend[3:]
    return None
