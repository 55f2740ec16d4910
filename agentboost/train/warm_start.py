"""Warm starts: whatever trains the policy before GRPO, resumable on its own.

A warm start is any object with ``run(trainer, directory, *, progress) -> dict`` (:class:`WarmStart`):
it trains ``trainer.model`` (the policy GRPO then starts from), keeps its own state in ``directory`` so
that a run interrupted during it (Ctrl-C, a lost machine) continues from its last save, and returns
what it measured (``summary.json``'s ``warm_start``). The training loop
(:func:`agentboost.train.run.run_training`) knows nothing else about it, so a recipe changes without
touching the loop. Two ship:

* :class:`EpisodeWarmStart`: SFT on episodes for a fixed number of steps (``agentboost train
  --sft-data``: successful rollouts and distilled frontier-model episodes,
  :mod:`agentboost.train.sft_data`);
* the quickstart's demonstrations with a check of the skill they teach, in both answer styles
  (:class:`agentboost.train.demonstration.DemonstrationWarmStart`).

Both save through :class:`SFTCheckpoint`: the trained weights, the optimizer with its fp32 masters, the
batch sampler's and torch's random state, the losses, the caller's own record (checks, seconds) and
any other weights it keeps (the quickstart's best-checked ones), written atomically (a new directory
renamed over the old one).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..episode import Episode
from .metrics import WARM_START_STEP
from .progress import phase_bar
from .sft import SFTRun

if TYPE_CHECKING:
    from .metrics import MetricsLogger
    from .trainer import GRPOTrainer

logger = logging.getLogger(__name__)

STATE = "state.json"


class WarmStart(Protocol):
    def run(
        self, trainer: GRPOTrainer, directory: Path | None, *, progress: bool, log: MetricsLogger | None = None
    ) -> dict[str, Any]:
        """Train ``trainer.model`` before GRPO, resuming from ``directory`` (None: not resumable); a row per
        step to ``log`` (:class:`StepRows`)."""
        ...


class StepRows:
    """A warm start's rows of the run's metrics (``metrics.csv``, TensorBoard, W&B, ``curves.png``): one per
    step, with its loss and learning rate; a check's results join the row of the step it checked. Rows after
    ``resumed_step`` (logged before an interruption, the steps are run again) are forgotten."""

    def __init__(self, log: MetricsLogger | None, resumed_step: int) -> None:
        self.log = log
        self._row: dict[str, Any] | None = None
        if log is not None:
            log.rewind_warm_start(resumed_step)

    def step(self, step: int, **values: float) -> None:
        self.flush()
        self._row = {WARM_START_STEP: step, **{f"warm_start/{k}": v for k, v in values.items()}}

    def add(self, step: int, **values: float) -> None:
        """Results of ``step`` (a check): into its row when that is the one in hand, else a row of their own."""
        if self._row is None or self._row[WARM_START_STEP] != step:
            self.flush()
            self._row = {WARM_START_STEP: step}
        self._row.update({f"warm_start/{k}": v for k, v in values.items()})

    def flush(self) -> None:
        if self._row is not None and self.log is not None:
            self.log.log_warm_start(self._row)
        self._row = None


def trained_state(model: Any, *, device: Any = None) -> dict[str, Any]:
    """The weights training changes: every trainable parameter (LoRA: the adapters only), copied (to
    ``device`` when given: a copy kept aside need not take accelerator memory)."""
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().to(device, copy=True) for k, v in model.state_dict().items() if k in trainable}


def load_trained_state(model: Any, state: dict[str, Any], where: Path) -> None:
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"{where} holds weights this model does not have: {result.unexpected_keys[:3]}")


class SFTCheckpoint:
    """The saved state of one SFT warm start in ``directory`` (see module doc)."""

    def __init__(self, directory: Path, model: Any, run: SFTRun) -> None:
        self.directory = Path(directory)
        self.model = model
        self.run = run
        self._written: dict[str, Any] = {}  # the weights in the saved directory, by name (linked, not rewritten)

    def load(self) -> dict[str, Any] | None:
        """Restore the model and the run from the last save; returns ``{"done", "record", "weights"}`` (the
        other weights saved with it, by name) or None."""
        import torch

        state_path = self.directory / STATE
        if not state_path.is_file():
            return None
        state = json.loads(state_path.read_text())
        self.run.load_state_dict(torch.load(self.directory / "sft.pt", map_location="cpu"))
        # after the run: its optimizer puts its fp32 masters back into low-precision weights, and a finished
        # warm start may have handed over other weights than its last step's (the quickstart's best-checked)
        load_trained_state(self.model, torch.load(self.directory / "model.pt", map_location="cpu"), self.directory)
        weights = {
            name: torch.load(self.directory / f"weights-{name}.pt", map_location="cpu")
            for name in state.get("weights", [])
        }
        self._written = dict(weights)
        logger.info("warm start resumed from %s at step %d", self.directory, self.run.step)
        return {"done": bool(state["done"]), "record": dict(state.get("record", {})), "weights": weights}

    def save(self, record: dict[str, Any], *, done: bool, weights: dict[str, dict[str, Any]] | None = None) -> None:
        """Save the run, the model's trained weights, ``record`` and ``weights`` (other trained states the
        caller keeps, by name: :func:`trained_state` dicts)."""
        import torch

        tmp = self.directory.with_name(self.directory.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        torch.save(trained_state(self.model), tmp / "model.pt")
        torch.save(self.run.state_dict(), tmp / "sft.pt")
        for name, state in (weights or {}).items():
            saved = self.directory / f"weights-{name}.pt"
            if self._written.get(name) is state and saved.is_file():
                try:
                    os.link(saved, tmp / saved.name)
                    continue
                except OSError:  # a file system without hard links
                    pass
            torch.save(state, tmp / saved.name)
        (tmp / STATE).write_text(
            json.dumps({"step": self.run.step, "done": done, "record": record, "weights": sorted(weights or {})})
        )
        if self.directory.exists():
            shutil.rmtree(self.directory)
        tmp.rename(self.directory)
        self._written = dict(weights or {})


@dataclass
class EpisodeWarmStart:
    """SFT on ``episodes`` for ``steps`` steps (batches drawn without replacement), saved every
    ``save_every`` steps; records the loss and what the episodes were (``sources``)."""

    episodes: list[Episode]
    steps: int
    lr: float = 1e-5
    batch_size: int = 8
    weight_decay: float = 0.0
    seed: int = 0
    save_every: int = 50
    sources: dict[str, Any] | None = None

    @staticmethod
    def summary_line(record: dict[str, Any]) -> str:
        """The run summary's line: steps, episodes, first and final loss."""
        if not record:
            return "warm start: none"
        losses = f"; loss {record['first_loss']:.3f} -> {record['final_loss']:.3f}" if record.get("final_loss") else ""
        return f"warm start: {record.get('steps', 0)} SFT steps on {record.get('episodes', 0)} episodes{losses}"

    def run(
        self, trainer: GRPOTrainer, directory: Path | None, *, progress: bool, log: MetricsLogger | None = None
    ) -> dict[str, Any]:
        started = time.monotonic()
        sft_run = SFTRun(
            trainer.model, self.episodes, pad_token_id=trainer.pad_token_id, steps=self.steps, lr=self.lr,
            batch_size=self.batch_size, seed=self.seed, weight_decay=self.weight_decay, schedule="cosine",
        )  # fmt: skip
        store = SFTCheckpoint(directory, trainer.model, sft_run) if directory is not None else None
        resumed = store.load() if store is not None else None
        earlier = float((resumed or {}).get("record", {}).get("seconds", 0.0))
        if resumed and resumed["done"]:
            return dict(resumed["record"])

        def record() -> dict[str, Any]:
            losses = sft_run.losses
            return {
                "kind": "sft-data",
                "steps": sft_run.step,
                "first_loss": losses[0] if losses else None,
                "final_loss": losses[-1] if losses else None,
                "episodes": len(sft_run.usable),
                "sources": self.sources or {},
                "seconds": earlier + time.monotonic() - started,
            }

        rows = StepRows(log, sft_run.step)

        def on_step(step: int, loss: float) -> None:
            rows.step(step, loss=loss, lr=sft_run.last_lr)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")

        def save(_step: int, _stop: bool = False) -> None:
            if store is not None:
                store.save(record(), done=False)

        bar = phase_bar("warm start (SFT)", self.steps, unit="step", progress=progress, initial=sft_run.step)
        try:
            sft_run.run(check_every=self.save_every, after_check=save if store is not None else None,
                        on_step=on_step, on_interrupt=save if store is not None else None)  # fmt: skip
        finally:
            rows.flush()
            bar.close()
        result = record()
        if store is not None:
            store.save(result, done=True)
        return result
