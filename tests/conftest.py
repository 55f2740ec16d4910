from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

import pytest

from agentboost.chat.template import ChatTemplate
from agentboost.offline.tokenizer_builder import load_tokenizer

# (config name, offline tokenizer family, template kwargs)
TEMPLATE_CONFIGS = {
    "qwen2.5": ("qwen2.5", {}),
    "qwen3-thinking": ("qwen3", {}),
    "qwen3-nothink": ("qwen3", {"enable_thinking": False}),
    "qwen3-instruct-2507": ("qwen3-instruct-2507", {}),
    "llama3.1": ("llama3.1", {}),
}

_TOKENIZERS: dict[str, object] = {}


def tokenizer_for(family: str):
    if family not in _TOKENIZERS:
        _TOKENIZERS[family] = load_tokenizer(family)
    return _TOKENIZERS[family]


def template_for(config: str) -> ChatTemplate:
    family, kwargs = TEMPLATE_CONFIGS[config]
    return ChatTemplate(tokenizer_for(family), template_kwargs=kwargs)


@pytest.fixture(scope="session")
def qwen25_template() -> ChatTemplate:
    return template_for("qwen2.5")


@pytest.fixture(scope="session")
def qwen25_tokenizer():
    return tokenizer_for("qwen2.5")


@pytest.fixture(scope="session")
def vllm_server():
    """The real vLLM server of this session (``agentboost.testing.vllm_server.session_server``: one that CI
    started, named by ``AGENTBOOST_VLLM_URL``, or one started here from ``AGENTBOOST_VLLM_PYTHON``); skipped,
    saying why, when neither is set."""
    from agentboost.testing.vllm_server import VLLMUnavailable, session_server

    try:
        with session_server() as info:
            yield info
    except VLLMUnavailable as exc:
        pytest.skip(str(exc))
