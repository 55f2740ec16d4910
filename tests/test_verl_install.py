"""The GPU install of the verl route (docs/gpu-verl.md), resolved without GPUs (``pip install --dry-run --report``).

``.ci/run`` resolves the first GPU command of docs/gpu-verl.md with ``constraints/verl09.txt``
into a report and points ``AGENTBOOST_VERL09_GPU_REPORT`` at it; without it this file skips. The second
command (flash-attn) compiles against the installed CUDA torch and cannot be resolved here.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPORT = os.environ.get("AGENTBOOST_VERL09_GPU_REPORT")

pytestmark = pytest.mark.skipif(
    not REPORT, reason="set AGENTBOOST_VERL09_GPU_REPORT to a `pip install --dry-run --report` of the GPU install"
)


def resolved() -> dict[str, str]:
    report = json.loads(Path(REPORT or "").read_text())
    return {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in report["install"]
    }


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints" / "verl09.txt").read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if match:
            out[match.group(1).lower().replace("_", "-")] = match.group(2)
    return out


def test_gpu_install_brings_what_verls_actor_and_weight_transfer_import_and_no_trl() -> None:
    versions = resolved()
    assert versions["verl"] == "0.9.1" and versions["vllm"] == "0.24.0" and versions["torch"] == "2.11.0"
    assert versions["transformers"] == "5.9.0"
    assert "cupy-cuda13x" in versions  # ASYNC=separate: verl's nccl checkpoint engine imports cupy
    assert "trl" not in versions  # verl imports trl's value-head model whenever trl is importable (trl >= 1: crash)
    assert tuple(int(x) for x in versions["numpy"].split(".")[:2]) < (2, 4)  # vLLM 0.24's numba
    # Ray's OpenTelemetry exporters on the SDK strands-agents pins: one release family
    sdk = versions["opentelemetry-sdk"]
    family = {"opentelemetry-api", "opentelemetry-proto", "opentelemetry-exporter-otlp",
              "opentelemetry-exporter-otlp-proto-grpc", "opentelemetry-exporter-otlp-proto-http"}  # fmt: skip
    assert {name: versions[name] for name in family if name in versions} == dict.fromkeys(family & set(versions), sdk)
    contrib = versions["opentelemetry-semantic-conventions"]
    assert versions["opentelemetry-exporter-prometheus"] == versions["opentelemetry-instrumentation"] == contrib


def test_the_constraints_file_is_the_resolved_set() -> None:
    versions, pinned = resolved(), pins()
    assert pinned, "constraints/verl09.txt pins nothing"
    differ = {name: (version, versions.get(name)) for name, version in pinned.items()
              if name in versions and versions[name] != version}  # fmt: skip
    assert not differ
    unpinned = sorted(set(versions) - set(pinned) - {"agentboost", "torch", "torchvision", "torchaudio"})
    assert not unpinned, unpinned
