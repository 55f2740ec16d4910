"""Prepare the math example's data: DeepScaleR-Preview for training, AIME 2024 for validation.

Rows become ``{"prompt", "answer", "task_id", "data_source"}``; rLLM stores each row in
``extra_info`` and the trainer builds ``MathEnv.from_dict(row)`` from it. The splits are written as
``<out-dir>/{train,test}.jsonl`` and registered as rLLM dataset ``strands_math`` when rLLM is
installed; ``--verl-out [DIR]`` also writes them as verl parquet (``train_math_verl.sh``), with the
example's system prompt as the chat prompt's system turn.

    python examples/math/prepare_math_data.py                       # full data from the HF hub
    python examples/math/prepare_math_data.py --limit 512 --cache-dir /data/hf
    python examples/math/prepare_math_data.py --sample              # the shipped sample, offline
    python examples/math/prepare_math_data.py --verl-out            # + data/strands_math/verl/*.parquet
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from agentboost.data_prep import (
    add_common_arguments,
    convert_rows,
    file_rows,
    hub_rows,
    verl_out_dir,
    write_dataset,
    write_verl_dataset,
)
from agentboost.environments.math_env import SYSTEM_PROMPT

HERE = Path(__file__).resolve().parent
TRAIN = ("agentica-org/DeepScaleR-Preview-Dataset", "train", "deepscaler")
TEST = ("HuggingFaceH4/aime_2024", "train", "aime2024")


def converter(source: str):
    def convert(row: dict[str, Any], index: int) -> dict[str, Any] | None:
        problem, answer = row.get("problem") or row.get("question"), row.get("answer")
        if not isinstance(problem, str) or not problem.strip() or answer is None or str(answer).strip() == "":
            return None
        task_id = f"{source}-{row.get('id', index)}"
        return {"prompt": problem.strip(), "answer": str(answer).strip(), "task_id": task_id, "data_source": source}

    return convert


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, default_out="data/strands_math")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    splits = {}
    for split, (name, hub_split, source) in (("train", TRAIN), ("test", TEST)):
        if args.sample:
            raw = file_rows(HERE / "sample" / f"{source}.jsonl")
        else:
            raw = hub_rows(name, split=hub_split, cache_dir=args.cache_dir, limit=args.limit)
        splits[split] = convert_rows(raw, converter(source), limit=args.limit, desc=source)
    write_dataset("strands_math", splits, args.out_dir, register=args.register)
    verl_dir = verl_out_dir(args)
    if verl_dir is not None:
        write_verl_dataset(splits, verl_dir, system_prompt=SYSTEM_PROMPT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
