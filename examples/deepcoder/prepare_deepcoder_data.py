"""Prepare the DeepCoder example's data (``agentica-org/DeepCoder-Preview-Dataset``).

Train: the ``primeintellect``, ``taco`` and ``lcbv5`` subsets; test: ``lcbv5``. Every problem's tests
(three formats upstream: LiveCodeBench lists, TACO ``{"inputs", "outputs", "fn_name"}`` dicts,
PrimeIntellect lists) become one list of ``{"input", "output", "testtype", "fn_name"}`` (TACO's
function outputs unwrapped from their one-element lists; problems with more tests than the reward
runs are dropped): all of them
are the hidden tests the reward runs in the sandbox; the first ``--public`` are also available to
the agent through its ``run_tests`` tool. No test is ever put into the prompt. Rows are written as
``<out-dir>/{train,test}.jsonl`` and registered as rLLM dataset ``strands_deepcoder`` when rLLM is
installed; ``--verl-out [DIR]`` also writes them as verl parquet (``train_deepcoder_verl.sh``).

    python examples/deepcoder/prepare_deepcoder_data.py [--limit N] [--public 2] [--cache-dir DIR]
    python examples/deepcoder/prepare_deepcoder_data.py --sample          # shipped sample, offline
    python examples/deepcoder/prepare_deepcoder_data.py --verl-out        # + data/strands_deepcoder/verl/*.parquet
"""

from __future__ import annotations

import argparse
import ast
import json
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
from agentboost.environments.code_env import SYSTEM_PROMPT
from agentboost.rewards.code import MAX_TESTS
from agentboost.sandbox.testcases import TestCase

logger = logging.getLogger("prepare_deepcoder_data")
HERE = Path(__file__).resolve().parent
DATASET = "agentica-org/DeepCoder-Preview-Dataset"
TRAIN_SUBSETS = ("primeintellect", "taco", "lcbv5")
TEST_SUBSETS = ("lcbv5",)


def _parse(tests: Any) -> Any:
    if not isinstance(tests, str):
        return tests
    try:
        return json.loads(tests)
    except json.JSONDecodeError:
        return ast.literal_eval(tests)  # a literal, never code: PrimeIntellect stores Python reprs


def normalise_tests(tests: Any) -> list[dict[str, Any]]:
    """Any of the three upstream test formats -> a list of TestCase dicts (raises on anything else)."""
    tests = _parse(tests)
    if isinstance(tests, dict):  # TACO
        inputs, outputs = tests.get("inputs") or [], tests.get("outputs") or []
        if len(inputs) != len(outputs):
            raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
        fn_name = tests.get("fn_name")
        if fn_name:  # TACO wraps each return value in a one-element list
            outputs = [o[0] if isinstance(o, list) and len(o) == 1 else o for o in outputs]
        tests = [{"input": i, "output": o, "testtype": "functional" if fn_name else "stdin", "fn_name": fn_name}
                 for i, o in zip(inputs, outputs, strict=True)]  # fmt: skip
    if not isinstance(tests, list) or not tests:
        raise ValueError("no tests")
    if len(tests) > MAX_TESTS:
        raise ValueError(f"{len(tests)} tests (the reward runs at most {MAX_TESTS})")
    out = []
    for t in tests:
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            raise ValueError(f"malformed test {str(t)[:80]!r}")
        fn_name = t.get("fn_name") or (t.get("metadata") or {}).get("func_name")
        kind = "functional" if fn_name or t.get("testtype") == "functional" else "stdin"
        case = TestCase.from_dict({"input": t["input"], "output": t["output"], "testtype": kind, "fn_name": fn_name})
        row = {"input": case.input, "output": case.output, "testtype": kind}
        if case.fn_name:
            row["fn_name"] = case.fn_name
        out.append(row)
    return out


def converter(source: str, split: str, public: int):
    def convert(row: dict[str, Any], index: int) -> dict[str, Any] | None:
        problem = row.get("problem")
        if not isinstance(problem, str) or not problem.strip():
            return None
        try:
            tests = normalise_tests(row.get("tests"))
        except (ValueError, SyntaxError, TypeError) as exc:
            logger.debug("%s-%d rejected: %s", source, index, exc)
            return None
        # JSON strings: parquet (rLLM's registry) cannot hold tests whose inputs mix str and list.
        return {"prompt": problem.strip(), "tests": json.dumps(tests), "public_tests": json.dumps(tests[:public]),
                "task_id": f"{source}-{split}-{index}", "data_source": source}  # fmt: skip

    return convert


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, default_out="data/strands_deepcoder")
    parser.add_argument("--public", type=int, default=2, help="tests the agent may run through its tool")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    splits: dict[str, list[dict[str, Any]]] = {}
    for split, subsets in (("train", TRAIN_SUBSETS), ("test", TEST_SUBSETS)):
        rows: list[dict[str, Any]] = []
        for subset in subsets:
            if args.sample:
                raw = file_rows(HERE / "sample" / f"{subset}_{split}.jsonl")
            else:
                raw = hub_rows(DATASET, config=subset, split=split, cache_dir=args.cache_dir, limit=args.limit)
            rows += convert_rows(raw, converter(subset, split, args.public), limit=args.limit, desc=f"{subset}/{split}")
        splits[split] = rows
    write_dataset("strands_deepcoder", splits, args.out_dir, register=args.register)
    verl_dir = verl_out_dir(args)
    if verl_dir is not None:
        write_verl_dataset(splits, verl_dir, system_prompt=SYSTEM_PROMPT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
