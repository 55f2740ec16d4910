"""Strict tool-call parsing: unit cases and property-based fuzzing over hostile model output."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentboost.chat.parsers import (
    MAX_CALLS_PER_TURN,
    TOOL_NAME_RE,
    HermesParser,
    Llama3JsonParser,
    detect_parser,
    parse_output,
    split_reasoning,
)

hermes = HermesParser()
llama = Llama3JsonParser()


def test_hermes_valid_and_content() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\nDone'
    content, calls = hermes.parse(text)
    assert content == "Sure.\n\nDone"
    assert [(c.name, c.arguments, c.ok) for c in calls] == [("add", {"a": 1}, True)]


def test_hermes_errors_are_reported_not_dropped() -> None:
    cases = {
        '<tool_call>{"name": "add", "arguments": {"a": 1}}': "unclosed",
        "</tool_call>": "unexpected",
        '<tool_call>{"name": "add", "arguments": {"a": 1},}</tool_call>': "invalid JSON",
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "add", "arguments": {}, "extra": 1}</tool_call>': "unexpected key",
        '<tool_call>{"arguments": {}}</tool_call>': 'no "name"',
        '<tool_call>{"name": "a b", "arguments": {}}</tool_call>': "invalid tool name",
        '<tool_call>{"name": "add", "name": "mul", "arguments": {}}</tool_call>': "duplicate key",
        '<tool_call>{"name": "add", "arguments": {"x": NaN}}</tool_call>': "non-finite",
        '<tool_call><tool_call>{"name": "add"}</tool_call>': "invalid JSON",
        "<tool_call>[1, 2]</tool_call>": "JSON object",
    }
    for text, expected in cases.items():
        _, calls = hermes.parse(text)
        assert calls, text
        assert any(c.error and expected in c.error for c in calls), (text, [c.error for c in calls])


def test_hermes_deeply_nested_json_does_not_crash() -> None:
    _, calls = hermes.parse("<tool_call>" + "[" * 50_000 + "</tool_call>")
    assert calls[0].error


def test_call_count_is_capped() -> None:
    one = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    _, calls = hermes.parse(one * (MAX_CALLS_PER_TURN + 5))
    assert len(calls) == MAX_CALLS_PER_TURN + 1
    assert "exceed the limit" in calls[-1].error


def test_llama_json_calls() -> None:
    content, calls = llama.parse(
        '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "mul", "arguments": {}}'
    )
    assert content == ""
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1}), ("mul", {})]
    assert llama.parse("The answer is {not a call}") == ("The answer is {not a call}", [])
    _, bad = llama.parse('{"name": "add", "parameters": {"a": 1}} and more text')
    assert bad[-1].error and "unexpected text" in bad[-1].error
    _, bad = llama.parse('{"name": "add", "parameters": {"a": 1}, "arguments": {}}')
    assert "not both" in bad[0].error
    _, bad = llama.parse('{"name": "add", "parameters": {"a": ')
    assert "invalid JSON" in bad[0].error


def test_reasoning_split_rules() -> None:
    assert split_reasoning("<think>\nplan\n</think>\n\nanswer", prefilled=False) == ("plan", "\n\nanswer", False)
    assert split_reasoning("plan\n</think>\nanswer", prefilled=True) == ("plan", "\nanswer", False)
    assert split_reasoning("<think>never closes", prefilled=False) == ("never closes", "", True)
    assert split_reasoning("still thinking", prefilled=True) == ("still thinking", "", True)
    assert split_reasoning("no reasoning at all", prefilled=False) == (None, "no reasoning at all", False)
    # A stray closing tag: what precedes it is treated as reasoning (never executed).
    assert split_reasoning("draft </think> final", prefilled=False) == ("draft", " final", False)


def test_calls_inside_reasoning_are_never_parsed() -> None:
    draft = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    out = parse_output(f"<think>maybe {draft}</think>Final answer.", hermes, reasoning_prefilled=False)
    assert out.calls == [] and out.content == "Final answer."
    # Prefilled <think>: the output has only the closing tag.
    out = parse_output(f"maybe {draft}</think>Final.", hermes, reasoning_prefilled=True)
    assert out.calls == [] and out.reasoning.startswith("maybe")
    # Unclosed reasoning: no answer, no calls, flagged.
    out = parse_output(f"<think>maybe {draft}", hermes, reasoning_prefilled=False)
    assert out.calls == [] and out.reasoning_unclosed


def test_detect_parser() -> None:
    assert detect_parser("... <tool_call> ...") == "hermes"
    assert detect_parser('{"name": function name, "parameters": dict}') == "llama3_json"
    assert detect_parser("plain chatml") is None


# --- property-based fuzzing ----------------------------------------------------------------
names = st.from_regex(TOOL_NAME_RE, fullmatch=True)
json_scalars = st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
arguments = st.dictionaries(st.text(max_size=10), json_values, max_size=5)
filler = st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=40)
hostile_fragments = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", '"name"', '"arguments"', ":", ",", "NaN",
     "[", "]", '"', "\\", "<|python_tag|>", ";", "\x00", "\ud7ff", "😀", "\n"]
)  # fmt: skip
hostile_text = st.lists(hostile_fragments | st.text(max_size=10), max_size=60).map("".join)
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(hostile_text, st.booleans())
def test_fuzz_never_raises_and_ok_calls_are_well_formed(text: str, prefilled: bool) -> None:
    for parser in (hermes, llama):
        out = parse_output(text, parser, reasoning_prefilled=prefilled)
        for call in out.calls:
            if call.ok:
                assert TOOL_NAME_RE.match(call.name)
                assert isinstance(call.arguments, dict)
                assert call.raw and call.raw in text
            else:
                assert call.error and len(call.error) < 400


@FUZZ
@given(st.lists(st.tuples(names, arguments), min_size=1, max_size=5), filler, filler)
def test_fuzz_hermes_round_trip(calls: list, before: str, after: str) -> None:
    # The one thing the format cannot carry: the closing tag inside an argument.
    assume(all("</tool_call>" not in json.dumps(a, ensure_ascii=False) for _, a in calls))
    blocks = "".join(
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n</tool_call>" for n, a in calls
    )
    content, parsed = hermes.parse(before + blocks + after)
    assert [(c.name, c.arguments) for c in parsed] == calls
    assert all(c.ok for c in parsed)
    assert content == (before + after).strip()


@FUZZ
@given(st.lists(st.tuples(names, arguments), min_size=1, max_size=4))
def test_fuzz_llama_round_trip(calls: list) -> None:
    text = "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    _, parsed = llama.parse(text)
    assert [(c.name, c.arguments) for c in parsed] == calls


@FUZZ
@given(hostile_text, st.lists(st.tuples(names, arguments), min_size=1, max_size=3))
def test_fuzz_reasoning_never_leaks_calls(reasoning: str, calls: list) -> None:
    # Reasoning ends at the first </think>; the drafts must not contain one to stay inside it.
    assume(all("</think>" not in json.dumps(a) for _, a in calls))
    reasoning = reasoning.replace("</think>", "")
    drafts = "".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in calls)
    out = parse_output(f"<think>{reasoning}{drafts}</think>plain answer", hermes, reasoning_prefilled=False)
    assert out.calls == []
    assert out.content == "plain answer"


@FUZZ
@given(hostile_text)
def test_fuzz_unclosed_call_is_never_silently_dropped(prefix: str) -> None:
    prefix = (
        prefix.replace("<tool_call>", "").replace("</tool_call>", "").replace("<think>", "").replace("</think>", "")
    )
    _, calls = hermes.parse(prefix + '<tool_call>{"name": "add", "arguments": {"a": 1}')
    assert calls and not calls[-1].ok and "unclosed" in calls[-1].error
