"""Check what a rollout server served against the weights it should have served with, in log space.

A server that returns sampling log-probs for its tokens can be audited after the fact: the same tokens run
through a transformers fp32 forward of the checkpoint that should have served them must give the same
log-probs. verl's own check, ``training/rollout_probs_diff_max``, compares *probabilities*: with a 151k-token
vocabulary and a small model every sampled token's probability is ~1e-5, so a server that never received new
weights stays far below its 1e-3 alarm. Log-probabilities keep the gap visible (a training step moves them by
1e-2 and more; a faithful fp32 server is within ~1e-5).

Input is the server's request log (:mod:`.verl_vllm`: ``prompt_ids``, ``token_ids``, ``log_probs`` and the
weight version ``global_steps`` per generation call) and, per version, a model directory::

    gaps = logprob_gaps(requests, lambda version: model_dirs[version])
    assert all(g.max_abs < 1e-3 for g in gaps.values())
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Gap:
    """How far a version's served log-probs are from the recomputation: ``max_abs``/``mean_abs`` in log space
    over ``tokens`` sampled tokens of ``requests`` calls; ``max_prob`` is the same gap in probability space
    (what verl's ``rollout_probs_diff_max`` measures)."""

    version: Any
    requests: int
    tokens: int
    max_abs: float
    mean_abs: float
    max_prob: float


def recompute(model: Any, prompt_ids: list[int], token_ids: list[int], temperature: float = 1.0) -> list[float]:
    """Log-probs of ``token_ids`` after ``prompt_ids`` under ``model`` (a transformers causal LM, fp32), from the
    logits divided by ``temperature`` (the distribution sampled from: vLLM's ``processed_logprobs``, verl's)."""
    import torch

    ids = torch.tensor([list(prompt_ids) + list(token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    picked = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(token_ids)[:, None]).squeeze(-1)
    return [float(x) for x in picked]


def comparable(request: dict[str, Any]) -> bool:
    """Sampled (not greedy: its log-probs are degenerate) from the whole tempered distribution (no top-k, top-p
    or min-p cut, no repetition penalty), with log-probs: what :func:`recompute` reproduces."""
    s = request.get("sampling") or {}
    whole = float(s.get("top_p", 1.0)) >= 1.0 and int(s.get("top_k", -1) or -1) <= 0 and not float(s.get("min_p") or 0)
    plain = float(s.get("repetition_penalty", 1.0)) == 1.0
    return bool(request.get("log_probs")) and float(s.get("temperature", 1.0)) > 0 and whole and plain


def load_model(path: str | Path) -> Any:
    """A HF model directory in fp32, with its ``lora_adapter/`` (PEFT) applied when it has one."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    if (Path(path) / "lora_adapter" / "adapter_config.json").is_file():
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(Path(path) / "lora_adapter"))
    return model.eval()


def logprob_gaps(
    requests: Iterable[dict[str, Any]], model_dir: Callable[[Any], str | Path], *, version_key: str = "global_steps"
) -> dict[Any, Gap]:
    """Per weight version, the gap between each request's served log-probs and a recomputation with
    ``model_dir(version)``; requests that are not :func:`comparable` (greedy validation, top-k...) are left out."""
    by_version: dict[Any, list[dict[str, Any]]] = {}
    for request in requests:
        if comparable(request):
            by_version.setdefault(request.get(version_key), []).append(request)
    gaps = {}
    for version, group in by_version.items():
        model = load_model(model_dir(version))
        diffs: list[float] = []
        prob_diffs: list[float] = []
        for request in group:
            served = request["log_probs"]
            temperature = float((request.get("sampling") or {}).get("temperature", 1.0))
            mine = recompute(model, request["prompt_ids"], request["token_ids"], temperature)
            diffs += [abs(a - b) for a, b in zip(served, mine, strict=True)]
            prob_diffs += [abs(math.exp(a) - math.exp(b)) for a, b in zip(served, mine, strict=True)]
        gaps[version] = Gap(version, len(group), len(diffs), max(diffs), sum(diffs) / len(diffs), max(prob_diffs))
    return gaps
