"""A tiny Hugging Face model directory for the tests of ``agentboost train`` / ``export``: a two-layer Qwen2
built from a config (random weights, no download) with a small BPE vocabulary trained on a few chats, and
the real Qwen2.5 chat template and tool-call format. It stands in for the model directory a user
downloads (README "Train your own agent")."""

from __future__ import annotations

import json
from pathlib import Path

CHATS = [
    ("What is 2 + 3 * 4?", "2 + 3 * 4", "14"),
    ("What is 7 * 6 - 5?", "7 * 6 - 5", "37"),
    ("What is 9 - 4 + 1?", "9 - 4 + 1", "6"),
    ("What is 8 * 8?", "8 * 8", "64"),
]


def corpus() -> list[str]:
    from agentboost.offline.tokenizer_builder import load_tokenizer

    real = load_tokenizer("qwen2.5")
    tools = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate an expression.",
                                               "parameters": {"type": "object", "properties": {
                                                   "expression": {"type": "string"}}}}}]  # fmt: skip
    texts = []
    for prompt, expression, answer in CHATS:
        call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        messages = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
            {"role": "tool", "content": answer},
            {"role": "assistant", "content": f"The answer is {answer}."},
        ]
        texts.append(real.apply_chat_template(messages, tools=tools, tokenize=False))
    return texts


def save_tiny_model(
    out: Path, *, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4, seed: int = 0
) -> Path:
    """``num_heads`` heads of ``hidden_size / num_heads`` (vLLM's CPU attention needs 32 or more), half as many
    key-value heads."""
    from transformers import AutoTokenizer

    from agentboost.offline.tiny_model import build_tiny_qwen2, save_model
    from agentboost.offline.tokenizer_builder import build_domain_tokenizer

    tokenizer_dir = build_domain_tokenizer(corpus(), family="qwen2.5", vocab_size=400)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    model, tokenizer = build_tiny_qwen2(tokenizer=tokenizer, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                                        num_layers=num_layers, num_heads=num_heads,
                                        num_kv_heads=max(1, num_heads // 2), seed=seed)  # fmt: skip
    return save_model(model, tokenizer, out)
