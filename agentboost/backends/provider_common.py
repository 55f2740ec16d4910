"""What the Strands-provider route's modules share: the ``strands:`` backend prefix, the "not token-exact"
mark and the stand-in chat template. :mod:`agentboost.backends.strands_provider` (specs, the backend) and
:mod:`agentboost.backends.provider_model` (each episode's model) both import it, never each other's
internals (the backend names the model class; the model does not import the backend)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Protocol

from ..types import SamplingParams

PREFIX = "strands:"
"""``ModelSpec.backend`` prefix of the provider route."""
NOT_TOKEN_EXACT = "not token-exact: not training data"
"""The mark every provider episode, summary and report carries."""


def is_provider_backend(backend: str) -> bool:
    return backend.startswith(PREFIX)


def is_token_exact(episode: Any) -> bool:
    """False for episodes recorded through a Strands provider (no tokens: never training data)."""
    return episode.metadata.get("token_exact") is not False


def mark_not_token_exact(episode: Any) -> None:
    """Mark ``episode`` as a provider baseline: no tokens, masked, never trained on."""
    episode.masked = True
    episode.metadata["token_exact"] = False
    episode.metadata["not_training_data"] = NOT_TOKEN_EXACT


class ProviderTemplate:
    """Stands where a chat template goes: the provider renders its own prompts (no tokens here)."""

    fingerprint = "none (Strands model provider: the provider renders prompts)"
    parser = SimpleNamespace(name="provider")


PROVIDER_TEMPLATE = ProviderTemplate()


class ProviderBackend(Protocol):
    """What a provider episode's model needs of its backend
    (:class:`~agentboost.backends.strands_provider.StrandsProviderBackend`)."""

    ref: Any
    """The parsed provider spec: ``describe()`` names it in records."""

    def strands_model(self, sampling: SamplingParams) -> Any: ...
