"""Test cases and verdicts: what a test expects and how a program's output is compared with it, on the host.

Two kinds of tests (the formats of TACO / LiveCodeBench / DeepCoder):

* ``stdin``: feed ``input`` on stdin, compare stdout with ``output``;
* ``call``: call function ``fn_name`` (or ``Solution().fn_name`` when the program defines a ``Solution``
  class) with the ``input`` arguments, compare the returned value.

The comparison happens here, in the trusted process, from what the sandbox printed: nothing the program
does can mark a test as passed except producing the expected output, and nothing derived from the expected
output is ever in the program's reach.

* Expected values keep the type the dataset stores. A call-based test's ``output`` is the return value
  itself (TACO and PrimeIntellect store values; TACO's one-element wrapping is removed when the data is
  prepared): a string ``"100"`` is the string ``"100"``, never the number 100. LiveCodeBench stores its
  functional tests as JSON text, inputs and outputs alike (its grader ``json.loads`` both): such a test
  (its ``input`` a string of one JSON value per line) has its ``output`` decoded once, when it is read
  (:meth:`TestCase.from_dict`), and prepared data stores the decoded value.
* ``call``: the result must equal the expected value with the same JSON types (``true`` is not ``1``,
  ``3`` is not ``[3]``); integers exactly (a float passes for an integer only when it equals it exactly);
  reals (where the *expected* value is a float) by the float rule.
* ``stdin``: line by line, token by token (spacing and trailing blank lines ignored); tokens equal as
  text, or, where the *expected* token is written as a real (``0.5``, ``1e-9``), numerically by the float
  rule. An expected integer token is matched exactly.
* Float rule (:class:`FloatRule`): ``|got - want| <= abs + rel * |want|``, numpy's ``isclose``, which is
  what the TACO / APPS / PrimeIntellect graders use (``rel`` 1e-5, ``abs`` 1e-8) on reals; LiveCodeBench's
  grader compares decimals exactly (``Decimal``: ``0.50`` is ``0.5``), which :data:`EXACT` does. A task's
  ``float_tolerance`` (a number: ``rel = abs = tolerance``; ``None``: exact) overrides its source's rule
  (:func:`float_rule_for`); without either, :data:`DEFAULT_FLOAT_TOLERANCE`.
* Output past twice the expected size plus 4 KiB (and past the sandbox's ``stdout_cap``, 64 KiB by
  default) is ``output limit exceeded``, decided here after the run: a correct long answer is never cut
  short, and the limit the program runs under is the same for every test (it does not depend on the
  expected output).
* Exit statuses are what they are: a program that exits with status 152 has a runtime error, only a
  death by SIGXCPU (the CPU limit) or the wall clock is a time limit.

No output can crash or stall a verdict (the program's output is hostile):

* its bytes are cut at the test's output limit before they are decoded (``SandboxResult.stdout_size``
  says how many there were); an outcome keeps at most :data:`SHOWN_CHARS` of them, and of stderr;
* a token is a number only when it is at most :data:`MAX_NUMBER_CHARS` long and of the form
  ``[+-]digits[.digits][e[+-]digits]`` (ASCII digits), checked in linear time (no regex);
* a call-based result is parsed as JSON with a depth cap (:data:`MAX_JSON_DEPTH`, checked by a linear scan
  before parsing) and integers of at most :data:`MAX_INT_DIGITS` digits; an integer no float can hold
  is not close to any real;
* anything else that goes wrong while parsing or comparing the program's value is a ``wrong answer``
  (logged): the output's shape is the program's doing, so it scores 0 and is trained on, never masked;
* :func:`verdict` judges off the event loop (a worker thread; a pool worker's heartbeat keeps beating)
  within :data:`VERDICT_S`: a verdict not reached by then is ``judging time limit exceeded``, the
  program's fault too (0, trained on). Every step is linear in the output kept, so only an extremely
  loaded machine gets near it. Only tiny verdicts (:data:`INLINE_BYTES`) are reached on the loop: they
  cost less than a thread hop.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from itertools import accumulate
from typing import Any

from .config import SandboxResult

logger = logging.getLogger(__name__)

PASSED, WRONG, ERROR, TIMEOUT = "passed", "wrong answer", "runtime error", "time limit exceeded"
OUTPUT_LIMIT, NOT_RUN = "output limit exceeded", "not run"
SUITE_TIME_LIMIT = "suite time limit exceeded"
JUDGE_TIME_LIMIT = "judging time limit exceeded"
CALL_MARK = "__agentboost_result__"
DEFAULT_FLOAT_TOLERANCE = 1e-6
DEFAULT_OUTPUT_FLOOR = 64 * 1024
"""Output every test may write whatever its expected size (``SandboxConfig.stdout_cap``'s default)."""
SIGXCPU = 24
MAX_NUMBER_CHARS = 4096
"""A longer token is never a number (compared as text only)."""
MAX_JSON_DEPTH = 512
"""A call-based result nested deeper is a wrong answer (not parsed)."""
MAX_INT_DIGITS = 4300
"""Digits of an integer in a call-based result (Python's own default limit, whatever the process set)."""
SHOWN_CHARS = 2000
"""Characters an outcome keeps of the output (its start; the verdict saw all of it) and of stderr (its end),
for reports: a suite's outcomes hold little whatever its programs wrote."""
VERDICT_S = 30.0
"""Seconds :func:`verdict` waits for a verdict (module doc)."""
INLINE_BYTES = 8192
"""A verdict on at most this much (output kept plus expected output) is reached on the event loop: tens of
microseconds, less than handing it to a thread costs (about 80 µs of CPU)."""
_NUMBER_CHARS = "0123456789+-.eE"
_BRACKETS = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)


def is_number(token: str, *, real: bool = False) -> bool:
    """Whether ``token`` is ``[+-]digits[.digits][(e|E)[+-]digits]`` (digits on at least one side of the
    point), at most :data:`MAX_NUMBER_CHARS` long; ``real``: written with a point or an exponent. Linear
    whatever the token holds: a strip (its characters are those of the grammar) and ``float``, which then
    accepts exactly the grammar (no ``inf``, ``nan``, ``_`` or spaces can be left)."""
    if not 0 < len(token) <= MAX_NUMBER_CHARS or token.strip(_NUMBER_CHARS):
        return False
    try:
        float(token)
    except ValueError:
        return False
    return not real or "." in token or "e" in token or "E" in token


@dataclass(frozen=True)
class FloatRule:
    """Reals match when ``|got - want| <= abs + rel * |want|``; ``rel == abs == 0``: equal as decimals."""

    rel: float
    abs: float

    @property
    def exact(self) -> bool:
        return self.rel == 0 and self.abs == 0

    def close(self, got: float, want: float) -> bool:
        if got == want:
            return True
        if self.exact or not (math.isfinite(got) and math.isfinite(want)):
            return False
        return abs(got - want) <= self.abs + self.rel * abs(want)

    def tokens_match(self, got: str, want: str) -> bool:
        """An output token against an expected token written as a real."""
        if not is_number(got):
            return False
        if self.exact:
            try:
                return Decimal(got) == Decimal(want)
            except InvalidOperation:
                return False
        try:
            return self.close(float(got), float(want))
        except (ValueError, OverflowError):
            return False


EXACT = FloatRule(0.0, 0.0)
TACO = FloatRule(1e-5, 1e-8)
_SOURCES = {"taco": TACO, "apps": TACO, "code_contests": TACO, "primeintellect": TACO, "livecodebench": EXACT,
            "lcb": EXACT, "lcbv5": EXACT, "lcbv6": EXACT}  # fmt: skip


def as_rule(tolerance: float | FloatRule | None) -> FloatRule:
    """A task's ``float_tolerance``: a number (``rel = abs``), None (exact) or a rule."""
    if isinstance(tolerance, FloatRule):
        return tolerance
    if tolerance is None:
        return EXACT
    return FloatRule(float(tolerance), float(tolerance))


def float_rule_for(task: dict[str, Any]) -> FloatRule:
    """The task's ``float_tolerance`` if it sets one, else its source benchmark's rule (``data_source``:
    TACO, APPS, CodeContests and PrimeIntellect: TACO's; LiveCodeBench: exact), else the default."""
    if "float_tolerance" in task:
        return as_rule(task["float_tolerance"])
    source = str(task.get("data_source") or "").lower()
    rule = _SOURCES.get(source) or next((r for k, r in _SOURCES.items() if source.startswith(k)), None)
    return rule or as_rule(DEFAULT_FLOAT_TOLERANCE)


@dataclass(frozen=True)
class TestCase:
    __test__ = False  # not a pytest test class

    input: Any
    output: Any
    kind: str = "stdin"
    fn_name: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TestCase:
        kind = str(data.get("testtype", data.get("kind", "stdin")))
        kind = "call" if kind in ("call", "functional", "call_based") else "stdin"
        fn_name = data.get("fn_name") or (data.get("metadata") or {}).get("func_name")
        if kind == "call" and not fn_name:
            raise ValueError("a call-based test needs fn_name")
        value, output = data["input"], data["output"]
        if kind == "call" and isinstance(value, str):  # LiveCodeBench: inputs and output are JSON text
            value = _call_arguments(value)
            output = _json_value(output)
        return cls(input=value, output=output, kind=kind, fn_name=fn_name)

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input, "output": self.output, "kind": self.kind, "fn_name": self.fn_name}


@dataclass
class TestOutcome:
    verdict: str
    got: str = ""
    stderr: str = ""
    exit_code: int | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED


def _call_arguments(text: str) -> list[Any]:
    """LiveCodeBench's functional input: one JSON value per line, one line per argument."""
    try:
        return [json.loads(line) for line in text.split("\n") if line.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(f"call-based test input is not one JSON value per line: {exc.msg}") from None


def _json_value(output: Any) -> Any:
    """LiveCodeBench's functional output: JSON text of the return value."""
    if not isinstance(output, str):
        return output
    try:
        return json.loads(output)
    except json.JSONDecodeError as exc:
        raise ValueError(f"call-based test output given as text is not JSON: {exc.msg}") from None


def _lines(text: Any) -> list[list[str]]:
    lines = [line.split() for line in str(text).replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_match(
    expected: Any, got: str, *, float_tolerance: float | FloatRule | None = DEFAULT_FLOAT_TOLERANCE
) -> bool:
    """Token-wise equality; expected tokens written as reals numerically, by the float rule (module doc)."""
    exp, out = _lines(expected), _lines(got)
    if exp == out:
        return True
    if len(exp) != len(out):
        return False
    rule = as_rule(float_tolerance)
    for a, b in zip(exp, out, strict=True):
        if len(a) != len(b):
            return False
        for want, token in zip(a, b, strict=True):
            if want != token and not (is_number(want, real=True) and rule.tokens_match(token, want)):
                return False
    return True


def same_value(got: Any, want: Any, float_tolerance: float | FloatRule | None = DEFAULT_FLOAT_TOLERANCE) -> bool:
    """Equality of JSON values with the same JSON types (bools are not numbers); integers exactly, reals
    (where ``want`` is one) by the float rule. Walks both with a stack of its own, not by recursion: a
    result nested as deep as :data:`MAX_JSON_DEPTH` compares like a flat one (recursing, two frames a
    level, a correct result nested about 490 deep raised RecursionError: a wrong answer)."""
    rule = as_rule(float_tolerance)
    pairs = [(got, want)]
    while pairs:
        got, want = pairs.pop()
        if isinstance(want, bool) or isinstance(got, bool):
            same = isinstance(want, bool) and isinstance(got, bool) and want == got
        elif isinstance(want, float) and isinstance(got, int | float):
            try:
                same = rule.close(float(got), want)
            except OverflowError:  # an integer past every float: no real is close to it
                same = False
        elif isinstance(want, int) and isinstance(got, int | float):
            same = got == want  # exactly (an equal float is equal; a nearby one is not)
        elif isinstance(want, list) and isinstance(got, list):
            same = len(want) == len(got)
            pairs.extend(zip(got, want, strict=False))
        elif isinstance(want, dict) and isinstance(got, dict):
            same = want.keys() == got.keys()
            if same:
                pairs.extend((got[k], want[k]) for k in want)
        else:
            same = type(want) is type(got) and want == got
        if not same:
            return False
    return True


def expected_size(test: TestCase) -> int:
    """Bytes of the expected output as the program would print it."""
    expected = test.output if isinstance(test.output, str) and test.kind == "stdin" else json.dumps(test.output)
    return len(expected.encode("utf-8")) + (len(CALL_MARK) + 2 if test.kind == "call" else 0)


def parse_value(text: str) -> Any:
    """A call-based result: JSON nested at most :data:`MAX_JSON_DEPTH` deep (checked before parsing, in
    linear time), integers of at most :data:`MAX_INT_DIGITS` digits; ValueError otherwise."""
    if _too_deep(text):
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} deep")
    return _DECODER.decode(text)


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(digits)


_DECODER = json.JSONDecoder(parse_int=_bounded_int)  # (one, as json.loads shares its own)


def _too_deep(text: str) -> bool:
    """Whether the brackets of JSON text nest deeper than :data:`MAX_JSON_DEPTH` outside its strings (text
    that is not JSON may be said to: it fails anyway). String and bytes methods, C iterators: linear."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return False
    plain = text.encode("utf-8", errors="replace").replace(b"\\\\", b"")  # escaped backslashes, then
    plain = plain.replace(b'\\"', b"")  # escaped quotes: what is left of a quote delimits a string
    outside = b"".join(plain.split(b'"')[::2])  # (UTF-8: no byte of a multi-byte character is ASCII)
    steps = map(_BRACKETS.__getitem__, outside.translate(None, _NOT_BRACKETS))
    return max(accumulate(steps), default=0) > MAX_JSON_DEPTH


def _judge_call(expected: Any, stdout: str, rule: FloatRule) -> tuple[bool, str]:
    marker = stdout.rfind(CALL_MARK)
    if marker < 0:
        return False, stdout
    payload = stdout[marker + len(CALL_MARK) :].strip()
    try:
        got = parse_value(payload)
    except ValueError:
        return False, payload
    return same_value(got, expected, rule), payload


def output_limit(test: TestCase, floor: int = DEFAULT_OUTPUT_FLOOR) -> int:
    """Bytes of stdout past which a test is ``output limit exceeded``."""
    return max(floor, 2 * expected_size(test) + 4096)


def judge(
    test: TestCase,
    result: SandboxResult,
    float_tolerance: float | FloatRule | None = DEFAULT_FLOAT_TOLERANCE,
    *,
    output_floor: int = DEFAULT_OUTPUT_FLOOR,
) -> TestOutcome:
    """The verdict on one test from what the program did (the same whether it ran alone or in a batch).
    Never raises for anything in the program's output (module doc)."""
    size = result.stdout_size
    if size is None:
        size = len(result.stdout.encode("utf-8", errors="replace"))
    shown, stderr = result.stdout[:SHOWN_CHARS], result.stderr[-SHOWN_CHARS:]
    if result.output_limited or size > output_limit(test, output_floor):  # killed for it, or past the limit
        return TestOutcome(OUTPUT_LIMIT, shown, stderr, result.exit_code)
    if result.timed_out or result.signal == SIGXCPU:  # the wall clock or the CPU limit
        return TestOutcome(TIMEOUT, shown, stderr, result.exit_code)
    if result.exit_code != 0:
        return TestOutcome(ERROR, shown, stderr, result.exit_code)
    rule = as_rule(float_tolerance)
    try:
        if test.kind == "call":
            ok, got = _judge_call(test.output, result.stdout, rule)
        else:
            ok, got = outputs_match(test.output, result.stdout, float_tolerance=rule), result.stdout
    except Exception as exc:  # whatever the output's shape does to a comparison is its verdict
        logger.warning("grading: comparing a program's output raised %s (%.200s): wrong answer", type(exc).__name__,
                       exc)  # fmt: skip
        ok, got = False, result.stdout
    return TestOutcome(PASSED if ok else WRONG, got[:SHOWN_CHARS], stderr, result.exit_code)


async def verdict(
    test: TestCase,
    result: SandboxResult,
    float_tolerance: float | FloatRule | None = DEFAULT_FLOAT_TOLERANCE,
    *,
    output_floor: int = DEFAULT_OUTPUT_FLOOR,
    deadline_s: float = VERDICT_S,
) -> TestOutcome:
    """:func:`judge` in a worker thread; ``judging time limit exceeded`` if it has not come within
    ``deadline_s`` (the thread finishes on its own: every step is linear). Only a verdict on at most
    :data:`INLINE_BYTES` is reached on the event loop (module doc)."""
    if len(result.stdout) * 4 + expected_size(test) <= INLINE_BYTES:  # (4: the most bytes a character takes)
        return judge(test, result, float_tolerance, output_floor=output_floor)
    work = functools.partial(judge, test, result, float_tolerance, output_floor=output_floor)
    try:
        return await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, work), deadline_s)
    except (TimeoutError, asyncio.TimeoutError):
        logger.warning("grading: no verdict within %gs (%d bytes of output): %s", deadline_s,
                       result.stdout_size or len(result.stdout), JUDGE_TIME_LIMIT)  # fmt: skip
        return TestOutcome(
            JUDGE_TIME_LIMIT, result.stdout[:SHOWN_CHARS], result.stderr[-SHOWN_CHARS:], result.exit_code
        )
