"""Convert Strands messages and tool specs into the chat-message dicts Hugging Face templates take.

Only *non-assistant* messages are ever converted on the hot path: assistant turns produced by the
policy are kept as the exact token ids the server returned and are never re-rendered. Assistant
messages in a caller-provided history (or synthetic ones a hook inserted) are rendered by the
template like any other context and carry loss mask 0.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..errors import UnsupportedContent

logger = logging.getLogger(__name__)

HFMessage = dict[str, Any]


def tool_specs_to_openai(tool_specs: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Strands ``ToolSpec`` (schema under ``inputSchema.json``) -> OpenAI function tools."""
    if not tool_specs:
        return None
    tools = []
    for spec in tool_specs:
        schema = spec.get("inputSchema", {})
        parameters = schema.get("json", schema) if isinstance(schema, dict) else {}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": spec["name"],
                    "description": spec.get("description", ""),
                    "parameters": parameters or {"type": "object", "properties": {}},
                },
            }
        )
    return tools


def tool_result_text(result: dict[str, Any]) -> str:
    """Text of a Strands ``ToolResult``: text items joined by newlines, JSON items serialised."""
    parts: list[str] = []
    for item in result.get("content", []):
        if "text" in item:
            parts.append(str(item["text"]))
        elif "json" in item:
            parts.append(json.dumps(item["json"], ensure_ascii=False))
        else:
            kinds = ", ".join(sorted(item))
            raise UnsupportedContent(f"tool result content of kind {kinds!r} cannot go into a text trajectory")
    return "\n".join(parts)


def _text_of(blocks: list[dict[str, Any]], role: str) -> str:
    texts = []
    for block in blocks:
        if "text" in block:
            texts.append(str(block["text"]))
        elif set(block) & {"image", "document", "video", "audio"}:
            raise UnsupportedContent(f"{role} message with {sorted(block)} content is not supported")
    return "\n".join(texts)


def strands_to_hf(messages: list[dict[str, Any]]) -> list[HFMessage]:
    """Convert Strands messages to HF chat messages, preserving order.

    * user text blocks -> one ``user`` message (blocks joined by newlines);
    * each ``toolResult`` block -> one ``tool`` message (parallel results keep the call order);
    * assistant messages -> ``assistant`` with text content, ``reasoning_content`` and ``tool_calls``
      (only for history the policy did not generate; see module docstring).
    """
    out: list[HFMessage] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content", [])
        if isinstance(content, str):
            content = [{"text": content}]
        if role == "user":
            pending: list[dict[str, Any]] = []
            for block in content:
                if "toolResult" in block:
                    if pending:
                        out.append({"role": "user", "content": _text_of(pending, "user")})
                        pending = []
                    result = block["toolResult"]
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": result.get("toolUseId", ""),
                            "content": tool_result_text(result),
                        }
                    )
                elif "cachePoint" in block:
                    continue
                else:
                    pending.append(block)
            if pending:
                out.append({"role": "user", "content": _text_of(pending, "user")})
        elif role == "assistant":
            hf: HFMessage = {"role": "assistant", "content": ""}
            texts, reasoning, calls = [], [], []
            for block in content:
                if "text" in block:
                    texts.append(block["text"])
                elif "reasoningContent" in block:
                    reasoning.append(block["reasoningContent"].get("reasoningText", {}).get("text", ""))
                elif "toolUse" in block:
                    use = block["toolUse"]
                    calls.append(
                        {
                            "id": use.get("toolUseId", ""),
                            "type": "function",
                            "function": {"name": use["name"], "arguments": use.get("input", {})},
                        }
                    )
            hf["content"] = "".join(texts)
            if reasoning:
                hf["reasoning_content"] = "".join(reasoning)
            if calls:
                hf["tool_calls"] = calls
            out.append(hf)
        else:
            raise UnsupportedContent(f"message role {role!r} is not supported")
    return out


def system_message(system_prompt: str | None) -> list[HFMessage]:
    return [{"role": "system", "content": system_prompt}] if system_prompt else []
