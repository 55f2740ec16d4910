"""Small causal LMs built from a config (random weights, no download), paired with an offline tokenizer.

Used by the tests (exercise the in-process backend and the trainer on real model code) and by the
quickstart (a model small enough to train on a laptop CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .tokenizer_builder import build_tokenizer


def build_tiny_qwen2(
    tokenizer_name: str = "qwen2.5",
    *,
    tokenizer: Any = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 4096,
    vocab_size: int | None = None,
    seed: int = 0,
) -> tuple[Any, Any]:
    """A randomly initialised ``Qwen2ForCausalLM`` and the offline tokenizer it pairs with
    (``tokenizer`` overrides the offline family ``tokenizer_name``; ``vocab_size``: the embedding's rows, the
    tokenizer's length by default)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(str(build_tokenizer(tokenizer_name)), local_files_only=True)
    config = Qwen2Config(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.eval()
    return model, tokenizer


def save_model(model: Any, tokenizer: Any, out_dir: str | Path) -> Path:
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path
