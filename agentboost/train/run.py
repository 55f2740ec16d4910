"""One training run on one machine: the loop behind ``agentboost train`` and ``agentboost quickstart``.

A run is a :class:`RunPlan` (rows, environment, agent, how the model is built, the GRPO settings and an
optional :class:`~agentboost.train.warm_start.WarmStart`); :func:`run_training` is the one loop both
commands go through. In ``plan.run_dir``:

1. the model is built (``plan.build_model``) and the first GRPO step's episodes are played, before the long
   work: every one failed or masked (a reward that raises or is not a number, an agent factory that raises,
   rows that overflow the context) stops the run (:class:`~agentboost.train.trainer.TrainingStopped`), as a
   step with nothing to train on, or too many steps in a row without a reward spread, do later;
2. the model is recorded for ``agentboost export``: ``run.json`` (the options and where the model came from:
   a local directory, LoRA settings, dtype) and ``model_init/`` (its config, generation config and
   tokenizer with the chat template);
3. the warm start, if any, resumable from ``warm_start/`` (a rerun after Ctrl-C continues where it was; a
   finished one is not run again), its loss and checks per step in the run's metrics;
4. held-out evaluation before GRPO (``eval/before/``: the evaluator's report with pass@k, and the
   episodes, readable with ``agentboost view`` and comparable with ``agentboost eval --compare``);
5. GRPO (:class:`~agentboost.train.trainer.GRPOTrainer`; ``checkpoint/`` every ``save_every`` steps,
   metrics in ``metrics.csv`` / ``metrics.jsonl``, W&B, TensorBoard; held-out evaluation every
   ``eval_every`` steps);
6. held-out evaluation after (``eval/after/``), ``final_model/`` (the whole model, or the LoRA adapter:
   ``agentboost export`` merges it; written whole or not at all), ``curves.png`` and ``summary.json``.

Rerunning the same command resumes: from the last GRPO checkpoint, else from the warm start's last save.
A run directory holding a checkpoint made with other model, tokenizer or task settings is refused
(``plan.check_resumable``). One progress display per phase.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..agents.strands_agent import StrandsAgent
from ..chat.template import ChatTemplate
from ..types import Termination
from .metrics import plot_curves
from .progress import phase_bar
from .trainer import GRPOTrainer, TrainConfig, TrainingStopped
from .warm_start import WarmStart

logger = logging.getLogger(__name__)

RUN_RECORD = "run.json"
SUMMARY = "summary.json"
MODEL_INIT = "model_init"
"""The model's config, generation config and tokenizer as the run started (what ``agentboost export`` rebuilds a
checkpoint on)."""
FINAL_MODEL = "final_model"
WARM_START = "warm_start"
EVAL = "eval"


@dataclass
class RunPlan:
    """Everything one run needs (see module doc)."""

    run_dir: Path
    title: str
    config: dict[str, Any]
    """The options as given (``summary.json``'s ``config``: what a resumed run is compared with)."""
    train_rows: list[dict[str, Any]]
    eval_rows: list[dict[str, Any]]
    env: str
    agent: StrandsAgent
    build_model: Callable[[], tuple[Any, Any]]
    """Returns ``(model, tokenizer)``, the model on its device."""
    model_record: dict[str, Any]
    """Where the model came from: ``{"base": <local dir> or None, "lora": {...} or None, "dtype": ...}``."""
    train_config: TrainConfig
    env_args: dict[str, Any] = field(default_factory=dict)
    warm_start: WarmStart | None = None
    threshold: float = 1.0
    """Reward counted as success when the environment gives no verdict (pass@k, the evaluator's report)."""
    check_resumable: Callable[[Path], None] | None = None
    seed: int = 0
    summary_extra: dict[str, Any] = field(default_factory=dict)
    summary_title: str | None = None
    """The title of the end-of-run table (:func:`summary_text`; default: the title, on held-out rows)."""
    before_label: str = "before GRPO"
    """What the "before" column of the end-of-run table measured (the quickstart's: after the warm start)."""


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds something a rerun resumes (a GRPO checkpoint or a warm start's save)."""
    return (run_dir / "checkpoint" / "trainer_state.json").is_file() or (run_dir / WARM_START / "state.json").is_file()


def saved_config(run_dir: Path) -> dict[str, Any] | None:
    """The options a run directory was made with (``summary.json``, else ``run.json``)."""
    for name in (SUMMARY, RUN_RECORD):
        config = read_json(run_dir / name).get("config")
        if isinstance(config, dict):
            return config
    return None


def record_model(plan: RunPlan, model: Any, tokenizer: Any) -> None:
    """``run.json`` and ``model_init/`` (see module doc); written once, at the run's first start."""
    run_dir = plan.run_dir
    record = read_json(run_dir / RUN_RECORD)
    if record.get("model") is None:
        record = {"agentboost": __version__, "title": plan.title, "config": plan.config, "model": plan.model_record}
        (run_dir / RUN_RECORD).write_text(json.dumps(record, indent=2))
    init = run_dir / MODEL_INIT
    if not (init / "config.json").is_file():
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        base.config.save_pretrained(str(init))
        if getattr(base, "generation_config", None) is not None:  # its end tokens and sampling defaults
            base.generation_config.save_pretrained(str(init))
        tokenizer.save_pretrained(str(init))


def run_training(plan: RunPlan, *, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) ``plan`` to the end; returns the summary also written to ``summary.json``."""
    import torch
    from tqdm.contrib.logging import logging_redirect_tqdm

    session = time.monotonic()
    run_dir = plan.run_dir
    if plan.check_resumable is not None:
        plan.check_resumable(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    random.seed(plan.seed)
    torch.manual_seed(plan.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    previous = read_json(run_dir / SUMMARY)
    timings: dict[str, float] = {k: float(v) for k, v in previous.get("timings", {}).items()}

    with logging_redirect_tqdm():
        model, tokenizer = plan.build_model()
        template = ChatTemplate(tokenizer)
        trainer = GRPOTrainer(
            model, template, plan.train_rows, eval_rows=plan.eval_rows, env=plan.env, env_args=plan.env_args,
            agent=plan.agent, config=plan.train_config,
        )  # fmt: skip
        timings["setup_s"] = timings.get("setup_s", 0.0) + time.monotonic() - session
        resumed = trainer.load_checkpoint()
        if not resumed:  # before the long work: a reward that raises, rows that overflow, ... (TrainingStopped)
            trainer.check_first_step(keep=plan.warm_start is None)
        record_model(plan, model, tokenizer)
        log = trainer.open_log()
        try:
            warm: dict[str, Any] = dict(previous.get("warm_start", {}))
            if resumed:
                trainer.warm_start_steps = int(warm.get("steps") or 0)
                before = dict(previous.get("before", {}))
                logger.info("resuming GRPO at step %d (warm start already done)", trainer.step)
            else:
                if plan.warm_start is not None:
                    t = time.monotonic()
                    # a warm start written before warm starts logged per step takes no log
                    logs = {"log": log} if "log" in inspect.signature(plan.warm_start.run).parameters else {}
                    warm = plan.warm_start.run(trainer, run_dir / WARM_START, progress=progress, **logs)
                    trainer.warm_start_steps = int(warm.get("steps") or 0)
                    trainer.optimizer.take_weights()  # GRPO's optimizer was made before: its masters are the old ones
                    timings["sft_s"] = float(warm.get("seconds", time.monotonic() - t))
                t = time.monotonic()
                before = evaluate(trainer, plan, "before", progress=progress)
                timings["eval_before_s"] = time.monotonic() - t
                _write(run_dir / SUMMARY, {"config": plan.config, "before": before, "warm_start": warm,
                                           "timings": timings, **plan.summary_extra})  # fmt: skip

            t = time.monotonic()
            history = trainer.fit(resume=False, progress=progress, log=log)
            timings["grpo_s"] = timings.get("grpo_s", 0.0) + time.monotonic() - t
            t = time.monotonic()
            last = history[-1] if history else {}
            if trainer.last_eval_episodes and "eval/success_rate" in last and last.get("step") == trainer.step:
                after = {k: v for k, v in last.items() if k.startswith("eval/")}  # evaluated at the last step already
                write_eval(trainer, plan, "after")
            else:
                after = evaluate(trainer, plan, "after", progress=progress)
            timings["eval_after_s"] = time.monotonic() - t
            warm_rows = log.warm_start_rows()
        finally:
            log.close()

    final = run_dir / FINAL_MODEL
    partial = final.with_name(final.name + ".tmp")  # a final_model/ is whole or absent (a full disk, a kill)
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    phases = ("setup_s", "sft_s", "eval_before_s", "grpo_s", "eval_after_s")
    timings["total_s"] = sum(timings.get(k, 0.0) for k in phases)
    points = {}
    if before:
        points["held-out success before GRPO"] = (0, before.get("eval/success_rate", 0.0))
    points["held-out success after GRPO"] = (len(history), after.get("eval/success_rate", 0.0))
    plot = plot_curves(history, run_dir / "curves.png", title=plan.title, extra_points=points, warm_start=warm_rows)
    reports = {tag: str(run_dir / EVAL / tag / "report.md") for tag in ("before", "after")}
    reports = {tag: path for tag, path in reports.items() if Path(path).is_file()}
    summary = {
        "config": plan.config,
        "before": before,
        "after": after,
        "improvement": after.get("eval/success_rate", 0.0) - before.get("eval/success_rate", 0.0),
        "warm_start": warm,
        "timings": timings,
        "plot": str(plot),
        "metrics_csv": str(run_dir / "metrics.csv"),
        "final_model": str(final),
        "eval_reports": reports,
        **plan.summary_extra,
    }
    _write(run_dir / SUMMARY, summary)
    return summary


def format_run_summary(
    summary: dict[str, Any], *, title: str, before_label: str = "before GRPO", warm_line: str | None = None
) -> str:
    """The end-of-run table printed by the CLI: held-out metrics before and after GRPO, pass@k, times,
    where the files are."""
    before, after = summary["before"], summary["after"]

    def row(name: str, key: str) -> str:
        return f"| {name} | {_cell(before.get(key))} | {_cell(after.get(key))} |"

    passes = sorted((k for k in after if k.startswith("eval/pass@")), key=lambda k: int(k.rsplit("@", 1)[1]))
    t = summary["timings"]
    lines = [
        f"## {title}",
        "",
        f"| metric | {before_label} | after GRPO |",
        "|---|---|---|",
        row("success rate", "eval/success_rate"),
        *[row(key.removeprefix("eval/"), key) for key in passes if key != "eval/pass@1"],
        row("reward mean", "eval/reward_mean"),
        row("tool-call rate", "eval/tool_call_rate"),
        row("parse errors / episode", "eval/parse_errors_per_episode"),
        "",
        f"improvement in success rate: {summary['improvement']:+.3f}",
    ]
    if warm_line is not None:
        lines.append(warm_line)
    lines += [
        f"time: warm start {t.get('sft_s', 0):.0f} s, GRPO {t.get('grpo_s', 0):.0f} s, "
        f"total {t.get('total_s', 0):.0f} s",
        f"curves: {summary['plot']}",
        f"metrics: {summary['metrics_csv']}",
    ]
    lines += [f"held-out report ({tag}): {path}" for tag, path in summary.get("eval_reports", {}).items()]
    lines.append(f"trained model: {summary['final_model']}")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}"


def summary_text(plan: RunPlan, summary: dict[str, Any]) -> str:
    """The end-of-run table of ``plan``'s run (what the CLI prints), with the warm start's line when it has
    one (its ``summary_line(record)``)."""
    line = getattr(plan.warm_start, "summary_line", None)
    return format_run_summary(
        summary, title=plan.summary_title or f"{plan.title} (held-out rows)", before_label=plan.before_label,
        warm_line=line(summary.get("warm_start") or {}) if callable(line) else None,
    )  # fmt: skip


def evaluate(trainer: GRPOTrainer, plan: RunPlan, tag: str, *, progress: bool) -> dict[str, float]:
    """Held-out evaluation (``eval_n`` samples per row) with its own progress display; the evaluator's
    report and the episodes go to ``eval/<tag>/``."""
    if not plan.eval_rows:
        return {}
    total = len(plan.eval_rows) * trainer.config.eval_n
    bar = phase_bar(f"held-out eval ({tag})", total, unit="ep", progress=progress)
    try:
        metrics = trainer.evaluate(tag=tag, on_episode=lambda _episode: bar.update(1))
    finally:
        bar.close()
    episodes = trainer.last_eval_episodes
    if episodes and all(e.termination is Termination.INFRA_ERROR for e in episodes):  # as agentboost eval stops
        detail = Counter(e.termination_detail for e in episodes).most_common(1)[0][0]
        raise TrainingStopped(
            f"held-out evaluation ({tag}): all {len(episodes)} episodes ended in infra_error: {detail}"
        )
    write_eval(trainer, plan, tag)
    return metrics


def write_eval(trainer: GRPOTrainer, plan: RunPlan, tag: str) -> Path:
    """``eval/<tag>/``: the latest evaluation's episodes (``episodes.jsonl``) and the evaluator's report
    (``report.json``, ``report.md``, ``report.png``: pass@k and pass^k, reward, terminations, tool use)."""
    from ..evaluation.report import build_report

    out = plan.run_dir / EVAL / tag
    out.mkdir(parents=True, exist_ok=True)
    episodes = trainer.last_eval_episodes
    with open(out / "episodes.jsonl", "w", encoding="utf-8") as fh:
        for episode in episodes:
            fh.write(episode.to_json() + "\n")
    report = build_report(
        episodes, ks=trainer.config.pass_ks(), threshold=plan.threshold, expected_per_task=trainer.config.eval_n
    )
    report.write(out, title=f"{plan.title}: held-out tasks, {tag} GRPO")
    return out


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
