"""Worker pool throughput vs one fresh process per episode (the design agentboost replaces).

Both run the same episodes (arithmetic task, calculator tool, 2 model calls per episode) against an
instant fake policy, so the numbers measure the rollout machinery, not a model. Also reported: the
framework's own cost per model call in-process, the pool's added cost per model call, and memory
per worker. Ratios are taken within one run (this machine is noisy).

    python benchmarks/pool_throughput.py [--concurrency 1 8 64 256] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from agentboost.backends.factory import ModelSpec
from agentboost.environments.arithmetic import SYSTEM_PROMPT, make_tasks
from agentboost.pool import PoolConfig, StrandsProcessPool
from agentboost.rollout import RolloutSettings
from agentboost.runs import AgentSpec, EpisodeSpec, expand, run_many

MODEL = ModelSpec(backend="py:agentboost.testing.instant:instant_backend", tokenizer="offline:qwen2.5")
AGENT = AgentSpec(env="agentboost.environments.arithmetic:ArithmeticEnv", system_prompt=SYSTEM_PROMPT)
ONE_EPISODE = (
    "import asyncio, json, sys\n"
    "from agentboost.runs import EpisodeSpec, run_spec\n"
    "spec = EpisodeSpec.from_dict(json.loads(sys.stdin.read()))\n"
    "print(json.dumps(asyncio.run(run_spec(spec)).summary()))\n"
)


def specs(n: int, seed: int = 0) -> list[EpisodeSpec]:
    return expand(make_tasks(n, seed=seed, split="bench"), AGENT, MODEL, RolloutSettings(), n=1)


async def process_per_episode(batch: list[EpisodeSpec], concurrency: int) -> float:
    """ATK's design: a new Python process per episode (imports, tokenizer, template every time)."""
    gate = asyncio.Semaphore(concurrency)
    env = dict(os.environ, USE_TORCH="0", TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")

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


def pool_rate(pool: StrandsProcessPool, batch: list[EpisodeSpec]) -> float:
    started = time.perf_counter()
    episodes = pool.run_all(batch)
    elapsed = time.perf_counter() - started
    assert all(e.termination.value == "completed" for e in episodes), {e.termination for e in episodes}
    return len(batch) / elapsed


def in_process_rate(batch: list[EpisodeSpec], concurrency: int) -> tuple[float, float]:
    async def go() -> tuple[float, int]:
        started = time.perf_counter()
        episodes = await run_many(batch, concurrency=concurrency)
        return time.perf_counter() - started, sum(len(e.calls) for e in episodes)

    elapsed, calls = asyncio.run(go())
    return len(batch) / elapsed, elapsed / calls


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--baseline-memory-gb", type=float, default=None,
                        help="cap on the baseline's concurrent processes (default: 80%% of RAM / 0.3 GB)")  # fmt: skip
    args = parser.parse_args()
    total_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    process_gb = 0.28  # measured RSS of one episode process (strands + tokenizer, no torch)
    max_processes = int((args.baseline_memory_gb or 0.8 * total_gb) / process_gb)
    print(f"machine: {os.cpu_count()} cores, {total_gb:.0f} GiB; pool workers: {args.workers}")

    # Framework cost per model call, in-process (warm: tokenizer/template built already).
    in_process_rate(specs(8, seed=99), 8)
    ip_rate, per_call = in_process_rate(specs(200, seed=98), 64)
    print(f"in-process: {ip_rate:.1f} episodes/s at 64 concurrent; {per_call * 1000:.2f} ms wall per model call "
          "(TokenModel render/parse + Strands loop + calculator tool), 1 core")  # fmt: skip

    config = PoolConfig(workers=args.workers, max_in_flight=max(args.concurrency), tool_threads=32)
    with StrandsProcessPool(config) as pool:
        pids = [w["pid"] for w in pool.stats()["per_worker"].values()]
        idle = [rss_mb(p) for p in pids]
        pool.run_all(specs(4 * args.workers, seed=97))  # warm-up: tokenizer, template, tools per worker
        warm = [rss_mb(p) for p in pids]
        rows = []
        for c in args.concurrency:
            n = max(64, 2 * c)
            pool_config_rate = pool_rate_at(pool, specs(n, seed=c), c)
            if c <= max_processes:
                base = asyncio.run(process_per_episode(specs(max(c, 8), seed=1000 + c), c))
                ratio = f"{pool_config_rate / base:.0f}x"
                base_text = f"{base:.2f}"
            else:
                base_text, ratio = f"not run ({c} processes x {process_gb} GB > RAM)", "-"
            rows.append((c, pool_config_rate, base_text, ratio))
        after = [rss_mb(p) for p in pids]
        print("\n| concurrent episodes | pool episodes/s | process-per-episode episodes/s | ratio |")
        print("|---|---|---|---|")
        for c, rate, base_text, ratio in rows:
            print(f"| {c} | {rate:.1f} | {base_text} | {ratio} |")
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        print(
            f"\nworker RSS: idle {mean(idle):.0f} MB, after warm-up {mean(warm):.0f} MB, after the runs "
            f"{mean(after):.0f} MB (mean of {len(pids)} workers; no torch in workers)"
        )

    # Pool overhead per model call: a 1-worker pool vs the same episodes in this process, same
    # concurrency, alternated 3 times (median).
    diffs = []
    with StrandsProcessPool(PoolConfig(workers=1, max_in_flight=64)) as single:
        single.run_all(specs(8, seed=6))
        for rep in range(3):
            batch = specs(256, seed=7 + rep)
            t0 = time.perf_counter()
            episodes = single.run_all(batch)
            pool_s = time.perf_counter() - t0
            calls = sum(len(e.calls) for e in episodes)
            in_rate, _ = in_process_rate(specs(256, seed=7 + rep), 64)
            diffs.append(((pool_s - len(batch) / in_rate) / calls * 1000, pool_s, len(batch) / in_rate))
    diffs.sort()
    median, pool_s, inproc_s = diffs[1]
    print(f"\npool overhead: {median:+.3f} ms per model call, median of 3 (1-worker pool {pool_s:.2f} s vs "
          f"in-process {inproc_s:.2f} s for 256 episodes, 2 model calls each); runs: "
          + ", ".join(f"{d[0]:+.3f}" for d in diffs))  # fmt: skip


def pool_rate_at(pool: StrandsProcessPool, batch: list[EpisodeSpec], concurrency: int) -> float:
    """Pool throughput with at most ``concurrency`` episodes submitted at a time."""
    started = time.perf_counter()
    pending = list(batch)
    in_flight: list = []
    done = 0
    import concurrent.futures

    while pending or in_flight:
        while pending and len(in_flight) < concurrency:
            in_flight.append(pool.submit(pending.pop()))
        finished, rest = concurrent.futures.wait(in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in finished:
            assert future.result().termination.value == "completed"
            done += 1
        in_flight = list(rest)
    return done / (time.perf_counter() - started)


if __name__ == "__main__":
    main()
