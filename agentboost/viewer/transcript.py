"""An episode's conversation as flat, capped items (text, reasoning, tool calls, tool results).

What the viewer shows and what W&B trajectory tables print. An episode of several trajectories has a
conversation per trajectory (``Episode.messages_of``): the history its first call was given (what its
prompt renders) and what followed in it. Strands messages hold model output and
tool output, so every field is read defensively: a block of an unexpected shape becomes an ``other``
item naming its keys, never an exception, and every text is cut at a limit that is reported
(``clipped`` characters not shown).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from ..episode import Episode, ModelCall

MAX_CHARS = 8000
"""Default cap on the characters of one item's text."""
MAX_ITEMS = 400
"""Default cap on the items of one episode."""


@dataclass
class Item:
    """One thing a person reads in the conversation."""

    role: str
    """``user``, ``assistant``, ``tool`` (a tool result) or the message's own role."""
    kind: str
    """``text``, ``reasoning``, ``tool_call``, ``tool_result`` or ``other``."""
    text: str
    clipped: int = 0
    """Characters of ``text`` not shown (cut at the cap)."""
    name: str = ""
    """Tool name (tool calls and their results)."""
    status: str = ""
    """Tool result status (``success``, ``error``...)."""
    call: int | None = None
    """Model call that produced this assistant item (``Episode.calls`` index), when recorded."""
    message: int = -1
    """Index of the message this item comes from (in the messages shown)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def clip(text: str, limit: int) -> tuple[str, int]:
    """``text`` cut to ``limit`` characters, and how many were cut."""
    if len(text) <= limit:
        return text, 0
    return text[:limit], len(text) - limit


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return repr(value)


def _block_text(block: Any) -> str:
    """Text of one tool-result content block (text, json, or a named placeholder for media)."""
    if not isinstance(block, dict):
        return _as_text(block)
    if isinstance(block.get("text"), str):
        return block["text"]
    if "json" in block:
        return _as_text(block["json"])
    kinds = ", ".join(sorted(str(k) for k in block))
    return f"<{kinds} block>"


def trajectory_calls(episode: Episode, trajectory: int | None) -> tuple[list[dict[str, Any]], list[ModelCall]]:
    """The messages of ``trajectory`` and its calls (whose ``message_index`` points into them). ``None``:
    the episode's own messages, with its calls when it is one trajectory (an episode of several keeps
    the messages its reward read, which no call indexes)."""
    if trajectory is None:
        return episode.messages, (episode.calls if episode.num_trajectories <= 1 else [])
    return episode.messages_of(trajectory), [c for c in episode.calls if c.trajectory == trajectory]


def conversation(
    episode: Episode, *, trajectory: int | None = None, max_chars: int = MAX_CHARS, max_items: int = MAX_ITEMS
) -> tuple[list[Item], int]:
    """The conversation's items (system prompt excluded: it lives in the prompt tokens) and how many
    items were left out past ``max_items``: the episode's messages, or those of ``trajectory``."""
    messages, calls = trajectory_calls(episode, trajectory)
    return message_items(messages, calls, max_chars=max_chars, max_items=max_items)


def message_items(
    messages: list[Any], calls: list[ModelCall], *, max_chars: int = MAX_CHARS, max_items: int = MAX_ITEMS
) -> tuple[list[Item], int]:
    """Items of ``messages`` (see :func:`conversation`); ``calls`` name the assistant messages they made."""
    call_of_message = {c.message_index: c.index for c in calls if c.message_index >= 0}
    tool_names: dict[str, str] = {}
    items: list[Item] = []
    total = 0
    index = -1

    def add(item: Item) -> None:
        nonlocal total
        total += 1
        if len(items) < max_items:
            item.text, item.clipped = clip(item.text, max_chars)
            item.message = index
            items.append(item)

    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            add(Item("other", "other", _as_text(message)))
            continue
        role = str(message.get("role", "?"))
        call = call_of_message.get(index) if role == "assistant" else None
        content = message.get("content")
        if isinstance(content, str):
            add(Item(role, "text", content, call=call))
            continue
        if not isinstance(content, list):
            add(Item(role, "other", _as_text(content), call=call))
            continue
        for block in content:
            if not isinstance(block, dict):
                add(Item(role, "other", _as_text(block), call=call))
            elif isinstance(block.get("text"), str):
                add(Item(role, "text", block["text"], call=call))
            elif isinstance(block.get("toolUse"), dict):
                use = block["toolUse"]
                name = str(use.get("name", "?"))
                tool_names[str(use.get("toolUseId", ""))] = name
                add(Item(role, "tool_call", _as_text(use.get("input", {})), name=name, call=call))
            elif isinstance(block.get("toolResult"), dict):
                result = block["toolResult"]
                parts = result.get("content")
                text = "\n".join(_block_text(b) for b in parts) if isinstance(parts, list) else _as_text(parts)
                name = tool_names.get(str(result.get("toolUseId", "")), "")
                add(Item("tool", "tool_result", text, name=name, status=str(result.get("status", ""))))
            elif isinstance(block.get("reasoningContent"), dict):
                reasoning = block["reasoningContent"].get("reasoningText")
                text = reasoning.get("text") if isinstance(reasoning, dict) else None
                add(Item(role, "reasoning", text if isinstance(text, str) else _as_text(reasoning), call=call))
            else:
                add(Item(role, "other", f"<{', '.join(sorted(str(k) for k in block))} block>", call=call))
    return items, total - len(items)


def prompt_text(episode: Episode, *, max_chars: int = MAX_CHARS) -> str:
    """The task as the agent got it: the first user message's text."""
    items, _ = conversation(episode, max_chars=max_chars, max_items=8)
    for item in items:
        if item.role == "user" and item.kind == "text":
            return item.text
    return ""


def response_text(episode: Episode, *, max_chars: int = MAX_CHARS) -> str:
    """Everything after the first user message as plain text, tool calls and results inline, cut at
    ``max_chars`` (the cut is said at the end)."""
    items, left_out = conversation(episode, max_chars=max_chars, max_items=MAX_ITEMS)
    lines: list[str] = []
    seen_prompt = False
    for item in items:
        if not seen_prompt and item.role == "user" and item.kind == "text":
            seen_prompt = True
            continue
        lines.append(_line(item))
    return _head("\n".join(lines), max_chars, left_out)


def trajectory_texts(episode: Episode, trajectory: int, *, max_chars: int = MAX_CHARS) -> tuple[str, str]:
    """``(prompt, response)`` of one trajectory as plain text: the history its first call was given
    (what its prompt renders; its tail when cut, the task's text alone when that is all) and what
    followed from that call on, tool calls and results inline (its head when cut)."""
    messages, calls = trajectory_calls(episode, trajectory)
    items, left_out = message_items(messages, calls, max_chars=max_chars, max_items=MAX_ITEMS)
    first = min((c.message_index for c in calls if c.message_index >= 0), default=len(messages))
    history = [item for item in items if item.message < first]
    after = [item for item in items if item.message >= first]
    if len(history) == 1 and history[0].role == "user" and history[0].kind == "text":
        prompt = history[0].text
    else:
        text = "\n".join(_line(item) for item in history)
        prompt = text if len(text) <= max_chars else f"[... {len(text) - max_chars} earlier characters not shown]\n" + (
            text[len(text) - max_chars :])  # fmt: skip
    return prompt, _head("\n".join(_line(item) for item in after), max_chars, left_out)


def _line(item: Item) -> str:
    """One item as a line of plain text."""
    if item.kind == "tool_call":
        line = f"[call {item.name}] {item.text}"
    elif item.kind == "tool_result":
        line = f"[{item.name or 'tool'} {item.status or 'result'}] {item.text}"
    elif item.kind == "reasoning":
        line = f"[reasoning] {item.text}"
    else:
        line = f"{item.role}: {item.text}"
    return line + (f" [+{item.clipped} chars]" if item.clipped else "")


def _head(text: str, max_chars: int, left_out: int) -> str:
    """``text`` cut to its first ``max_chars`` characters, the cut and the items left out said at the end."""
    text, cut = clip(text, max_chars)
    if cut or left_out:
        text += f"\n[... {cut} more characters, {left_out} more items not shown]"
    return text


def tool_summary(episode: Episode) -> str:
    """Per-tool calls and failures in one line, e.g. ``add 2, explode 1 (1 error)``."""
    parts = []
    for name, stats in sorted(episode.tools.items()):
        bad = [f"{n} {what}" for n, what in ((stats.errors, "error"), (stats.timeouts, "timeout"),
                                              (stats.truncated, "truncated")) if n]  # fmt: skip
        parts.append(f"{name} {stats.calls}" + (f" ({', '.join(bad)})" if bad else ""))
    if episode.parse_errors:
        parts.append(f"unparseable {episode.parse_errors}")
    if episode.unknown_tool_calls:
        parts.append(f"unknown tool {episode.unknown_tool_calls}")
    return ", ".join(parts)


def ends(count: int, cap: int) -> list[int]:
    """Indexes of the trajectories shown of ``count`` when at most ``cap`` are: all, or the first and the
    last ones (the task is in the first, the answer in the last)."""
    if count <= cap:
        return list(range(count))
    tail = cap // 2
    return [*range(cap - tail), *range(count - tail, count)]


def finite(value: Any) -> float | None:
    """``value`` as a float, or None when it is missing or not finite (JSON has no NaN/inf)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
