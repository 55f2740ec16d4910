"""Run a program against test cases in the sandbox and compare outputs on the host.

Two kinds of tests (the formats of TACO / LiveCodeBench / DeepCoder):

* ``stdin``: feed ``input`` on stdin, compare stdout with ``output``;
* ``call``: call function ``fn_name`` (or ``Solution().fn_name`` when the program defines a
  ``Solution`` class) with the ``input`` arguments (a list, or LiveCodeBench's string with one JSON
  value per line, one line per argument), compare the JSON result.

The comparison happens here, in the trusted process, from what the sandbox printed: nothing the
program does can mark a test as passed except producing the expected output. Outputs are compared
line by line with trailing whitespace ignored (and numbers compared with a tolerance if
``float_tolerance`` is set).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from dataclasses import dataclass
from typing import Any

from .sandbox import Sandbox, SandboxResult

PASSED, WRONG, ERROR, TIMEOUT = "passed", "wrong answer", "runtime error", "time limit exceeded"
_CALL_MARK = "__agentboost_result__"


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
        value = data["input"]
        if kind == "call" and isinstance(value, str):
            value = _call_arguments(value)
        return cls(input=value, output=data["output"], kind=kind, fn_name=fn_name)

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


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in str(text).replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_match(expected: Any, got: str, *, float_tolerance: float | None = None) -> bool:
    exp, out = _lines(expected), _lines(got)
    if exp == out:
        return True
    if float_tolerance is None or len(exp) != len(out):
        return False
    for a, b in zip(exp, out, strict=True):
        ta, tb = a.split(), b.split()
        if len(ta) != len(tb):
            return False
        for x, y in zip(ta, tb, strict=True):
            if x == y:
                continue
            try:
                fx, fy = float(x), float(y)
            except ValueError:
                return False
            if not math.isclose(fx, fy, rel_tol=float_tolerance, abs_tol=float_tolerance):
                return False
    return True


def _call_program(code: str, fn_name: str) -> str:
    """The program plus a driver that calls ``fn_name`` with stdin's JSON arguments."""
    driver = f"""

def __agentboost_call():
    import json as _j, sys as _s
    _args = _j.loads(_s.stdin.read())
    if not isinstance(_args, list):
        _args = [_args]
    _g = globals()
    if "Solution" in _g and hasattr(_g["Solution"], {fn_name!r}):
        _fn = getattr(_g["Solution"](), {fn_name!r})
    else:
        _fn = _g[{fn_name!r}]
    _r = _fn(*_args)
    _s.stdout.write("\\n{_CALL_MARK}" + _j.dumps(_r) + "\\n")

__agentboost_call()
"""
    return code + driver


def _judge_call(expected: Any, result: SandboxResult) -> tuple[bool, str]:
    marker = result.stdout.rfind(_CALL_MARK)
    if marker < 0:
        return False, result.stdout
    payload = result.stdout[marker + len(_CALL_MARK) :].strip()
    try:
        got = json.loads(payload)
    except ValueError:
        return False, payload
    want = expected
    if isinstance(want, str):
        with contextlib.suppress(ValueError):
            want = json.loads(want)
    if isinstance(want, list) and len(want) == 1 and not isinstance(got, list):
        want = want[0]  # TACO wraps single return values in a list
    return got == want, payload


async def run_test_case(
    sandbox: Sandbox, code: str, test: TestCase, *, timeout_s: float, float_tolerance: float | None = None
) -> TestOutcome:
    if test.kind == "call":
        assert test.fn_name is not None
        arguments = test.input if isinstance(test.input, str) else json.dumps(test.input)
        result = await sandbox.run(_call_program(code, test.fn_name), stdin=arguments, timeout_s=timeout_s)
    else:
        result = await sandbox.run(code, stdin=str(test.input), timeout_s=timeout_s)
    if result.timed_out or result.signal == 24:  # wall clock or the CPU limit's SIGXCPU
        return TestOutcome(TIMEOUT, result.stdout, result.stderr, result.exit_code)
    if result.exit_code != 0:
        return TestOutcome(ERROR, result.stdout, result.stderr, result.exit_code)
    if test.kind == "call":
        ok, got = _judge_call(test.output, result)
    else:
        ok, got = outputs_match(test.output, result.stdout, float_tolerance=float_tolerance), result.stdout
    return TestOutcome(PASSED if ok else WRONG, got, result.stderr, result.exit_code)


async def run_test_cases(
    sandbox: Sandbox,
    code: str,
    tests: list[TestCase],
    *,
    timeout_s: float = 6.0,
    float_tolerance: float | None = None,
    stop_at_first_failure: bool = False,
) -> list[TestOutcome]:
    """Run every test (concurrently, bounded by the sandbox's slots); one outcome per test, in order."""
    if stop_at_first_failure:
        outcomes = []
        for test in tests:
            outcome = await run_test_case(sandbox, code, test, timeout_s=timeout_s, float_tolerance=float_tolerance)
            outcomes.append(outcome)
            if not outcome.passed:
                break
        return outcomes
    return list(
        await asyncio.gather(
            *(run_test_case(sandbox, code, t, timeout_s=timeout_s, float_tolerance=float_tolerance) for t in tests)
        )
    )
