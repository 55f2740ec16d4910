"""The CPU rollouts' options in a verl rollout config, and their request log: shared by the in-process rollout
(:mod:`.verl_cpu`) and the real-vLLM one (:mod:`.verl_vllm`), which each import this, not each other."""

from __future__ import annotations

import json
import time
from typing import Any

CUSTOM_KEY = "agentboost"
"""The CPU rollouts' options: ``actor_rollout_ref.rollout.custom.agentboost.<option>`` (verl's extension point):
``request_log`` (a JSONL file, one line per generation call: what was served, with which weights; for audits,
:mod:`.rollout_audit`) and, for ``agentboost_vllm``, ``vllm_url``."""


def rollout_options(config: Any) -> dict[str, Any]:
    """This layer's options in a rollout config (see :data:`CUSTOM_KEY`)."""
    return dict((getattr(config, "custom", None) or {}).get(CUSTOM_KEY) or {})


def log_request(path: str | None, **record: Any) -> None:
    """Append one generation call to the request log ``path`` (nothing without one)."""
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({**record, "time": time.time()}) + "\n")
