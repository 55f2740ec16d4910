"""README command 1 over many seeds: does the quickstart learn whatever the seed?

Runs ``agentboost quickstart --seed S`` (``agentboost train``'s loop with the quickstart's preset) for
every seed (default 12 and 100-119: seeds the quickstart was never developed on, and seed 12, which did
not learn before the warm start demonstrated a wide expression space), each in its own process and run
directory with default settings, and reports per seed the held-out greedy success after the warm start
and after GRPO, the improvement, the warm start's own check (tool use learned) and the wall time; plus
the distribution (min / median / max).
Goal: every improvement >= +0.4, every run <= 10 min on 2 cores.

    python benchmarks/quickstart_seeds.py                      # seeds 12, 100-119 one after the other
    python benchmarks/quickstart_seeds.py --parallel 2         # two at a time, one thread each
    python benchmarks/quickstart_seeds.py --seeds 3 7 --out runs/seeds
    python benchmarks/quickstart_seeds.py --report-only --out runs/seeds   # table + figure from finished runs

Writes ``<out>/seeds.json``, ``<out>/seeds.md`` and a figure (``--figure``, default
``<out>/quickstart_seeds.png``; the docs' is ``assets/quickstart_seeds.png``). A seed whose run directory
already holds a finished summary is not run again (delete it to re-run). With ``--parallel N`` every
run gets ``cores / N`` threads (OMP_NUM_THREADS), so each run's time is what it takes on that many
cores: with ``--parallel 2`` on a 2-core machine, a run within 10 minutes on one core is within 10
minutes on 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GOAL_IMPROVEMENT = 0.4
GOAL_SECONDS = 600.0


def finished(summary_path: Path) -> bool:
    """Whether a seed's run got to the end (a summary is written before GRPO too)."""
    return summary_path.exists() and "after" in json.loads(summary_path.read_text())


def run_seed(seed: int, out: Path, extra: list[str], threads: int | None = None) -> dict:
    run_dir = out / f"seed{seed}"
    summary_path = run_dir / "summary.json"
    if finished(summary_path):
        print(f"seed {seed}: already done ({summary_path})", flush=True)
    else:
        cmd = [sys.executable, "-m", "agentboost.cli.main", "quickstart", "--seed", str(seed),
               "--run-dir", str(run_dir), "--no-wandb", *extra]  # fmt: skip
        started = time.monotonic()
        print(f"seed {seed}: {' '.join(cmd)}", flush=True)
        env = dict(os.environ)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        with open(out / f"seed{seed}.log", "w") as log:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False, env=env).returncode
        print(f"seed {seed}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
        if code != 0 or not summary_path.exists():
            return {"seed": seed, "error": f"exit {code}; see {out / f'seed{seed}.log'}"}
    summary = json.loads(summary_path.read_text())
    before, after = summary["before"], summary["after"]
    checks = summary.get("warm_start", {}).get("checks", [])
    return {
        "seed": seed,
        "before": before.get("eval/success_rate", 0.0),
        "after": after.get("eval/success_rate", 0.0),
        "improvement": summary["improvement"],
        "warm_start_check": summary.get("warm_start", {}).get("check"),
        "warm_start_steps": summary.get("warm_start", {}).get("steps"),
        "warm_start_weak": summary.get("warm_start", {}).get("weak"),  # below --warm-start-low: the run warned
        "warm_start_restarted_at": next((c["step"] for c in checks if c.get("restarted")), None),
        "warm_start_handed_over_step": summary.get("warm_start", {}).get("handed_over_step"),  # best-checked
        "seconds": summary["timings"].get("total_s"),
        "timings": summary["timings"],
        "not_default": not_default(summary.get("config", {})),
    }


def not_default(saved: dict) -> dict:
    """The options defining a run (model, vocabulary, tasks) on which ``saved`` differs from today's defaults
    for its seed: a run directory kept from an earlier sweep is skipped, not rerun, so the report names what
    it was made with."""
    from agentboost.quickstart import QuickstartConfig, settings_that_differ

    today = QuickstartConfig(seed=saved.get("seed", QuickstartConfig.seed))
    return {name: then for name, (then, _) in settings_that_differ(today, saved).items()}


def report(rows: list[dict], out: Path, figure: Path, threads_note: str = "one run at a time") -> str:
    done = [r for r in rows if "error" not in r]
    lines = [
        "| seed | success after warm start | after GRPO | improvement | warm-start check (steps) | time "
        "(warm start + GRPO) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['seed']} | failed: {r['error']} | | | | |")
            continue
        check = "-" if r["warm_start_check"] is None else f"{r['warm_start_check']:.2f} ({r['warm_start_steps']})"
        if r.get("warm_start_restarted_at") is not None:
            check += f" (restarted at {r['warm_start_restarted_at']})"
        handed = r.get("warm_start_handed_over_step")
        if handed is not None and handed != r["warm_start_steps"]:
            check += f" (GRPO from step {handed}'s weights)"
        lines.append(
            f"| {r['seed']} | {r['before']:.3f} | {r['after']:.3f} | {r['improvement']:+.3f} | {check} | "
            f"{r['seconds'] / 60:.1f} min{_split(r.get('timings') or {})} |"
        )
    if done:
        gains = [r["improvement"] for r in done]
        times = [r["seconds"] for r in done]
        lines += [
            "",
            f"improvement: min {min(gains):+.3f}, median {statistics.median(gains):+.3f}, max {max(gains):+.3f} "
            f"(goal: each >= +{GOAL_IMPROVEMENT}; {sum(g >= GOAL_IMPROVEMENT for g in gains)}/{len(gains)} met)",
            f"time: min {min(times) / 60:.1f}, median {statistics.median(times) / 60:.1f}, "
            f"max {max(times) / 60:.1f} min "
            f"(goal: each <= {GOAL_SECONDS / 60:.0f} min; {sum(t <= GOAL_SECONDS for t in times)}/{len(times)} met)",
            f"machine: {os.cpu_count()} CPU cores, {threads_note}",
        ]
        lines += [
            f"seed {r['seed']} was run with settings that are not today's defaults: {r['not_default']}"
            for r in done
            if r.get("not_default")
        ]
        _figure(done, figure, threads_note)
        lines.append(f"figure: {figure}")
    text = "\n".join(lines)
    (out / "seeds.json").write_text(json.dumps(rows, indent=2))
    (out / "seeds.md").write_text(text + "\n")
    return text


def _split(timings: dict) -> str:
    if "sft_s" not in timings or "grpo_s" not in timings:
        return ""
    return f" ({timings['sft_s'] / 60:.1f} + {timings['grpo_s'] / 60:.1f})"


def _figure(rows: list[dict], path: Path, threads_note: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = [r["seed"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.4 * len(seeds)), 4.0), dpi=110)
    width = 0.38
    xs = range(len(seeds))
    ax.bar([x - width / 2 for x in xs], [r["before"] for r in rows], width, label="after warm start", color="C7")
    ax.bar([x + width / 2 for x in xs], [r["after"] for r in rows], width, label="after GRPO", color="C0")
    ax.axhline(GOAL_IMPROVEMENT, color="C3", linestyle=":", linewidth=1, label=f"+{GOAL_IMPROVEMENT} (goal gain)")
    ax.set_xticks(list(xs), [str(s) for s in seeds], fontsize=8)
    ax.set_xlabel("seed")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_ylim(0, 1.05)
    minutes = [r["seconds"] / 60 for r in rows]
    span = f"{min(minutes):.1f}-{max(minutes):.1f} min each"
    ax.set_title(f"agentboost quickstart, default settings: {len(rows)} seeds, {span} ({threads_note})", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[12, *range(100, 120)])
    parser.add_argument("--out", default="runs/quickstart-seeds")
    parser.add_argument("--figure", default=None)
    parser.add_argument("--report-only", action="store_true", help="only tabulate runs already finished")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time, cores shared equally")
    parser.add_argument("--threads", type=int, default=None, help="threads per run (default: cores / --parallel)")
    args, extra = parser.parse_known_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figure = Path(args.figure) if args.figure else out / "quickstart_seeds.png"
    seeds = [s for s in args.seeds if not args.report_only or finished(out / f"seed{s}" / "summary.json")]
    threads = args.threads or (max(1, (os.cpu_count() or 1) // args.parallel) if args.parallel > 1 else None)
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as runs:
        rows = list(runs.map(lambda seed: run_seed(seed, out, extra, threads), seeds))
    note = f"{args.parallel} runs at a time, {threads} thread(s) each" if threads else "one run at a time"
    print(report(rows, out, figure, note))
    return 0 if rows and all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
