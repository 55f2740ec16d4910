"""Append-only episode store that makes an evaluation resumable.

``<dir>/episodes.jsonl`` gets one finished :class:`~agentboost.episode.Episode` per line, flushed and
fsynced as it finishes, so an interrupted run (Ctrl-C, SIGKILL, a lost node) loses at most the
episodes that were still running. ``<dir>/manifest.json`` holds the fingerprint of what is being
evaluated (data, environment, agent, model, sampling, budgets, n); resuming with a different
fingerprint is refused, so results of two different evaluations are never mixed. The fingerprint's
``where`` entry (server URLs, request timeouts: where and how episodes run, not what they compute)
may change between runs; the change is logged and the manifest updated.

Reading back: a last line without its newline is a write the interruption cut short; it is
discarded and the file truncated to the last complete record. A malformed line anywhere else is
corruption and raises (nothing is skipped silently). When an id appears more than once (an episode
re-run with ``retry``), the last record wins.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from pathlib import Path
from typing import IO, Any

from ..episode import Episode

logger = logging.getLogger(__name__)

EPISODES = "episodes.jsonl"
MANIFEST = "manifest.json"
LOCK = ".lock"
REPORTS = ("report.json", "report.md", "report.png")
WHERE = "where"


class ResumeMismatch(RuntimeError):
    """The output directory holds an evaluation of something else."""


class StoreLocked(RuntimeError):
    """Another process is writing to the same output directory."""


class EpisodeStore:
    """Episodes of one evaluation, on disk. Use as a context manager (holds an exclusive lock)."""

    def __init__(self, directory: str | Path, fingerprint: dict[str, Any], *, overwrite: bool = False) -> None:
        self.directory = Path(directory)
        self.fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True, default=str))
        self.overwrite = overwrite
        self.episodes: dict[str, Episode] = {}
        self.discarded_partial_line = False
        self._fh: IO[str] | None = None
        self._lock_fh: IO[str] | None = None

    @property
    def path(self) -> Path:
        return self.directory / EPISODES

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> EpisodeStore:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> EpisodeStore:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fh = open(self.directory / LOCK, "w")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(self._lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self._lock_fh.close()
            self._lock_fh = None
            raise StoreLocked(f"{self.directory} is in use by another evaluation") from exc
        try:
            self._open_records()
        except BaseException:
            self.close()  # refused or unreadable: release the lock
            raise
        return self

    def _open_records(self) -> None:
        manifest = self.directory / MANIFEST
        if self.overwrite:
            self._discard()
        elif manifest.exists():
            stored = json.loads(manifest.read_text())
            what = {k: v for k, v in stored.items() if k != WHERE}
            if what != {k: v for k, v in self.fingerprint.items() if k != WHERE}:
                raise ResumeMismatch(self._mismatch_message(stored))
            if stored.get(WHERE) != self.fingerprint.get(WHERE):
                for line in _changes(stored.get(WHERE), self.fingerprint.get(WHERE), WHERE):
                    logger.warning("resuming with %s", line)
        elif self.path.exists() and self.path.stat().st_size:
            raise ResumeMismatch(f"{self.path} exists without {MANIFEST}; use another --out or --overwrite")
        self.episodes = self._load()
        _atomic_write(manifest, json.dumps(self.fingerprint, indent=2, sort_keys=True))
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def clear(self) -> None:
        """Discard everything stored, manifest included: the next run starts afresh, with any settings.
        The store takes no more episodes (it stays locked until closed)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self._discard()
        self.episodes = {}

    def _discard(self) -> None:
        for name in (EPISODES, MANIFEST, *REPORTS):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / name).unlink()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._lock_fh is not None:
            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    # -- records -----------------------------------------------------------------------------
    def add(self, episode: Episode) -> None:
        """Persist one finished episode (durable when this returns)."""
        if self._fh is None:
            raise RuntimeError("the store is not open")
        self._fh.write(episode.to_json() + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.episodes[episode.id] = episode

    def _load(self) -> dict[str, Episode]:
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            logger.warning("%s: discarding a partial last record (%d bytes) from an interrupted run",
                           self.path, len(data) - end)  # fmt: skip
            with open(self.path, "r+b") as fh:
                fh.truncate(end)
            self.discarded_partial_line = True
        episodes: dict[str, Episode] = {}
        for number, line in enumerate(data[:end].decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                episode = Episode.from_json(line)
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{self.path}:{number}: corrupt record ({exc}); refusing to guess") from exc
            episodes[episode.id] = episode
        return episodes

    def _mismatch_message(self, stored: dict[str, Any]) -> str:
        changes = [line for key in sorted(set(stored) | set(self.fingerprint)) if key != WHERE
                   for line in _changes(stored.get(key), self.fingerprint.get(key), key)]  # fmt: skip
        lines = [f"{self.directory} holds an evaluation with different settings:"]
        lines += [f"  {line}" for line in changes[:20]]
        if len(changes) > 20:
            lines.append(f"  ... and {len(changes) - 20} more")
        lines.append("Use another --out, or --overwrite to discard the stored episodes.")
        return "\n".join(lines)


def _changes(stored: Any, now: Any, path: str) -> list[str]:
    """Every leaf that differs, as ``path: stored X, now Y`` (dicts are compared key by key)."""
    if isinstance(stored, dict) and isinstance(now, dict):
        return [line for key in sorted(set(stored) | set(now), key=str)
                for line in _changes(stored.get(key), now.get(key), f"{path}.{key}")]  # fmt: skip
    if stored == now:
        return []
    return [f"{path}: stored {_short(stored)}, now {_short(now)}"]


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
