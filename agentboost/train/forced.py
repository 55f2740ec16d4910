"""What greedy decoding and sampling would do with a demonstration, read off one teacher-forced pass.

A rollout check generates token by token and, sampled, is noisy. With the demonstration fed in, one
forward pass says whether greedy decoding reproduces it and how likely a sample is to.
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
    """One demonstration under the model (all its trajectories, model tokens only). The *choice* is the
    first token of its last assistant turn (an answer's style, and for a bare number its first digit)."""

    greedy: bool
    """Greedy decoding reproduces it once its ``rival`` is set aside at the choice: every model token is
    the argmax, the choice the argmax of all tokens but the rival (the other style's opening)."""
    picked: bool
    """The choice is the argmax of all tokens: greedy decoding opens the last turn this way."""
    logprob: float
    """Log-probability that a sample (at the given temperature) reproduces it, the choice included."""
    choice: float
    """Log-probability of the choice."""


NOTHING = Forced(greedy=False, picked=False, logprob=float("-inf"), choice=float("-inf"))
"""A demonstration with no model token to check (masked, or failed before its first call) reproduces nothing."""

CHOICE = -1
"""The class of a choice position in a :data:`Tally` and in :func:`response_classes` (other model tokens: their
own token id)."""

Tally = dict[int, list[int]]
"""Per class of model token: ``[seen, wrong]``, where wrong is what :attr:`Forced.greedy` counts as a miss."""


@dataclass
class _Row:
    episode: int
    ids: list[int]
    mask: list[int]
    response_at: int  # where the response starts (after the prompt)
    choice_at: int | None = None  # position of the episode's choice, in the row that holds it


def _rows(index: int, episode: Episode, pad_token_id: int) -> list[_Row]:
    rows = []
    for trajectory in episode_rows(episode):
        prompt, response, mask, _ = row_tokens(trajectory, pad_token_id)
        rows.append(_Row(index, [*prompt, *response], [0] * len(prompt) + list(mask), len(prompt)))
    for row in reversed(rows):  # the last turn's first model token: in the last row that has model tokens
        starts = [j for j in range(1, len(row.mask)) if row.mask[j] and not row.mask[j - 1]]
        if starts:
            row.choice_at = starts[-1]
            break
    return rows


def response_classes(episode: Episode, pad_token_id: int) -> list[list[int | None]]:
    """Per row of ``episode`` (as :func:`agentboost.batch.episodes_to_batch` lays them out), per response
    position: the class a :data:`Tally` counts it in (:data:`CHOICE` or the token id), None where no loss is."""
    return [
        [(CHOICE if j == row.choice_at else row.ids[j]) if row.mask[j] else None
         for j in range(row.response_at, len(row.ids))]
        for row in _rows(0, episode, pad_token_id)
    ]  # fmt: skip


def choice_token(episode: Episode) -> int | None:
    """The choice of ``episode`` (the first token of its last assistant turn), None when it has none."""
    for row in _rows(0, episode, 0):
        if row.choice_at is not None:
            return row.ids[row.choice_at]
    return None


def forced(
    model: Any,
    episodes: Sequence[Episode],
    *,
    pad_token_id: int,
    temperature: float = 1.0,
    rivals: Sequence[int | None] | None = None,
    tally: Tally | None = None,
) -> list[Forced]:
    """:class:`Forced` for every episode; ``rivals[i]`` is the token set aside at episode i's choice (None:
    none). ``tally``, when given, counts every model token checked and every miss, by class (:data:`Tally`).
    No gradients; the model is in eval mode for the pass and put back as it was."""
    import torch

    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (greedy decoding is Forced.greedy), got {temperature}")
    if rivals is not None and len(rivals) != len(episodes):
        raise ValueError(f"{len(rivals)} rivals for {len(episodes)} episodes")
    rows: list[_Row] = []
    usable = [not e.masked and e.num_model_tokens > 0 for e in episodes]
    for index, episode in enumerate(episodes):
        if usable[index]:
            rows.extend(_rows(index, episode, pad_token_id))
    greedy, picked = list(usable), [False] * len(episodes)
    logprob = [0.0] * len(episodes)
    choice = [float("-inf")] * len(episodes)
    if rows:
        rows.sort(key=lambda row: len(row.ids))  # chunks of rows of about one length: little padding
        vocab = int(model.config.vocab_size)
        was_training = bool(getattr(model, "training", False))
        model.eval()
        try:
            with torch.no_grad():
                first = 0
                while first < len(rows):
                    count = 1
                    while first + count < len(rows) and (count + 1) * len(rows[first + count].ids) * vocab <= (
                        _LOGITS_PER_CHUNK
                    ):
                        count += 1
                    _score(model, rows[first : first + count], pad_token_id, temperature, rivals,
                           greedy, picked, logprob, choice, tally)  # fmt: skip
                    first += count
        finally:
            if was_training:
                model.train()
    return [
        Forced(greedy=g, picked=p, logprob=lp, choice=c) if ok else NOTHING
        for g, p, lp, c, ok in zip(greedy, picked, logprob, choice, usable, strict=True)
    ]


def _score(  # noqa: PLR0917 (the caller's accumulators, filled in place)
    model: Any,
    chunk: list[_Row],
    pad_token_id: int,
    temperature: float,
    rivals: Sequence[int | None] | None,
    greedy: list[bool],
    picked: list[bool],
    logprob: list[float],
    choice: list[float],
    tally: Tally | None,
) -> None:
    import torch

    device = next(model.parameters()).device
    width = max(len(row.ids) for row in chunk)
    ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(chunk), width), dtype=torch.long)
    for k, row in enumerate(chunk):
        ids[k, : len(row.ids)] = torch.tensor(row.ids)
        attention[k, : len(row.ids)] = 1
    ids, attention = ids.to(device), attention.to(device)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()  # position j-1 predicts j
    token_lp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[:, 1:, None])[..., 0].cpu()
    top2 = logits.topk(2, dim=-1).indices.cpu()
    for k, row in enumerate(chunk):
        e = row.episode
        rival = rivals[e] if rivals is not None else None
        for j in range(1, len(row.ids)):
            if not row.mask[j]:
                continue
            token, best, second = row.ids[j], int(top2[k, j - 1, 0]), int(top2[k, j - 1, 1])
            logprob[e] += float(token_lp[k, j - 1])
            if j == row.choice_at:
                choice[e] = float(token_lp[k, j - 1])
                picked[e] = best == token
                miss = not (best == token or (rival is not None and best == rival and second == token))
            else:
                miss = best != token
            if miss:
                greedy[e] = False
            if tally is not None:
                counts = tally.setdefault(CHOICE if j == row.choice_at else token, [0, 0])
                counts[0] += 1
                counts[1] += miss
