"""Run the test suite on an interpreter without torch (CI's Python 3.13 step). Arguments go to pytest.

* Test modules that import torch at their top are left out, named; any other collection error fails.
* A test that fails only because torch is missing (``ModuleNotFoundError: No module named 'torch'`` raised in
  it) is reported as skipped, named at the end; every other failure stays a failure.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest


def _needs_torch(exc: BaseException | None) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        name = getattr(exc, "name", None) or ""
        if isinstance(exc, ModuleNotFoundError) and (name == "torch" or name.startswith("torch.")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class TorchlessSkips:
    """Turns a test's failure caused by the missing torch into a skip that says so."""

    def __init__(self) -> None:
        self.skipped: list[str] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: Any, call: Any) -> Any:
        outcome = yield
        report = outcome.get_result()
        if report.failed and call.excinfo is not None and _needs_torch(call.excinfo.value):
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, "Skipped: needs torch (not installed here)")
            self.skipped.append(item.nodeid)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.skipped:
            terminalreporter.write_line(f"needs torch, skipped: {len(self.skipped)} tests ({', '.join(self.skipped)})")


def main(args: list[str]) -> int:
    collect = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                             capture_output=True, text=True, check=False)  # fmt: skip
    errors = re.findall(r"^ERROR (tests/\S+\.py)", collect.stdout, re.MULTILINE)
    blocks = re.split(r"_{3,} ERROR collecting ", collect.stdout)[1:]
    torchless = {b.split()[0] for b in blocks if "No module named 'torch'" in b}
    others = [e for e in errors if e not in torchless]
    if others:
        sys.stderr.write(collect.stdout[-5000:] + f"\ncollection errors other than a missing torch: {others}\n")
        return 1
    for module in sorted(torchless):
        sys.stderr.write(f"left out (imports torch at its top): {module}\n")
    return int(pytest.main([*(f"--ignore={m}" for m in sorted(torchless)), *args], plugins=[TorchlessSkips()]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
