"""Token-exact use of a model's own Hugging Face chat template.

``ChatTemplate`` renders the first prompt of an episode in full, and afterwards renders only what is
*new* (tool results, user turns, the generation prompt), so that the policy's own tokens are never
re-encoded. New messages are rendered behind a fixed fake ``[system, user]`` prefix whose own render
is subtracted: fragments are never rendered alone (which would trigger default system prompts or
"first message" logic). The text between the end-of-turn token the model generated and the next
message (``"\\n"`` for Qwen, ``""`` for Llama 3) is probed once from the template.

Templates that print the current date (``strftime_now``, Llama 3.2/3.3) render every piece of an
episode with one moment, pinned when the episode starts (``now=``): the fake prefix is rendered
with the same moment it is subtracted from, so a run that crosses midnight keeps working.

Where the template is *prefix-stable* (rendering a conversation and then appending messages gives a
prefix of rendering the longer conversation: Qwen2.5, Qwen3-2507, Llama 3.1), the concatenated
episode tokens equal the template's full render. Where it is not (Qwen3 hybrid thinking: an empty
``<think></think>`` appears only on the last assistant turn, and reasoning of turns before the latest
user query is dropped), the episode keeps exactly what the model saw and generated; the tests pin
down these differences.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..errors import TemplateError
from .messages import HFMessage
from .parsers import ParsedOutput, ToolCallParser, detect_parser, get_parser, parse_output

logger = logging.getLogger(__name__)

_FAKE_PREFIX: list[HFMessage] = [
    {"role": "system", "content": "agentboost-probe-system"},
    {"role": "user", "content": "agentboost-probe-user"},
]
_MARK = "agentboost-probe-assistant"
_PROBE_TOOL_RESULT = {"role": "tool", "tool_call_id": "call_probe", "content": "agentboost-probe-tool"}


@dataclass(frozen=True)
class TemplateInfo:
    """What the probe learned about a template."""

    eot_token_id: int
    """The end-of-turn token the template closes an assistant turn with."""
    separator: str
    """Text the template puts between that end-of-turn token and the next message."""
    generation_prompt: str
    reasoning_prefilled: bool
    """The generation prompt opens ``<think>`` (output starts inside the reasoning)."""
    has_reasoning: bool


class ChatTemplate:
    """A tokenizer + chat template + tool-call parser, probed once and shared by all episodes of a process.

    Stateless after construction (safe to share between concurrent episodes).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template (fast tokenizers recommended).
        template_kwargs: extra variables for every render, e.g. ``{"enable_thinking": False}``; the
            same values are used for every render of every episode.
        tool_parser: ``"hermes"`` or ``"llama3_json"``; detected from the template when omitted.
        chat_template: override the tokenizer's template.
        extra_eot_tokens: tokens besides the template's end-of-turn token that also end a turn
            cleanly (e.g. Llama's ``<|eom_id|>``); detected for known families.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        template_kwargs: dict[str, Any] | None = None,
        tool_parser: str | None = None,
        chat_template: str | None = None,
        extra_eot_tokens: list[str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            raise TemplateError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template")
        parser_name = tool_parser or detect_parser(self.chat_template)
        if parser_name is None:
            raise TemplateError("cannot detect the tool-call format of this template; pass tool_parser=")
        self.parser: ToolCallParser = get_parser(parser_name)
        self.info = self._probe()
        extra = list(extra_eot_tokens or [])
        if parser_name == "llama3_json" and "<|eom_id|>" in tokenizer.get_vocab():
            extra.append("<|eom_id|>")
        self.eot_token_ids = frozenset([self.info.eot_token_id] + [self._single_token_id(t) for t in extra])
        stops = set(self.eot_token_ids)
        if tokenizer.eos_token_id is not None:
            stops.add(tokenizer.eos_token_id)
        vocab = tokenizer.get_vocab()
        for end_of_text in ("<|endoftext|>", "<|end_of_text|>"):  # document-end tokens of Qwen / Llama 3
            if end_of_text in vocab:
                stops.add(vocab[end_of_text])
        self.stop_token_ids: tuple[int, ...] = tuple(sorted(stops))
        self.fingerprint = hashlib.sha256(
            (self.chat_template + repr(sorted(self.template_kwargs.items())) + parser_name).encode()
        ).hexdigest()[:12]
        self._fake_renders: dict[str, str] = {}
        self._fake_lock = threading.Lock()

    @property
    def uses_clock(self) -> bool:
        """The template prints the current date or time (``strftime_now``)."""
        return "strftime_now" in self.chat_template and "strftime_now" not in self.template_kwargs

    # -- rendering ---------------------------------------------------------------------
    def render(
        self,
        messages: list[HFMessage],
        *,
        tools: list[dict] | None = None,
        add_generation_prompt: bool,
        now: datetime | None = None,
    ) -> str:
        """The template's text for ``messages``; ``now`` is the moment ``strftime_now`` reports
        (default: the current time)."""
        clock = {"strftime_now": (now or datetime.now()).strftime} if self.uses_clock else {}
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **clock,
            **self.template_kwargs,
        )
        if not isinstance(text, str):
            raise TemplateError("apply_chat_template(tokenize=False) did not return a string")
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))

    def initial_prompt(
        self, messages: list[HFMessage], tools: list[dict] | None, *, now: datetime | None = None
    ) -> list[int]:
        """Token ids of the first call: the full render with the generation prompt."""
        return self.encode(self.render(messages, tools=tools, add_generation_prompt=True, now=now))

    def _fake_render(self, now: datetime | None) -> str:
        """The render of the fixed ``[system, user]`` prefix, at the episode's moment."""
        key = (now or datetime.now()).isoformat() if self.uses_clock else ""
        with self._fake_lock:
            cached = self._fake_renders.get(key)
        if cached is None:
            cached = self.render(_FAKE_PREFIX, add_generation_prompt=False, now=now)
            with self._fake_lock:
                if len(self._fake_renders) >= 256:  # one entry per episode start when the clock is used
                    self._fake_renders.clear()
                self._fake_renders[key] = cached
        return cached

    def continuation(
        self, new_messages: list[HFMessage], last_token_id: int | None, *, now: datetime | None = None
    ) -> list[int]:
        """Token ids that follow the model's last response: separator, ``new_messages``, generation prompt.

        If the last response did not end with an end-of-turn token (a different stop token, e.g.
        Qwen's ``<|endoftext|>``), the template's end-of-turn token is inserted first so the context
        stays well-formed; it is an env token (loss 0), never a model token.
        """
        if not new_messages:
            raise TemplateError("no new messages to render")
        now = now or (datetime.now() if self.uses_clock else None)
        prefix = self._fake_render(now)
        full = self.render(_FAKE_PREFIX + new_messages, add_generation_prompt=True, now=now)
        if not full.startswith(prefix):
            raise TemplateError(
                "the chat template is not incremental: rendering messages after a [system, user] prefix "
                "changes the prefix"
            )
        delta = full[len(prefix) :]
        if last_token_id in self.eot_token_ids:
            return self.encode(self.info.separator + delta)
        eot = [self.info.eot_token_id]
        return eot + self.encode(self.info.separator + delta)

    def parse(self, completion_ids: list[int]) -> tuple[str, ParsedOutput]:
        """Decode the generated ids (minus a final stop token) and parse them."""
        ids = completion_ids
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        text = self.decode(ids)
        return text, parse_output(
            text,
            self.parser,
            reasoning_prefilled=self.info.reasoning_prefilled,
            reasoning=self.info.has_reasoning,
        )

    # -- probing -------------------------------------------------------------------------
    def _single_token_id(self, token: str) -> int:
        ids = self.encode(token)
        if len(ids) != 1:
            raise TemplateError(f"{token!r} is not a single token in this tokenizer")
        return ids[0]

    def _probe(self) -> TemplateInfo:
        try:
            base = self.render(_FAKE_PREFIX, add_generation_prompt=False)
            with_gen = self.render(_FAKE_PREFIX, add_generation_prompt=True)
            with_asst = self.render(
                [*_FAKE_PREFIX, {"role": "assistant", "content": _MARK}], add_generation_prompt=False
            )
            with_tool = self.render(
                [*_FAKE_PREFIX, {"role": "assistant", "content": _MARK}, _PROBE_TOOL_RESULT], add_generation_prompt=True
            )
        except Exception as exc:  # jinja errors, raise_exception() in templates
            raise TemplateError(f"the chat template failed on a probe conversation: {exc}") from exc
        if not with_gen.startswith(base):
            raise TemplateError("add_generation_prompt changes the rendered prefix")
        generation_prompt = with_gen[len(base) :]
        if _MARK not in with_asst:
            raise TemplateError("the template drops assistant content")
        trailer = with_asst[with_asst.index(_MARK) + len(_MARK) :]
        trailer_ids = self.encode(trailer)
        if not trailer_ids:
            raise TemplateError("the template closes assistant turns with no token")
        eot_id = trailer_ids[0]
        eot_text = self.decode([eot_id])
        if (
            eot_id not in set(getattr(self.tokenizer, "all_special_ids", []))
            and eot_text not in self.tokenizer.get_vocab()
        ):
            raise TemplateError(f"assistant turns end with {eot_text!r}, which is not a special token")
        if not trailer.startswith(eot_text):
            raise TemplateError(f"cannot split the assistant-turn trailer {trailer!r}")
        separator = trailer[len(eot_text) :]
        if "agentboost-probe-tool" not in with_tool:
            raise TemplateError("the template drops tool results")
        gen_tail = generation_prompt.rstrip()
        prefilled = gen_tail.endswith("<think>") or (
            "<think>" in generation_prompt and "</think>" not in generation_prompt
        )
        has_reasoning = "<think>" in self.chat_template or "</think>" in self.chat_template
        logger.debug(
            "template probe: eot=%r separator=%r generation_prompt=%r prefilled=%s",
            eot_text, separator, generation_prompt, prefilled,
        )  # fmt: skip
        return TemplateInfo(eot_id, separator, generation_prompt, prefilled, has_reasoning)


_TEMPLATE_CACHE: dict[tuple[int, str, str | None], ChatTemplate] = {}
_CACHE_LOCK = threading.Lock()


def get_chat_template(tokenizer: Any, **kwargs: Any) -> ChatTemplate:
    """One probed ``ChatTemplate`` per (tokenizer, settings) per process."""
    key = (id(tokenizer), repr(sorted(kwargs.items(), key=lambda kv: kv[0])), None)
    with _CACHE_LOCK:
        cached = _TEMPLATE_CACHE.get(key)
        if cached is None or cached.tokenizer is not tokenizer:
            cached = ChatTemplate(tokenizer, **kwargs)
            _TEMPLATE_CACHE[key] = cached
        return cached
