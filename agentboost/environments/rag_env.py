"""Multi-hop question answering (HotpotQA-style) with a ``retrieve`` tool.

Rows: ``{"question", "answer" | "answers", ...}``; optional ``retrieval_url`` (else
``$AGENTBOOST_RETRIEVAL_URL``, else http://127.0.0.1:8010) and ``reward_metric`` (``em``, default, or
``f1``). Reward: :func:`agentboost.rewards.rag.rag_reward` on the final answer.
"""

from __future__ import annotations

from typing import Any

from ..rewards.rag import rag_reward
from .strands_env import StrandsEnv

SYSTEM_PROMPT = (
    "You answer questions using a document collection. Search it with the `retrieve` tool, as often as you "
    "need: questions may need facts from several documents, so look up what one passage tells you to find "
    "the next. When you know the answer, reply with only the answer inside <answer></answer> tags, as short "
    "as possible (a name, a number, yes or no)."
)


def rag_tools(task: dict[str, Any]) -> list[Any]:
    """A fresh ``retrieve`` tool bound to the task's retrieval server."""
    from ..tools.retrieve_tool import make_retrieve_tool, retrieval_url

    return [make_retrieve_tool(retrieval_url(task))]


class RagEnv(StrandsEnv):
    """``StrandsEnv`` with the ``retrieve`` tool and the EM/F1 reward as defaults."""

    def __init__(self, task: dict[str, Any] | None = None, tools: Any = None, reward_fn: Any = None, **kwargs: Any):
        super().__init__(task, tools if tools is not None else rag_tools, reward_fn or rag_reward, **kwargs)
