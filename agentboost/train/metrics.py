"""Metrics out of the trainer: ``metrics.jsonl`` + ``metrics.csv`` in the run directory, W&B (offline
unless configured; its own console output silenced, so the progress bars stay readable), TensorBoard
event files (``<run_dir>/tensorboard``, when asked and installed), and a PNG of the curves. Eval steps
also keep their episodes (``episodes/eval_step<N>.jsonl``, readable with ``agentboost view``) and log a
W&B table of sample trajectories (``eval/trajectories``)."""

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
            self.rows = [r for r in self.rows if int(r.get("step", 0)) <= resume_step]
            self.jsonl.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
            self._write_csv()
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
        self.rows.append(metrics)
        with open(self.jsonl, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(metrics) + "\n")
        self._write_csv()
        step = int(metrics.get("step", len(self.rows)))
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if self._tensorboard is not None:
            for key, value in metrics.items():
                if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                    self._tensorboard.add_scalar(key, value, global_step=step)
            self._tensorboard.flush()

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
            log_trajectory_table(f"{tag}/trajectories", episodes, step=step, wandb=self._wandb_module, run=self._wandb)
        return path

    def _write_csv(self) -> None:
        keys: list[str] = []
        for row in self.rows:
            keys.extend(k for k in row if k not in keys)
        with open(self.csv, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=keys)
            writer.writeheader()
            writer.writerows(self.rows)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def plot_curves(history: list[dict[str, Any]], path: str | Path, *, title: str = "GRPO training",
                extra_points: dict[str, tuple[float, float]] | None = None) -> Path:  # fmt: skip
    """Reward, success rate and tool-call rate per step (plus eval points) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
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


def _moving_average(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out
