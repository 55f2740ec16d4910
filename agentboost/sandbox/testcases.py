"""Run a program against test cases in the sandbox; verdicts are decided on the host (:mod:`.grading`).

A suite runs through batch harnesses where the sandbox allows it (one sandboxed process, every test in
sandboxes of its own inside it: :mod:`.batch`), otherwise one sandbox per test; the verdicts are the same
either way. Every test runs under the same output limit (:data:`OUTPUT_CAP`: nothing about its expected
output reaches the sandbox; ``output limit exceeded`` is decided after the run).

A suite is one owner of the sandbox's slots (:mod:`.slots`: a slow suite cannot keep other suites out),
and it can be given a total budget (``budget_s``): charged only while the suite runs tests (not while it
waits for a slot, see :class:`~agentboost.utils.clock.ChargedClock`), it ends the suite with a verdict
once spent, every test not finished then being ``suite time limit exceeded``.
"""

from __future__ import annotations

import asyncio
import json

from ..utils.clock import ChargedClock, current_clock, use_clock
from .batch import BatchInput, check_batches, run_batch
from .config import SandboxResult
from .grading import (
    CALL_MARK,
    DEFAULT_FLOAT_TOLERANCE,
    ERROR,
    JUDGE_TIME_LIMIT,
    NOT_RUN,
    OUTPUT_LIMIT,
    PASSED,
    SUITE_TIME_LIMIT,
    TIMEOUT,
    WRONG,
    FloatRule,
    TestCase,
    TestOutcome,
    float_rule_for,
    judge,
    output_limit,
    outputs_match,
    same_value,
    verdict,
)
from .sandbox import Sandbox
from .slots import owner_scope

__all__ = [
    "DEFAULT_FLOAT_TOLERANCE", "ERROR", "JUDGE_TIME_LIMIT", "NOT_RUN", "OUTPUT_CAP", "OUTPUT_LIMIT", "PASSED",
    "SUITE_TIME_LIMIT", "TIMEOUT", "WRONG", "FloatRule", "TestCase", "TestOutcome", "float_rule_for", "judge",
    "outputs_match", "run_test_case", "run_test_cases", "same_value",
]  # fmt: skip

OUTPUT_CAP = 16 * 1024 * 1024
"""Bytes of stdout a test may write before it is killed (the same for every test). The host keeps (and
decodes) only the test's output limit and one byte more: past it the verdict is ``output limit exceeded``
whatever the rest holds."""


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
    _s.stdout.write("\\n{CALL_MARK}" + _j.dumps(_r) + "\\n")

__agentboost_call()
"""
    return code + driver


def _program(code: str, test: TestCase) -> str:
    if test.kind == "call":
        assert test.fn_name is not None
        return _call_program(code, test.fn_name)
    return code


def _stdin(test: TestCase) -> str:
    if test.kind == "call":
        return test.input if isinstance(test.input, str) else json.dumps(test.input)
    return str(test.input)


def _output_cap(sandbox: Sandbox) -> int:
    return max(sandbox.config.stdout_cap, OUTPUT_CAP)


def _keep(sandbox: Sandbox, test: TestCase) -> int:
    """Bytes of the test's stdout worth keeping: one past its output limit says it is past."""
    return output_limit(test, sandbox.config.stdout_cap) + 1


async def _run_alone(sandbox: Sandbox, code: str, test: TestCase, timeout_s: float) -> SandboxResult:
    return await sandbox.run(_program(code, test), stdin=_stdin(test), timeout_s=timeout_s,
                             stdout_cap=_output_cap(sandbox), stdout_keep=_keep(sandbox, test))  # fmt: skip


async def run_test_case(
    sandbox: Sandbox,
    code: str,
    test: TestCase,
    *,
    timeout_s: float,
    float_tolerance: float | FloatRule | None = DEFAULT_FLOAT_TOLERANCE,
) -> TestOutcome:
    """One test in a sandbox of its own."""
    result = await _run_alone(sandbox, code, test, timeout_s)
    return await verdict(test, result, float_tolerance, output_floor=sandbox.config.stdout_cap)


async def run_test_cases(
    sandbox: Sandbox,
    code: str,
    tests: list[TestCase],
    *,
    timeout_s: float = 6.0,
    float_tolerance: float | FloatRule | None = DEFAULT_FLOAT_TOLERANCE,
    stop_after_timeout: bool = False,
    batch: bool = True,
    budget_s: float | None = None,
) -> list[TestOutcome]:
    """Run every test; one outcome per test, in order.

    Where the sandbox allows it (:func:`~agentboost.sandbox.batch.check_batches`) and ``batch`` is True,
    the tests of a program run through batch harnesses (each test still in a fresh sandbox of its own
    inside; far less start-up per test); otherwise each test runs in a sandbox of its own, concurrently
    (bounded by the sandbox's slots). The verdicts are the same either way.

    ``stop_after_timeout``: once a test exceeds the time limit, tests not finished yet are cancelled
    and reported ``not run`` (a program that is too slow once cannot pass anyway). ``budget_s``: the whole
    suite's time (module doc); once spent, tests not finished are ``suite time limit exceeded``.
    """
    outcomes: list[TestOutcome | None] = [None] * len(tests)
    with owner_scope():
        clock = ChargedClock(budget_s, parent=current_clock()) if budget_s is not None else None
        if clock is None:
            await _suite(sandbox, code, tests, outcomes, timeout_s, float_tolerance, stop_after_timeout, batch)
        else:
            with use_clock(clock):
                suite = asyncio.ensure_future(
                    _suite(sandbox, code, tests, outcomes, min(timeout_s, budget_s), float_tolerance,
                           stop_after_timeout, batch))  # fmt: skip
            spent = False
            try:
                while not suite.done():
                    left = clock.remaining()
                    if left <= 0:
                        spent = True
                        break
                    await asyncio.wait({suite}, timeout=left)
            finally:
                if not suite.done():
                    suite.cancel()
                    await asyncio.wait({suite})
            if not suite.cancelled():
                suite.result()  # an error in the suite (not the program's) is the caller's
            if spent:
                return [o if o is not None else TestOutcome(SUITE_TIME_LIMIT) for o in outcomes]
    return [o if o is not None else TestOutcome(NOT_RUN) for o in outcomes]


async def _suite(  # noqa: PLR0917 - private, called twice
    sandbox: Sandbox,
    code: str,
    tests: list[TestCase],
    outcomes: list[TestOutcome | None],
    timeout_s: float,
    float_tolerance: float | FloatRule | None,
    stop_after_timeout: bool,
    batch: bool,
) -> None:
    """Fill ``outcomes`` as tests finish."""
    if batch and len(tests) > 1 and await check_batches(sandbox):
        await _run_batched(sandbox, code, tests, outcomes, timeout_s=timeout_s, float_tolerance=float_tolerance,
                           stop_after_timeout=stop_after_timeout)  # fmt: skip
        return

    async def one(i: int) -> None:
        outcomes[i] = await run_test_case(sandbox, code, tests[i], timeout_s=timeout_s, float_tolerance=float_tolerance)

    tasks = [asyncio.ensure_future(one(i)) for i in range(len(tests))]
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
            if stop_after_timeout and any(o is not None and o.verdict == TIMEOUT for o in outcomes):
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _run_batched(
    sandbox: Sandbox,
    code: str,
    tests: list[TestCase],
    outcomes: list[TestOutcome | None],
    *,
    timeout_s: float,
    float_tolerance: float | FloatRule | None,
    stop_after_timeout: bool,
) -> None:
    groups: dict[str, list[int]] = {}  # one batch per program text (call-based tests carry their driver)
    for i, test in enumerate(tests):
        groups.setdefault(_program(code, test), []).append(i)
    stopped = False
    for program, members in groups.items():
        if stopped:
            break

        async def on_result(k: int, result: SandboxResult, members: list[int] = members) -> bool:
            nonlocal stopped
            outcome = await verdict(tests[members[k]], result, float_tolerance, output_floor=sandbox.config.stdout_cap)
            outcomes[members[k]] = outcome
            stopped = stopped or (stop_after_timeout and outcome.verdict == TIMEOUT)
            return stopped

        async def single(k: int, members: list[int] = members) -> SandboxResult:
            return await _run_alone(sandbox, code, tests[members[k]], timeout_s)

        inputs = [BatchInput(_stdin(tests[i]), stdout_keep=_keep(sandbox, tests[i])) for i in members]
        await run_batch(sandbox, program, inputs, timeout_s=timeout_s, stdout_cap=_output_cap(sandbox), single=single,
                        on_result=on_result, preload_json=tests[members[0]].kind == "call")  # fmt: skip
