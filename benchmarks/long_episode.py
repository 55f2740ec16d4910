"""Per-model-call cost vs call index in one long episode, with the long-episode adapter off and on.

One Strands agent, an instant scripted model (every call but the last asks for one tool call) and an
instant tool, in this process: the gap between consecutive model calls is what the framework
(Strands' loop, agentboost's ``TokenModel``, hooks, the tool executor) costs per call at that point of
the episode. With upstream Strands that gap grows with the history (deep copies, span serialisation,
recursion; see ``agentboost/strands_patches.py``); the adapter is meant to keep it flat.

Episodes alternate off/on (``AGENTBOOST_STRANDS_ADAPTER``), ``--repeats`` times each; each call index
gets the fastest of its repeats (other load on the machine only adds time; the median is printed too).
Both modes must produce identical episodes (tokens, messages): the benchmark checks it. Writes the
curves to ``assets/long_episode.png`` (``--png``) and the summary and raw gaps to
``benchmarks/results/long_episode.json`` (``--json``); ``--quick`` runs 2 repeats (about 30 s)::

    python benchmarks/long_episode.py [--calls 200] [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from strands import tool

from agentboost.agents.strands_agent import StrandsAgent
from agentboost.backends.base import FINISH_STOP, GenerationRequest, GenerationResult
from agentboost.chat.template import ChatTemplate
from agentboost.environments.strands_env import StrandsEnv
from agentboost.episode import Episode
from agentboost.offline.tokenizer_builder import load_tokenizer
from agentboost.rollout import RolloutSettings, run_episode
from agentboost.strands_patches import ENV_SWITCH, strands_version
from agentboost.types import Budget

HERE = Path(__file__).resolve().parent
EARLY = (3, 12)
LATE = (141, 150)


@tool
def echo(value: int) -> int:
    """Return the value.

    Args:
        value: any integer
    """
    return value


class InstantModel:
    """A backend that answers at once: a tool call on every call but the last, then a final answer.
    Records when each call arrived (wall and process CPU time); keeps nothing else."""

    def __init__(self, template: ChatTemplate, calls: int) -> None:
        eot = template.info.eot_token_id
        self.tool_call = [
            *template.encode('<tool_call>\n{"name": "echo", "arguments": {"value": 7}}\n</tool_call>'),
            eot,
        ]
        self.final = [*template.encode("Done."), eot]
        self.calls = calls
        self.wall: list[float] = []
        self.cpu: list[float] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())
        ids = self.tool_call if len(self.wall) < self.calls else self.final
        return GenerationResult(list(ids), [-0.5] * len(ids), FINISH_STOP, server="instant")

    def describe(self) -> str:
        return "instant"


def run_one(template: ChatTemplate, calls: int, adapter: bool) -> tuple[list[float], list[float], Episode]:
    """One episode of ``calls`` model calls: the wall and CPU time before each call (call 1: since the
    episode started)."""
    os.environ[ENV_SWITCH] = "1" if adapter else "0"
    env = StrandsEnv(task={"prompt": "Echo 7, many times."}, tools=[echo], reward_fn=lambda task, episode: 0.0)
    budget = Budget(max_turns=calls + 5, max_total_tokens=10**8, wall_clock_s=3600)
    backend = InstantModel(template, calls)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    episode = asyncio.run(
        run_episode(env, StrandsAgent(system_prompt="You echo."), backend, template, RolloutSettings(budget=budget))
    )
    if episode.termination.value != "completed" or len(backend.wall) != calls:
        raise RuntimeError(
            f"episode ended {episode.termination.value} after {len(backend.wall)} calls: {episode.termination_detail}"
        )
    wall = [b - a for a, b in zip([wall0, *backend.wall], backend.wall, strict=False)]
    cpu = [b - a for a, b in zip([cpu0, *backend.cpu], backend.cpu, strict=False)]
    return wall, cpu, episode


def fingerprint(episode: Episode) -> tuple[Any, ...]:
    """What must not depend on the adapter: tokens, mask, logprobs, messages (minus Strands' random ids)."""
    messages = [{k: v for k, v in m.items() if k != "tracking_id"} for m in episode.messages]
    for m in messages:
        m.get("metadata", {}).get("metrics", {}).pop("timeToFirstByteMs", None)
        m.get("metadata", {}).get("metrics", {}).pop("latencyMs", None)
    return (
        [(s.kind.value, s.token_ids, s.logprobs) for s in episode.segments],
        json.dumps(messages, sort_keys=True, default=str),
        episode.termination.value,
    )


def window(gaps: list[float], span: tuple[int, int]) -> float:
    lo, hi = span
    return statistics.median(gaps[lo - 1 : hi])


def plot(curves: dict[str, list[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, gaps in curves.items():
        ax.plot(range(1, len(gaps) + 1), [g * 1000 for g in gaps], label=label, linewidth=1.2)
    for lo, hi in (EARLY, LATE):
        ax.axvspan(lo, hi, color="grey", alpha=0.12)
    ax.set_xlabel("model call index")
    ax.set_ylabel("ms since the previous call (fastest of the repeats)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


MODES = (("adapter off (upstream)", False), ("adapter on", True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 repeats per mode instead of --repeats")
    parser.add_argument("--png", type=Path, default=HERE.parent / "assets" / "long_episode.png")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "long_episode.json")
    args = parser.parse_args()
    if args.calls < LATE[1]:
        parser.error(f"--calls must be at least {LATE[1]}")
    if args.quick:
        args.repeats = 2
    logging.basicConfig(level=logging.WARNING)
    for path in (args.png, args.json):
        path.parent.mkdir(parents=True, exist_ok=True)
    template = ChatTemplate(load_tokenizer("qwen2.5"))
    load_before = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {load_before[0]:.2f}; strands-agents "
          f"{strands_version()}; {args.calls} calls per episode, {args.repeats} repeats per mode")  # fmt: skip

    run_one(template, 20, adapter=True)  # warm-up: imports, tokenizer caches
    runs: dict[str, dict[str, list[list[float]]]] = {label: {"wall": [], "cpu": []} for label, _ in MODES}
    reference: Any = None
    for rep in range(args.repeats):
        for label, adapter in MODES:
            wall, cpu, episode = run_one(template, args.calls, adapter)
            runs[label]["wall"].append(wall)
            runs[label]["cpu"].append(cpu)
            fp = fingerprint(episode)
            reference = reference or fp
            if fp != reference:
                raise SystemExit(
                    f"episodes differ between modes (repeat {rep}, {label}): the adapter changed something"
                )
    os.environ.pop(ENV_SWITCH, None)
    load_after = os.getloadavg()

    # Per call index, the fastest of the repeats (load from other processes only ever adds time) and
    # the median; a window's cost is the median over its calls.
    stats = {
        stat: {
            label: {kind: [fn(col) for col in zip(*series, strict=True)] for kind, series in data.items()}
            for label, data in runs.items()
        }
        for stat, fn in (("min", min), ("median", statistics.median))
    }
    print("\nper-call cost (per call index the fastest of the repeats; a window: the median of its calls):")
    print(
        "| mode | clock | calls 3-12 (ms/call) | calls 141-150 (ms/call) | ratio 141-150 / 3-12 | episode (s, median) |"
    )
    print("|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for label, data in stats["min"].items():
        for kind, gaps in data.items():
            early, late = window(gaps, EARLY), window(gaps, LATE)
            total = statistics.median(sum(g) for g in runs[label][kind])
            medians = stats["median"][label][kind]
            summary[f"{label}, {kind}"] = {
                "early_ms": early * 1000,
                "late_ms": late * 1000,
                "ratio": late / early,
                "ratio_of_medians": window(medians, LATE) / window(medians, EARLY),
                "episode_s": total,
            }
            clock = "wall" if kind == "wall" else "CPU"
            print(f"| {label} | {clock} | {early * 1000:.2f} | {late * 1000:.2f} | {late / early:.2f}x | {total:.2f} |")
    print("same with the median of the repeats per call index: "
          + "; ".join(f"{key}: {value['ratio_of_medians']:.2f}x" for key, value in summary.items()))  # fmt: skip
    for label, data in runs.items():
        per_run = ", ".join(f"{window(g, LATE) / window(g, EARLY):.2f}x" for g in data["cpu"])
        print(f"{label}: CPU ratio of each repeat alone {per_run}")
    print(f"episodes identical with the adapter off and on: yes ({args.repeats * len(MODES)} episodes); "
          f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}")  # fmt: skip

    png = args.png
    curves = {f"{label}, {kind}": gaps for label, data in stats["min"].items() for kind, gaps in data.items()}
    plot(curves, png, f"cost per model call vs call index: instant model and tool ({os.cpu_count()} cores)")
    record = {
        "machine": {"cores": os.cpu_count(), "load_average": [load_before[0], load_after[0]]},
        "strands_agents": strands_version(),
        "calls": args.calls,
        "repeats": args.repeats,
        "summary": summary,
        "runs_s": {
            label: {kind: [[round(g, 6) for g in r] for r in rs] for kind, rs in d.items()} for label, d in runs.items()
        },
    }
    args.json.write_text(json.dumps(record, indent=1))
    print(f"curve: {png}; figures: {args.json}")


if __name__ == "__main__":
    main()
