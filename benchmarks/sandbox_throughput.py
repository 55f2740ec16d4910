"""Trivial programs per second: a bare interpreter vs the sandbox started per run vs the sandbox's zygote.

Why: a code episode runs many short sandboxed programs; what a run costs beyond the program itself is
what the sandbox adds. Three ways run the same snippets at the same concurrency:

* bare: ``subprocess.run([sys.executable, "-c", code])`` with stdin and captured output (what an
  unsandboxed code tool does), no isolation at all;
* started: ``SandboxConfig(zygote=False)``: every run starts the launcher (namespaces, fresh root,
  rlimits, uid) and then its own interpreter (the path before the zygote);
* zygote: the default sandbox: every run is forked from a warm interpreter and gets the same layers;
* main@REV (with ``--today-rev REV``): the default sandbox of the package as it is at git revision REV
  (``git archive`` into a temporary directory, run in a worker process), to compare with in the same run.

Rounds rotate which way goes first; ratios are taken within a round (the machine may be shared) and
reported as median (min-max) over rounds, with the load average before and after.

    python benchmarks/sandbox_throughput.py [--n 60] [--rounds 3] [--concurrency 1 2] [--quick]
        [--today-rev b14b9f6] [--json benchmarks/results/sandbox_throughput.json] [--png assets/sandbox_throughput.png]
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

from agentboost.sandbox import Sandbox, SandboxConfig

REPO = Path(__file__).resolve().parents[1]
logger = logging.getLogger("sandbox_throughput")

SNIPPETS = {
    "print": "print(sum(range(1000)))",
    "stdin": "import sys\nprint(sum(map(int, sys.stdin.read().split())))",
}
STDIN = " ".join(str(i) for i in range(1000))
WAYS = ("bare", "started", "zygote")


def _bare(code: str, stdin: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], input=stdin.encode(), capture_output=True, check=False)
    assert done.returncode == 0 and done.stdout, done


async def bare(code: str, stdin: str) -> None:
    await asyncio.to_thread(_bare, code, stdin)


async def sandboxed(box: Sandbox, code: str, stdin: str) -> None:
    result = await box.run(code, stdin=stdin)
    assert result.ok and result.stdout, result


class Remote:
    """The default sandbox as it is at a git revision, in a worker process (a package of its own on PYTHONPATH)."""

    def __init__(self, rev: str) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="agentboost-at-")
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "agentboost"], capture_output=True,
                                 check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", self._dir.name], input=archive, check=True)
        env = {**os.environ, "PYTHONPATH": self._dir.name}
        self._proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env, cwd=self._dir.name)  # fmt: skip
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().split() != ["ready", str(Path(self._dir.name, "agentboost"))]:
            raise RuntimeError(f"the worker for {rev} did not start right")

    async def rate(self, snippet: str, n: int, concurrency: int) -> float:
        return await asyncio.to_thread(self._rate, snippet, n, concurrency)

    def _rate(self, snippet: str, n: int, concurrency: int) -> float:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(f"{snippet} {n} {concurrency}\n")
        self._proc.stdin.flush()
        return float(self._proc.stdout.readline())

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=60)
        self._dir.cleanup()


def worker() -> None:
    """``--worker``: runs/s of the snippet each stdin line names (``snippet n concurrency``) in this
    interpreter's ``agentboost`` (an older one on PYTHONPATH), default sandbox; one line per request."""
    import agentboost

    box = Sandbox(SandboxConfig())
    box.isolation()
    print(f"ready {Path(agentboost.__file__).parent}", flush=True)
    for line in sys.stdin:
        name, n, concurrency = line.split()
        stdin = STDIN if name == "stdin" else ""
        code = SNIPPETS[name]
        runs_per_s = asyncio.run(
            rate(lambda code=code, stdin=stdin: sandboxed(box, code, stdin), int(n), int(concurrency))
        )
        print(runs_per_s, flush=True)
    box.close()


async def rate(fn: Callable[[], Awaitable[None]], n: int, concurrency: int) -> float:
    """Runs per second of ``n`` calls of ``fn``, ``concurrency`` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await fn()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return n / (time.perf_counter() - started)


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


async def measure(n: int, rounds: int, concurrencies: list[int], today_rev: str | None = None) -> dict[str, object]:
    started_box = Sandbox(SandboxConfig(zygote=False))
    zygote_box = Sandbox(SandboxConfig())
    remote = await asyncio.to_thread(Remote, today_rev) if today_rev else None
    ways = (*WAYS, "main") if remote is not None else WAYS
    try:
        await asyncio.to_thread(started_box.isolation)
        iso = await asyncio.to_thread(zygote_box.isolation)
        zygote_notes = [note for note in iso["notes"] if note.startswith("no-zygote")]
        report: dict[str, object] = {
            "machine": machine(),
            "load_before": _load(),
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "sandbox_python": iso["python"],
            "zygote": iso["zygote"],
            "zygote_notes": zygote_notes,
            "namespaces": iso["namespaces"],
            "n": n,
            "rounds": rounds,
            "today_rev": today_rev,
            "rows": [],
        }
        rows: list[dict[str, object]] = []
        for name, code in SNIPPETS.items():
            stdin = STDIN if name == "stdin" else ""
            fns: dict[str, Callable[[], Awaitable[None]]] = {
                "bare": lambda code=code, stdin=stdin: bare(code, stdin),
                "started": lambda code=code, stdin=stdin: sandboxed(started_box, code, stdin),
                "zygote": lambda code=code, stdin=stdin: sandboxed(zygote_box, code, stdin),
            }
            for c in concurrencies:
                for fn in fns.values():
                    await rate(fn, 4, c)  # warm caches
                if remote is not None:
                    await remote.rate(name, 4, c)
                per_round: dict[str, list[float]] = {way: [] for way in ways}
                for r in range(rounds):
                    order = ways[r % len(ways) :] + ways[: r % len(ways)]
                    for way in order:
                        if way == "main":
                            assert remote is not None
                            per_round[way].append(await remote.rate(name, n, c))
                        else:
                            per_round[way].append(await rate(fns[way], n, c))
                row = {
                    "snippet": name,
                    "concurrency": c,
                    **{f"{way}_runs_per_s": statistics.median(per_round[way]) for way in WAYS},
                    "zygote_vs_bare": _spread(
                        [z / b for z, b in zip(per_round["zygote"], per_round["bare"], strict=True)]
                    ),
                    "started_vs_bare": _spread(
                        [s / b for s, b in zip(per_round["started"], per_round["bare"], strict=True)]
                    ),
                    "zygote_vs_started": _spread(
                        [z / s for z, s in zip(per_round["zygote"], per_round["started"], strict=True)]
                    ),
                }
                if remote is not None:
                    row["main_runs_per_s"] = statistics.median(per_round["main"])
                    row["main_vs_bare"] = _spread(
                        [m / b for m, b in zip(per_round["main"], per_round["bare"], strict=True)]
                    )
                    row["zygote_vs_main"] = _spread(
                        [z / m for z, m in zip(per_round["zygote"], per_round["main"], strict=True)]
                    )
                rows.append(row)
                logger.info("%s", row)
        report["rows"] = rows
        report["load_after"] = _load()
        return report
    finally:
        if remote is not None:
            remote.close()
        zygote_box.close()
        started_box.close()


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def table(report: dict[str, object]) -> str:
    lines = [
        f"machine: {report['machine']}; load average before {report['load_before']}, after {report['load_after']}",
        f"zygote active: {report['zygote']} {report['zygote_notes'] or ''}; namespaces: {report['namespaces']}; "
        f"{report['n']} runs per way and round, {report['rounds']} rounds",
        "",
        "| snippet | concurrency | bare runs/s | started runs/s | zygote runs/s | started / bare | zygote / bare "
        "| zygote / started |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:  # type: ignore[attr-defined]
        ratios = [row[k] for k in ("started_vs_bare", "zygote_vs_bare", "zygote_vs_started")]
        lines.append(
            f"| {row['snippet']} | {row['concurrency']} | {row['bare_runs_per_s']:.1f} "
            f"| {row['started_runs_per_s']:.1f} | {row['zygote_runs_per_s']:.1f} | "
            + " | ".join(f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})" for r in ratios)
            + " |"
        )
    if report.get("today_rev"):
        lines += ["", f"| snippet | concurrency | main@{report['today_rev']} runs/s | main / bare | zygote / main |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for row in report["rows"]:  # type: ignore[attr-defined]
            ratios = [row[k] for k in ("main_vs_bare", "zygote_vs_main")]
            cells = " | ".join(f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})" for r in ratios)
            lines.append(f"| {row['snippet']} | {row['concurrency']} | {row['main_runs_per_s']:.1f} | {cells} |")
    return "\n".join(lines)


def plot(report: dict[str, object], path: Path) -> None:
    """A small bar chart of runs/s per way, one group per snippet and concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]  # type: ignore[assignment]
    labels = [f"{r['snippet']}\nx{r['concurrency']}" for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=100)
    ways = (*WAYS, "main") if report.get("today_rev") else WAYS
    width = 0.8 / len(ways)
    colors = {"bare": "#9e9e9e", "started": "#e07b39", "zygote": "#2e7d32", "main": "#6a8caf"}
    names = {"main": f"main@{report.get('today_rev')}"}
    for k, way in enumerate(ways):
        values = [r[f"{way}_runs_per_s"] for r in rows]
        xs = [i + (k - (len(ways) - 1) / 2) * width for i in range(len(rows))]
        bars = ax.bar(xs, values, width, label=names.get(way, way), color=colors[way])
        if way == "zygote":
            for bar, r in zip(bars, rows, strict=True):
                ax.annotate(f"{r['zygote_vs_bare']['median']:.1f}x", (bar.get_x() + width / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)  # fmt: skip
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.margins(y=0.12)
    ax.set_ylabel("runs / s")
    ax.set_title(f"Trivial programs per second ({os.cpu_count()} cores; zygote / bare on the bars)", fontsize=9)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=60, help="runs per way, snippet, concurrency and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, os.cpu_count() or 2])
    parser.add_argument("--quick", action="store_true", help="--n 20 --rounds 3, the print snippet only")
    parser.add_argument("--today-rev", help="also measure the default sandbox as it is at this git revision")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--png", type=Path, help="draw them here")
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.quick:
        args.n = 20
        SNIPPETS.pop("stdin")
    report = asyncio.run(measure(args.n, args.rounds, args.concurrency, args.today_rev))
    print(table(report))  # the benchmark's output
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.png:
        plot(report, args.png)


if __name__ == "__main__":
    main()
