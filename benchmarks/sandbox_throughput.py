"""Sandboxed executions per second vs a bare ``subprocess`` Python on the same snippets.

The bare baseline is what unsandboxed code tools do (``subprocess.run([sys.executable, "-c", code])``,
with stdin and captured output); the sandbox adds a session, a scrubbed environment, a private
working directory, rlimits, and (where available) an unprivileged uid and network / mount / PID
namespaces. Both run the same snippets at the same concurrency; ratios come from one run.

    python benchmarks/sandbox_throughput.py [--n 200] [--concurrency 1 2]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import time

from agentboost.sandbox import Sandbox, SandboxConfig

SNIPPETS = {
    "print": "print(sum(range(1000)))",
    "stdin": "import sys\ndata = sys.stdin.read().split()\nprint(sum(map(int, data)))",
    "stdlib": "import json, re, collections, itertools\nprint(json.dumps(collections.Counter('abracadabra')))",
    "compute": "print(sum(i * i for i in range(200_000)))",
}
STDIN = " ".join(str(i) for i in range(1000))


async def bare(code: str, stdin: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate(stdin.encode())
    assert proc.returncode == 0 and out


async def sandboxed(box: Sandbox, code: str, stdin: str) -> None:
    result = await box.run(code, stdin=stdin)
    assert result.ok and result.stdout, result


async def rate(fn, n: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await fn()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return n / (time.perf_counter() - started)


async def main_async(n: int, concurrencies: list[int]) -> None:
    box = Sandbox(SandboxConfig())
    iso = await asyncio.to_thread(box.isolation)
    active = [k for k, v in iso.items() if v is True]
    inactive = [k for k, v in iso.items() if v is False]
    print(
        f"machine: {os.cpu_count()} cores; sandbox interpreter {iso['python']}; baseline interpreter {sys.executable}"
    )
    print(f"isolation active: {', '.join(active)}; not active: {', '.join(inactive) or 'none'}\n")
    print("| snippet | concurrency | bare subprocess exec/s | sandbox exec/s | sandbox / bare |")
    print("|---|---|---|---|---|")
    ratios = []
    for name, code in SNIPPETS.items():
        stdin = STDIN if name == "stdin" else ""
        for c in concurrencies:
            run_bare = functools.partial(bare, code, stdin)
            run_box = functools.partial(sandboxed, box, code, stdin)
            await rate(run_bare, 4, c)  # warm caches
            await rate(run_box, 4, c)
            b = await rate(run_bare, n, c)
            s = await rate(run_box, n, c)
            ratios.append(s / b)
            print(f"| {name} | {c} | {b:.1f} | {s:.1f} | {s / b:.2f} |")
    print(f"\nsandbox / bare, geometric mean over all rows: {_gmean(ratios):.2f}")


def _gmean(values: list[float]) -> float:
    product = 1.0
    for v in values:
        product *= v
    return product ** (1 / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, os.cpu_count() or 2])
    args = parser.parse_args()
    asyncio.run(main_async(args.n, args.concurrency))


if __name__ == "__main__":
    main()
