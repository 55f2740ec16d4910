"""Small causal LMs built from a config (random weights, no download), paired with an offline tokenizer.

Used by the tests (exercise the in-process backend and the trainer on real model code), by the
quickstart (a model small enough to train on a laptop CPU) and by ``agentboost train --model tiny`` /
``agentboost init-model`` (:mod:`agentboost.train.starting_model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tokenizer_builder import build_tokenizer


@dataclass(frozen=True)
class SmallModel:
    """The sizes of the quickstart's model (``agentboost quickstart --help`` says why each): also what
    ``agentboost train --model tiny`` and ``agentboost init-model`` build."""

    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 8
    """Half as many key/value heads; the MLP is twice the hidden size."""

    def problems(self) -> list[str]:
        """What is wrong with these sizes (empty when they build a model)."""
        problems = [f"{name} must be >= 1, got {value}" for name, value in vars(self).items() if value < 1]
        heads, kv_heads = self.num_heads, max(1, self.num_heads // 2)
        if not problems and (self.hidden_size % (2 * heads) or heads % kv_heads):
            problems.append(
                f"num_heads={heads} must split hidden_size={self.hidden_size} into heads of an even size (rotary "
                f"embeddings) and be a multiple of its {kv_heads} key/value heads (num_heads // 2)"
            )
        return problems


def build_small_qwen2(tokenizer: Any, sizes: SmallModel, *, seed: int = 0) -> tuple[Any, Any]:
    """:func:`build_tiny_qwen2` with ``sizes`` as the quickstart shapes them."""
    return build_tiny_qwen2(
        tokenizer=tokenizer, hidden_size=sizes.hidden_size, intermediate_size=2 * sizes.hidden_size,
        num_layers=sizes.num_layers, num_heads=sizes.num_heads, num_kv_heads=max(1, sizes.num_heads // 2), seed=seed,
    )  # fmt: skip


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
