"""Every file a run can read kept in the page cache, so no run can set a bit there (issue 39, finding 1).

The files of a run's fresh root (interpreter, standard library, shared libraries: read-only binds of the
host's) are the same for every run, and so is their page cache. The system-call filter (:mod:`.policy`)
leaves a run no way to drop a page from it or to look at it without reading; what is left is reading a
page that is not cached (bringing it in: a bit a later run can time). Here the host reads ahead every
such file (``POSIX_FADV_WILLNEED``, on a background thread) when the sandbox is probed and again at most
every :data:`INTERVAL_S` when runs start: a run finds every page already there. Pages the host evicts
between two read-aheads (memory pressure) are such bits again until the next one; a run cannot evict them
itself (its cgroup reclaims only what it brought in). ``benchmarks/page_cache_channel.py`` measures both.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Iterable

logger = logging.getLogger(__name__)

INTERVAL_S = 60.0


class Warmer:
    """Reads ahead the files under ``paths`` (files or directories), at most every :data:`INTERVAL_S`."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = tuple(paths)
        self._lock = threading.Lock()
        self._next = 0.0
        self.done = threading.Event()
        """Set after each complete pass."""
        self.files = 0

    def poke(self) -> None:
        """Start a pass on a daemon thread if one is due (cheap when not: one clock read)."""
        now = time.monotonic()
        if now < self._next:
            return
        with self._lock:
            if now < self._next:
                return
            self._next = now + INTERVAL_S
        self.done.clear()
        threading.Thread(target=self._pass, name="agentboost-pagecache", daemon=True).start()

    def _pass(self) -> None:
        files = 0
        try:
            for path in self.paths:
                files += _read_ahead(path)
        except Exception:  # a bug: logged, the runs go on (with the cache as it is)
            logger.exception("sandbox page-cache read-ahead failed")
        self.files = files
        self.done.set()


def _read_ahead(top: str) -> int:
    """``WILLNEED`` for every regular file at or below ``top`` (symlinks not followed); how many."""
    count = 0
    for root, dirs, names in os.walk(top) if os.path.isdir(top) and not os.path.islink(top) else [("", [], [top])]:
        dirs.sort()
        for name in names:
            path = os.path.join(root, name) if root else name
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                    count += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return count
