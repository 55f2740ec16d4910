"""Two runs side by side: a policy against a frontier model, or two checkpoints (``eval --compare A B``).

Each run is read from its ``episodes.jsonl`` (an ``agentboost eval`` or ``rollout`` output directory),
and both are scored again on the tasks they share, with one success rule and the same k, so the
numbers compare like for like: pass@k and pass^k, episode success rate, reward, masked episodes and
infrastructure errors, turns, tool calls and tool errors per episode (trajectories and re-rendered
prompt tokens per episode when a run has episodes of several trajectories), terminations, each tool's
use, and the tasks on which they differ. A run through a Strands model provider stays marked ("not
token-exact: not training data") in the comparison as in its own report.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends.strands_provider import NOT_TOKEN_EXACT
from ..episode import Episode
from .passk import default_ks
from .report import build_report, is_success

logger = logging.getLogger(__name__)

EPISODES = "episodes.jsonl"
MAX_TASK_ROWS = 50
"""Tasks listed in the per-task table (the largest differences first)."""


@dataclass
class Run:
    label: str
    directory: Path
    episodes: list[Episode]


def load_run(directory: str | Path, label: str | None = None) -> Run:
    """The episodes of one run directory. A torn last line (an interrupted run) is skipped; any
    other malformed line is an error (nothing is skipped silently). The last record of an id wins."""
    directory = Path(directory)
    path = directory / EPISODES
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no {EPISODES} (not an eval or rollout output directory)")
    data = path.read_text(encoding="utf-8")
    lines = data.split("\n")
    if lines and lines[-1].strip():
        logger.warning("%s: skipping a partial last record from an interrupted run", path)
    episodes: dict[str, Episode] = {}
    for number, line in enumerate(lines[:-1], 1):
        if not line.strip():
            continue
        try:
            episode = Episode.from_json(line)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: corrupt record ({exc})") from exc
        episodes[episode.id] = episode
    if not episodes:
        raise ValueError(f"{path} holds no episodes")
    return Run(label or directory.name or str(directory), directory, list(episodes.values()))


@dataclass
class Comparison:
    data: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(self.data, indent=2)

    def to_markdown(self) -> str:
        d = self.data
        a, b = d["runs"]
        lines = [f"# {a['label']} vs {b['label']}", ""]
        for run in d["runs"]:
            mark = f" **{NOT_TOKEN_EXACT}** (Strands model provider)" if not run["token_exact"] else ""
            lines.append(f"- **{run['label']}** ({run['directory']}): {', '.join(run['models']) or 'unknown model'}; "
                         f"{run['tasks']} tasks, {run['episodes']} episodes.{mark}")  # fmt: skip
        lines += ["", f"Compared on the {d['common_tasks']} tasks both ran ({d['samples_per_task'][0]} and "
                  f"{d['samples_per_task'][1]} samples per task; success: {d['success_rule']})."]  # fmt: skip
        for label, count in d["only_in_counts"].items():
            if count:
                lines.append(f"{count} tasks only in {label} are left out.")
        for run in d["runs"]:
            if run["infra_errors"]:
                lines.append(f"**Warning: {run['infra_errors']} episodes of {run['label']} ended in `infra_error` "
                             "and count as failures.**")  # fmt: skip
        lines += ["", f"| metric | {a['label']} | {b['label']} | {b['label']} - {a['label']} |", "|---|---|---|---|"]
        for row in d["metrics"]:
            lines.append(f"| {row['metric']} | {_fmt(row['a'])} | {_fmt(row['b'])} | {_fmt(row['delta'], sign=True)} |")
        lines += [
            "",
            "## Terminations (episodes)",
            "",
            f"| termination | {a['label']} | {b['label']} |",
            "|---|---|---|",
        ]
        lines += [f"| {name} | {x} | {y} |" for name, (x, y) in d["terminations"].items() if x or y]
        if d["tools"]:
            la, lb = a["label"], b["label"]
            lines += ["", "## Tools", "", f"| tool | calls / episode ({la}) | calls / episode ({lb}) "
                      f"| error rate ({la}) | error rate ({lb}) |", "|---|---|---|---|---|"]  # fmt: skip
            for name, row in d["tools"].items():
                (ca, cb), (ea, eb) = row["calls_per_episode"], row["error_rate"]
                lines.append(f"| {name} | {ca:.2f} | {cb:.2f} | {ea:.3f} | {eb:.3f} |")
        s = d["task_outcomes"]
        lines += ["", "## Tasks", "", f"Solved at least once: both {s['both']}, only {a['label']} {s['only_a']}, "
                  f"only {b['label']} {s['only_b']}, neither {s['neither']}.", ""]  # fmt: skip
        if d["per_task"]:
            lines += [f"| task | {a['label']} successes | {b['label']} successes |", "|---|---|---|"]
            lines += [f"| {t['task_id']} | {t['a']} | {t['b']} |" for t in d["per_task"]]
        return "\n".join(lines) + "\n"

    def write(self, directory: Path, *, plots: bool = True) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        written = [directory / "compare.json", directory / "compare.md"]
        written[0].write_text(self.to_json())
        written[1].write_text(self.to_markdown())
        if plots:
            png = plot(self.data, directory / "compare.png")
            if png is not None:
                written.append(png)
        return written


def compare_runs(
    dir_a: str | Path, dir_b: str | Path, *, ks: list[int] | None = None, threshold: float = 1.0
) -> Comparison:
    """Compare the runs in two directories on the tasks both ran (see module doc)."""
    label_a, label_b = Path(dir_a).name or str(dir_a), Path(dir_b).name or str(dir_b)
    if label_a == label_b:
        label_a, label_b = str(dir_a), str(dir_b)
    runs = [load_run(dir_a, label_a), load_run(dir_b, label_b)]
    tasks = [{_task(e) for e in run.episodes} for run in runs]
    common = tasks[0] & tasks[1]
    if not common:
        raise ValueError(f"{runs[0].directory} and {runs[1].directory} share no task: nothing to compare")
    kept = [[e for e in run.episodes if _task(e) in common] for run in runs]
    per_task = [_samples(eps) for eps in kept]
    n_min = min(min(len(v) for v in counts.values()) for counts in per_task)
    chosen = sorted(set(ks)) if ks else default_ks(n_min)
    if max(chosen) > n_min or min(chosen) < 1:
        raise ValueError(f"every k must be in 1..{n_min} (the fewest samples of a shared task), got {chosen}")
    reports = [build_report(eps, ks=chosen, threshold=threshold).data for eps in kept]
    full = [build_report(run.episodes, ks=[1], threshold=threshold).data for run in runs]

    metrics: list[dict[str, Any]] = []

    def add(name: str, a: float | None, b: float | None) -> None:
        delta = None if a is None or b is None else b - a
        metrics.append({"metric": name, "a": a, "b": b, "delta": delta})

    for k in chosen:
        add(f"pass@{k}", reports[0]["pass_at_k"].get(str(k)), reports[1]["pass_at_k"].get(str(k)))
    for k in chosen:
        add(f"pass^{k}", reports[0]["pass_hat_k"].get(str(k)), reports[1]["pass_hat_k"].get(str(k)))
    add("episode success rate", reports[0]["episode_success_rate"], reports[1]["episode_success_rate"])
    sa, sb = reports[0]["summary"], reports[1]["summary"]
    for key, name in (("reward_mean", "reward mean"), ("reward_std", "reward std"), ("turns_mean", "turns / episode"),
                      ("tool_calls_per_episode", "tool calls / episode"), ("tool_error_rate", "tool error rate"),
                      ("parse_errors", "unparseable tool calls"), ("unknown_tool_calls", "unknown-tool calls"),
                      ("masked", "masked episodes"), ("wall_s_mean", "wall s / episode")):  # fmt: skip
        add(name, sa[key], sb[key])
    if sa["multi_trajectory_episodes"] or sb["multi_trajectory_episodes"]:  # a run split episodes
        add("trajectories / episode", sa["trajectories_mean"], sb["trajectories_mean"])
        add("re-rendered prompt tokens / episode", sa["rerendered_tokens_mean"], sb["rerendered_tokens_mean"])
    add("infra_error episodes", reports[0]["infra_errors"], reports[1]["infra_errors"])

    terminations = {name: [sa["terminations"].get(name, 0), sb["terminations"].get(name, 0)]
                    for name in sa["terminations"]}  # fmt: skip
    tools: dict[str, dict[str, list[float]]] = {}
    for i, summary in enumerate((sa, sb)):
        for name, row in summary["tools"].items():
            entry = tools.setdefault(name, {"calls_per_episode": [0.0, 0.0], "error_rate": [0.0, 0.0]})
            entry["calls_per_episode"][i] = row["calls_per_episode"]
            entry["error_rate"][i] = row["error_rate"]

    outcomes = {"both": 0, "only_a": 0, "only_b": 0, "neither": 0}
    rows = []
    for task in sorted(common):
        (na, ca), (nb, cb) = (_successes(per_task[i][task], threshold) for i in (0, 1))
        outcomes["both" if ca and cb else "only_a" if ca else "only_b" if cb else "neither"] += 1
        diff = cb / nb - ca / na
        if diff:
            rows.append({"task_id": task, "a": f"{ca}/{na}", "b": f"{cb}/{nb}", "difference": diff})
    rows.sort(key=lambda r: (-abs(r["difference"]), r["task_id"]))

    def describe(run: Run, report: dict[str, Any]) -> dict[str, Any]:
        keys = ("models", "token_exact", "not_token_exact_episodes", "tasks", "episodes", "infra_errors")
        return {"label": run.label, "directory": str(run.directory), **{key: report[key] for key in keys}}

    only = {runs[0].label: sorted(tasks[0] - common), runs[1].label: sorted(tasks[1] - common)}
    return Comparison(
        {
            "runs": [describe(run, report) for run, report in zip(runs, full, strict=True)],
            "common_tasks": len(common),
            "only_in_counts": {label: len(ids) for label, ids in only.items()},
            "only_in": {label: ids[:20] for label, ids in only.items()},
            "samples_per_task": [reports[0]["samples_per_task"], reports[1]["samples_per_task"]],
            "success_rule": reports[0]["success_rule"],
            "ks": chosen,
            "metrics": metrics,
            "terminations": terminations,
            "tools": dict(sorted(tools.items())),
            "task_outcomes": outcomes,
            "per_task": rows[:MAX_TASK_ROWS],
        }
    )


def _task(episode: Episode) -> str:
    return episode.task_id or episode.id


def _samples(episodes: list[Episode]) -> dict[str, list[Episode]]:
    out: dict[str, list[Episode]] = {}
    for e in episodes:
        out.setdefault(_task(e), []).append(e)
    return out


def _successes(episodes: list[Episode], threshold: float) -> tuple[int, int]:
    return len(episodes), sum(is_success(e, threshold) for e in episodes)


def _fmt(value: float | None, *, sign: bool = False) -> str:
    """Counts as integers, rates and means with four decimals; ``n/a`` where a run has no value."""
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return f"{value:+d}" if sign else str(value)
    return f"{value:+.4f}" if sign else f"{value:.4f}"


def plot(data: dict[str, Any], path: Path) -> Path | None:
    """pass@k of both runs, their terminations and their tool calls per episode (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed; no plot (pip install 'agentboost[local]')")
        return None
    labels = [run["label"] + ("" if run["token_exact"] else "\n(not token-exact)") for run in data["runs"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax = axes[0]
    passk = [row for row in data["metrics"] if row["metric"].startswith("pass@")]
    ks = [int(row["metric"][5:]) for row in passk]
    for i, (label, marker) in enumerate(zip(labels, ("o", "s"), strict=True)):
        ax.plot(ks, [row["ab"[i]] for row in passk], marker=marker, label=label)
    if len(ks) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("pass@k (shared tasks)")
    ax.set_xlabel("k")
    ax.legend()
    ax = axes[1]
    names = [name for name, counts in data["terminations"].items() if any(counts)]
    y = range(len(names))
    for i, label in enumerate(labels):
        ax.barh([v + (0.2 if i else -0.2) for v in y], [data["terminations"][n][i] for n in names], height=0.4,
                label=label)  # fmt: skip
    ax.set_yticks(list(y), names)
    ax.set_title("terminations (episodes)")
    ax = axes[2]
    tools = list(data["tools"])
    x = range(len(tools))
    for i, label in enumerate(labels):
        ax.bar([v + (0.2 if i else -0.2) for v in x], [data["tools"][t]["calls_per_episode"][i] for t in tools],
               width=0.4, label=label)  # fmt: skip
    ax.set_xticks(list(x), tools)
    ax.set_title("tool calls per episode")
    fig.suptitle(f"{data['runs'][0]['label']} vs {data['runs'][1]['label']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
