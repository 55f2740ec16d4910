"""The evaluation report: pass@k / pass^k, reward, terminations and tool usage as JSON, Markdown, PNG."""

from __future__ import annotations

import json
import logging
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends.strands_provider import NOT_TOKEN_EXACT, is_token_exact
from ..episode import Episode
from ..report import markdown as summary_markdown
from ..report import summarize
from ..types import Termination
from .passk import pass_at_k, pass_hat_k

logger = logging.getLogger(__name__)

CALL_BINS = 10
"""Tool calls per episode are binned 0, 1, ..., CALL_BINS - 1 and ``>= CALL_BINS``."""
UNKNOWN_TOOL, UNPARSEABLE = "(unknown tool)", "(unparseable call)"
"""Rows of the tool table for calls that never reached a tool (they count as errors)."""


def is_success(episode: Episode, threshold: float = 1.0) -> bool:
    """The environment's verdict when it gives one, else ``reward >= threshold``."""
    if episode.is_correct is not None:
        return bool(episode.is_correct)
    return episode.reward >= threshold


@dataclass
class EvalReport:
    data: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(self.data, indent=2, sort_keys=False)

    def to_markdown(self, title: str = "Evaluation") -> str:
        d = self.data
        samples = d["samples_per_task"] if d["samples_uniform"] else f">={d['samples_per_task']}"
        lines = [f"# {title}", ""]
        if d.get("token_exact") is False:
            lines += [f"**{NOT_TOKEN_EXACT}.** {d['not_token_exact_episodes']} of {d['episodes']} episodes ran "
                      "through a Strands model provider: they carry no tokens and are masked (a baseline, never "
                      "a training signal).", ""]  # fmt: skip
        if d.get("models"):
            lines += [f"Model: {', '.join(d['models'])}.", ""]
        lines += [f"{d['tasks']} tasks x {samples} samples = {d['episodes']} episodes "
                  f"(success: {d['success_rule']}).", ""]  # fmt: skip
        if d["infra_errors"]:
            lines += [f"**Warning: {d['infra_errors']} episodes ended in `infra_error` (the server, the worker or the "
                      "setup failed, not the model) and count as failures below.** Re-run them with "
                      "`--retry-failed`.", ""]  # fmt: skip
        lines += ["| metric | value |", "|---|---|"]
        for k, value in d["pass_at_k"].items():
            lines.append(f"| pass@{k} | {value:.4f} |")
        for k, value in d["pass_hat_k"].items():
            lines.append(f"| pass^{k} | {value:.4f} |")
        lines.append(f"| episode success rate | {d['episode_success_rate']:.4f} |")
        lines += ["", summary_markdown(d["summary"], title="Episodes").rstrip(), ""]
        if d["tool_outcomes"]:
            lines += ["## Tool outcomes", "", "| tool | calls | ok | error | of which timeout | truncated output |"
                      " mean time (s) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
            for name, row in d["tool_outcomes"].items():
                lines.append(f"| {name} | {row['calls']} | {row['ok']} | {row['errors']} | {row['timeouts']} | "
                             f"{row['truncated']} | {row['mean_time_s']:.3f} |")  # fmt: skip
        hist = d["tool_calls_per_episode_histogram"]
        lines += ["", "## Tool calls per episode (attempted, invalid ones included)", "", "| calls | episodes |",
                  "|---|---|"]  # fmt: skip
        lines += [f"| {bucket} | {count} |" for bucket, count in hist.items()]
        return "\n".join(lines) + "\n"

    def write(self, directory: Path, *, title: str = "Evaluation", plots: bool = True) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        written = [directory / "report.json", directory / "report.md"]
        written[0].write_text(self.to_json())
        written[1].write_text(self.to_markdown(title))
        if plots:
            marked = title if self.data.get("token_exact", True) else f"{title}\n({NOT_TOKEN_EXACT})"
            png = plot(self.data, directory / "report.png", title=marked)
            if png is not None:
                written.append(png)
        return written


def turns_of(episode: Episode) -> int:
    """Model calls of an episode (token-level calls, or the provider's calls of a baseline)."""
    return len(episode.calls) or len(episode.metadata.get("provider_calls") or [])


def model_of(episode: Episode) -> str:
    """What answered: the Strands provider's model, else the backend's description."""
    return str(episode.metadata.get("strands_model") or episode.metadata.get("backend") or "unknown")


def build_report(
    episodes: Iterable[Episode],
    *,
    ks: Sequence[int] = (1,),
    threshold: float = 1.0,
    expected_per_task: int | None = None,
) -> EvalReport:
    episodes = list(episodes)
    by_task: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        by_task[e.task_id or e.id].append(e)
    counts = {task: (len(eps), sum(is_success(e, threshold) for e in eps)) for task, eps in by_task.items()}
    n_min = min((n for n, _ in counts.values()), default=0)
    if expected_per_task is not None and any(n != expected_per_task for n, _ in counts.values()):
        logger.warning("some tasks have fewer than %d samples; pass@k uses the samples present", expected_per_task)
    pass_k: dict[str, float] = {}
    hat_k: dict[str, float] = {}
    for k in sorted(set(ks)):
        if k > n_min or not counts:
            logger.warning("pass@%d needs >= %d samples per task (have %d); not reported", k, k, n_min)
            continue
        pass_k[str(k)] = statistics.fmean(pass_at_k(n, c, k) for n, c in counts.values())
        hat_k[str(k)] = statistics.fmean(pass_hat_k(n, c, k) for n, c in counts.values())
    outcomes: dict[str, dict[str, Any]] = {}
    calls_hist: Counter[str] = Counter()
    for e in episodes:
        calls = e.tool_calls + e.unknown_tool_calls + e.parse_errors
        calls_hist[str(calls) if calls < CALL_BINS else f">={CALL_BINS}"] += 1
        for name, count in ((UNKNOWN_TOOL, e.unknown_tool_calls), (UNPARSEABLE, e.parse_errors)):
            if count:
                row = outcomes.setdefault(name, {"calls": 0, "ok": 0, "errors": 0, "timeouts": 0, "truncated": 0,
                                                 "total_time_s": 0.0})  # fmt: skip
                row["calls"] += count
                row["errors"] += count
        for name, stats in e.tools.items():
            row = outcomes.setdefault(name, {"calls": 0, "ok": 0, "errors": 0, "timeouts": 0, "truncated": 0,
                                             "total_time_s": 0.0})  # fmt: skip
            row["calls"] += stats.calls
            row["ok"] += stats.calls - stats.errors
            row["errors"] += stats.errors
            row["timeouts"] += stats.timeouts
            row["truncated"] += stats.truncated
            row["total_time_s"] += stats.total_time_s
    for row in outcomes.values():
        row["mean_time_s"] = row["total_time_s"] / row["calls"] if row["calls"] else 0.0
    buckets = [str(i) for i in range(CALL_BINS)] + [f">={CALL_BINS}"]
    per_task = [
        {"task_id": task, "samples": n, "successes": c,
         "reward_mean": statistics.fmean(e.reward for e in by_task[task])}
        for task, (n, c) in sorted(counts.items())
    ]  # fmt: skip
    summary = summarize(episodes)
    if episodes:  # provider episodes have no token-level calls; their turns are the provider's calls
        summary["turns_mean"] = statistics.fmean(turns_of(e) for e in episodes)
    baseline = sum(not is_token_exact(e) for e in episodes)
    data = {
        "token_exact": not baseline,
        "not_token_exact_episodes": baseline,
        "models": sorted({model_of(e) for e in episodes if "strands_model" in e.metadata or "backend" in e.metadata}),
        "tasks": len(counts),
        "samples_per_task": n_min,
        "samples_uniform": len({n for n, _ in counts.values()}) <= 1,
        "episodes": len(episodes),
        "infra_errors": sum(e.termination is Termination.INFRA_ERROR for e in episodes),
        "success_rule": f"is_correct, else reward >= {threshold:g}",
        "pass_at_k": pass_k,
        "pass_hat_k": hat_k,
        "episode_success_rate": statistics.fmean(is_success(e, threshold) for e in episodes) if episodes else 0.0,
        "summary": summary,
        "tool_outcomes": dict(sorted(outcomes.items())),
        "tool_calls_per_episode_histogram": {b: calls_hist.get(b, 0) for b in buckets},
        "per_task": per_task,
    }
    return EvalReport(data)


def plot(data: dict[str, Any], path: Path, *, title: str = "Evaluation") -> Path | None:
    """pass@k, terminations, tool outcomes and calls per episode in one PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed; no plot (pip install 'agentboost[local]')")
        return None
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax = axes[0][0]
    if data["pass_at_k"]:
        ks = [int(k) for k in data["pass_at_k"]]
        ax.plot(ks, list(data["pass_at_k"].values()), marker="o", label="pass@k")
        ax.plot(ks, list(data["pass_hat_k"].values()), marker="s", label="pass^k")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.legend()
    ax.set_ylim(0, 1.02)
    ax.set_title("pass@k / pass^k")
    ax.set_xlabel("k")
    ax = axes[0][1]
    terms = {k: v for k, v in data["summary"]["terminations"].items() if v}
    ax.barh(list(terms), list(terms.values()), color="tab:gray")
    ax.set_title("terminations (episodes)")
    ax = axes[1][0]
    tools = data["tool_outcomes"]
    if tools:
        names = list(tools)
        ok = [tools[n]["ok"] for n in names]
        timeouts = [tools[n]["timeouts"] for n in names]
        other = [tools[n]["errors"] - tools[n]["timeouts"] for n in names]
        ax.barh(names, ok, color="tab:green", label="ok")
        ax.barh(names, other, left=ok, color="tab:red", label="error")
        ax.barh(names, timeouts, left=[a + b for a, b in zip(ok, other, strict=True)], color="tab:orange",
                label="timeout")  # fmt: skip
        ax.legend()
    ax.set_title("tool call outcomes")
    ax = axes[1][1]
    hist = data["tool_calls_per_episode_histogram"]
    ax.bar(list(hist), list(hist.values()), color="tab:blue")
    ax.set_title("tool calls per episode")
    ax.set_xlabel("calls")
    ax.set_ylabel("episodes")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
