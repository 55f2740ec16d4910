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
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from .config import SandboxResult

PASSED, WRONG, ERROR, TIMEOUT = "passed", "wrong answer", "runtime error", "time limit exceeded"
OUTPUT_LIMIT, NOT_RUN = "output limit exceeded", "not run"
SUITE_TIME_LIMIT = "suite time limit exceeded"
CALL_MARK = "__agentboost_result__"
DEFAULT_FLOAT_TOLERANCE = 1e-6
DEFAULT_OUTPUT_FLOOR = 64 * 1024
"""Output every test may write whatever its expected size (``SandboxConfig.stdout_cap``'s default)."""
SIGXCPU = 24
_REAL = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


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
        if not _NUMBER.match(got):
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
            if want != token and not (_REAL.match(want) and rule.tokens_match(token, want)):
                return False
    return True


def same_value(got: Any, want: Any, float_tolerance: float | FloatRule | None = DEFAULT_FLOAT_TOLERANCE) -> bool:
    """Equality of JSON values with the same JSON types (bools are not numbers); integers exactly, reals
    (where ``want`` is one) by the float rule."""
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(want, bool) and isinstance(got, bool) and want == got
    if isinstance(want, float) and isinstance(got, int | float):
        return as_rule(float_tolerance).close(float(got), want)
    if isinstance(want, int) and isinstance(got, int | float):
        return got == want  # exactly (an equal float is equal; a nearby one is not)
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(same_value(g, w, float_tolerance) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict) and isinstance(got, dict):
        return want.keys() == got.keys() and all(same_value(got[k], want[k], float_tolerance) for k in want)
    return type(want) is type(got) and want == got


def expected_size(test: TestCase) -> int:
    """Bytes of the expected output as the program would print it."""
    expected = test.output if isinstance(test.output, str) and test.kind == "stdin" else json.dumps(test.output)
    return len(expected.encode("utf-8")) + (len(CALL_MARK) + 2 if test.kind == "call" else 0)


def _judge_call(expected: Any, result: SandboxResult, rule: FloatRule) -> tuple[bool, str]:
    marker = result.stdout.rfind(CALL_MARK)
    if marker < 0:
        return False, result.stdout
    payload = result.stdout[marker + len(CALL_MARK) :].strip()
    try:
        got = json.loads(payload)
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
    """The verdict on one test from what the program did (the same whether it ran alone or in a batch)."""
    too_long = len(result.stdout.encode("utf-8", errors="replace")) > output_limit(test, output_floor)
    if result.stdout_truncated or result.stderr_truncated or too_long:  # killed for it, or past the limit
        return TestOutcome(OUTPUT_LIMIT, result.stdout[:2000], result.stderr, result.exit_code)
    if result.timed_out or result.signal == SIGXCPU:  # the wall clock or the CPU limit
        return TestOutcome(TIMEOUT, result.stdout, result.stderr, result.exit_code)
    if result.exit_code != 0:
        return TestOutcome(ERROR, result.stdout, result.stderr, result.exit_code)
    rule = as_rule(float_tolerance)
    if test.kind == "call":
        ok, got = _judge_call(test.output, result, rule)
    else:
        ok, got = outputs_match(test.output, result.stdout, float_tolerance=rule), result.stdout
    return TestOutcome(PASSED if ok else WRONG, got, result.stderr, result.exit_code)
