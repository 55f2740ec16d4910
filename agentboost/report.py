"""Aggregate episodes into the numbers people look at: reward, terminations, tool usage, tokens.

Token counts are over every trajectory of an episode. An episode of several trajectories (a
conversation manager rewrote the history, several agents ran) is counted once; ``trajectories_mean``,
``multi_trajectory_episodes`` and ``rerendered_tokens_mean`` (prompt tokens that render again what an
earlier trajectory of the same agent held) say how much splitting happened, and the Markdown shows them
when any episode has several trajectories."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

from .episode import Episode
from .types import Termination


def summarize(episodes: Iterable[Episode]) -> dict[str, Any]:
    episodes = list(episodes)
    n = len(episodes)
    rewards = [e.reward for e in episodes]
    terminations = Counter(e.termination.value for e in episodes)
    tools: dict[str, dict[str, float]] = {}
    for e in episodes:
        for name, stats in e.tools.items():
            row = tools.setdefault(name, {"calls": 0, "errors": 0, "episodes_using": 0, "total_time_s": 0.0})
            row["calls"] += stats.calls
            row["errors"] += stats.errors
            row["episodes_using"] += 1 if stats.calls else 0
            row["total_time_s"] += stats.total_time_s
    for row in tools.values():
        row["calls_per_episode"] = row["calls"] / n if n else 0.0
        row["error_rate"] = row["errors"] / row["calls"] if row["calls"] else 0.0
    correct = [e.is_correct for e in episodes if e.is_correct is not None]
    return {
        "episodes": n,
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "success_rate": (sum(correct) / len(correct)) if correct else None,
        "masked": sum(e.masked for e in episodes),
        "terminations": {t.value: terminations.get(t.value, 0) for t in Termination},
        "turns_mean": statistics.fmean(len(e.calls) for e in episodes) if n else 0.0,
        "tool_calls_per_episode": (sum(e.tool_calls for e in episodes) / n) if n else 0.0,
        "tool_error_rate": _ratio(sum(e.tool_errors for e in episodes), sum(e.tool_calls for e in episodes)),
        "parse_errors": sum(e.parse_errors for e in episodes),
        "unknown_tool_calls": sum(e.unknown_tool_calls for e in episodes),
        "tools": dict(sorted(tools.items())),
        "prompt_tokens_mean": _mean(e.num_prompt_tokens for e in episodes),
        "response_tokens_mean": _mean(e.num_response_tokens for e in episodes),
        "model_tokens_mean": _mean(e.num_model_tokens for e in episodes),
        "trajectories_mean": _mean(e.num_trajectories for e in episodes),
        "multi_trajectory_episodes": sum(e.num_trajectories > 1 for e in episodes),
        "rerendered_tokens_mean": _mean(e.rerendered_tokens for e in episodes),
        "wall_s_mean": _mean(e.timings.get("wall_s", 0.0) for e in episodes),
    }


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.fmean(values) if values else 0.0


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def markdown(summary: dict[str, Any], title: str = "Rollout summary") -> str:
    lines = [f"## {title}", ""]
    success = summary["success_rate"]
    lines += [
        "| metric | value |",
        "|---|---|",
        f"| episodes | {summary['episodes']} |",
        f"| reward mean ± std | {summary['reward_mean']:.4f} ± {summary['reward_std']:.4f} |",
        f"| success rate | {'n/a' if success is None else f'{success:.4f}'} |",
        f"| masked (no gradient) | {summary['masked']} |",
        f"| turns / episode | {summary['turns_mean']:.2f} |",
        f"| tool calls / episode | {summary['tool_calls_per_episode']:.2f} |",
        f"| tool error rate | {summary['tool_error_rate']:.4f} |",
        f"| parse errors | {summary['parse_errors']} |",
        f"| unknown-tool calls | {summary['unknown_tool_calls']} |",
        f"| prompt / response / model tokens (mean) | {summary['prompt_tokens_mean']:.1f} / "
        f"{summary['response_tokens_mean']:.1f} / {summary['model_tokens_mean']:.1f} |",
    ]
    if summary.get("multi_trajectory_episodes"):
        lines += [
            f"| trajectories / episode | {summary['trajectories_mean']:.2f} "
            f"({summary['multi_trajectory_episodes']} episodes of several) |",
            f"| re-rendered prompt tokens / episode | {summary['rerendered_tokens_mean']:.1f} |",
        ]
    lines += [
        "",
        "| termination | episodes |",
        "|---|---|",
    ]
    lines += [f"| {name} | {count} |" for name, count in summary["terminations"].items()]
    if summary["tools"]:
        lines += [
            "",
            "| tool | calls | calls / episode | errors | error rate | episodes using |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in summary["tools"].items():
            lines.append(
                f"| {name} | {int(row['calls'])} | {row['calls_per_episode']:.2f} | {int(row['errors'])} | "
                f"{row['error_rate']:.3f} | {int(row['episodes_using'])} |"
            )
    return "\n".join(lines) + "\n"
