"""Episodes -> training batch. The one conversion used by both the single-machine trainer and the
rLLM / veRL path (so there is no second copy of this logic).

Layout (veRL's): prompts left-padded to ``P``, responses right-padded to ``R``; ``input_ids`` is their
concatenation, ``attention_mask`` marks real tokens, ``position_ids`` count real tokens. Per row:

* ``response_mask``: the loss mask (1 on model tokens, 0 on env tokens, padding and masked episodes);
* ``token_level_scores``: the episode reward on the last real response token, 0 elsewhere;
* ``rollout_log_probs``: the sampling log-probabilities of response tokens (0 where there are none).

Failed episodes are never dropped: an episode with no tokens at all becomes one pad prompt token and
one pad response token, all masked, reward 0. A row that does not fit ``P``/``R`` is cut (prompt: its
first tokens are dropped; response: its tail) and masked like a failure: reward 0, out of its GRPO
group, never trained on half-seen. The episode itself is marked (``masked = True``,
``metadata["batch_cut"]`` says why) so metrics, saved episodes and advantages all agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .episode import Episode


@dataclass
class Batch:
    input_ids: Any
    attention_mask: Any
    position_ids: Any
    prompts: Any
    responses: Any
    response_mask: Any
    token_level_scores: Any
    rollout_log_probs: Any
    rewards: Any
    episode_ids: list[str]
    group_ids: list[str]
    terminations: list[str]
    masked: list[bool]
    truncated: list[bool] = field(default_factory=list)

    @property
    def prompt_length(self) -> int:
        return int(self.prompts.shape[1])

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def row_tokens(episode: Episode, pad_token_id: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt, response, loss mask, rollout log-probs) of one row. Never empty: an episode that has no
    tokens (it failed before the first call) becomes one masked pad token on each side."""
    if not episode.response_ids:
        return episode.prompt_ids or [pad_token_id], [pad_token_id], [0], [0.0]
    return episode.prompt_ids or [pad_token_id], episode.response_ids, episode.response_mask, episode.response_logprobs


def episodes_to_batch(
    episodes: list[Episode],
    *,
    pad_token_id: int,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    group_of: Any = None,
) -> Batch:
    """Pad and stack episodes. ``group_of(episode) -> str`` names the GRPO group (default: the
    episode's ``metadata["group_id"]``, else its task id)."""
    import torch

    if not episodes:
        raise ValueError("no episodes to batch")
    prompts, responses, masks, logprobs, truncated = [], [], [], [], []
    for episode in episodes:
        prompt, response, mask, lps = row_tokens(episode, pad_token_id)
        reasons = []
        if max_prompt_length is not None and len(prompt) > max_prompt_length:
            reasons.append(f"prompt of {len(prompt)} tokens > max_prompt_length={max_prompt_length}")
            prompt = prompt[-max_prompt_length:]
        if max_response_length is not None and len(response) > max_response_length:
            reasons.append(f"response of {len(response)} tokens > max_response_length={max_response_length}")
            response, mask, lps = response[:max_response_length], mask[:max_response_length], lps[:max_response_length]
        cut = bool(reasons)
        if cut:
            mask = [0] * len(mask)
            if not episode.masked:  # a failure's own reason stays; a cut row is masked from here on
                episode.masked = True
                episode.metadata["batch_cut"] = "; ".join(reasons)
        prompts.append(prompt)
        responses.append(response)
        masks.append(mask)
        logprobs.append(lps)
        truncated.append(cut)
    width_p = max_prompt_length or max(len(p) for p in prompts)
    width_r = max_response_length or max(len(r) for r in responses)
    n = len(episodes)
    prompt_t = torch.full((n, width_p), pad_token_id, dtype=torch.long)
    prompt_attn = torch.zeros((n, width_p), dtype=torch.long)
    resp_t = torch.full((n, width_r), pad_token_id, dtype=torch.long)
    resp_attn = torch.zeros((n, width_r), dtype=torch.long)
    mask_t = torch.zeros((n, width_r), dtype=torch.long)
    lp_t = torch.zeros((n, width_r), dtype=torch.float32)
    scores = torch.zeros((n, width_r), dtype=torch.float32)
    rewards = torch.zeros(n, dtype=torch.float32)
    for i, (p, r, m, lp, episode) in enumerate(zip(prompts, responses, masks, logprobs, episodes, strict=True)):
        prompt_t[i, width_p - len(p) :] = torch.tensor(p, dtype=torch.long)
        prompt_attn[i, width_p - len(p) :] = 1
        resp_t[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        resp_attn[i, : len(r)] = 1
        mask_t[i, : len(m)] = torch.tensor(m, dtype=torch.long)
        lp_t[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
        reward = 0.0 if episode.masked else float(episode.reward)
        rewards[i] = reward
        scores[i, len(r) - 1] = reward
    attention = torch.cat([prompt_attn, resp_attn], dim=1)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0) * attention
    group_of = group_of or (lambda e: str(e.metadata.get("group_id") or e.task_id or e.id))
    return Batch(
        input_ids=torch.cat([prompt_t, resp_t], dim=1),
        attention_mask=attention,
        position_ids=positions,
        prompts=prompt_t,
        responses=resp_t,
        response_mask=mask_t,
        token_level_scores=scores,
        rollout_log_probs=lp_t,
        rewards=rewards,
        episode_ids=[e.id for e in episodes],
        group_ids=[group_of(e) for e in episodes],
        terminations=[e.termination.value for e in episodes],
        masked=[e.masked or t for e, t in zip(episodes, truncated, strict=True)],
        truncated=truncated,
    )


def select_rows(batch: Batch, idx: list[int]) -> Batch:
    """The rows ``idx`` of ``batch`` (tensors and per-row lists), padded as before."""
    import dataclasses

    import torch

    index = torch.tensor(idx, dtype=torch.long)
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if hasattr(value, "index_select"):
            changes[f.name] = value.index_select(0, index)
        elif isinstance(value, list) and value:
            changes[f.name] = [value[i] for i in idx]
    return dataclasses.replace(batch, **changes)


def compact(batch: Batch) -> Batch:
    """``batch`` without the prompt columns that are padding in every row (on the left) and the
    response columns that are padding in every row (on the right). Positions, masks and response column
    indices are unchanged for the columns kept, so a model sees exactly the same tokens."""
    import dataclasses

    width_p = batch.prompt_length
    real_p = batch.attention_mask[:, :width_p].any(0).nonzero()
    real_r = batch.attention_mask[:, width_p:].any(0).nonzero()
    first = int(real_p[0]) if real_p.numel() else width_p - 1
    last = int(real_r[-1]) + 1 if real_r.numel() else 1
    if first == 0 and last == batch.responses.shape[1]:
        return batch
    keep = slice(first, width_p + last)
    return dataclasses.replace(
        batch,
        input_ids=batch.input_ids[:, keep],
        attention_mask=batch.attention_mask[:, keep],
        position_ids=batch.position_ids[:, keep],
        prompts=batch.prompts[:, first:],
        responses=batch.responses[:, :last],
        response_mask=batch.response_mask[:, :last],
        token_level_scores=batch.token_level_scores[:, :last],
        rollout_log_probs=batch.rollout_log_probs[:, :last],
    )


def length_chunks(batch: Batch, idx: list[int], max_tokens: int) -> list[list[int]]:
    """Split the rows ``idx`` into chunks of similar length (shortest first) of at most ``max_tokens``
    rows x the width :func:`compact` leaves them (longest prompt + longest response of the chunk; a
    row wider than that is a chunk of its own): a short row then no longer pays for the longest
    episode of the batch in attention, MLPs and backward."""
    width_p = batch.prompt_length
    prompt = batch.attention_mask[:, :width_p].sum(1).tolist()
    response = batch.attention_mask[:, width_p:].sum(1).tolist()
    chunks: list[list[int]] = []
    widest = (0, 0)
    for i in sorted(idx, key=lambda i: (prompt[i] + response[i], i)):
        grown = (max(widest[0], prompt[i]), max(widest[1], response[i]))
        if chunks and (len(chunks[-1]) + 1) * (grown[0] + grown[1]) <= max_tokens:
            chunks[-1].append(i)
            widest = grown
        else:
            chunks.append([i])
            widest = (prompt[i], response[i])
    return chunks
