"""Run a program against test cases in the sandbox and compare outputs on the host.

Two kinds of tests (the formats of TACO / LiveCodeBench / DeepCoder):

* ``stdin``: feed ``input`` on stdin, compare stdout with ``output``;
* ``call``: call function ``fn_name`` (or ``Solution().fn_name`` when the program defines a
  ``Solution`` class) with the ``input`` arguments (a list, or LiveCodeBench's string with one JSON
  value per line, one line per argument), compare the JSON result.

The comparison happens here, in the trusted process, from what the sandbox printed: nothing the
program does can mark a test as passed except producing the expected output.

* ``stdin``: line by line, token by token (spacing and trailing blank lines ignored); where the
  expected token is a real number (``0.5``, ``1e-9``) the output's may differ by ``float_tolerance``
  (absolute or relative, default 1e-6; None: exact). Output beyond twice the expected size is an
  ``output limit exceeded`` verdict, so a correct long answer is never cut short.
* ``call``: the JSON result must equal the expected value with the same JSON types (``true`` is not
  ``1``, ``3`` is not ``[3]``); reals within ``float_tolerance``. Sources that wrap return values
  (TACO wraps each in a one-element list) are unwrapped when the data is prepared, not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from .batch import BatchInput, check_batches, run_batch
from .sandbox import Sandbox, SandboxResult

PASSED, WRONG, ERROR, TIMEOUT = "passed", "wrong answer", "runtime error", "time limit exceeded"
OUTPUT_LIMIT, NOT_RUN = "output limit exceeded", "not run"
_CALL_MARK = "__agentboost_result__"
DEFAULT_FLOAT_TOLERANCE = 1e-6
_REAL = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$")


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


def _lines(text: Any) -> list[list[str]]:
    lines = [line.split() for line in str(text).replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _close(a: float, b: float, tolerance: float) -> bool:
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)


def outputs_match(expected: Any, got: str, *, float_tolerance: float | None = DEFAULT_FLOAT_TOLERANCE) -> bool:
    """Token-wise equality, reals (as written in ``expected``) within ``float_tolerance`` (module doc)."""
    exp, out = _lines(expected), _lines(got)
    if exp == out:
        return True
    if float_tolerance is None or len(exp) != len(out):
        return False
    for a, b in zip(exp, out, strict=True):
        if len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=True):
            if x == y:
                continue
            if not _REAL.match(x):
                return False
            try:
                if not _close(float(x), float(y), float_tolerance):
                    return False
            except ValueError:
                return False
    return True


def same_value(got: Any, want: Any, float_tolerance: float | None = DEFAULT_FLOAT_TOLERANCE) -> bool:
    """Equality of JSON values with the same JSON types (bools are not numbers); reals within tolerance."""
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(want, bool) and isinstance(got, bool) and want == got
    if isinstance(want, int | float) and isinstance(got, int | float):
        if isinstance(want, float) or isinstance(got, float):
            return want == got or (float_tolerance is not None and _close(float(got), float(want), float_tolerance))
        return want == got
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(same_value(g, w, float_tolerance) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict) and isinstance(got, dict):
        return want.keys() == got.keys() and all(same_value(got[k], want[k], float_tolerance) for k in want)
    return type(want) is type(got) and want == got


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


def _judge_call(expected: Any, result: SandboxResult, float_tolerance: float | None) -> tuple[bool, str]:
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
    return same_value(got, want, float_tolerance), payload


def _stdout_cap(test: TestCase, sandbox: Sandbox) -> int:
    """Room for twice the expected output (what a correct program prints always fits)."""
    expected = test.output if isinstance(test.output, str) else json.dumps(test.output)
    return max(sandbox.config.stdout_cap, 2 * len(expected.encode("utf-8")) + 4096)


def _program(code: str, test: TestCase) -> str:
    if test.kind == "call":
        assert test.fn_name is not None
        return _call_program(code, test.fn_name)
    return code


def _stdin(test: TestCase) -> str:
    if test.kind == "call":
        return test.input if isinstance(test.input, str) else json.dumps(test.input)
    return str(test.input)


def judge(
    test: TestCase, result: SandboxResult, float_tolerance: float | None = DEFAULT_FLOAT_TOLERANCE
) -> TestOutcome:
    """The verdict on one test from what the program did (the same whether it ran alone or in a batch)."""
    if result.stdout_truncated:  # killed for it, or flooded as the time ran out: either way too much output
        return TestOutcome(OUTPUT_LIMIT, result.stdout[:2000], result.stderr, result.exit_code)
    if result.timed_out or result.signal == 24:  # wall clock or the CPU limit's SIGXCPU
        return TestOutcome(TIMEOUT, result.stdout, result.stderr, result.exit_code)
    if result.exit_code != 0:
        return TestOutcome(ERROR, result.stdout, result.stderr, result.exit_code)
    if test.kind == "call":
        ok, got = _judge_call(test.output, result, float_tolerance)
    else:
        ok, got = outputs_match(test.output, result.stdout, float_tolerance=float_tolerance), result.stdout
    return TestOutcome(PASSED if ok else WRONG, got, result.stderr, result.exit_code)


async def _run_alone(sandbox: Sandbox, code: str, test: TestCase, timeout_s: float) -> SandboxResult:
    return await sandbox.run(_program(code, test), stdin=_stdin(test), timeout_s=timeout_s,
                             stdout_cap=_stdout_cap(test, sandbox), kill_on_overflow=True)  # fmt: skip


async def run_test_case(
    sandbox: Sandbox,
    code: str,
    test: TestCase,
    *,
    timeout_s: float,
    float_tolerance: float | None = DEFAULT_FLOAT_TOLERANCE,
) -> TestOutcome:
    """One test in a sandbox of its own."""
    return judge(test, await _run_alone(sandbox, code, test, timeout_s), float_tolerance)


async def run_test_cases(
    sandbox: Sandbox,
    code: str,
    tests: list[TestCase],
    *,
    timeout_s: float = 6.0,
    float_tolerance: float | None = DEFAULT_FLOAT_TOLERANCE,
    stop_after_timeout: bool = False,
    batch: bool = True,
) -> list[TestOutcome]:
    """Run every test; one outcome per test, in order.

    Where the sandbox allows it (:func:`~agentboost.sandbox.batch.check_batches`) and ``batch`` is True,
    the tests of a program run through batch harnesses (each test still a fresh program with its own
    limits; far less start-up per test); otherwise each test runs in a sandbox of its own, concurrently
    (bounded by the sandbox's slots). The verdicts are the same either way.

    ``stop_after_timeout``: once a test exceeds the time limit, tests not finished yet are cancelled
    and reported ``not run`` (a program that is too slow once cannot pass anyway; this bounds the cost
    of a slow program on a large suite).
    """
    if batch and len(tests) > 1 and await check_batches(sandbox):
        return await _run_batched(sandbox, code, tests, timeout_s=timeout_s, float_tolerance=float_tolerance,
                                  stop_after_timeout=stop_after_timeout)  # fmt: skip
    tasks = [
        asyncio.ensure_future(run_test_case(sandbox, code, t, timeout_s=timeout_s, float_tolerance=float_tolerance))
        for t in tests
    ]
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if stop_after_timeout and any(t.result().verdict == TIMEOUT for t in done):
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
    finally:
        for task in tasks:
            task.cancel()
    return [t.result() if not t.cancelled() else TestOutcome(NOT_RUN) for t in tasks]


async def _run_batched(
    sandbox: Sandbox,
    code: str,
    tests: list[TestCase],
    *,
    timeout_s: float,
    float_tolerance: float | None,
    stop_after_timeout: bool,
) -> list[TestOutcome]:
    outcomes: list[TestOutcome | None] = [None] * len(tests)
    groups: dict[str, list[int]] = {}  # one batch per program text (call-based tests carry their driver)
    for i, test in enumerate(tests):
        groups.setdefault(_program(code, test), []).append(i)
    stopped = False
    for program, members in groups.items():
        if stopped:
            break

        def on_result(k: int, result: SandboxResult, members: list[int] = members) -> bool:
            nonlocal stopped
            outcome = judge(tests[members[k]], result, float_tolerance)
            outcomes[members[k]] = outcome
            stopped = stopped or (stop_after_timeout and outcome.verdict == TIMEOUT)
            return stopped

        async def single(k: int, members: list[int] = members) -> SandboxResult:
            return await _run_alone(sandbox, code, tests[members[k]], timeout_s)

        inputs = [BatchInput(_stdin(tests[i]), _stdout_cap(tests[i], sandbox)) for i in members]
        await run_batch(sandbox, program, inputs, timeout_s=timeout_s, single=single, on_result=on_result,
                        preload_json=tests[members[0]].kind == "call")  # fmt: skip
    return [o if o is not None else TestOutcome(NOT_RUN) for o in outcomes]
