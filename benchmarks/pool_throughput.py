"""Worker pool throughput vs one fresh process per episode (the design agentboost replaces), and the
pool's added cost per model call over running the same episodes in-process.

Every episode is the arithmetic task against an instant fake policy (2 model calls: one calculator
call, then the answer), so the numbers measure the rollout machinery, not a model. Two tools:

* ``instant``: the calculator itself (CPU-bound episodes);
* ``sleep50``: the calculator after a 50 ms ``time.sleep`` (an I/O-bound tool: a sandbox, an HTTP
  API, a database), which the pool must overlap across episodes instead of serialising.

The pool's overhead per model call is measured ``--overhead-runs`` times, each run alternating a
1-worker pool and the same episodes in this process at the same concurrency; the wall-clock difference
and the CPU difference (this process and the worker vs this process alone) per model call are
reported as min / median / max. This machine is shared: compare figures of one run, and read the
load average printed with them.

One process per episode is measured up to ``--baseline-max`` (8) episodes in flight: its rate is
bound by CPU well before that (every episode starts an interpreter and loads a tokenizer), so above it
the table gives the highest measured rate as an upper bound. Figures are also written as JSON
(``--json``, default ``benchmarks/results/pool_throughput.json``)::

    python benchmarks/pool_throughput.py [--quick] [--concurrency 1 8 64 256] [--workers 2] [--overhead-runs 7]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# As in pool workers: no torch (transformers imports it with the tokenizer otherwise, which triples the
# heap every garbage collection walks), so the in-process figures are comparable with the pool's.
os.environ.setdefault("USE_TORCH", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from strands import tool

from agentboost.backends.factory import ModelSpec
from agentboost.environments.arithmetic import SYSTEM_PROMPT, make_tasks
from agentboost.pool import PoolConfig, StrandsProcessPool
from agentboost.rollout import RolloutSettings
from agentboost.runs import AgentSpec, EpisodeSpec, expand, run_many
from agentboost.tools.calculator import calculator

HERE = Path(__file__).resolve().parent
MODEL = ModelSpec(backend="py:agentboost.testing.instant:instant_backend", tokenizer="offline:qwen2.5")
TOOLS = {"instant": None, "sleep50": ["pool_throughput:sleepy_calculator"]}
ONE_EPISODE = (
    "import asyncio, json, sys\n"
    "from agentboost.runs import EpisodeSpec, run_spec\n"
    "spec = EpisodeSpec.from_dict(json.loads(sys.stdin.read()))\n"
    "print(json.dumps(asyncio.run(run_spec(spec)).summary()))\n"
)
PROCESS_GB = 0.28
"""Measured RSS of one episode process (strands + tokenizer, no torch)."""
TICK = os.sysconf("SC_CLK_TCK")


@tool(name="calculator")
def sleepy_calculator(expression: str) -> dict:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: the expression, e.g. "(12 + 7) * 3"; numbers and + - * / // % ** ( ) only.
    """
    time.sleep(0.05)  # the I/O an ordinary tool waits on
    return calculator(expression)


def specs(n: int, seed: int = 0, tools: str = "instant") -> list[EpisodeSpec]:
    env_args = {"tools": TOOLS[tools]} if TOOLS[tools] else {}
    agent = AgentSpec(
        env="agentboost.environments.arithmetic:ArithmeticEnv", env_args=env_args, system_prompt=SYSTEM_PROMPT
    )
    return expand(make_tasks(n, seed=seed, split="bench"), agent, MODEL, RolloutSettings(), n=1)


async def process_per_episode(batch: list[EpisodeSpec], concurrency: int) -> float:
    """A new Python process per episode (imports, tokenizer, template every time)."""
    gate = asyncio.Semaphore(concurrency)
    env = dict(os.environ, USE_TORCH="0", TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)

    async def one(spec: EpisodeSpec) -> None:
        async with gate:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", ONE_EPISODE, env=env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            out, _ = await proc.communicate(json.dumps(spec.to_dict()).encode())
            assert json.loads(out.decode().strip().splitlines()[-1])["termination"] == "completed"

    started = time.perf_counter()
    await asyncio.gather(*(one(s) for s in batch))
    return len(batch) / (time.perf_counter() - started)


def pool_rate_at(pool: StrandsProcessPool, batch: list[EpisodeSpec], concurrency: int) -> float:
    """Pool throughput with at most ``concurrency`` episodes submitted at a time."""
    started = time.perf_counter()
    pending = list(batch)
    in_flight: list[concurrent.futures.Future[Any]] = []
    done = 0
    while pending or in_flight:
        while pending and len(in_flight) < concurrency:
            in_flight.append(pool.submit(pending.pop()))
        finished, rest = concurrent.futures.wait(in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in finished:
            episode = future.result()
            assert episode.termination.value == "completed", episode.termination_detail
            done += 1
        in_flight = list(rest)
    return done / (time.perf_counter() - started)


def in_process(batch: list[EpisodeSpec], concurrency: int) -> tuple[float, float, int]:
    """(wall s, CPU s, model calls) of ``batch`` run in this process."""

    async def go() -> int:
        episodes = await run_many(batch, concurrency=concurrency)
        assert all(e.termination.value == "completed" for e in episodes)
        return sum(len(e.calls) for e in episodes)

    wall, cpu = time.perf_counter(), time.process_time()
    calls = asyncio.run(go())
    return time.perf_counter() - wall, time.process_time() - cpu, calls


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def throughput(args: argparse.Namespace, max_processes: int, record: dict[str, Any]) -> None:
    """Episodes/s of a ``--workers`` pool at each concurrency, and of one process per episode.

    One process per episode costs an interpreter start, imports and a tokenizer load (seconds of CPU),
    so it is run only up to ``--baseline-max`` in flight: on this machine 8 such processes already
    keep every core busy, and more in flight cannot raise their rate (they only add memory). Above
    that the highest measured rate is shown as an upper bound and the ratio as a lower bound."""
    config = PoolConfig(workers=args.workers, max_in_flight=max(args.concurrency))
    with StrandsProcessPool(config) as pool:
        pids = [w["pid"] for w in pool.stats()["per_worker"].values()]
        idle = [rss_mb(p) for p in pids]
        for kind in args.tools:
            pool.run_all(specs(4 * args.workers, seed=97, tools=kind))  # warm-up: tokenizer, template, tools
        warm = [rss_mb(p) for p in pids]
        for kind in args.tools:
            load = os.getloadavg()[0]
            print(f"\n{kind} tool ({'calculator' if kind == 'instant' else 'calculator after a 50 ms sleep'}), "
                  f"{args.workers} pool workers; load average {load:.2f}")  # fmt: skip
            print("| episodes in flight | pool episodes/s | process-per-episode episodes/s | ratio |")
            print("|---|---|---|---|")
            rows: list[dict[str, Any]] = []
            best_base: float | None = None
            for c in args.concurrency:
                rate = pool_rate_at(pool, specs(max(args.pool_episodes, 2 * c), seed=c, tools=kind), c)
                row: dict[str, Any] = {"in_flight": c, "pool_eps": rate, "baseline_eps": None, "baseline": "not run"}
                if args.skip_baseline:
                    base_text, ratio = "not run", "-"
                elif c <= min(args.baseline_max, max_processes):
                    n = max(c, args.baseline_episodes)
                    base = asyncio.run(process_per_episode(specs(n, seed=1000 + c, tools=kind), c))
                    best_base = max(best_base or 0.0, base)
                    base_text, ratio = f"{base:.2f}", f"{rate / base:.0f}x"
                    row.update(baseline_eps=base, baseline=f"measured ({n} episodes)")
                elif best_base is not None:
                    base_text, ratio = f"<= {best_base:.2f} (bound)", f">= {rate / best_base:.0f}x"
                    row.update(
                        baseline_eps=best_base, baseline="upper bound: the highest rate measured at fewer in flight"
                    )
                else:
                    base_text, ratio = "not run", "-"
                print(f"| {c} | {rate:.1f} | {base_text} | {ratio} |", flush=True)
                rows.append(row)
            record["throughput"][kind] = {"load_average": load, "rows": rows}
        after = [rss_mb(p) for p in pids]
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        print(
            f"\nworker RSS: idle {mean(idle):.0f} MB, after warm-up {mean(warm):.0f} MB, after the runs "
            f"{mean(after):.0f} MB (mean of {len(pids)} workers; no torch in workers)"
        )
        record["worker_rss_mb"] = {"idle": mean(idle), "warm": mean(warm), "after": mean(after)}


def overhead(args: argparse.Namespace, record: dict[str, Any]) -> None:
    """The pool's added cost per model call: a 1-worker pool vs this process, alternated."""
    n, concurrency = args.overhead_episodes, 64
    wall: list[float] = []
    cpu: list[float] = []
    loads = [os.getloadavg()[0]]
    with StrandsProcessPool(PoolConfig(workers=1, max_in_flight=concurrency)) as pool:
        pid = next(iter(pool.stats()["per_worker"].values()))["pid"]
        pool.run_all(specs(16, seed=6))
        in_process(specs(16, seed=99), 16)
        for rep in range(args.overhead_runs):
            if rep % 2:  # alternate which side goes first: load drifting during a run hits both
                local_wall, local_cpu, local_calls = in_process(specs(n, seed=7 + rep), concurrency)
            main_cpu, worker_cpu, started = time.process_time(), cpu_s(pid), time.perf_counter()
            episodes = pool.run_all(specs(n, seed=7 + rep))
            pool_wall = time.perf_counter() - started
            pool_cpu = time.process_time() - main_cpu + cpu_s(pid) - worker_cpu
            assert all(e.termination.value == "completed" for e in episodes)
            calls = sum(len(e.calls) for e in episodes)
            if not rep % 2:
                local_wall, local_cpu, local_calls = in_process(specs(n, seed=7 + rep), concurrency)
            assert local_calls == calls
            wall.append((pool_wall - local_wall) / calls * 1000)
            cpu.append((pool_cpu - local_cpu) / calls * 1000)
            loads.append(os.getloadavg()[0])
            print(f"  run {rep + 1}: pool {pool_wall:.2f} s wall / {pool_cpu:.2f} s CPU, in-process {local_wall:.2f} s "
                  f"/ {local_cpu:.2f} s for {n} episodes ({calls} model calls): {wall[-1]:+.3f} ms wall, "
                  f"{cpu[-1]:+.3f} ms CPU per call", flush=True)  # fmt: skip
    describe = lambda xs: f"min {min(xs):+.3f}, median {statistics.median(xs):+.3f}, max {max(xs):+.3f}"  # noqa: E731
    print(f"\npool overhead per model call over in-process ({args.overhead_runs} runs of {n} episodes, "
          f"{concurrency} in flight, 1 worker):\n  wall: {describe(wall)} ms\n  CPU:  {describe(cpu)} ms "
          f"(this process + the worker, vs in-process)\n  load average during the runs: "
          f"{min(loads):.2f}-{max(loads):.2f}")  # fmt: skip
    summary = lambda xs: {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "runs": xs}  # noqa: E731
    record["overhead_ms_per_call"] = {
        "episodes_per_run": n,
        "in_flight": concurrency,
        "wall": summary(wall),
        "cpu": summary(cpu),
        "load_average": [min(loads), max(loads)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--overhead-runs", type=int, default=7)
    parser.add_argument("--overhead-episodes", type=int, default=256)
    parser.add_argument(
        "--pool-episodes", type=int, default=128, help="episodes per pool throughput figure (at least 2x in flight)"
    )
    parser.add_argument(
        "--baseline-max", type=int, default=8, help="most episodes in flight the process-per-episode baseline is run at"
    )
    parser.add_argument(
        "--baseline-episodes", type=int, default=4, help="episodes per baseline figure (at least the number in flight)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer runs and episodes (about 1.5 minutes on 2 idle cores)"
    )
    parser.add_argument("--json", type=Path, default=HERE / "results" / "pool_throughput.json")
    parser.add_argument("--tools", nargs="+", choices=sorted(TOOLS), default=list(TOOLS))
    parser.add_argument("--skip-baseline", action="store_true", help="pool figures only (no process per episode)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--baseline-memory-gb", type=float, default=None,
                        help="cap on the baseline's concurrent processes (default: 80%% of RAM / 0.28 GB)")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.overhead_runs, args.overhead_episodes, args.pool_episodes = 5, 128, 64
        args.baseline_episodes = 2
    total_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    max_processes = int((args.baseline_memory_gb or 0.8 * total_gb) / PROCESS_GB)
    print(f"machine: {os.cpu_count()} cores, {total_gb:.0f} GiB; load average {os.getloadavg()[0]:.2f}")
    record: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "memory_gib": round(total_gb), "load_average_start": os.getloadavg()[0]},
        "workers": args.workers,
        "quick": args.quick,
        "throughput": {},
    }

    # Framework cost per model call, in-process (warm: tokenizer/template built already).
    in_process(specs(8, seed=99), 8)
    local_wall, _, calls = in_process(specs(200, seed=98), 64)
    record["in_process"] = {"episodes_per_s": 200 / local_wall, "ms_per_call": local_wall / calls * 1000}
    print(f"in-process: {200 / local_wall:.1f} episodes/s at 64 concurrent; {local_wall / calls * 1000:.2f} ms wall "
          "per model call (TokenModel render/parse + Strands loop + calculator tool), 1 core")  # fmt: skip
    if not args.skip_throughput:
        throughput(args, max_processes, record)
    if not args.skip_overhead:
        overhead(args, record)
    record["machine"]["load_average_end"] = os.getloadavg()[0]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1))
    print(f"figures: {args.json}")


if __name__ == "__main__":
    main()
