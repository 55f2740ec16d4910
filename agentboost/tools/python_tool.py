"""A Strands ``python`` tool that runs model-written code in the sandbox (never in the agent's process)."""

from __future__ import annotations

import signal
from typing import Any

from strands import tool

from ..sandbox import Sandbox
from .strands_code_tool import MAX_CODE_CHARS, default_sandbox

MAX_OUTPUT_CHARS = 4000


def _clip(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... [{len(text) - limit} more characters cut]"


def make_python_tool(*, sandbox: Sandbox | None = None, timeout_s: float = 10.0, name: str = "python") -> Any:
    """A tool that executes a Python program and returns what it printed (stdout, stderr, exit status)."""

    @tool(name=name)
    async def python(code: str) -> dict[str, Any]:
        """Run a Python program and see what it prints. Use print() to show results.

        Only the standard library is available (math, fractions, decimal, itertools, functools,
        collections, statistics, ...): no third-party packages and no network; the program can write
        files only in its own working directory.

        Args:
            code: the complete Python program.
        """
        if not isinstance(code, str) or not code.strip():
            return {"status": "error", "content": [{"text": "Error: `code` must be a non-empty Python program."}]}
        if len(code) > MAX_CODE_CHARS:
            return {
                "status": "error",
                "content": [{"text": f"Error: program longer than {MAX_CODE_CHARS} characters."}],
            }
        result = await (sandbox or default_sandbox()).run(code, timeout_s=timeout_s)
        parts = []
        if result.stdout:
            parts.append(_clip(result.stdout))
        if result.stderr:
            parts.append("stderr:\n" + _clip(result.stderr))
        if result.output_limited:
            parts.append("(killed: it wrote more output than is kept)")
        elif result.timed_out:
            parts.append(f"(killed: exceeded {timeout_s:g}s)")
        elif result.signal == signal.SIGXCPU:  # the CPU-time limit: the same limit, reached by CPU first
            parts.append(f"(killed: exceeded {timeout_s:g}s of CPU time)")
        elif result.exit_code not in (0, None):
            parts.append(f"(exit code {result.exit_code})")
        elif result.exit_code is None:
            parts.append(f"(killed by signal {result.signal})")
        text = "\n".join(parts) or "(no output; use print() to show results)"
        return {"status": "success" if result.ok else "error", "content": [{"text": text}]}

    return python


python_tool = make_python_tool()
