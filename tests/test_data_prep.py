"""The examples' prepare scripts on their shipped raw samples (same conversion code as on the hub data)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agentboost.data import load_rows
from agentboost.environments.code_env import CodeEnv
from agentboost.environments.math_env import MathEnv
from agentboost.episode import Episode
from agentboost.rewards.code import code_reward
from agentboost.rewards.math import math_reward
from agentboost.types import Termination

ROOT = Path(__file__).resolve().parents[1]


def _script(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _answer(text: str) -> Episode:
    return Episode(
        id="e", messages=[{"role": "assistant", "content": [{"text": text}]}], termination=Termination.COMPLETED
    )


async def test_math_sample_rows_feed_the_math_env_and_reward(tmp_path) -> None:
    prep = _script("examples/math/prepare_math_data.py")
    assert prep.main(["--sample", "--out-dir", str(tmp_path), "--register", "no"]) == 0
    train, test = load_rows(tmp_path / "train.jsonl"), load_rows(tmp_path / "test.jsonl")
    assert (len(train), len(test)) == (8, 5)
    assert {r["data_source"] for r in train} == {"deepscaler"} and test[0]["task_id"] == "aime2024-60"
    for row in train + test:
        env = MathEnv.from_dict(row)
        assert env.reset()[0]["prompt"] == row["prompt"]
        right = await math_reward(row, _answer(f"The answer is $\\boxed{{{row['answer']}}}$."))
        wrong = await math_reward(row, _answer("The answer is $\\boxed{999999}$."))
        assert (right.reward, wrong.reward) == (1.0, 0.0), row
    assert prep.main(["--sample", "--limit", "3", "--out-dir", str(tmp_path / "small"), "--register", "no"]) == 0
    assert len(load_rows(tmp_path / "small" / "train.jsonl")) == 3


async def test_deepcoder_sample_rows_keep_hidden_tests_out_of_the_prompt(tmp_path) -> None:
    prep = _script("examples/deepcoder/prepare_deepcoder_data.py")
    assert prep.main(["--sample", "--public", "1", "--out-dir", str(tmp_path), "--register", "no"]) == 0
    train, test = load_rows(tmp_path / "train.jsonl"), load_rows(tmp_path / "test.jsonl")
    # primeintellect 2 + taco 2 (its third row has 2 inputs for 1 output and is rejected) + lcbv5 1
    assert [r["data_source"] for r in train] == ["primeintellect"] * 2 + ["taco"] * 2 + ["lcbv5"]
    assert len(test) == 1
    raw = {}
    for name in ("primeintellect_train", "taco_train", "lcbv5_train", "lcbv5_test"):
        source, split = name.split("_")
        for i, line in enumerate((ROOT / "examples/deepcoder/sample" / f"{name}.jsonl").read_text().splitlines()):
            raw[f"{source}-{split}-{i}"] = json.loads(line)
    for row in train + test:
        tests, public = json.loads(row["tests"]), json.loads(row["public_tests"])
        assert public == tests[:1] and len(tests) >= 2
        for t in tests:
            if isinstance(t["input"], str) and len(t["input"].strip()) > 3:
                assert t["input"].strip() not in row["prompt"]
        env = CodeEnv.from_dict(row)
        env.reset()
        assert [getattr(t, "tool_name", None) for t in env.tools] == ["run_tests"]
        solution = raw[row["task_id"]]["reference_solution"]
        good = await code_reward(row, _answer(f"```python\n{solution}\n```"))
        bad = await code_reward(row, _answer("```python\nprint('no')\n```"))
        assert good.reward == 1.0, (row["task_id"], good.metrics)
        assert bad.reward == 0.0


def test_functional_string_inputs_are_one_json_value_per_line() -> None:
    prep = _script("examples/deepcoder/prepare_deepcoder_data.py")
    [case] = prep.normalise_tests([{"input": "[1, 2]\n3", "output": "1", "testtype": "functional",
                                    "metadata": {"func_name": "f"}}])  # fmt: skip
    # LiveCodeBench stores functional outputs as JSON text, as its inputs: decoded once, here (grading.py)
    assert case == {"input": [[1, 2], 3], "output": 1, "testtype": "functional", "fn_name": "f"}
    with pytest.raises(ValueError):
        prep.normalise_tests({"inputs": ["1"], "outputs": []})


def test_rag_sample_rows(tmp_path) -> None:
    prep = _script("examples/rag/prepare_rag_data.py")
    argv = ["--sample", "--out-dir", str(tmp_path), "--register", "no", "--retrieval-url", "http://h:1"]
    assert prep.main(argv) == 0
    rows = load_rows(tmp_path / "test.jsonl")
    assert len(rows) == 30 and all(r["retrieval_url"] == "http://h:1" for r in rows)
    assert {r["type"] for r in rows} == {"bridge", "comparison"} and len(rows[0]["supporting_titles"]) == 2
    from agentboost.environments.rag_env import RagEnv

    env = RagEnv.from_dict(rows[0])
    assert env.reset()[0]["prompt"] == rows[0]["question"] and [t.tool_name for t in env.tools] == ["retrieve"]
