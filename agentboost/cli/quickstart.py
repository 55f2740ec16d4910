"""``agentboost quickstart``: train a Strands agent end to end on this machine (see
:mod:`agentboost.quickstart`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from ..quickstart import QuickstartConfig, format_summary, run_quickstart


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
        kind = {int: int, float: float, str: str}.get(type(default), str)
        if field.name in ("sft_steps", "model", "device", "wandb_project"):
            kind = int if field.name == "sft_steps" else str
        parser.add_argument(flag, type=kind, default=default, help=f"(default: {default})")
    parser.add_argument("--no-wandb", action="store_true", help="do not log to W&B")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(QuickstartConfig)}
    if args.no_wandb:
        values["wandb_project"] = None
    summary = run_quickstart(QuickstartConfig(**values))
    sys.stdout.write(format_summary(summary) + "\n")
    return 0
