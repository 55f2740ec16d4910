"""The code tool: run the agent's program against the problem's *public* tests, in the sandbox.

The program is an explicit tool argument (the model passes the code it wants tested); nothing is
ever scraped out of the conversation or the reasoning. The result text is deterministic (no timings,
no paths): a summary line and, per test, the verdict with capped input / expected / actual output.
Hidden tests are never visible to the tool; they belong to the reward.
"""

from __future__ import annotations

import threading
from typing import Any

from strands import tool

from ..sandbox import Sandbox, SandboxConfig
from ..sandbox.testcases import PASSED, TIMEOUT, TestCase, TestOutcome, run_test_cases

MAX_FIELD_CHARS = 400
MAX_CODE_CHARS = 100_000

_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """One sandbox per process (its isolation is probed once)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox(SandboxConfig())
        return _default


def _cap(text: Any) -> str:
    text = str(text)
    if len(text) <= MAX_FIELD_CHARS:
        return text
    return text[:MAX_FIELD_CHARS] + f"... [{len(text) - MAX_FIELD_CHARS} more characters]"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip("\n").split("\n")) if text.strip() else "    (empty)"


def format_report(tests: list[TestCase], outcomes: list[TestOutcome], timeout_s: float) -> str:
    passed = sum(o.passed for o in outcomes)
    lines = [f"Public tests: {passed}/{len(tests)} passed."]
    for i, (test, outcome) in enumerate(zip(tests, outcomes, strict=True), 1):
        if outcome.verdict == PASSED:
            lines.append(f"Test {i}: passed")
            continue
        detail = f" ({timeout_s:g} s)" if outcome.verdict == TIMEOUT else ""
        lines.append(f"Test {i}: {outcome.verdict}{detail}")
        lines.append("  input:\n" + _indent(_cap(test.input)))
        lines.append("  expected:\n" + _indent(_cap(test.output)))
        if outcome.got.strip():
            lines.append("  got:\n" + _indent(_cap(outcome.got)))
        if outcome.stderr.strip():
            tail = "\n".join(outcome.stderr.strip().splitlines()[-6:])
            lines.append("  stderr (last lines):\n" + _indent(_cap(tail)))
    return "\n".join(lines)


def make_code_tool(
    public_tests: list[TestCase | dict[str, Any]],
    *,
    sandbox: Sandbox | None = None,
    timeout_s: float = 6.0,
    name: str = "run_tests",
) -> Any:
    """A Strands tool that runs ``code`` against ``public_tests`` and reports the verdicts."""
    tests = [t if isinstance(t, TestCase) else TestCase.from_dict(t) for t in public_tests]

    @tool(name=name)
    async def run_tests(code: str) -> dict[str, Any]:
        """Run your complete Python program against the problem's public example tests.

        For input/output problems the program reads the test input from stdin and prints the answer;
        for function problems it defines the function (or ``class Solution`` method) the problem
        asks for. The result lists which tests pass, with the expected and actual output of those
        that fail.

        Args:
            code: the complete Python program to test.
        """
        if not isinstance(code, str) or not code.strip():
            return {"status": "error", "content": [{"text": "Error: `code` must be a non-empty Python program."}]}
        if len(code) > MAX_CODE_CHARS:
            return {
                "status": "error",
                "content": [{"text": f"Error: program longer than {MAX_CODE_CHARS} characters."}],
            }
        if not tests:
            return {"status": "success", "content": [{"text": "This problem has no public tests."}]}
        outcomes = await run_test_cases(sandbox or default_sandbox(), code, tests, timeout_s=timeout_s)
        return {"status": "success", "content": [{"text": format_report(tests, outcomes, timeout_s)}]}

    return run_tests
