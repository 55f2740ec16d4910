"""Log-probabilities of response tokens under a causal LM, computing logits only where needed.

With a 150k-token vocabulary the output projection dominates the cost of a small model: logits are
computed only at positions whose next token carries loss (``response_mask``), in chunks, never as
a full [batch, sequence, vocab] tensor. They must be the logits the model's own forward produces (the
rollouts were sampled from those), so the head's post-processing is reproduced and checked once per
model against a full forward; a model whose forward does something else is refused.

Rows of a batch usually open with the same tokens (system prompt, tool specs: ~80% of a quickstart
row). That common prefix is run once and its keys/values are shared by every row, when the model's
cache supports it; checked once per model against a full forward, the full forward otherwise.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from ..batch import Batch
from ..utils.torch_errors import is_out_of_memory

logger = logging.getLogger(__name__)

_CHECKED: weakref.WeakKeyDictionary[Any, Callable[[Any], Any]] = weakref.WeakKeyDictionary()
_PROBE_TOKENS = 12
_SHARES_PREFIX: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_MIN_SHARED_PREFIX = 16


def _unwrap(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: LoRA lives inside


def _backbone_and_head(model: Any) -> tuple[Any, Any]:
    model = _unwrap(model)
    head = model.get_output_embeddings()
    backbone = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if backbone is None or head is None:
        raise TypeError(f"{type(model).__name__} does not expose a backbone and an output head")
    return backbone, head


def _head_postprocess(model: Any) -> Callable[[Any], Any]:
    """What ``transformers`` causal LMs apply to ``lm_head``'s output, read from the config:
    Cohere's ``logit_scale`` (multiply), Granite's ``logits_scaling`` (divide), Gemma 2/3's
    ``final_logit_softcapping`` (cap * tanh(logits / cap))."""
    import torch

    config = _unwrap(model).config
    scale = getattr(config, "logit_scale", None)
    divide = getattr(config, "logits_scaling", None)
    cap = getattr(config, "final_logit_softcapping", None)

    def post(logits: Any) -> Any:
        if scale is not None:
            logits = logits * scale
        if divide is not None:
            logits = logits / divide
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return post


def output_logits_fn(model: Any) -> Callable[[Any], Any]:
    """``hidden states -> logits`` exactly as the model's forward computes them (checked once per model)."""
    import torch

    cached = _CHECKED.get(model)
    if cached is not None:
        return cached
    backbone, head = _backbone_and_head(model)
    post = _head_postprocess(model)

    def logits_of(states: Any) -> Any:
        return post(head(states)).float()

    vocab = int(head.weight.shape[0])
    device = next(model.parameters()).device
    ids = (torch.arange(_PROBE_TOKENS, device=device) * 7919 + 11).remainder(vocab).unsqueeze(0)
    attention = torch.ones_like(ids)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            full = model(input_ids=ids, attention_mask=attention).logits.float()
            hidden = backbone(input_ids=ids, attention_mask=attention).last_hidden_state
            ours = logits_of(hidden)
    finally:
        model.train(was_training)
    gap = float((full - ours).abs().max())
    if not gap <= 1e-3 * (1.0 + float(full.abs().max())):
        raise TypeError(
            f"{type(_unwrap(model)).__name__}'s forward post-processes its output logits in a way agentboost does "
            f"not reproduce (max difference {gap:.4g} from lm_head + the known scalings: logit_scale, "
            "logits_scaling, final_logit_softcapping). Its log-probs in the loss would not be the ones the "
            "rollouts were sampled from, so the trainer refuses this model."
        )
    _CHECKED[model] = logits_of
    return logits_of


def response_logprobs(
    model: Any, batch: Batch, *, chunk_positions: int = 2048, temperature: float = 1.0, with_raw: bool = False
) -> Any:
    """[B, R] log-probabilities of ``batch.responses`` (0 where ``response_mask`` is 0) under the
    model's distribution at ``temperature`` (the one the rollouts were sampled from, as veRL uses).
    ``with_raw``: also return the temperature-1 values (what backends report, for the staleness check)."""
    import torch

    if temperature <= 0:
        raise ValueError(f"log-probs need a temperature > 0, got {temperature}")
    logits_of = output_logits_fn(model)
    backbone, _ = _backbone_and_head(model)
    device = next(model.parameters()).device
    input_ids = batch.input_ids.to(device)
    attention_mask = batch.attention_mask.to(device)
    position_ids = batch.position_ids.to(device)
    hidden, offset = _last_hidden_states(
        model, backbone, input_ids, attention_mask, position_ids, prompt_length=batch.prompt_length
    )
    p = batch.prompt_length - offset  # hidden[:, i] is position offset + i
    mask = batch.response_mask.to(device).bool()
    rows, cols = mask.nonzero(as_tuple=True)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=device)
    if rows.numel() == 0:
        out = out + hidden.sum() * 0.0  # keeps the graph connected for an all-masked batch
        return (out, out.detach().clone()) if with_raw else out
    # The token at response position j is predicted from the hidden state at p + j - 1.
    states = hidden[rows, p + cols - 1]
    targets = input_ids[rows, batch.prompt_length + cols]
    pieces, raw_pieces = [], []
    for start in range(0, states.shape[0], chunk_positions):
        logits = logits_of(states[start : start + chunk_positions])
        chunk_targets = targets[start : start + chunk_positions, None]
        if with_raw:
            raw_pieces.append(torch.log_softmax(logits, dim=-1).gather(-1, chunk_targets))
        if temperature != 1.0:
            logits = logits / temperature
        pieces.append(torch.log_softmax(logits, dim=-1).gather(-1, chunk_targets))
    values = out.index_put((rows, cols), torch.cat(pieces).squeeze(-1))
    if not with_raw:
        return values
    return values, torch.zeros_like(out).index_put((rows, cols), torch.cat(raw_pieces).squeeze(-1))


def shared_prefix_length(input_ids: Any, attention_mask: Any, position_ids: Any, prompt_length: int) -> int:
    """How many leading tokens every row has in common (same tokens at the same positions), counted from
    each row's first token (prompts are left-padded: rows of different prompt lengths start at different
    columns), short of every row's last prompt position (the first one whose hidden state the loss needs)."""
    import torch

    if input_ids.shape[0] < 2:
        return 0
    starts = _starts(attention_mask)
    width = prompt_length - 1 - int(starts.max())
    if width <= 0:
        return 0
    columns = starts[:, None] + torch.arange(width, device=input_ids.device)[None, :]
    ids, positions = input_ids.gather(1, columns), position_ids.gather(1, columns)
    same = ((ids == ids[:1]) & (positions == positions[:1]) & (attention_mask.gather(1, columns) == 1)).all(0)
    return int(same.long().cumprod(0).sum())


def _starts(attention_mask: Any) -> Any:
    """[B] each row's first real column (the width of its left padding)."""
    return attention_mask.long().argmax(dim=1)


def _last_hidden_states(
    model: Any, backbone: Any, input_ids: Any, attention_mask: Any, position_ids: Any, *, prompt_length: int
) -> tuple[Any, int]:
    """The backbone's last hidden states from column ``offset`` on, and ``offset``: the rows' common
    prefix is run once and its cache shared where that was checked to equal the full forward."""
    k = shared_prefix_length(input_ids, attention_mask, position_ids, prompt_length)
    inputs = (input_ids, attention_mask, position_ids)
    if k >= _MIN_SHARED_PREFIX and _prefix_sharing_matches(model, backbone, *inputs, k=k):
        try:
            hidden = _shared_prefix_forward(backbone, input_ids, attention_mask, position_ids, k)
            return hidden, int(_starts(attention_mask).min()) + k
        except _NoCache:  # this mode keeps no cache (gradient checkpointing; Gemma 2 in training): stop trying
            _SHARES_PREFIX[model] = False
            logger.info("%s keeps no cache to share in this mode; running every row in full from now on",
                        type(_unwrap(model)).__name__)  # fmt: skip
    full = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    return full.last_hidden_state, 0


class _NoCache(Exception):
    """The prefix forward returned no cache to share."""


def _shared_prefix_forward(backbone: Any, input_ids: Any, attention_mask: Any, position_ids: Any, k: int) -> Any:
    """Hidden states of every row from column ``min(starts) + k`` on: the ``k`` common tokens run once
    (row 0's), their cache repeated for every row, then each row's own tokens after them. Rows of other
    prompt lengths are realigned: each one's tail follows the prefix directly (right-padded), and its
    hidden states go back to its own columns (those before its tail, inside its prefix, are 0)."""
    import torch

    rows, width = input_ids.shape
    starts = _starts(attention_mask)
    s0 = int(starts[0])
    prefix = backbone(
        input_ids=input_ids[:1, s0 : s0 + k], attention_mask=attention_mask[:1, s0 : s0 + k],
        position_ids=position_ids[:1, s0 : s0 + k], use_cache=True,
    )  # fmt: skip
    cache = prefix.past_key_values
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        raise _NoCache
    if hasattr(cache, "get_seq_length") and cache.get_seq_length() != k:  # layers dropped it (checkpointing)
        raise _NoCache
    cache.batch_repeat_interleave(rows)  # differentiable: the rows' gradients add up in the prefix
    first = starts + k  # each row's first column after the prefix
    offset = int(first.min())
    columns = first[:, None] + torch.arange(width - offset, device=input_ids.device)[None, :]
    inside = columns < width
    columns = columns.clamp(max=width - 1)
    tail_mask = attention_mask.gather(1, columns) * inside
    hidden = backbone(
        input_ids=input_ids.gather(1, columns), position_ids=position_ids.gather(1, columns),
        attention_mask=torch.cat([attention_mask.new_ones((rows, k)), tail_mask], dim=1),
        past_key_values=cache, use_cache=True,
    ).last_hidden_state  # fmt: skip
    if bool((starts == starts[0]).all()):
        return hidden  # aligned rows: each tail is already at its own columns
    row_index = torch.arange(rows, device=input_ids.device)[:, None].expand_as(columns)
    placed = hidden.new_zeros(hidden.shape)
    return placed.index_put((row_index[inside], columns[inside] - offset), hidden[inside])


def _prefix_sharing_matches(
    model: Any, backbone: Any, input_ids: Any, attention_mask: Any, position_ids: Any, *, k: int
) -> bool:
    """Once per model: does the shared-prefix forward give the full forward's hidden states (on two
    rows of the first batch that can share)? A cache without the needed support, or any difference,
    keeps this model on the full forward."""
    import torch

    known = _SHARES_PREFIX.get(model)
    if known is not None:
        return known
    rows = slice(0, 2)
    starts = _starts(attention_mask[rows])
    offset = int(starts.min()) + k
    # compared where each row's tail is (a realigned row's columns inside its prefix are not computed)
    tail = torch.arange(input_ids.shape[1] - offset, device=input_ids.device)[None, :] + offset >= (starts + k)[:, None]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            full = (
                backbone(
                    input_ids=input_ids[rows], attention_mask=attention_mask[rows], position_ids=position_ids[rows]
                )
                .last_hidden_state[:, offset:]
                .float()
            )
            try:
                shared = _shared_prefix_forward(
                    backbone, input_ids[rows], attention_mask[rows], position_ids[rows], k
                ).float()
            except (_NoCache, AttributeError, TypeError, ValueError, NotImplementedError, RuntimeError) as exc:
                if is_out_of_memory(exc):  # says nothing about the model: not a reason to stop sharing for good
                    raise
                shared, why = None, f"{type(exc).__name__}: {exc}"
    finally:
        model.train(was_training)
    if shared is not None:
        gap = float((full - shared)[tail].abs().max()) if shared.shape == full.shape else float("inf")
        why = f"max difference {gap:.3g} from the full forward"
        ok = gap <= 1e-3 * (1.0 + float(full.abs().max()))
    else:
        ok = False
    _SHARES_PREFIX[model] = ok
    if ok:
        logger.debug("%s: rows' common prefix is run once (%s)", type(_unwrap(model)).__name__, why)
    else:
        logger.info("%s: rows' common prefix cannot be shared (%s); running every row in full",
                    type(_unwrap(model)).__name__, why)  # fmt: skip
    return ok
