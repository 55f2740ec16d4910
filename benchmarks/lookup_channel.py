"""The directory-lookup channel between two sandboxed runs, measured: with the runs' root bound from the
host's disk, and from the copy in memory (``SandboxConfig.root_in_memory``, the default).

Why: a lookup of a name that does not exist leaves a negative dentry in the filesystem's cache, which every
run shares when the directory is bound from the host's disk; no call the system-call filter could deny is
involved (``stat`` of a made-up path). A sender run looks up ``<stdlib>/.<tag>_<i>`` for every bit ``i``
that is 1; a receiver run, started after the sender ended, times one lookup of each name and decides every
bit from the timings alone (the threshold that best splits the log-timings in two, Otsu's);
bits/s = message bits x (1 - H(bit error rate)) / (sender wall time + receiver wall time), median of
``--rounds``. Unlike a page brought into the cache, a negative dentry is written by a lookup of any new
name: the channel has no capacity limit, and a message stays until memory pressure prunes the cache.
On a tmpfs a lookup leaves nothing (:mod:`agentboost.sandbox.mirror`).

    python benchmarks/lookup_channel.py [--bits 4096] [--rounds 5] [--json benchmarks/results/lookup_channel.json]
"""

from __future__ import annotations

import argparse
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

from page_cache_channel import entropy

from agentboost.sandbox import Sandbox, SandboxConfig

logger = logging.getLogger("lookup_channel")

SENDER = """
import os
for i, bit in enumerate({bits!r}):
    if bit == "1":
        try:
            os.stat({directory!r} + "/.{tag}_%d" % i)
        except FileNotFoundError:
            pass
"""
RECEIVER = """
import os, time
out = []
for i in range({n}):
    start = time.perf_counter_ns()
    try:
        os.stat({directory!r} + "/.{tag}_%d" % i)
    except FileNotFoundError:
        pass
    out.append(time.perf_counter_ns() - start)
print(out)
"""


def decode(timings: list[int]) -> str:
    """Bits from lookup timings alone: 1 (cached: fast) below the threshold that splits the sorted
    log-timings into two groups of least spread (Otsu's; the largest gap would fall among a few slow
    outliers of thousands)."""
    logs = sorted(math.log(max(t, 1)) for t in timings)
    total, n = sum(logs), len(logs)
    best, threshold, left = -1.0, logs[0], 0.0
    for i in range(1, n):
        left += logs[i - 1]
        mean_low, mean_high = left / i, (total - left) / (n - i)
        between = i * (n - i) * (mean_low - mean_high) ** 2
        if between > best:
            best, threshold = between, (logs[i - 1] + logs[i]) / 2
    return "".join("1" if math.log(max(t, 1)) < threshold else "0" for t in timings)


def one_round(box: Sandbox, directory: str, bits: int) -> dict[str, float]:
    message, tag = "".join(secrets.choice("01") for _ in range(bits)), secrets.token_hex(6)
    sent = box.run_sync(SENDER.format(bits=message, directory=directory, tag=tag))
    if sent.exit_code != 0:
        raise RuntimeError(f"sender failed: {sent}")
    received = box.run_sync(RECEIVER.format(n=bits, directory=directory, tag=tag))
    if received.exit_code != 0:
        raise RuntimeError(f"receiver failed: {received}")
    got = decode(json.loads(received.stdout))
    errors = sum(a != b for a, b in zip(got, message, strict=True)) / bits
    errors = min(errors, 1 - errors)  # (a flipped threshold is still a channel)
    seconds = sent.wall_s + received.wall_s
    return {"bit_error_rate": errors, "seconds": seconds, "bits_per_s": bits * (1 - entropy(errors)) / seconds}


def measure(in_memory: bool, bits: int, rounds: int) -> dict[str, object]:
    box = Sandbox(SandboxConfig(root_in_memory=in_memory, wall_s=60))
    try:
        iso = box.isolation()
        if box._plan is None:
            raise RuntimeError(f"no fresh root here: {iso['notes']}")
        directory = next(str(op[1]) for op in box._plan.ops if op[0] == "ro" and op[2])  # (the stdlib)
        results = [one_round(box, directory, bits) for _ in range(rounds)]
    finally:
        box.close()
    return {
        "root_in_memory": iso["root_in_memory"], "seccomp": iso["seccomp"], "directory": directory,
        "bits_per_round": bits, "rounds": results,
        "bits_per_s_median": statistics.median(r["bits_per_s"] for r in results),
        "bit_error_rate_median": statistics.median(r["bit_error_rate"] for r in results),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bits", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.time()
    report = {
        "machine": {"python": sys.version.split()[0], "kernel": platform.release(), "cpus": os.cpu_count(),
                    "uid": os.geteuid(), "loadavg_before": os.getloadavg()},
        "runs": [measure(in_memory, args.bits, args.rounds) for in_memory in (False, True)],
    }  # fmt: skip
    report["machine"]["loadavg_after"] = os.getloadavg()
    report["seconds"] = round(time.time() - started, 1)
    for run in report["runs"]:
        logger.info("root_in_memory=%s: %.0f bits/s (bit error rate %.3f, %d bits per round)", run["root_in_memory"],
                    run["bits_per_s_median"], run["bit_error_rate_median"], run["bits_per_round"])  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
