"""README's "From a snippet to a run" works as written: every block marked ``<!-- readme-snippet: NAME -->``
is extracted and run against the instant scripted policy (``agentboost.testing.instant``), no model.

Files are written under their names; the ``commands`` block is run line by line through the CLI (a
command aimed at an HTTP server gets the instant policy and ``--workers 0`` instead, everything else
as written); the pool snippet runs as a script, since its workers are spawned processes.
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agentboost.cli.main import main

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = re.compile(r"<!-- readme-snippet: (?P<name>[\w.\-]+) -->\n```[\w-]*\n(?P<body>.*?)\n```", re.DOTALL)
NAMES = {"mytools.py", "tasks.jsonl", "commands", "run_episode.py", "pool_run.py"}
INSTANT = ["--backend", "py:agentboost.testing.instant:instant_backend", "--tokenizer", "offline:qwen2.5"]


def snippets() -> dict[str, str]:
    found: dict[str, str] = {}
    for match in MARKER.finditer(README.read_text(encoding="utf-8")):
        assert match["name"] not in found, f"snippet {match['name']} appears twice"
        found[match["name"]] = match["body"] + "\n"
    return found


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A directory holding every file snippet, as a user would have it."""
    found = snippets()
    assert set(found) == NAMES, f"README snippets: {sorted(found)}"
    directory = tmp_path_factory.mktemp("readme")
    for name, body in found.items():
        if name != "commands":
            (directory / name).write_text(body, encoding="utf-8")
    return directory


@pytest.fixture
def in_workdir(workdir, monkeypatch) -> Path:
    monkeypatch.chdir(workdir)
    monkeypatch.syspath_prepend(str(workdir))  # what PYTHONPATH=. does for the user
    return workdir


def commands(text: str) -> list[list[str]]:
    joined = re.sub(r"\\\n\s*", " ", text)
    return [shlex.split(line) for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_rows_are_json_and_name_tools_and_reward_by_reference(workdir) -> None:
    rows = [json.loads(line) for line in (workdir / "tasks.jsonl").read_text().splitlines()]
    assert rows and all(r["tools"] == ["mytools:calculator"] and r["reward_fn"] == "mytools:reward" for r in rows)


def test_the_commands_run(in_workdir, capsys) -> None:
    lines = commands(snippets()["commands"])
    assert [line[:3] for line in lines] == [
        ["PYTHONPATH=.", "agentboost", "rollout"],
        ["PYTHONPATH=.", "agentboost", "eval"],
    ]
    for line in lines:
        argv = line[2:]
        assert "--env" in argv, f"README command without --env: {shlex.join(line)}"
        backend = argv[argv.index("--backend") + 1]
        if backend.startswith("http"):  # the server is the user's: the instant policy stands in for it
            argv = [*argv, *INSTANT, "--workers", "0", "--no-plots"]
        assert main(argv) == 0, capsys.readouterr().err[-3000:]
        out = in_workdir / argv[argv.index("--out") + 1]
        if argv[0] == "rollout":
            summary = json.loads((out / "summary.json").read_text())
            assert summary["reward_mean"] == 1.0 and summary["terminations"]["completed"] == summary["episodes"] == 2
        else:
            report = json.loads((out / "report.json").read_text())
            assert report["tasks"] == 2 and report["samples_per_task"] == 4 and report["infra_errors"] == 0
            assert report["pass_at_k"]["1"] == 1.0


def test_the_run_episode_snippet(in_workdir, capsys) -> None:
    code = snippets()["run_episode.py"]
    assert len([line for line in code.splitlines() if line and not line.startswith(("import", "from"))]) == 4
    runpy.run_path(str(in_workdir / "run_episode.py"), run_name="__main__")
    termination, reward, tool_calls, _ = capsys.readouterr().out.split()
    assert (termination, float(reward), int(tool_calls)) == ("completed", 1.0, 1)


def test_the_pool_snippet(workdir) -> None:
    done = subprocess.run(
        [sys.executable, "pool_run.py"], cwd=workdir, capture_output=True, text=True, timeout=240
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    stats, result = done.stdout.strip().splitlines()[-2:]
    assert "'completed': 8" in stats and "'failures': {}" in stats
    assert result == "1.0 {'completed'}"
