"""Strict client-side parsing of raw model output: reasoning split and tool calls.

Model output is hostile input. Nothing here evaluates, repairs or guesses: a call is either exactly
well-formed or it is reported as an error that the agent sees as a tool result (and that is counted).

* Reasoning (``<think>...</think>``) is split off first and never searched for calls. Templates that
  prefill ``<think>`` in the generation prompt produce output with only the closing tag; an output
  whose reasoning never closes has no answer and no calls.
* ``hermes`` (Qwen2.5, Qwen3, Qwen3-2507, Hermes): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks anywhere in the answer. A block ends at the first ``</tool_call>`` (so that literal cannot
  appear inside arguments; such a call is reported as invalid JSON).
* Reasoning ends at the first ``</think>`` (vLLM's Qwen3 reasoning parser does the same).
* ``llama3_json`` (Llama 3.1+): the whole answer is one JSON object ``{"name": ..., "parameters": {...}}``
  (optionally after ``<|python_tag|>``), or several separated by ``;``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")
MAX_CALLS_PER_TURN = 32
MAX_ERROR_SNIPPET = 200


@dataclass
class ParsedCall:
    """One tool call found in the output; ``error`` is set when it is malformed."""

    name: str
    arguments: dict[str, Any] | None
    raw: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class ParsedOutput:
    reasoning: str | None
    content: str
    """Answer text with the tool-call markup removed."""
    calls: list[ParsedCall] = field(default_factory=list)
    reasoning_unclosed: bool = False

    @property
    def parse_errors(self) -> int:
        return sum(1 for c in self.calls if not c.ok)


def _snippet(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_ERROR_SNIPPET else text[:MAX_ERROR_SNIPPET] + "..."


def split_reasoning(text: str, *, prefilled: bool) -> tuple[str | None, str, bool]:
    """Return ``(reasoning, answer, unclosed)``.

    ``prefilled`` means the generation prompt already opened ``<think>``. The first ``</think>``
    ends the reasoning (as vLLM's Qwen3 reasoning parser does); ``<think>`` only opens reasoning at
    the very start of the output.
    """
    stripped = text.lstrip()
    opened = prefilled or stripped.startswith(THINK_OPEN)
    if not opened:
        if THINK_CLOSE in text:
            # A stray closing tag without an opening one: treat what precedes it as reasoning too,
            # so that draft calls before it are never executed.
            head, _, tail = text.partition(THINK_CLOSE)
            return head.strip(), tail, False
        return None, text, False
    body = stripped[len(THINK_OPEN) :] if stripped.startswith(THINK_OPEN) else text
    if THINK_CLOSE not in body:
        return body.strip(), "", True
    head, _, tail = body.partition(THINK_CLOSE)
    return head.strip(), tail, False


def _strict_object(text: str) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            out[key] = value
        return out

    def no_constants(name: str) -> Any:
        raise ValueError(f"non-finite number {name} is not JSON")

    try:
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constants)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _validate_call(obj: Any, raw: str, args_key: str, alt_key: str | None = None) -> ParsedCall:
    if not isinstance(obj, dict):
        return ParsedCall("", None, raw, "a tool call must be a JSON object")
    name = obj.get("name")
    keys = {"name", args_key} | ({alt_key} if alt_key else set())
    extra = sorted(set(obj) - keys)
    if not isinstance(name, str) or not name:
        return ParsedCall("", None, raw, 'the tool call has no "name" string')
    if not TOOL_NAME_RE.match(name):
        return ParsedCall(name, None, raw, f"invalid tool name {_snippet(name)!r}")
    if extra:
        return ParsedCall(name, None, raw, f"unexpected key(s) {extra} in the tool call")
    present = [k for k in (args_key, alt_key) if k and k in obj]
    if len(present) > 1:
        return ParsedCall(name, None, raw, f'give either "{args_key}" or "{alt_key}", not both')
    args = obj.get(present[0]) if present else {}
    if not isinstance(args, dict):
        return ParsedCall(name, None, raw, f'"{present[0]}" must be a JSON object, got {type(args).__name__}')
    return ParsedCall(name, args, raw)


class ToolCallParser(Protocol):
    name: str

    def parse(self, answer: str) -> tuple[str, list[ParsedCall]]:
        """Return (content without call markup, calls)."""
        ...


class HermesParser:
    """``<tool_call>{json}</tool_call>`` blocks (Qwen2.5 / Qwen3 / Hermes templates)."""

    name = "hermes"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def parse(self, answer: str) -> tuple[str, list[ParsedCall]]:
        calls: list[ParsedCall] = []
        content_parts: list[str] = []
        pos = 0
        while True:
            start = answer.find(self.open_tag, pos)
            stray_close = answer.find(self.close_tag, pos)
            if stray_close != -1 and (start == -1 or stray_close < start):
                content_parts.append(answer[pos:stray_close])
                calls.append(
                    ParsedCall("", None, self.close_tag, f"unexpected {self.close_tag} without {self.open_tag}")
                )
                pos = stray_close + len(self.close_tag)
                continue
            if start == -1:
                content_parts.append(answer[pos:])
                break
            content_parts.append(answer[pos:start])
            body_start = start + len(self.open_tag)
            end = answer.find(self.close_tag, body_start)
            if end == -1:
                raw = answer[start:]
                calls.append(ParsedCall(_guess_name(raw), None, raw, f"unclosed {self.open_tag} (no {self.close_tag})"))
                break
            body = answer[body_start:end]
            raw = answer[start : end + len(self.close_tag)]
            pos = end + len(self.close_tag)
            try:
                obj = _strict_object(body)
            except ValueError as exc:
                calls.append(ParsedCall(_guess_name(body), None, raw, f"invalid JSON in tool call: {exc}"))
                continue
            calls.append(_validate_call(obj, raw, "arguments"))
        return "".join(content_parts).strip(), _cap(calls)


class Llama3JsonParser:
    """Llama 3.1+ JSON tool calls: the whole answer is ``{"name", "parameters"}`` object(s)."""

    name = "llama3_json"
    python_tag = "<|python_tag|>"

    def parse(self, answer: str) -> tuple[str, list[ParsedCall]]:
        text = answer.strip()
        if text.startswith(self.python_tag):
            text = text[len(self.python_tag) :].lstrip()
        if not text.startswith("{"):
            return answer.strip(), []
        decoder = json.JSONDecoder()
        calls: list[ParsedCall] = []
        pos = 0
        while pos < len(text):
            try:
                _, end = decoder.raw_decode(text, pos)
            except (ValueError, RecursionError) as exc:
                raw = text[pos:]
                calls.append(ParsedCall(_guess_name(raw), None, raw, f"invalid JSON in tool call: {exc}"))
                break
            raw = text[pos:end]
            try:
                obj = _strict_object(raw)
            except ValueError as exc:
                calls.append(ParsedCall(_guess_name(raw), None, raw, f"invalid JSON in tool call: {exc}"))
            else:
                calls.append(_validate_call(obj, raw, "parameters", alt_key="arguments"))
            rest = text[end:].lstrip()
            if not rest:
                break
            if not rest.startswith(";"):
                calls.append(ParsedCall("", None, rest, f"unexpected text after a tool call: {_snippet(rest)!r}"))
                break
            rest = rest[1:].lstrip()
            if not rest:
                break
            pos = len(text) - len(rest)
        return "", _cap(calls)


_NAME_GUESS = re.compile(r'"name"\s*:\s*"([A-Za-z0-9_\-]{1,64})"')


def _guess_name(raw: str) -> str:
    """Best-effort tool name of a malformed call, only used to word the error message."""
    match = _NAME_GUESS.search(raw)
    return match.group(1) if match else ""


def _cap(calls: list[ParsedCall]) -> list[ParsedCall]:
    if len(calls) <= MAX_CALLS_PER_TURN:
        return calls
    extra = len(calls) - MAX_CALLS_PER_TURN
    kept = calls[:MAX_CALLS_PER_TURN]
    kept.append(ParsedCall("", None, "", f"{extra} more tool calls exceed the limit of {MAX_CALLS_PER_TURN} per turn"))
    return kept


PARSERS: dict[str, type] = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}


def get_parser(name: str) -> ToolCallParser:
    try:
        return PARSERS[name]()  # type: ignore[no-any-return]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {sorted(PARSERS)}") from None


def detect_parser(chat_template: str) -> str | None:
    """Guess the tool-call format from the chat template text."""
    if "<tool_call>" in chat_template:
        return "hermes"
    if "<|python_tag|>" in chat_template or '"parameters": ' in chat_template:
        return "llama3_json"
    return None


def parse_output(
    text: str, parser: ToolCallParser, *, reasoning_prefilled: bool, reasoning: bool = True
) -> ParsedOutput:
    """Split reasoning (when the family has it), then parse tool calls out of the answer only."""
    if reasoning:
        thought, answer, unclosed = split_reasoning(text, prefilled=reasoning_prefilled)
    else:
        thought, answer, unclosed = None, text, False
    if unclosed:
        return ParsedOutput(thought, "", [], reasoning_unclosed=True)
    content, calls = parser.parse(answer)
    return ParsedOutput(thought, content, calls)
