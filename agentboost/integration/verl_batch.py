"""Strands episodes -> the batch rLLM v0.2.1's ``AgentPPOTrainer`` trains on.

The tensors come from :func:`agentboost.batch.episodes_to_batch` (the one conversion, shared with the
single-machine trainer), padded to exactly ``data.max_prompt_length`` / ``data.max_response_length``:
``input_ids``, ``attention_mask``, ``position_ids``, ``prompts``, ``responses``, ``response_mask``,
``token_level_scores`` (what rLLM's ``_transform_agent_trajectories`` produces) plus
``rollout_log_probs`` (the sampling log-probs; rLLM then logs ``training/rollout_probs_diff_*`` and
veRL can use them for importance correction).

Per-row bookkeeping travels as non-tensor columns prefixed ``agentboost_``: the episode id, the
termination and whether the row is masked.

Fixes to how the trainer treats rows, applied by the adapter:

* :func:`mask_padding_rows`: rLLM pads the batch to the world size with *copies* of real rows
  (``pad_dataproto_to_divisor``); the copies would be trained on twice. Their loss mask is zeroed.
* :func:`isolated_masked_uids`: a masked (failed) row keeps reward 0 but must not drag its GRPO
  group's mean and std down: while advantages are computed it gets a uid of its own.
* :func:`zero_lone_survivors`: a row whose group has fewer than 2 unmasked members has no baseline.
  veRL's group estimators treat a group of one as mean 0 / std 1, i.e. its raw reward becomes its
  advantage (REINFORCE without a baseline, on whichever sample happened to survive); agentboost's
  rule, shared with the built-in trainer, is advantage 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..batch import episodes_to_batch
from ..episode import Episode

GROUP_ESTIMATORS = frozenset(
    {"grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized", "opo", "gpg", "reinforce_plus_plus_baseline"}
)
"""veRL advantage estimators whose baseline comes from the other samples of the prompt (``uid``)."""
MASKED_KEY = "agentboost_masked"
TERMINATION_KEY = "agentboost_termination"
EPISODE_KEY = "agentboost_episode_id"
TENSOR_KEYS = (
    "input_ids", "attention_mask", "position_ids", "prompts", "responses", "response_mask",
    "token_level_scores", "rollout_log_probs",
)  # fmt: skip


def episodes_to_verl(
    episodes: list[Episode], *, pad_token_id: int, max_prompt_length: int, max_response_length: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors, non_tensors) for ``DataProto.from_dict``; rows in the order of ``episodes``."""
    import numpy as np

    batch = episodes_to_batch(
        episodes,
        pad_token_id=pad_token_id,
        max_prompt_length=max_prompt_length,
        max_response_length=max_response_length,
    )
    tensors = {key: getattr(batch, key) for key in TENSOR_KEYS}
    non_tensors = {
        MASKED_KEY: np.array(batch.masked, dtype=bool),
        TERMINATION_KEY: np.array(batch.terminations, dtype=object),
        EPISODE_KEY: np.array(batch.episode_ids, dtype=object),
    }
    return tensors, non_tensors


def mask_padding_rows(batch: Any, original_size: int) -> int:
    """Zero the loss mask and scores of rows ``original_size..`` of a padded ``DataProto``; returns how many."""
    total = int(batch.batch["response_mask"].shape[0])
    pad = total - original_size
    if pad <= 0:
        return 0
    batch.batch["response_mask"][original_size:] = 0
    for key in ("token_level_scores", "token_level_rewards", "advantages", "returns"):
        if key in batch.batch.keys():  # noqa: SIM118 - TensorDict refuses `in`
            batch.batch[key][original_size:] = 0
    if MASKED_KEY in batch.non_tensor_batch:
        batch.non_tensor_batch[MASKED_KEY][original_size:] = True
    if "uid" in batch.non_tensor_batch:  # copies must not join their original's GRPO group
        uids = batch.non_tensor_batch["uid"]
        for i in range(original_size, total):
            uids[i] = f"agentboost-pad-{i}"
    return pad


@contextlib.contextmanager
def isolated_masked_uids(batch: Any) -> Iterator[int]:
    """Inside the block every masked row has a uid of its own (GRPO: a singleton group, advantage 0);
    the original uids are restored afterwards (rLLM's metrics read them). Yields the number of rows
    isolated."""
    non_tensor = getattr(batch, "non_tensor_batch", {})
    if MASKED_KEY not in non_tensor or "uid" not in non_tensor:
        yield 0
        return
    masked = non_tensor[MASKED_KEY]
    original = non_tensor["uid"].copy()
    uids = non_tensor["uid"]
    count = 0
    for i, flag in enumerate(masked):
        if flag:
            uids[i] = f"agentboost-masked-{i}-{original[i]}"
            count += 1
    try:
        yield count
    finally:
        batch.non_tensor_batch["uid"] = original


def lone_survivors(uids: Any, masked: Any) -> list[int]:
    """Rows that are unmasked but have no unmasked sibling in their group (``uids``)."""
    alive: dict[Any, list[int]] = {}
    for i, (uid, flag) in enumerate(zip(uids, masked, strict=True)):
        if not flag:
            alive.setdefault(uid, []).append(i)
    return [rows[0] for rows in alive.values() if len(rows) == 1]


def zero_lone_survivors(batch: Any, uids: Any) -> int:
    """Zero the advantages (and returns) of rows in groups with fewer than 2 unmasked members; returns
    how many. ``uids``: the real group ids (not the isolated ones used during the computation)."""
    non_tensor = getattr(batch, "non_tensor_batch", {})
    if MASKED_KEY not in non_tensor:
        return 0
    rows = lone_survivors(list(uids), list(non_tensor[MASKED_KEY]))
    keys = set(batch.batch.keys())
    for key in ("advantages", "returns"):
        if key in keys:
            for i in rows:
                batch.batch[key][i] = 0
    return len(rows)
