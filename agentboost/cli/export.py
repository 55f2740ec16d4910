"""``agentboost export RUN_DIR OUT``: a training run (``agentboost train`` or ``quickstart``) as a Hugging Face
model directory that transformers and vLLM load: LoRA adapters merged, the tokenizer and its chat template
included, the logits checked against the trained model's (adapters unmerged) after writing.

    agentboost export runs/train runs/train-hf
    vllm serve runs/train-hf --port 8000
    agentboost eval --data tasks.jsonl --env agentboost.environments.strands_env:StrandsEnv \\
        --backend http://127.0.0.1:8000 --tokenizer runs/train-hf --n 4 --out runs/eval-trained
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import contract
from .contract import BadInput


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("export", help="a training run as a Hugging Face directory (LoRA merged) for vLLM",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the --run-dir of agentboost train or quickstart")
    parser.add_argument("out", metavar="OUT", help="the directory to write (must not exist or be empty)")
    parser.add_argument("--from", dest="source", choices=["auto", "final", "checkpoint"], default="auto",
                        help="final_model/ of a finished run, or the latest checkpoint/ (default: final when the run "
                        "finished, else the checkpoint)")  # fmt: skip
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="dtype of the written weights (default: the dtype the run trained in)")  # fmt: skip
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it holds something")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip loading the written directory back to compare its logits")  # fmt: skip
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..train.export import check_export, export_run

    contract.require_module("torch", "agentboost export", "local")
    try:
        source = check_export(args.run_dir, args.out, source=args.source, overwrite=args.overwrite)
    except (ValueError, OSError) as exc:
        raise BadInput(str(exc)) from exc
    contract.output_dir(args.out, "OUT")
    try:
        record = export_run(args.run_dir, args.out, source=source, dtype=args.dtype, overwrite=args.overwrite,
                            verify=not args.no_verify)  # fmt: skip
    except Exception as exc:  # after the checks: loading, merging, writing or the reload failed
        extra = contract.missing_extra(exc, "agentboost export")
        if extra is not None:
            raise extra from exc
        raise contract.InfraFailure(f"the export failed: {contract.describe(exc)}") from exc
    gap = record.get("verified_max_logit_gap")
    unmerged = " (LoRA unmerged)" if record.get("lora") else ""
    checked = f"; reloaded, logits within {gap:.2g} of the trained model's{unmerged}" if gap is not None else ""
    sys.stdout.write(
        f"wrote {args.out} ({record['source']} weights of {args.run_dir}, {record['dtype']}"
        f"{', LoRA merged' if record.get('lora') else ''}{checked})\n"
        f"serve it: vllm serve {args.out} --port 8000\n"
        f"evaluate it: agentboost eval --backend http://127.0.0.1:8000 --tokenizer {args.out} --data ROWS --env ENV\n"
    )
    return 0
