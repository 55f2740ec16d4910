"""The agent's final answer, as every reward reads it.

An answer exists only when the agent finished the episode itself (termination ``completed``): an
episode cut off by the turn or token limit ends on a tool call or a truncated message, and what that
message holds is not an answer. The text is the last assistant message's text (reasoning content
excluded by the episode) with any ``<think>...</think>`` block removed: models emit them as plain
text under templates without a reasoning section, and an unclosed one runs to the end. A text that
starts inside reasoning (the template opened ``<think>`` in the prompt) keeps what follows the last
``</think>``.
"""

from __future__ import annotations

import re

from ..episode import Episode
from ..types import Termination

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)


def strip_reasoning(text: str) -> str:
    """``text`` without ``<think>`` blocks (see module doc)."""
    text = _THINK.sub("", text or "")
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text


def final_answer_text(episode: Episode) -> str | None:
    """The final answer's text, or None when the episode did not complete (see module doc)."""
    if episode.termination is not Termination.COMPLETED:
        return None
    return strip_reasoning(episode.final_text)
