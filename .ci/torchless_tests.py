"""Run the test suite on an interpreter without torch (CI's Python 3.13 step). Arguments go to pytest.

* Test modules that import torch at their top are left out, named; any other collection error fails.
* A test that fails only because torch is missing (``ModuleNotFoundError: No module named 'torch'`` raised in
  it) is reported as skipped, named at the end; every other failure stays a failure.

This module is also the pytest plugin doing that (``-p torchless_tests``, this directory on ``PYTHONPATH``), so
that pytest-xdist's workers load it too (``-n 2``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SKIP_REASON = "Skipped: needs torch (not installed here)"
_skipped: list[str] = []


def _needs_torch(exc: BaseException | None) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        name = getattr(exc, "name", None) or ""
        if isinstance(exc, ModuleNotFoundError) and (name == "torch" or name.startswith("torch.")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    """A test's failure caused by the missing torch becomes a skip that says so (where the test runs)."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None and _needs_torch(call.excinfo.value):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, SKIP_REASON)


def pytest_runtest_logreport(report: Any) -> None:
    """Counts those skips where the results arrive (the controller, under xdist)."""
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple | list) and len(longrepr) == 3 and longrepr[2] == SKIP_REASON:
        _skipped.append(report.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _skipped:
        terminalreporter.write_line(f"needs torch, skipped: {len(_skipped)} tests ({', '.join(_skipped)})")


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
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, here)
    return int(pytest.main([*(f"--ignore={m}" for m in sorted(torchless)), "-p", "torchless_tests", *args]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
