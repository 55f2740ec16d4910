"""An environment that is none of the examples, for the tests of ``agentboost train``: count a word's letters
with a ``count_letters`` tool; reward 1 for exactly the count. Rows: ``{"task_id", "word", "prompt", "answer"}``."""

from __future__ import annotations

from typing import Any

from strands import tool

from agentboost.environments.strands_env import StrandsEnv
from agentboost.rewards.answer import final_answer_text

WORDS = ("banana", "kiwi", "apple", "fig", "cherry", "melon", "plum", "grape", "lemon", "mango")


@tool
def count_letters(word: str) -> str:
    """Count the letters of a word.

    Args:
        word: the word
    """
    return str(sum(ch.isalpha() for ch in word))


def exact_count(task: dict[str, Any], episode: Any) -> float:
    return float((final_answer_text(episode) or "").strip() == task["answer"])


class LetterCountEnv(StrandsEnv):
    def __init__(self, task: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(task, tools=[count_letters], reward_fn=exact_count, **kwargs)

    @classmethod
    def from_dict(cls, info: dict[str, Any]) -> LetterCountEnv:
        row = dict(info)
        return cls(task=row, prompt_key=row.pop("prompt_key", None))


def rows() -> list[dict[str, Any]]:
    return [
        {"task_id": f"w{i}", "word": w, "prompt": f"How many letters are in {w}?", "answer": str(len(w))}
        for i, w in enumerate(WORDS)
    ]


def teacher(body: dict[str, Any]) -> Any:
    """A "frontier model" for the fake chat server: looks the count up with the tool, answers with it."""
    from agentboost.testing.fake_openai_chat import ChatReply, last_user_text, tool_results

    results = tool_results(body)
    if not results:
        word = last_user_text(body).removeprefix("How many letters are in ").rstrip("?")
        return ChatReply(content="Let me count.", tool_calls=[{"name": "count_letters", "arguments": {"word": word}}])
    return ChatReply(content=results[-1])


def make_agent(*, model: Any, tools: list[Any], task: dict[str, Any], **defaults: Any) -> Any:
    """An agent factory (what ``--agent`` / ``AGENT_ARGS=agent_factory=...`` name)."""
    from strands import Agent

    return Agent(model=model, tools=tools, system_prompt="You count letters with the tool.", **defaults)
