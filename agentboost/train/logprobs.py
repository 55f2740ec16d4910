"""Log-probabilities of response tokens under a causal LM, computing logits only where needed.

With a 150k-token vocabulary the output projection dominates the cost of a small model: logits are
computed only at positions whose next token carries loss (``response_mask``), in chunks, never as
a full [batch, sequence, vocab] tensor.
"""

from __future__ import annotations

from typing import Any

from ..batch import Batch


def _backbone_and_head(model: Any) -> tuple[Any, Any]:
    if hasattr(model, "get_base_model"):  # peft: LoRA layers live inside the base model's modules
        model = model.get_base_model()
    head = model.get_output_embeddings()
    backbone = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if backbone is None or head is None:
        raise TypeError(f"{type(model).__name__} does not expose a backbone and an output head")
    return backbone, head


def response_logprobs(model: Any, batch: Batch, *, chunk_positions: int = 2048, temperature: float = 1.0) -> Any:
    """[B, R] log-probabilities of ``batch.responses`` (0 where ``response_mask`` is 0)."""
    import torch

    backbone, head = _backbone_and_head(model)
    device = next(model.parameters()).device
    input_ids = batch.input_ids.to(device)
    hidden = backbone(
        input_ids=input_ids,
        attention_mask=batch.attention_mask.to(device),
        position_ids=batch.position_ids.to(device),
    ).last_hidden_state
    p = batch.prompt_length
    mask = batch.response_mask.to(device).bool()
    rows, cols = mask.nonzero(as_tuple=True)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=device)
    if rows.numel() == 0:
        return out + hidden.sum() * 0.0  # keeps the graph connected for an all-masked batch
    # The token at response position j is predicted from the hidden state at p + j - 1.
    states = hidden[rows, p + cols - 1]
    targets = input_ids[rows, p + cols]
    pieces = []
    for start in range(0, states.shape[0], chunk_positions):
        logits = head(states[start : start + chunk_positions]).float()
        if temperature != 1.0:
            logits = logits / temperature
        pieces.append(torch.log_softmax(logits, dim=-1).gather(-1, targets[start : start + chunk_positions, None]))
    values = torch.cat(pieces).squeeze(-1)
    return out.index_put((rows, cols), values)
