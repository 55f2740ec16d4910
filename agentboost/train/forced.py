"""What greedy decoding and sampling would do with a demonstration, read off one teacher-forced pass.

A rollout check generates token by token and, sampled, is noisy. With the demonstration fed in, one
forward pass says exactly whether greedy decoding reproduces it and how likely a sample is to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..batch import episode_rows, row_tokens
from ..episode import Episode

_LOGITS_PER_CHUNK = 1 << 25
"""Floats of logits held at once (128 MiB): a 150k-token vocabulary gets a few rows per forward pass."""


@dataclass(frozen=True)
class Forced:
    """One demonstration under the model (all its trajectories, model tokens only)."""

    greedy: bool
    """Every model token but the choice is the argmax: given the choice, greedy decoding reproduces it."""
    logprob: float
    """Log-probability that a sample (at the given temperature) reproduces it, the choice included."""
    choice: float
    """Log-probability of the choice: the first token of the last assistant turn (e.g. an answer's style)."""


def forced(model: Any, episodes: Sequence[Episode], *, pad_token_id: int, temperature: float = 1.0) -> list[Forced]:
    """:class:`Forced` for every episode (the model's mode is left as it was; no gradients)."""
    import torch

    rows: list[tuple[int, list[int], list[int]]] = []  # (episode index, token ids, loss mask over them)
    for index, episode in enumerate(episodes):
        for row in episode_rows(episode):
            prompt, response, mask, _ = row_tokens(row, pad_token_id)
            rows.append((index, [*prompt, *response], [0] * len(prompt) + list(mask)))
    choice_at: dict[int, tuple[int, int]] = {}  # episode -> (row, position of its last turn's first model token)
    for r, (index, _, mask) in enumerate(rows):
        starts = [j for j, m in enumerate(mask) if m and (j == 0 or not mask[j - 1])]
        if starts:
            choice_at[index] = (r, starts[-1])
    greedy = [True] * len(episodes)
    logprob = [0.0] * len(episodes)
    choice = [0.0] * len(episodes)
    device = next(model.parameters()).device
    vocab = int(model.get_output_embeddings().weight.shape[0])
    longest = max(len(ids) for _, ids, _ in rows)
    per_chunk = max(1, _LOGITS_PER_CHUNK // (longest * vocab))
    with torch.no_grad():
        for first in range(0, len(rows), per_chunk):
            chunk = rows[first : first + per_chunk]
            width = max(len(ids) for _, ids, _ in chunk)
            ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for k, (_, tokens, _) in enumerate(chunk):
                ids[k, : len(tokens)] = torch.tensor(tokens)
                attention[k, : len(tokens)] = 1
            logits = model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits.float()
            logps = torch.log_softmax(logits / temperature, dim=-1).cpu()
            best = logits.argmax(dim=-1).cpu()
            for k, (index, tokens, mask) in enumerate(chunk):
                r = first + k
                for j in range(1, len(tokens)):
                    if not mask[j]:
                        continue
                    lp = float(logps[k, j - 1, tokens[j]])
                    logprob[index] += lp
                    if choice_at.get(index) == (r, j):
                        choice[index] = lp
                    elif int(best[k, j - 1]) != tokens[j]:
                        greedy[index] = False
    return [Forced(greedy=g, logprob=lp, choice=c) for g, lp, c in zip(greedy, logprob, choice, strict=True)]
