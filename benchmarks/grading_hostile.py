"""Hostile outputs against the grader: seconds to a verdict, and what a suite of large outputs costs the
reward's memory, for this tree and (``--today-rev REV``) the package as it is at git revision REV.

Why: the grader parses what a program printed, which the program controls (issue 39): a call-based result
of 30,000 nested ``[``, 10**400 where a real is expected and ``"1" * N + "x"`` against a real each broke or
stalled the verdict (findings 2-4); twelve outputs of 16 MiB were each held until their suite ended
(finding 8). Every measurement runs in a process of its own (the package imported from its directory
alone, its peak memory its own), the verdicts with a time limit (``--limit-s``: an old grader takes
minutes on the longest inputs; past it the row says so):

* verdict rows: ``judge`` on each input as a run would hand it over; the verdict, or the exception it
  raised, and the seconds it took;
* memory rows: a suite of 12 tests, each printing 16 MiB (the output cap: the program is not killed, its
  output is past every limit), batched and one sandbox per test: how much the process's peak memory
  grew over the suite (MiB), and the seconds the suite took.

    python benchmarks/grading_hostile.py [--today-rev 90a59cf] [--limit-s 120] [--skip-memory]
        [--json benchmarks/results/grading_hostile.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from code_reward_throughput import _load, machine  # (run as a script: its directory is on sys.path)

REPO = Path(__file__).resolve().parents[1]
logger = logging.getLogger("grading_hostile")
PRELUDE = (
    "import sys, types\n"
    "pkg = types.ModuleType('agentboost'); pkg.__path__ = [{root!r} + '/agentboost']; sys.modules['agentboost'] = pkg\n"
)
INPUTS = {  # name: (kind, expected, program's value or stdout)
    "30,000 nested [ (call)": ("call", [1], "[" * 30000),
    "10**400 for a real (call)": ("call", 0.5, str(10**400)),
    **{f"'1' * {n:,} + 'x' for a real (stdin)": ("stdin", "0.5\n", "1" * n + "x\n") for n in (9000, 30000, 65000)},
}
_VERDICT = """
import json, sys, time
from agentboost.sandbox.config import SandboxResult
from agentboost.sandbox.grading import CALL_MARK, TestCase, judge
kind, expected, printed = json.loads(sys.stdin.read())
test = TestCase([], expected, kind="call", fn_name="f") if kind == "call" else TestCase("", expected)
stdout = "\\n" + CALL_MARK + printed + "\\n" if kind == "call" else printed
started = time.perf_counter()
try:
    verdict = judge(test, SandboxResult(stdout=stdout, stderr="", exit_code=0)).verdict
except BaseException as exc:
    verdict = "raised " + type(exc).__name__
print(json.dumps({"verdict": verdict, "seconds": time.perf_counter() - started}))
"""
_MEMORY = """
import asyncio, json, resource, time
from agentboost.sandbox import Sandbox, SandboxConfig
from agentboost.sandbox.testcases import OUTPUT_CAP, TestCase, run_test_cases
box = Sandbox(SandboxConfig(wall_s=30, cpu_s=20, memory_mb=512))
warm = [TestCase(f"{{i}}\\n", f"{{i}}\\n") for i in range(3)]
asyncio.run(run_test_cases(box, "print(input())", warm, batch={batch}))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
flood = f"import sys\\nsys.stdout.write('x' * {{OUTPUT_CAP}})"
started = time.perf_counter()
tests = [TestCase(f"{{i}}\\n", f"{{i}}\\n") for i in range(12)]
outcomes = asyncio.run(run_test_cases(box, flood, tests, timeout_s=30, batch={batch}))
seconds = time.perf_counter() - started
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - before
box.close()
print(json.dumps({{"verdicts": sorted({{o.verdict for o in outcomes}}), "peak_grew_mib": grew, "seconds": seconds}}))
"""


def _child(root: Path, script: str, limit_s: float, stdin: str = "") -> dict[str, Any] | None:
    """``script`` run with the package at ``root``; its last JSON line, or None past ``limit_s``."""
    try:
        done = subprocess.run([sys.executable, "-c", PRELUDE.format(root=str(root)) + script], input=stdin,
                              check=False, capture_output=True, text=True, timeout=limit_s,
                              cwd=tempfile.gettempdir())  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        raise RuntimeError(f"a measurement failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(roots: dict[str, Path], limit_s: float, memory: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": machine(), "load_before": _load(), "limit_s": limit_s, "verdicts": [],
                              "memory": []}  # fmt: skip
    for name, spec in INPUTS.items():
        row: dict[str, Any] = {"input": name}
        for label, root in roots.items():
            got = _child(root, _VERDICT, limit_s, stdin=json.dumps(spec))
            row[label] = got if got is not None else {"verdict": f"no verdict within {limit_s:g} s", "seconds": None}
            logger.info("%s %s: %s", name, label, row[label])
        report["verdicts"].append(row)
    for batch in (True, False) if memory else ():
        row = {"suite": "12 tests x 16 MiB, " + ("batched" if batch else "one sandbox per test")}
        for label, root in roots.items():
            row[label] = _child(root, _MEMORY.format(batch=batch), 600)
            logger.info("%s %s: %s", row["suite"], label, row[label])
        report["memory"].append(row)
    report["load_after"] = _load()
    return report


def _seconds(cell: dict[str, Any]) -> str:
    return "-" if cell["seconds"] is None else f"{cell['seconds']:.4f}"


def table(report: dict[str, Any], labels: list[str]) -> str:
    lines = [f"machine: {report['machine']}; load average before {report['load_before']}, after "
             f"{report['load_after']}", "",
             "| input | " + " | ".join(f"{label}: verdict | {label}: s" for label in labels) + " |",
             "|---|" + "---|---|" * len(labels)]  # fmt: skip
    for row in report["verdicts"]:
        cells = [f"{row[label]['verdict']} | {_seconds(row[label])}" for label in labels]
        lines.append(f"| {row['input']} | " + " | ".join(cells) + " |")
    if report["memory"]:
        lines += ["", "| suite | " + " | ".join(f"{label}: peak grew MiB | {label}: s" for label in labels) + " |",
                  "|---|" + "---|---|" * len(labels)]  # fmt: skip
        for row in report["memory"]:
            cells = [f"{row[label]['peak_grew_mib']} | {row[label]['seconds']:.1f}" for label in labels]
            lines.append(f"| {row['suite']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--today-rev", help="also measure the package as it is at this git revision")
    parser.add_argument("--limit-s", type=float, default=120.0, help="seconds a verdict may take before it is cut")
    parser.add_argument("--skip-memory", action="store_true", help="verdicts only")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="agentboost-at-") as old:
        roots = {"new": REPO}
        if args.today_rev:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.today_rev, "agentboost"],
                                     capture_output=True, check=True).stdout  # fmt: skip
            subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
            roots = {f"main@{args.today_rev}": Path(old), **roots}
        report = measure(roots, args.limit_s, not args.skip_memory)
    report["paths"] = list(roots)
    print(table(report, list(roots)))  # the benchmark's output
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
