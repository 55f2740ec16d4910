"""A 200-tool-call episode under a 4k-token context window, with Strands' sliding window (the episode goes
on in new trajectories when the context is full) and without it (the episode ends at the context limit).

One Strands agent, an instant scripted model (every call but the last asks for one tool call) and an
instant tool, in this process. Reported per mode: model calls made, trainable (model) tokens per
episode, trajectories, re-rendered prompt tokens, the episode's termination, and the wall time per
call, early (calls 3-12) and late (the last ten calls), fastest of ``--repeats`` episodes per call
index. Goal: with the window, the late per-call cost is at most 1.5x the early one (the history the
model sees stays bounded, and opening a trajectory renders only the kept window).

    python benchmarks/sliding_window.py [--calls 200] [--context 4096] [--window 40] [--repeats 3]
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

from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager, SlidingWindowConversationManager

from agentboost.agents.strands_agent import StrandsAgent
from agentboost.backends.base import FINISH_STOP, GenerationRequest, GenerationResult
from agentboost.chat.template import ChatTemplate
from agentboost.environments.strands_env import StrandsEnv
from agentboost.episode import Episode
from agentboost.offline.tokenizer_builder import load_tokenizer
from agentboost.rollout import RolloutSettings, run_episode
from agentboost.types import Budget

HERE = Path(__file__).resolve().parent
EARLY = (3, 12)


@tool
def echo(value: int) -> int:
    """Return the value.

    Args:
        value: any integer
    """
    return value


class InstantModel:
    """Answers at once: a tool call on every call but the last, then a final answer; records when each
    call arrived."""

    def __init__(self, template: ChatTemplate, calls: int) -> None:
        eot = template.info.eot_token_id
        self.tool_call = [
            *template.encode('<tool_call>\n{"name": "echo", "arguments": {"value": 7}}\n</tool_call>'),
            eot,
        ]
        self.final = [*template.encode("Done."), eot]
        self.calls = calls
        self.wall: list[float] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.wall.append(time.perf_counter())
        ids = self.tool_call if len(self.wall) < self.calls else self.final
        return GenerationResult(list(ids), [-0.5] * len(ids), FINISH_STOP, server="instant")

    def describe(self) -> str:
        return "instant"


def run_one(template: ChatTemplate, calls: int, context: int, window: int | None) -> tuple[list[float], Episode]:
    def factory(*, model: Any, tools: list[Any], task: Any, **defaults: Any) -> Agent:
        manager = SlidingWindowConversationManager(window_size=window) if window else NullConversationManager()
        return Agent(model=model, tools=tools, system_prompt="You echo.", conversation_manager=manager,
                     callback_handler=None)  # fmt: skip

    env = StrandsEnv(task={"prompt": "Echo 7, many times."}, tools=[echo], reward_fn=lambda task, episode: 0.0)
    budget = Budget(max_turns=calls + 5, max_total_tokens=context, min_call_tokens=64, wall_clock_s=3600)
    backend = InstantModel(template, calls)
    started = time.perf_counter()
    episode = asyncio.run(run_episode(env, StrandsAgent(factory), backend, template, RolloutSettings(budget=budget)))
    gaps = [b - a for a, b in zip([started, *backend.wall], backend.wall, strict=False)]
    return gaps, episode


def mean_ms(gaps: list[float], lo: int, hi: int) -> float:
    part = gaps[lo - 1 : hi]
    return 1000.0 * sum(part) / max(len(part), 1)


def median_ms(gaps: list[float], lo: int, hi: int) -> float:
    return 1000.0 * statistics.median(gaps[lo - 1 : hi])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--window", type=int, default=40, help="SlidingWindowConversationManager window_size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=str(HERE / "results" / "sliding_window.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    template = ChatTemplate(load_tokenizer("qwen2.5"))
    load = os.getloadavg()[0]
    results: dict[str, Any] = {}
    for mode, window in (("no window (NullConversationManager)", None), ("sliding window", args.window)):
        runs = [run_one(template, args.calls, args.context, window) for _ in range(args.repeats)]
        episode = runs[-1][1]
        per_call = [min(r[0][i] for r in runs if i < len(r[0])) for i in range(min(len(r[0]) for r in runs))]
        n = len(per_call)
        late = (max(EARLY[1] + 1, n - 9), n)
        early_ms, late_ms = mean_ms(per_call, *EARLY), mean_ms(per_call, *late)
        early_med, late_med = median_ms(per_call, *EARLY), median_ms(per_call, *late)
        openings = [c.index for c in episode.calls if c.index and episode.segments[2 * c.index].kind.value == "prompt"]
        results[mode] = {
            "termination": episode.termination.value,
            "detail": episode.termination_detail[:200],
            "model_calls": len(episode.calls),
            "trainable_tokens": episode.num_model_tokens,
            "trajectories": episode.num_trajectories,
            "rerendered_tokens": episode.rerendered_tokens,
            "longest_trajectory_tokens": max(len(t.prompt_ids) + len(t.response_ids) for t in episode.trajectories),
            "early_calls": list(EARLY),
            "late_calls": list(late),
            "early_ms_per_call": round(early_ms, 3),
            "late_ms_per_call": round(late_ms, 3),
            "late_over_early": round(late_ms / early_ms, 3) if early_ms else None,
            "early_median_ms": round(early_med, 3),
            "late_median_ms": round(late_med, 3),
            "late_over_early_median": round(late_med / early_med, 3) if early_med else None,
            "opening_calls": openings,
            "opening_ms": [round(1000.0 * per_call[i], 3) for i in openings if i < n],
            "median_ms_per_call": round(1000.0 * statistics.median(per_call), 3),
        }
    report = {
        "calls": args.calls,
        "context_tokens": args.context,
        "window_size": args.window,
        "repeats": args.repeats,
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "modes": results,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    for mode, r in results.items():
        print(
            f"{mode}: {r['termination']} after {r['model_calls']} calls, {r['trainable_tokens']} trainable tokens in "
            f"{r['trajectories']} trajectories ({r['rerendered_tokens']} re-rendered), longest "
            f"{r['longest_trajectory_tokens']} tokens; ms/call early {r['early_ms_per_call']} late "
            f"{r['late_ms_per_call']} ({r['late_over_early']}x; medians {r['late_over_early_median']}x); "
            f"calls opening a trajectory: {r['opening_ms']} ms"
        )


if __name__ == "__main__":
    main()
