"""Prepare the math example's data and register it with rLLM's DatasetRegistry.

Train: DeepScaleR-Preview (``agentica-org/DeepScaleR-Preview-Dataset``, problem/answer). Validation:
AIME 2024 (``HuggingFaceH4/aime_2024``). Rows become ``{"prompt", "answer", "task_id", "data_source"}``;
rLLM stores each row in ``extra_info`` and the trainer builds ``MathEnv.from_dict(row)`` from it.

    python examples/math/prepare_math_data.py [--train-limit N]
"""

from __future__ import annotations

import argparse
import logging

logger = logging.getLogger("prepare_math_data")


def rows(name: str, split: str, source: str, limit: int | None) -> list[dict]:
    from datasets import load_dataset

    data = load_dataset(name, split=split)
    out = []
    for i, row in enumerate(data):
        if limit is not None and i >= limit:
            break
        problem, answer = row.get("problem") or row.get("question"), row.get("answer")
        if not problem or answer in (None, ""):
            continue
        out.append({"prompt": str(problem), "answer": str(answer), "task_id": f"{source}-{i}", "data_source": source})
    logger.info("%s: %d rows", source, len(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-limit", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from rllm.data.dataset import DatasetRegistry

    DatasetRegistry.register_dataset(
        "strands_math",
        rows("agentica-org/DeepScaleR-Preview-Dataset", "train", "deepscaler", args.train_limit),
        "train",
    )
    DatasetRegistry.register_dataset("strands_math", rows("HuggingFaceH4/aime_2024", "train", "aime2024", None), "test")


if __name__ == "__main__":
    main()
