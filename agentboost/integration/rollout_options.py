"""The CPU rollouts' options in a verl rollout config, and their request log: shared by the in-process rollout
(:mod:`.verl_cpu`) and the real-vLLM one (:mod:`.verl_vllm`), which each import this, not each other; and the
generation budget both give a call."""

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


def max_new_tokens(params: dict[str, Any], prompt_len: int, config: Any, max_model_len: int) -> int:
    """The tokens a call may generate, as verl's vLLM server decides it: the call's ``max_tokens`` (or
    ``max_new_tokens``, popped from ``params``), else what ``config``'s prompt and response lengths leave, cut
    to the room in the model's window; a prompt that leaves no room is refused as verl's server refuses it."""
    room = max_model_len - prompt_len
    if room < 1:
        raise ValueError(
            f"Prompt length ({prompt_len}) leaves no room to generate within the model's maximum "
            f"context length ({max_model_len}); need at least 1 token of headroom."
        )
    if "max_tokens" in params:
        wanted = int(params.pop("max_tokens"))
    elif "max_new_tokens" in params:
        wanted = int(params.pop("max_new_tokens"))
    else:
        wanted = min(config.response_length, config.prompt_length + config.response_length - prompt_len)
    return max(1, min(wanted, room))
