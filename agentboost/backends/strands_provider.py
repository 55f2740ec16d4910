"""Baselines through any Strands model provider: the same environments, rewards and reports, no tokens.

``agentboost eval`` / ``rollout`` normally run the policy through :class:`~agentboost.model.TokenModel`
(token ids in and out). To measure a frontier model or any chat endpoint on the same tasks, a
``ModelSpec`` whose backend is ``strands:<provider spec>`` runs each episode through a Strands model
provider instead (:func:`parse_provider`):

* ``openai:<model>@<base_url>``: any OpenAI-compatible chat endpoint (vLLM's or SGLang's chat API,
  Ollama's ``/v1``, LiteLLM proxies; a key only when given, never ``OPENAI_API_KEY``);
  ``openai:<model>`` alone: api.openai.com (``OPENAI_API_KEY``);
* ``bedrock:<model-id>[@<region>]``: Amazon Bedrock (credentials from the usual AWS chain);
* ``py:<module>:<factory>``: ``factory(sampling=SamplingParams) -> strands.models.Model``, for every
  other provider (Anthropic, Gemini, LiteLLM, Ollama's native API...).

The episode still goes through :func:`agentboost.rollout.run_episode` (the backend names its model
class, :class:`~agentboost.backends.provider_model.ProviderModel`), so the termination rule, the turn,
token and wall-clock budgets, tool statistics, tool timeouts and output caps, unknown-tool handling
and the reward are the same code as for token-exact episodes (:class:`~agentboost.model.TrajectoryHooks`
and the tool middleware are reused as they are). What differs is recorded, never hidden: the episode has **no tokens**
(``segments`` and ``calls`` are empty; each provider call is in ``metadata["provider_calls"]`` with
the provider's own token counts), ``metadata["token_exact"]`` is False with the reason
:data:`NOT_TOKEN_EXACT`, and the episode is ``masked``: a trainer gives it no gradient and no
baseline, whatever its reward. The token budget is checked against the provider's reported usage
(its tokenizer, not the policy's).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from ..types import SamplingParams
from .provider_common import (
    NOT_TOKEN_EXACT,
    PREFIX,
    PROVIDER_TEMPLATE,
    ProviderTemplate,
    is_provider_backend,
    is_token_exact,
    mark_not_token_exact,
)

logger = logging.getLogger(__name__)

__all__ = [
    "NOT_TOKEN_EXACT",
    "PREFIX",
    "PROVIDERS",
    "PROVIDER_TEMPLATE",
    "ProviderRef",
    "ProviderTemplate",
    "StrandsProviderBackend",
    "build_strands_model",
    "is_provider_backend",
    "is_token_exact",
    "mark_not_token_exact",
    "parse_provider",
]

PROVIDERS = ("openai", "bedrock", "py")


@dataclass(frozen=True)
class ProviderRef:
    """A parsed provider spec (see module doc). ``location`` is a base URL or a region."""

    provider: str
    model: str
    location: str | None = None

    def describe(self) -> str:
        """``provider:model[@location]``: what the reports show (never a key)."""
        return f"{self.provider}:{self.model}" + (f"@{self.location}" if self.location else "")

    def what(self) -> str:
        """The model without where it is served (a base URL may change between resumed runs)."""
        return f"{PREFIX}{self.provider}:{self.model}"


def parse_provider(spec: str) -> ProviderRef:
    """Parse ``openai:<model>[@<base_url>]``, ``bedrock:<model-id>[@<region>]`` or ``py:<module>:<attr>``
    (with or without the ``strands:`` prefix)."""
    text = spec[len(PREFIX) :] if spec.startswith(PREFIX) else spec
    provider, sep, rest = text.partition(":")
    if not sep or not rest or provider not in PROVIDERS:
        raise ValueError(
            f"invalid Strands model {spec!r}: use openai:<model>[@<base_url>], bedrock:<model-id>[@<region>] "
            "or py:<module>:<factory>"
        )
    if provider == "py":
        return ProviderRef("py", rest)
    model, at, location = rest.rpartition("@")
    if not at:
        model, location = rest, ""
    if not model:
        raise ValueError(f"invalid Strands model {spec!r}: the model name is empty")
    if provider == "openai" and location and not location.startswith(("http://", "https://")):
        raise ValueError(f"invalid Strands model {spec!r}: the part after '@' must be an http(s):// base URL")
    return ProviderRef(provider, model, location or None)


def build_strands_model(
    ref: ProviderRef,
    *,
    sampling: SamplingParams | None = None,
    api_key: str | None = None,
    request_timeout_s: float = 900.0,
    max_retries: int = 2,
) -> Any:
    """A Strands model provider instance for ``ref``, sampling as ``sampling`` says.

    Parameters equal to the providers' own defaults (temperature 1, top-p 1) are not sent: several
    frontier models refuse them (reasoning models reject ``temperature``; recent Claude models
    reject ``temperature`` together with ``top_p``)."""
    sampling = sampling or SamplingParams()
    if ref.provider == "openai":
        from strands.models.openai import OpenAIModel

        # OPENAI_API_KEY goes to api.openai.com only, never to another endpoint named by a base URL.
        key = api_key or (os.environ.get("OPENAI_API_KEY") if ref.location is None else "EMPTY")
        if not key:
            raise ValueError("openai:<model> without a base URL needs OPENAI_API_KEY (or --api-key-env NAME)")
        client_args: dict[str, Any] = {"api_key": key, "timeout": request_timeout_s, "max_retries": max_retries}
        if ref.location:
            client_args["base_url"] = ref.location
        return OpenAIModel(client_args=client_args, model_id=ref.model, params=_openai_params(sampling))
    if ref.provider == "bedrock":
        from botocore.config import Config
        from strands.models.bedrock import BedrockModel

        config: dict[str, Any] = {"model_id": ref.model}
        if sampling.temperature != 1.0:
            config["temperature"] = sampling.temperature
        if sampling.top_p != 1.0:
            config["top_p"] = sampling.top_p
        if sampling.max_tokens_per_call is not None:
            config["max_tokens"] = sampling.max_tokens_per_call
        ignored = [name for name, off in (("seed", None), ("top_k", -1), ("min_p", 0.0), ("repetition_penalty", 1.0))
                   if getattr(sampling, name) != off]  # fmt: skip
        if ignored:
            logger.warning("bedrock: %s not supported by the Converse API; ignored", ", ".join(ignored))
        client_config = Config(read_timeout=request_timeout_s, retries={"max_attempts": max_retries + 1})
        return BedrockModel(region_name=ref.location, boto_client_config=client_config, api_key=api_key, **config)
    from ..utils.refs import resolve

    model = resolve(ref.model)(sampling=sampling)
    from strands.models.model import Model

    if not isinstance(model, Model):
        raise TypeError(f"{ref.model} returned {type(model).__name__}, not a strands.models.Model")
    return model


def _openai_params(sampling: SamplingParams) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if sampling.temperature != 1.0:
        params["temperature"] = sampling.temperature
    if sampling.top_p != 1.0:
        params["top_p"] = sampling.top_p
    if sampling.max_tokens_per_call is not None:
        params["max_tokens"] = sampling.max_tokens_per_call
    if sampling.seed is not None:
        params["seed"] = sampling.seed
    extra = {name: getattr(sampling, name) for name, off in (("top_k", -1), ("min_p", 0.0), ("repetition_penalty", 1.0))
             if getattr(sampling, name) != off}  # fmt: skip
    if extra:  # vLLM / SGLang sampling extensions; OpenAI itself rejects them
        params["extra_body"] = extra
    return params


class StrandsProviderBackend:
    """What ``build_model`` returns for a ``strands:`` spec: how to build each episode's provider model.

    ``run_episode`` builds the episode's Strands model through :attr:`episode_model`."""

    def __init__(self, ref: ProviderRef, *, api_key: str | None = None, request_timeout_s: float = 900.0) -> None:
        self.ref = ref
        self.api_key = api_key
        self.request_timeout_s = request_timeout_s
        if ref.provider == "py":
            from ..utils.refs import resolve

            resolve(ref.model)  # an import error shows at once, not once per episode
        elif ref.provider == "openai":
            build_strands_model(ref, api_key=api_key)  # a missing key is refused before any episode runs

    def describe(self) -> str:
        return f"strands provider {self.ref.describe()} ({NOT_TOKEN_EXACT})"

    def strands_model(self, sampling: SamplingParams) -> Any:
        return build_strands_model(
            self.ref, sampling=sampling, api_key=self.api_key, request_timeout_s=self.request_timeout_s
        )

    @property
    def episode_model(self) -> type:
        """The Strands model class ``run_episode`` builds for each episode."""
        from .provider_model import ProviderModel

        return ProviderModel
