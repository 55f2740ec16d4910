"""Run a sandbox scenario as an ordinary user: as root, in a child as user nobody (or another account) with
a system interpreter (this repository's sandbox package imported on its own, stdlib only); as another user,
in a child as that user. The scenario prints one JSON line last; :func:`as_ordinary_user` returns it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534
IS_ROOT = os.geteuid() == 0

PRELUDE = (
    "import sys, types\n"
    "pkg = types.ModuleType('agentboost'); pkg.__path__ = [{repo!r} + '/agentboost']; sys.modules['agentboost'] = pkg\n"
)
"""Imports this repository's sandbox package alone (under a bare ``agentboost`` package), so a system
interpreter without agentboost's dependencies can run it."""


def system_python() -> str | None:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(candidate) and os.access(candidate, os.X_OK):
            return os.path.realpath(candidate)
    return None


def _world_readable(path: Path) -> bool:
    return bool(os.stat(path).st_mode & stat.S_IROTH) and all(os.stat(p).st_mode & stat.S_IXOTH for p in path.parents)


def as_ordinary_user(
    script: str, *, timeout_s: float = 180, cwd: str = "/tmp", user: tuple[int, int] = (NOBODY, NOBODY)
) -> dict[str, Any]:
    """Run ``script`` (after :data:`PRELUDE`) as an ordinary user (as root: ``user``, a uid and gid); its
    last JSON line. Skips where that cannot be arranged."""
    if IS_ROOT:
        python, setpriv = system_python(), shutil.which("setpriv")
        if python is None or setpriv is None:
            pytest.skip("running as user nobody needs setpriv and a system python")
        if not _world_readable(REPO / "agentboost" / "sandbox" / "sandbox.py"):
            pytest.skip(f"{REPO} is not readable by user nobody")
        prefix = [setpriv, f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", python]
    else:
        prefix = [sys.executable]
    env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    done = subprocess.run([*prefix, "-c", PRELUDE.format(repo=str(REPO)) + script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(lines[-1])
    report["_stderr"] = done.stderr[-2000:]
    return report
