"""Code reward on a large hidden-test suite: today's path vs the new one, side by side in one run.

Every path scores the same final answer through ``agentboost.rewards.code.code_reward`` (every test runs;
the verdict metrics must come out identical, the benchmark stops otherwise):

* started: every test in a sandbox of its own, each starting the launcher and the interpreter
  (``SandboxConfig(zygote=False)``, batches off), at most ``slots`` (16) at once: the path before the
  zygote and the batch harness, on this tree's launcher;
* main@REV (with ``--today-rev REV``): the same reward from the package as it is at git revision REV
  (``git archive`` into a temporary directory, run in a worker process): today's main itself;
* new: the tests go through batch harnesses (one sandboxed process per worker, one fork per test) in
  sandboxes forked from the zygote.

Problems: a stdin problem and a call-based one with ``--tests`` tests each, scored with a correct program
(all pass) and a wrong one (all fail; every test still runs). Rounds rotate which path goes first; the
table gives the median time and the median (min-max) of the per-round speed-ups. The machine and its load
average before and after are printed: the machine may be shared.

    python benchmarks/code_reward_throughput.py [--tests 200] [--rounds 2] [--today-rev b14b9f6] [--quick]
        [--json benchmarks/results/code_reward_throughput.json] [--png assets/code_reward_throughput.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
logger = logging.getLogger("code_reward_throughput")
Scorer = Callable[[str, str], Awaitable[tuple[float, dict[str, float]]]]


def problems(n: int) -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    stdin_tests = [{"input": f"{i} {2 * i}\n", "output": f"{3 * i}\n"} for i in range(n)]
    call_tests = [{"input": [i, [i, i + 1]], "output": 2 * i + 1, "fn_name": "add", "testtype": "functional"}
                  for i in range(n)]  # fmt: skip
    return {
        "stdin": (
            {"tests": stdin_tests},
            {"correct": "a, b = map(int, input().split())\nprint(a + b)", "wrong": "print(0)"},
        ),
        "call": (
            {"tests": call_tests},
            {
                "correct": "class Solution:\n    def add(self, a, pair):\n        return a + pair[1]",
                "wrong": "def add(a, pair):\n    return -1",
            },
        ),
    }


async def score_with(box: Any, task: dict[str, Any], program: str) -> tuple[float, dict[str, float]]:
    """Seconds to score ``program`` on ``task`` through the reward, with ``box`` as its sandbox."""
    from agentboost.episode import Episode
    from agentboost.rewards.code import code_reward
    from agentboost.tools import strands_code_tool
    from agentboost.types import Termination

    strands_code_tool._default = box  # the reward's sandbox
    text = f"Here is my solution.\n```python\n{program}\n```"
    episode = Episode(id="bench", messages=[{"role": "assistant", "content": [{"text": text}]}],
                      termination=Termination.COMPLETED)  # fmt: skip
    started = time.perf_counter()
    result = await code_reward(task, episode)
    return time.perf_counter() - started, dict(result.metrics)


def worker() -> None:
    """``--worker``: score what each stdin line names (``problem program n``) with this interpreter's
    ``agentboost`` (an older one on PYTHONPATH) and its default sandbox; one JSON line per request."""
    import agentboost
    from agentboost.sandbox import Sandbox, SandboxConfig

    box = Sandbox(SandboxConfig())
    box.isolation()
    print(f"ready {Path(agentboost.__file__).parent}", flush=True)
    for line in sys.stdin:
        problem, program, n = line.split()
        task, programs = problems(int(n))[problem]
        seconds, metrics = asyncio.run(score_with(box, task, programs[program]))
        print(json.dumps({"seconds": seconds, "metrics": metrics}), flush=True)


class Remote:
    """The reward as it is at a git revision, in a worker process (a package of its own on PYTHONPATH)."""

    def __init__(self, rev: str) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="agentboost-at-")
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "agentboost"], capture_output=True,
                                 check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", self._dir.name], input=archive, check=True)
        env = {**os.environ, "PYTHONPATH": self._dir.name}
        self._proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env, cwd=self._dir.name)  # fmt: skip
        assert self._proc.stdout is not None
        hello = self._proc.stdout.readline().split()
        if hello != ["ready", str(Path(self._dir.name, "agentboost"))]:  # and imports that revision's package
            raise RuntimeError(f"the worker for {rev} did not start right: {hello}")

    async def score(self, problem: str, program: str, n: int) -> tuple[float, dict[str, float]]:
        return await asyncio.to_thread(self._score, problem, program, n)

    def _score(self, problem: str, program: str, n: int) -> tuple[float, dict[str, float]]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(f"{problem} {program} {n}\n")
        self._proc.stdin.flush()
        answer = json.loads(self._proc.stdout.readline())
        return answer["seconds"], answer["metrics"]

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=60)
        self._dir.cleanup()


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model or platform.processor() or 'unknown CPU'}), Linux {platform.release()}"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


async def measure(n: int, rounds: int, programs: list[str], today_rev: str | None) -> dict[str, Any]:
    from agentboost.sandbox import Sandbox, SandboxConfig
    from agentboost.sandbox import batch as batch_module

    started_box = Sandbox(SandboxConfig(zygote=False))
    new_box = Sandbox(SandboxConfig())
    await asyncio.to_thread(started_box.isolation)
    iso = await asyncio.to_thread(new_box.isolation)
    batch_module._available[started_box] = False  # the path before: one sandbox per test
    batches = await batch_module.check_batches(new_box)
    remote = await asyncio.to_thread(Remote, today_rev) if today_rev else None
    suite = problems(n)
    paths: dict[str, Callable[[str, str], Awaitable[tuple[float, dict[str, float]]]]] = {
        "started": lambda p, k: score_with(started_box, suite[p][0], suite[p][1][k]),
        "new": lambda p, k: score_with(new_box, suite[p][0], suite[p][1][k]),
    }
    if remote is not None:
        paths = {f"main@{today_rev}": lambda p, k: remote.score(p, k, n), **paths}
    report: dict[str, Any] = {
        "machine": machine(),
        "load_before": _load(),
        "tests": n,
        "rounds": rounds,
        "zygote": iso["zygote"],
        "batches": batches,
        "sandbox_python": iso["python"],
        "paths": list(paths),
        "rows": [],
    }
    try:
        small = problems(2)
        for name in paths:  # warm every path (imports, probes, the batch check) on a small suite
            for problem in small:
                if name.startswith("main@") and remote is not None:
                    await remote.score(problem, "correct", 2)
                else:
                    box = started_box if name == "started" else new_box
                    await score_with(box, small[problem][0], small[problem][1]["correct"])
        for problem in suite:
            for program in programs:
                times: dict[str, list[float]] = {name: [] for name in paths}
                names = list(paths)
                for r in range(rounds):
                    metrics = {}
                    for name in names[r % len(names) :] + names[: r % len(names)]:
                        seconds, metrics[name] = await paths[name](problem, program)
                        times[name].append(seconds)
                    first = metrics["new"]
                    if any(m != first for m in metrics.values()):  # the same verdicts every way
                        raise SystemExit(f"verdicts differ on {problem}/{program}: {metrics}")
                row: dict[str, Any] = {"problem": problem, "program": program, "verdicts": first}
                for name in paths:
                    row[f"{name}_s"] = round(statistics.median(times[name]), 3)
                    if name != "new":
                        row[f"new_vs_{name}"] = _spread([t / w for t, w in zip(times[name], times["new"], strict=True)])
                report["rows"].append(row)
                logger.info("%s", row)
    finally:
        if remote is not None:
            remote.close()
        new_box.close()
        started_box.close()
    report["load_after"] = _load()
    return report


def table(report: dict[str, Any]) -> str:
    others = [p for p in report["paths"] if p != "new"]
    lines = [
        f"machine: {report['machine']}; load average before {report['load_before']}, after {report['load_after']}",
        f"new path: zygote {report['zygote']}, batches {report['batches']}; {report['tests']} tests per problem, "
        f"{report['rounds']} rounds",
        "",
        "| problem | program | " + " | ".join(f"{p} s" for p in others) + " | new s | "
        + " | ".join(f"{p} / new" for p in others) + " |",
        "|---|---|" + "---|" * (2 * len(others) + 1),
    ]  # fmt: skip
    for row in report["rows"]:
        cells = [f"{row[f'{p}_s']:.2f}" for p in others] + [f"{row['new_s']:.2f}"]
        cells += [f"{row[f'new_vs_{p}']['median']:.1f}x ({row[f'new_vs_{p}']['min']:.1f}-"
                  f"{row[f'new_vs_{p}']['max']:.1f})" for p in others]  # fmt: skip
        lines.append(f"| {row['problem']} | {row['program']} | " + " | ".join(cells) + " |")
    lines.append("")
    for p in others:
        lowest = min(row[f"new_vs_{p}"]["median"] for row in report["rows"])
        lines.append(f"lowest median speed-up over {p}: {lowest:.1f}x")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """A small bar chart: seconds to score each suite, per path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, paths = report["rows"], report["paths"]
    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=100)
    width = 0.8 / len(paths)
    palette = ["#9e9e9e", "#e07b39", "#2e7d32"][-len(paths) :]
    for k, (name, color) in enumerate(zip(paths, palette, strict=True)):
        xs = [i + (k - (len(paths) - 1) / 2) * width for i in range(len(rows))]
        bars = ax.bar(xs, [r[f"{name}_s"] for r in rows], width, label=name, color=color)
        if name == "new":
            first = paths[0]
            for bar, r in zip(bars, rows, strict=True):
                ax.annotate(f"{r[f'new_vs_{first}']['median']:.1f}x", (bar.get_x() + width / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)  # fmt: skip
    ax.set_xticks(range(len(rows)), [f"{r['problem']}\n{r['program']}" for r in rows], fontsize=8)
    ax.margins(y=0.12)
    ax.set_ylabel(f"seconds to score {report['tests']} tests")
    ax.set_title(f"Code reward, {report['tests']}-test suites ({os.cpu_count()} cores; speed-up on the bars)",
                 fontsize=9)  # fmt: skip
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--today-rev", help="also score with the package as it is at this git revision")
    parser.add_argument("--quick", action="store_true", help="the correct programs only, 1 round")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--png", type=Path, help="draw them here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    programs = ["correct"] if args.quick else ["correct", "wrong"]
    rounds = 1 if args.quick else args.rounds
    report = asyncio.run(measure(args.tests, rounds, programs, args.today_rev))
    print(table(report))  # the benchmark's output
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.png:
        plot(report, args.png)


if __name__ == "__main__":
    main()
