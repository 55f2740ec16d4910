"""Prepare the DeepCoder example's data and register it with rLLM's DatasetRegistry.

Source: ``agentica-org/DeepCoder-Preview-Dataset`` (train: ``primeintellect`` + ``taco`` +
``lcbv5``; test: ``lcbv5``). Each problem's ``tests`` (a JSON list of ``{"input", "output",
"testtype", "metadata": {"func_name"}}``) becomes the hidden tests the reward runs in the sandbox; the
first ``--public`` of them are shown to the agent through its ``run_tests`` tool.

    python examples/deepcoder/prepare_deepcoder_data.py [--train-limit N] [--public 2]
"""

from __future__ import annotations

import argparse
import json
import logging

logger = logging.getLogger("prepare_deepcoder_data")


def convert(row: dict, source: str, index: int, public: int) -> dict | None:
    tests = row.get("tests")
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError:
            return None
    if not isinstance(tests, list) or not tests or not row.get("problem"):
        return None
    clean = []
    for t in tests:
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            return None
        test = {"input": t["input"], "output": t["output"], "testtype": t.get("testtype", "stdin")}
        fn = t.get("fn_name") or (t.get("metadata") or {}).get("func_name")
        if fn:
            test["fn_name"] = fn
        clean.append(test)
    return {"prompt": row["problem"], "tests": clean, "public_tests": clean[:public],
            "task_id": f"{source}-{index}", "data_source": source}  # fmt: skip


def load(subset: str, split: str, public: int, limit: int | None) -> list[dict]:
    from datasets import load_dataset

    out = []
    for i, row in enumerate(load_dataset("agentica-org/DeepCoder-Preview-Dataset", subset, split=split)):
        if limit is not None and len(out) >= limit:
            break
        converted = convert(row, subset, i, public)
        if converted is not None:
            out.append(converted)
    logger.info("%s/%s: %d problems", subset, split, len(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-limit", type=int, default=None, help="per subset")
    parser.add_argument("--public", type=int, default=2, help="tests shown to the agent")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from rllm.data.dataset import DatasetRegistry

    train = [r for s in ("primeintellect", "taco", "lcbv5") for r in load(s, "train", args.public, args.train_limit)]
    DatasetRegistry.register_dataset("strands_deepcoder", train, "train")
    DatasetRegistry.register_dataset("strands_deepcoder", load("lcbv5", "test", args.public, None), "test")


if __name__ == "__main__":
    main()
