"""Metrics out of the trainer: ``metrics.jsonl`` + ``metrics.csv`` in the run directory, W&B (offline
unless configured; its own console output silenced, so the progress bars stay readable), TensorBoard
event files (``<run_dir>/tensorboard``, when asked and installed), and a PNG of the curves. Eval steps
also keep their episodes (``episodes/eval_step<N>.jsonl``, readable with ``agentboost view``) and log a
W&B table of sample trajectories (``eval/trajectories``).

A warm start logs a row per step too (:meth:`MetricsLogger.log_warm_start`: ``warm_start/step``,
``warm_start/loss``, ``warm_start/lr`` and its checks' results), in the same files: GRPO's rows have
``step``, the warm start's ``warm_start/step``. W&B charts each against its own step (``define_metric``);
W&B's own step counts on across both phases (GRPO's steps come after the warm start's in one W&B run).
TensorBoard has a tag per metric, each with its own step."""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path
from typing import Any

from ..episode import Episode
from ..viewer.rows import log_trajectory_table

logger = logging.getLogger(__name__)


WANDB_MODES = ("offline", "online", "disabled")
WARM_START_STEP = "warm_start/step"


def resolve_wandb_mode(requested: str | None = None) -> str:
    """``requested``, else ``$WANDB_MODE``, else online when ``$WANDB_API_KEY`` is set, else offline."""
    mode = requested or os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    if mode not in WANDB_MODES:
        raise ValueError(f"W&B mode must be one of {', '.join(WANDB_MODES)}, got {mode!r}")
    return mode


class MetricsLogger:
    def __init__(
        self,
        run_dir: str | Path,
        *,
        project: str | None = "agentboost",
        config: dict[str, Any] | None = None,
        wandb_mode: str | None = None,
        tensorboard: bool = False,
        resume_step: int | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.run_dir / "metrics.jsonl"
        self.csv = self.run_dir / "metrics.csv"
        self.rows: list[dict[str, Any]] = []
        if self.jsonl.exists():  # resumed run: keep what was logged before
            self.rows = [json.loads(line) for line in self.jsonl.read_text().splitlines() if line.strip()]
        if resume_step is not None and any(int(r.get("step", 0)) > resume_step for r in self.rows):
            # steps logged after the checkpoint being resumed (an interrupted run): they are run again
            self._keep(lambda r: int(r.get("step", 0)) <= resume_step)
        self._csv_keys: list[str] | None = None  # the header metrics.csv was last written with
        self._wandb_offset = 0  # W&B steps taken by the warm start in this W&B run: GRPO's come after
        self._defined: set[str] = set()
        self._wandb = None
        self._wandb_module: Any = None
        mode = resolve_wandb_mode(wandb_mode)
        if project and mode != "disabled":
            try:
                import wandb
            except ImportError:
                logger.info("wandb is not installed: metrics go to %s only", self.csv)
            else:
                self._wandb_module = wandb
                quiet = {"settings": wandb.Settings(silent=True)} if hasattr(wandb, "Settings") else {}
                self._wandb = wandb.init(project=project, config=config or {}, dir=str(self.run_dir), mode=mode,
                                         reinit="finish_previous", **quiet)  # fmt: skip
                logger.info("W&B run (%s) in %s", mode, self.run_dir / "wandb")
        self._tensorboard: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                logger.info("tensorboard is not installed (pip install tensorboard): no TensorBoard event files")
            else:
                self._tensorboard = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))

    def log(self, metrics: dict[str, Any]) -> None:
        """One GRPO step's row (``step`` and its metrics)."""
        step = int(metrics.get("step", len(self.rows) + 1))
        self._append(metrics, step_key="step", step=step, wandb_step=self._wandb_offset + step)

    def log_warm_start(self, metrics: dict[str, Any]) -> None:
        """One warm-start step's row (``warm_start/step`` and ``warm_start/...`` metrics)."""
        step = int(metrics[WARM_START_STEP])
        self._append(metrics, step_key=WARM_START_STEP, step=step, wandb_step=step)
        self._wandb_offset = max(self._wandb_offset, step)

    def rewind_warm_start(self, step: int) -> None:
        """Forget the warm start's rows after ``step`` (the step it resumes from: they are run again)."""
        if any(int(r.get(WARM_START_STEP, 0)) > step for r in self.rows):
            self._keep(lambda r: int(r.get(WARM_START_STEP, 0)) <= step)

    def warm_start_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if WARM_START_STEP in r]

    def _append(self, metrics: dict[str, Any], *, step_key: str, step: int, wandb_step: int) -> None:
        self.rows.append(metrics)
        with open(self.jsonl, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(metrics) + "\n")
        self._append_csv(metrics)
        if self._wandb is not None:
            new = [key for key in metrics if key not in self._defined and key != step_key]
            if new and hasattr(self._wandb, "define_metric"):
                if step_key not in self._defined:
                    self._wandb.define_metric(step_key)
                    self._defined.add(step_key)
                for key in new:
                    self._wandb.define_metric(key, step_metric=step_key)
                self._defined.update(new)
            self._wandb.log(metrics, step=wandb_step)
        if self._tensorboard is not None:
            for key, value in metrics.items():
                if key != step_key and isinstance(value, int | float) and not isinstance(value, bool):
                    self._tensorboard.add_scalar(key, value, global_step=step)
            self._tensorboard.flush()

    def _keep(self, keep: Any) -> None:
        self.rows = [r for r in self.rows if keep(r)]
        self.jsonl.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        self._write_csv()

    def log_episodes(self, tag: str, episodes: list[Episode], *, step: int) -> Path:
        """Keep ``episodes`` as ``episodes/<tag>_step<step>.jsonl`` and log a W&B table of sample
        trajectories under ``<tag>/trajectories`` (when W&B is on). Returns the JSONL path."""
        directory = self.run_dir / "episodes"
        directory.mkdir(exist_ok=True)
        path = directory / f"{tag}_step{step}.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for episode in episodes:
                fh.write(episode.to_json() + "\n")
        if self._wandb is not None:
            log_trajectory_table(f"{tag}/trajectories", episodes, step=step, wandb=self._wandb_module, run=self._wandb,
                                 wandb_step=self._wandb_offset + step)  # fmt: skip
        return path

    def _append_csv(self, row: dict[str, Any]) -> None:
        """Add ``row`` to metrics.csv: one line when its columns are the header's, else the file again with
        the new columns (rows without a column leave it empty)."""
        if self._csv_keys is None or any(k not in self._csv_keys for k in row) or not self.csv.is_file():
            self._write_csv()
            return
        with open(self.csv, "a", newline="", encoding="utf-8") as fh:
            csv.DictWriter(fh, fieldnames=self._csv_keys).writerow(row)

    def _write_csv(self) -> None:
        keys: list[str] = []
        for row in self.rows:
            keys.extend(k for k in row if k not in keys)
        with open(self.csv, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=keys)
            writer.writeheader()
            writer.writerows(self.rows)
        self._csv_keys = keys

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def plot_curves(history: list[dict[str, Any]], path: str | Path, *, title: str = "GRPO training",
                extra_points: dict[str, tuple[float, float]] | None = None,
                warm_start: list[dict[str, Any]] | None = None) -> Path:  # fmt: skip
    """Reward, success rate and tool-call rate per GRPO step (plus eval points) as a PNG; with ``warm_start``
    rows (:meth:`MetricsLogger.log_warm_start`), a panel before it with the warm start's loss per step and
    its checks' results."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    if warm_start:
        fig, (warm_ax, ax) = plt.subplots(1, 2, figsize=(13, 4.5), dpi=120, gridspec_kw={"width_ratios": [2, 3]})
        _plot_warm_start(warm_ax, warm_start)
    else:
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    steps = [h["step"] for h in history]
    same = history and all(h.get("reward_mean") == h.get("success_rate") for h in history)
    series = [("reward_mean", "reward = success (train)" if same else "reward (train)", "C0")]
    if not same:
        series.append(("success_rate", "success rate (train)", "C1"))
    series.append(("tool_call_rate", "tool-call rate (train)", "C2"))
    for key, label, color in series:
        if history and key in history[0]:
            values = [h[key] for h in history]
            ax.plot(steps, values, color=color, alpha=0.35, linewidth=1.0)
            ax.plot(steps, _moving_average(values, 5), color=color, linewidth=2.0, label=f"{label}, 5-step mean")
    evals = [(h["step"], h["eval/success_rate"]) for h in history if "eval/success_rate" in h]
    if evals:
        ax.plot(*zip(*evals, strict=True), "o--", color="C3", label="success rate (held-out, greedy)", linewidth=1.2)
    for label, (x, y) in (extra_points or {}).items():
        ax.plot([x], [y], "s", markersize=8, label=label)
    ax.set_xlabel("GRPO step")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


WARM_START_CHECKS = {"warm_start/check_greedy": "check: reproduced greedily", "warm_start/check_rewarded": "check: "
                     "P(rewarded sample)"}  # fmt: skip
"""Check results a warm start logs that the curves show (a share, on the right axis)."""


def _plot_warm_start(ax: Any, rows: list[dict[str, Any]]) -> None:
    steps = [r[WARM_START_STEP] for r in rows if "warm_start/loss" in r]
    losses = [r["warm_start/loss"] for r in rows if "warm_start/loss" in r]
    ax.plot(steps, losses, color="C4", alpha=0.35, linewidth=1.0)
    ax.plot(steps, _moving_average(losses, 25), color="C4", linewidth=2.0, label="SFT loss, 25-step mean")
    ax.set_xlabel("warm-start step")
    ax.set_ylabel("loss")
    if losses and min(losses) > 0:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.set_title("warm start")
    handles, labels = ax.get_legend_handles_labels()
    checks = [(key, label) for key, label in WARM_START_CHECKS.items() if any(key in r for r in rows)]
    if checks:
        right = ax.twinx()
        for (key, label), color in zip(checks, ("C3", "C0"), strict=False):
            points = [(r[WARM_START_STEP], r[key]) for r in rows if key in r]
            right.plot(*zip(*points, strict=True), "o-", color=color, markersize=3, linewidth=1.0, label=label)
        right.set_ylim(-0.05, 1.05)
        right.set_ylabel("share of check tasks")
        more, more_labels = right.get_legend_handles_labels()
        handles, labels = handles + more, labels + more_labels
    ax.legend(handles, labels, loc="upper right", fontsize=8)


def _moving_average(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out
