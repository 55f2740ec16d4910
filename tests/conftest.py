from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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


# CI runs the suite on two workers (pytest-xdist, ``-n 2 --dist loadfile``): a module's tests stay on one worker
# (module-scoped fixtures start once), and the modules that run programs in the sandbox count as one module, run
# one after another on one worker: they share the host's sandbox state (the in-memory root, user nobody's processes
# and zygotes, the leak counts some of them take). (Not xdist_group + loadgroup: pytest 9.2's node ids ignore the
# group suffix pytest-xdist 3.8 writes, so those groups are silently split.)
SANDBOX_MODULES = ("test_sandbox", "test_rewards_code", "test_example_envs", "test_pool_robustness")


def xdist_scope(nodeid: str) -> str:
    """The unit ``--dist loadfile`` sends to one worker: the test's module, or "sandbox" for those above."""
    module = nodeid.split("::", 1)[0]
    return "sandbox" if Path(module).name.startswith(SANDBOX_MODULES) else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return Scheduling(config, log)


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
