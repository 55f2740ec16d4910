"""A trajectory's tokens for display: ids, decoded pieces, loss mask, sampling log-probs, segments.

An episode of one trajectory is shown whole; an episode of several is shown trajectory by trajectory
(``Episode.trajectories``), each under the caps below.

Pieces come from the tokenizer by decoding each token behind a few tokens of context, as a streaming
detokenizer does: byte-level BPE tokens that hold part of a UTF-8 character have no text of their
own, so they show an empty piece and the character appears on the token that completes it. The
tokens shown are capped: the prompt's tail (the task sits at its end, after the system prompt and
tool schemas) and the response's head.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..episode import Episode, MultiTrajectoryError, SegmentKind, TokenTrajectory
from .transcript import finite

logger = logging.getLogger(__name__)

CONTEXT = 4
"""Tokens of left context each piece is decoded behind."""
MAX_TOKENS = 4096
"""Default cap on the tokens shown per trajectory."""
MAX_PROMPT_TOKENS = 1024
"""Default cap on the prompt tokens shown (its tail), within ``MAX_TOKENS``."""


class TokenizerMismatch(ValueError):
    """The episode holds token ids the tokenizer does not have: it is not the episode's tokenizer."""


@dataclass
class TokenView:
    """The tokens of one trajectory that the page embeds (see module doc)."""

    ids: list[int] = field(default_factory=list)
    pieces: list[str] | None = None
    """Decoded text per token, or None (the page shows ids)."""
    mask: str = ""
    """Loss mask, one ``0``/``1`` per token."""
    logprobs: list[float | None] = field(default_factory=list)
    segments: list[tuple[str, int, int, int]] = field(default_factory=list)
    """``(kind, call, start, length)`` in shown-token positions."""
    prompt_total: int = 0
    prompt_shown: int = 0
    response_total: int = 0
    response_shown: int = 0
    note: str = ""
    """Why pieces are missing (tokenizer absent or not the episode's), '' otherwise."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ids": self.ids,
            "pieces": self.pieces,
            "mask": self.mask,
            "lp": self.logprobs,
            "segs": [list(s) for s in self.segments],
            "prompt_total": self.prompt_total,
            "prompt_shown": self.prompt_shown,
            "resp_total": self.response_total,
            "resp_shown": self.response_shown,
            "note": self.note,
        }


class PieceDecoder:
    """Decodes token pieces with one tokenizer (through the Rust tokenizer directly when there is one)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._fast = getattr(backend, "decode", None)

    def _decode(self, ids: list[int]) -> str:
        if self._fast is not None:
            return self._fast(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def pieces(self, ids: list[int], start: int, stop: int) -> list[str]:
        """Pieces of ``ids[start:stop]``, decoded behind the tokens before them (see module doc): a
        token whose text is not complete yet (part of a UTF-8 character) gets ``""`` and the text
        lands on the token that completes it."""
        bad = [t for t in ids[max(0, start - CONTEXT) : stop] if not 0 <= t < self.vocab_size]
        if bad:
            raise TokenizerMismatch(f"token id {bad[0]} is outside the tokenizer's {self.vocab_size} ids")
        out: list[str] = []
        prefix, read = max(0, start - CONTEXT), start  # decode window start; first token not yet shown
        # a character begun before ``start`` is shown whole on the token that completes it
        prefix_text = self._decode(ids[prefix:read]).rstrip("\ufffd")
        for j in range(start, stop):
            text = self._decode(ids[prefix : j + 1])
            complete = not text.endswith("\ufffd") and text.startswith(prefix_text)
            if complete or j == stop - 1:  # the last token shows whatever is left, even a broken byte
                out.append(
                    text[len(prefix_text) :] if text.startswith(prefix_text) else self._decode(ids[read : j + 1])
                )
                prefix, read = max(0, j + 1 - CONTEXT), j + 1
                prefix_text = self._decode(ids[prefix:read])
            else:
                out.append("")
        return out


def trains(source: Episode | TokenTrajectory) -> bool:
    """Whether the model tokens of ``source`` carry loss: not when the episode is masked, nor in a
    trajectory left out of training (``TrajectoryInfo.trained``)."""
    if source.masked:
        return False
    if isinstance(source, TokenTrajectory):
        return source.trained
    return all(info.trained for info in source.trajectory_info)


def trained_tokens(source: Episode | TokenTrajectory) -> int:
    """The model tokens of ``source`` that carry loss (none of a discarded reply's, ``ModelCall.discarded``)."""
    if not trains(source):
        return 0
    discarded = {c.index for c in source.calls if c.discarded}
    return sum(len(s.token_ids) for s in source.segments if s.kind is SegmentKind.MODEL and s.call not in discarded)


def token_view(
    source: Episode | TokenTrajectory,
    decoder: PieceDecoder | None,
    *,
    max_tokens: int = MAX_TOKENS,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    logprob_digits: int = 4,
) -> TokenView:
    """The shown tokens of one trajectory (its prompt's tail, its response's head), decoded when
    ``decoder`` is given: an episode of one trajectory, or one of ``Episode.trajectories``. The loss
    mask shown is what the trainer uses (0 everywhere in a masked episode or an untrained trajectory)."""
    if isinstance(source, Episode) and source.num_trajectories > 1:
        raise MultiTrajectoryError(
            f"episode {source.id} has {source.num_trajectories} trajectories: show each of episode.trajectories"
        )
    view = TokenView()
    if not source.segments:
        view.note = "no tokens recorded"
        return view
    prompt = source.segments[0].token_ids
    view.prompt_total = len(prompt)
    view.response_total = sum(len(s.token_ids) for s in source.segments[1:])
    view.prompt_shown = min(len(prompt), max_prompt_tokens, max_tokens)
    view.response_shown = min(view.response_total, max_tokens - view.prompt_shown)
    skip = len(prompt) - view.prompt_shown  # prompt tokens not shown (its head)
    budget = view.response_shown
    trained = trains(source)
    discarded = {c.index for c in source.calls if c.discarded}  # replies the agent never acted on: loss 0
    flat: list[int] = []  # the trajectory's tokens up to the last one shown
    mask: list[str] = []
    for position, seg in enumerate(source.segments):
        ids = seg.token_ids
        if position == 0:
            take = ids[skip:]
        else:
            take = ids[:budget]
            budget -= len(take)
        if take:
            view.segments.append((seg.kind.value, seg.call, len(view.ids), len(take)))
            bit = "1" if seg.kind is SegmentKind.MODEL and trained and seg.call not in discarded else "0"
            mask.append(bit * len(take))
            view.ids.extend(take)
            logprobs = seg.logprobs if seg.kind is SegmentKind.MODEL and seg.logprobs is not None else None
            for k in range(len(take)):
                value = finite(logprobs[k]) if logprobs is not None else None
                view.logprobs.append(None if value is None else round(value, logprob_digits))
        flat.extend(ids)
        if budget <= 0 and position > 0:
            break
    view.mask = "".join(mask)
    if decoder is None:
        view.note = "no tokenizer: token ids shown (agentboost view --tokenizer offline:<family> or a path)"
        return view
    try:
        head = decoder.pieces(flat, skip, len(prompt))
        tail = decoder.pieces(flat, len(prompt), len(prompt) + view.response_shown)
    except TokenizerMismatch as exc:
        view.note = f"token ids shown: {exc} (not this episode's tokenizer?)"
        return view
    except Exception as exc:  # a tokenizer failing on odd ids must not lose the page
        view.note = f"token ids shown: decoding failed ({type(exc).__name__}: {exc})"
        return view
    view.pieces = head + tail
    return view


def open_tokenizer(ref: str, *, local_only: bool) -> Any:
    """The tokenizer ``ref`` (``offline:<family>``, a local directory or a hub id). ``local_only``
    (a ref guessed from an evaluation's settings) never downloads: a hub id must be in the cache."""
    from ..backends.factory import load_tokenizer

    if local_only and not ref.startswith("offline:") and not Path(ref).expanduser().is_dir():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(ref, local_files_only=True)
    return load_tokenizer(ref)
