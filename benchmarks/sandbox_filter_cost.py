"""What the system-call filter costs: per run (installing it) and per call (evaluating it).

Why: every sandboxed run installs the filter of :mod:`agentboost.sandbox.policy` right before its program
and every system call of the program then goes through it. Three figures:

* install: ``_runner.seal`` in a freshly forked child of a process that made its ``prctl`` caller before
  forking, as a zygote does (non-dumpable + ``prctl(PR_SET_SECCOMP)``), minus the same child sealing
  without a filter, median over ``--n`` children, in microseconds;
* per call: nanoseconds added to a call the filter allows outright (``getppid``: the kernel caches that
  verdict) and to one it allows on its arguments (``fcntl(F_GETFL)``: the BPF program runs), median of
  ``--rounds`` loops of 100,000 calls with and without the filter;
* per run: microseconds a trivial sandboxed run (zygote) takes more with ``SandboxConfig(syscall_filter=
  True)`` than with ``False``, the two alternating, median over ``--rounds`` rounds of ``--n`` runs.

    python benchmarks/sandbox_filter_cost.py [--n 200] [--rounds 5] [--json benchmarks/results/sandbox_filter_cost.json]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import fcntl
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from agentboost.sandbox import Sandbox, SandboxConfig, seccomp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agentboost" / "sandbox"))
import _runner  # (the launcher's own module, imported as the sandbox imports it)

logger = logging.getLogger("sandbox_filter_cost")
_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NO_NEW_PRIVS = 38
CALLS = 100_000


def _in_child(work) -> float:
    """``work()`` in a forked child (no new privileges, as in a run); what it returned (a float)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            os.write(write, repr(work()).encode())
        finally:
            os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 4096):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return float(data)


def _seal_us(program: bytes | None) -> float:
    def work() -> float:
        start = time.perf_counter_ns()
        _runner.seal(program)
        return (time.perf_counter_ns() - start) / 1000

    return _in_child(work)


def _call_ns(program: bytes | None, call) -> float:
    def work() -> float:
        _runner.seal(program)
        start = time.perf_counter_ns()
        for _ in range(CALLS):
            call()
        return (time.perf_counter_ns() - start) / CALLS

    return _in_child(work)


async def _runs_us(box: Sandbox, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        result = await box.run("print(1)")
        assert result.ok, result
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    program = seccomp.filters().program
    _runner.sealer()  # (made before forking, as a zygote and the batch harness do)
    load_before = os.getloadavg()
    with_filter = [_seal_us(program) for _ in range(args.n)]
    without = [_seal_us(None) for _ in range(args.n)]
    install_us = statistics.median(with_filter) - statistics.median(without)
    fd = os.open(os.devnull, os.O_RDONLY)
    per_call = {}
    for name, call in (("getppid", os.getppid), ("fcntl_getfl", lambda: fcntl.fcntl(fd, fcntl.F_GETFL))):
        diffs = [_call_ns(program, call) - _call_ns(None, call) for _ in range(args.rounds)]
        per_call[name] = statistics.median(diffs)
    boxes = {flag: Sandbox(SandboxConfig(syscall_filter=flag)) for flag in (True, False)}
    per_run = []
    try:
        for box in boxes.values():
            box.isolation()
            asyncio.run(_runs_us(box, 5))  # (zygotes up)
        for _ in range(args.rounds):
            on = asyncio.run(_runs_us(boxes[True], args.n // 4))
            off = asyncio.run(_runs_us(boxes[False], args.n // 4))
            per_run.append({"filter_us": on, "no_filter_us": off})
    finally:
        for box in boxes.values():
            box.close()
    report = {
        "machine": {"python": sys.version.split()[0], "kernel": platform.release(), "cpus": os.cpu_count(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "filter_instructions": len(program) // 8,
        "install_us_median": round(install_us, 1),
        "install_us_with_filter_median": round(statistics.median(with_filter), 1),
        "per_call_ns_median": {k: round(v, 1) for k, v in per_call.items()},
        "per_run_rounds": per_run,
        "per_run_us_median": round(statistics.median(r["filter_us"] - r["no_filter_us"] for r in per_run), 1),
    }  # fmt: skip
    logger.info(json.dumps(report, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
