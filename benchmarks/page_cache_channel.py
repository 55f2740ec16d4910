"""The page-cache channel between two sandboxed runs that is left under the system-call filter, measured.

Why: every run reads the same read-only library files, so their page cache is memory the runs share
(issue 39, finding 1). The filter denies every call that drops a page from that cache or probes it
without reading (``posix_fadvise``, ``readahead``, ``madvise`` hints, ``mincore``, ``cachestat``,
``preadv2(RWF_NOWAIT)``, ``/proc/self/pagemap``). What is left: a run can still *read* a page that is not
cached (bringing it in: a bit set once), and a later run can *time* a read of it (a page from memory
takes microseconds, one from the disk many more). This script measures that channel end to end:

* the host drops a visible library file from the cache (``POSIX_FADV_DONTNEED`` from outside the
  sandbox: what memory pressure does to pages no one used for a while);
* a sender run reads one byte at the start of each 128 KiB window whose bit is 1 (windows far enough
  apart that readahead never reaches the next one);
* a receiver run, started after the sender ended, times a one-byte read of every window and decides
  each bit from the timings alone (the largest gap between the sorted log-timings is its threshold);
* bits/s = message bits x (1 - H(bit error rate)) / (sender wall time + receiver wall time), the
  capacity of that binary channel per second of both runs; ``--rounds`` messages, median reported.

Twice: with ``SandboxConfig(keep_cached=False)`` (the file dropped before each round, as memory
pressure would), and with the default ``keep_cached=True`` (the host reads every file of the runs' root
ahead, :mod:`agentboost.sandbox.pagecache`, and nothing evicts it here: the sender finds nothing to bring
in, so nothing it does changes what the receiver sees).

    python benchmarks/page_cache_channel.py [--bits 64] [--rounds 5] [--json benchmarks/results/page_cache_channel.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import platform
import secrets
import statistics
import sys
import time
from pathlib import Path

from agentboost.sandbox import Sandbox, SandboxConfig

WINDOW = 128 * 1024
logger = logging.getLogger("page_cache_channel")

SENDER = """
import os
fd = os.open({path!r}, os.O_RDONLY)
for i, bit in enumerate({bits!r}):
    if bit == "1":
        os.pread(fd, 1, i * {window})
"""
RECEIVER = """
import os, time
fd = os.open({path!r}, os.O_RDONLY)
out = []
for i in range({n}):
    start = time.perf_counter_ns()
    os.pread(fd, 1, i * {window})
    out.append(time.perf_counter_ns() - start)
print(out)
"""
OLD_WRITE = """
import os
fd = os.open({path!r}, os.O_RDONLY)
try:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    print("fadvise allowed")
except OSError as exc:
    print("fadvise denied:", exc)
"""


def largest_library(bound: list[str]) -> str:
    """The largest regular file a run can read (the more windows, the more bits per round)."""
    best, size = "", 0
    for top in bound:
        for root, _, files in os.walk(top) if os.path.isdir(top) else [(os.path.dirname(top), [], [top])]:
            for name in files:
                path = os.path.join(root, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if st.st_size > size and os.access(path, os.R_OK):
                    best, size = path, st.st_size
    return best


def decode(timings: list[int]) -> str:
    """Bits from read timings alone: 1 (cached: fast) below the largest gap of the sorted log-timings."""
    logs = sorted(math.log(max(t, 1)) for t in timings)
    gaps = [(b - a, (a + b) / 2) for a, b in itertools.pairwise(logs)]
    threshold = max(gaps)[1] if gaps else 0.0
    return "".join("1" if math.log(max(t, 1)) < threshold else "0" for t in timings)


def entropy(p: float) -> float:
    return 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def one_round(box: Sandbox, path: str, bits: int, evict: bool) -> dict[str, float]:
    message = "".join(secrets.choice("01") for _ in range(bits))
    if evict:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    sent = box.run_sync(SENDER.format(path=path, bits=message, window=WINDOW))
    if sent.exit_code != 0:
        raise RuntimeError(f"sender failed: {sent}")
    received = box.run_sync(RECEIVER.format(path=path, n=bits, window=WINDOW))
    if received.exit_code != 0:
        raise RuntimeError(f"receiver failed: {received}")
    got = decode(json.loads(received.stdout))
    errors = sum(a != b for a, b in zip(got, message, strict=True)) / bits
    errors = min(errors, 1 - errors)  # (a flipped threshold is still a channel)
    seconds = sent.wall_s + received.wall_s
    return {"bit_error_rate": errors, "seconds": seconds, "bits_per_s": bits * (1 - entropy(errors)) / seconds}


def measure(keep_cached: bool, bits: int, rounds: int) -> dict[str, object]:
    box = Sandbox(SandboxConfig(keep_cached=keep_cached, root_in_memory=False))
    try:
        iso = box.isolation()
        path = largest_library([op[1] for op in box._plan.ops if op[0] == "ro"] if box._plan else [])
        windows = os.stat(path).st_size // WINDOW
        n = min(bits, windows)
        old = box.run_sync(OLD_WRITE.format(path=path)).stdout.strip()
        if box._warmer is not None:
            box._warmer.done.wait(120)  # (the first read-ahead, started by the probe)
        # Without keep_cached the host's memory pressure is what leaves pages out of the cache: here the
        # file is dropped before every round. With it, nothing is evicted (no memory pressure here).
        results = [one_round(box, path, n, evict=not keep_cached) for _ in range(rounds)]
    finally:
        box.close()
    return {
        "keep_cached": keep_cached, "seccomp": iso["seccomp"], "file": path, "windows_in_file": windows,
        "bits_per_round": n, "old_write_primitive": old, "rounds": results,
        "bits_per_s_median": statistics.median(r["bits_per_s"] for r in results),
        "bit_error_rate_median": statistics.median(r["bit_error_rate"] for r in results),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bits", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.time()
    report = {
        "machine": {"python": sys.version.split()[0], "kernel": platform.release(), "cpus": os.cpu_count(),
                    "loadavg_before": os.getloadavg()},
        "runs": [measure(keep, args.bits, args.rounds) for keep in (False, True)],
    }  # fmt: skip
    report["machine"]["loadavg_after"] = os.getloadavg()
    report["seconds"] = round(time.time() - started, 1)
    for run in report["runs"]:
        logger.info("keep_cached=%s: %.1f bits/s (bit error rate %.2f, %d bits per round, %s)", run["keep_cached"],
                    run["bits_per_s_median"], run["bit_error_rate_median"], run["bits_per_round"],
                    run["old_write_primitive"])  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
