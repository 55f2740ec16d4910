"""``TokenModel``: a Strands ``Model`` provider that speaks token ids to the inference server.

One ``TokenModel`` per episode. It owns the episode's token trajectory:

* call 0 renders the full prompt with the model's own chat template (system prompt, tools converted
  from the Strands tool specs, the user turn) -> ``prompt`` segment;
* call k>0 renders only the messages Strands appended since the previous response (tool results,
  user turns) plus the generation prompt -> ``env`` segment (loss 0);
* every response is kept exactly as the server returned it, end-of-turn token included -> ``model``
  segment (loss 1), with its sampling logprobs. Assistant text is never re-encoded.

Tool calls are parsed client-side, strictly (:mod:`agentboost.chat.parsers`). Malformed, unclosed
and unknown-tool calls are turned into error tool results the agent sees (through a Strands
``BeforeToolCallEvent`` hook, see :class:`TrajectoryHooks`) and are counted.

Budgets (turns, total/prompt/response tokens, wall clock) are enforced before each call; each call's
``max_tokens`` is the remaining token budget. A stop raises :class:`~agentboost.errors.EpisodeStop`
(or a typed error) that the episode runner maps to a :class:`~agentboost.types.Termination`.
State is committed only after a complete response, and a divergence between the token trajectory
and Strands' message history (hook retries of a completed call, dropped messages) is detected and
raised instead of being silently trained on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
import time
import uuid
from array import array
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import datetime
from typing import Any

from strands.hooks import AfterToolCallEvent, BeforeToolCallEvent, HookProvider, HookRegistry
from strands.middleware import ToolResultEvent
from strands.models.model import Model

from .backends.base import FINISH_LENGTH, FINISH_STOP, GenerationBackend, GenerationRequest, GenerationResult
from .chat.messages import strands_to_hf, system_message, tool_specs_to_openai
from .chat.parsers import TOOL_NAME_RE, ParsedCall
from .chat.template import ChatTemplate
from .episode import Episode, ModelCall, Segment, SegmentKind, ToolStats
from .errors import (
    BackendContextOverflow,
    BackendError,
    BackendTimeout,
    ContextOverflow,
    EpisodeStop,
    EpisodeTimeout,
    ToolFatalError,
    TrajectoryDivergence,
)
from .tool_executor import ToolClock
from .types import Budget, SamplingParams, Termination

logger = logging.getLogger(__name__)

INVALID_CALL_NAME = "invalid_tool_call"
_CANCEL_POLL_S = 0.2

_FORMAT_HINTS = {
    "hermes": 'Call tools as <tool_call>{"name": <tool-name>, "arguments": {<json-object>}}</tool_call>.',
    "llama3_json": 'Call tools by answering only {"name": <tool-name>, "parameters": {<json-object>}}.',
}


class TokenModel(Model):
    """Token-in/token-out Strands model provider for one episode.

    Args:
        backend: any :class:`~agentboost.backends.base.GenerationBackend`.
        template: the probed :class:`~agentboost.chat.template.ChatTemplate` (shared per process).
        sampling: sampling parameters for every call of the episode.
        budget: the episode's limits.
        episode_id: id of the episode; also the request id (sticky routing per episode).
        group_id: id shared by the members of a GRPO group (routing hint).
        model_id: name reported through ``get_config()``.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        template: ChatTemplate,
        *,
        sampling: SamplingParams | None = None,
        budget: Budget | None = None,
        episode_id: str | None = None,
        group_id: str | None = None,
        model_id: str = "agentboost-policy",
    ) -> None:
        self.backend = backend
        self.template = template
        self.sampling = sampling or SamplingParams()
        self.budget = budget or Budget()
        self.model_id = model_id
        self.group_id = group_id
        self.episode = Episode(id=episode_id or uuid.uuid4().hex)
        self.hooks = TrajectoryHooks(self)
        self._context: list[int] = []
        self._context_hash = hashlib.blake2b(digest_size=16)
        """``episode.token_digest`` of ``_context``, kept up to date: hashing the whole context per call
        would make an episode's cost quadratic in its length."""
        self._prompt_len = 0
        self._consumed = 0
        self._system: str | None = None
        self._tools: list[dict[str, Any]] | None = None
        self._tool_names: list[str] = []
        self._frozen = False
        self._in_flight = False
        self._deadline = time.monotonic() + self.budget.wall_clock_s
        self._call_errors: dict[str, str] = {}
        self._cancelled_calls: set[str] = set()
        self._turn_limit_calls: set[str] = set()
        self._request_window: tuple[float, float | None] | None = None
        self._started_at = datetime.now()
        """The episode's moment for templates that print the date: every render of the episode uses it."""
        self._pending_stop: EpisodeStop | None = None
        self.synthetic_messages = 0
        self.model_time_s = 0.0

    # -- Strands Model API -----------------------------------------------------------------
    def update_config(self, **model_config: Any) -> None:
        if "model_id" in model_config:
            self.model_id = str(model_config.pop("model_id"))
        if model_config:
            self.sampling = self.sampling.replace(**model_config)

    def get_config(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "sampling": self.sampling.to_dict(),
            "budget": self.budget.to_dict(),
            "context_window_limit": self.budget.max_total_tokens,
        }

    async def structured_output(  # type: ignore[override]
        self, output_model: Any, prompt: Any, system_prompt: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[dict[str, Any], None]:
        raise NotImplementedError(
            "structured_output is not supported in RL rollouts: it injects synthetic messages and "
            "changes the tool list mid-episode"
        )
        yield {}  # pragma: no cover  (makes this an async generator)

    async def count_tokens(
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kwargs: Any
    ) -> int:
        # Strands adds this estimate for new messages to the exact usage we report; a cheap
        # character heuristic avoids tiktoken (which downloads its vocabulary).
        chars = len(json.dumps(messages, default=str)) if messages else 0
        return chars // 4

    @property
    def history_reads_from(self) -> int:
        """Index of the first history message the next :meth:`stream` call reads: the first call reads
        them all, later calls only the previous response's message and what follows it (earlier turns
        are already tokens). Lets :mod:`agentboost.strands_patches` skip preparing the rest."""
        return max(0, self._consumed - 1) if self._frozen else 0

    def start_clock(self, deadline: float) -> None:
        """Share the episode deadline (monotonic seconds) set by the runner."""
        self._deadline = deadline

    @property
    def deadline(self) -> float:
        """The episode's deadline (monotonic seconds). With a backend whose waits are off the episode's
        clock (``server_time_off_clock``: verl's servers, which queue requests and pause for weight
        updates) it moves later by every call's time; each call is then bounded by the backend alone."""
        return self._deadline

    @property
    def _off_clock(self) -> bool:
        return bool(getattr(self.backend, "server_time_off_clock", False))

    def waiting_on_server_at(self, moment: float) -> bool:
        """Whether a request was with the server at ``moment`` (monotonic): a deadline that passed
        then was used up by the server, not by the policy."""
        if self._request_window is None:
            return False
        sent, answered = self._request_window
        return sent <= moment and (answered is None or answered > moment)

    async def stream(  # type: ignore[override]
        self,
        messages: list[dict[str, Any]],
        tool_specs: list[dict[str, Any]] | None = None,
        system_prompt: str | None = None,
        *,
        cancel_signal: threading.Event | None = None,
        system_prompt_content: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[dict[str, Any]]:
        if self._in_flight:
            raise RuntimeError("TokenModel belongs to one episode and is not re-entrant")
        self._in_flight = True
        try:
            result, parsed_events = await self._generate(
                messages, tool_specs, _system_text(system_prompt, system_prompt_content), cancel_signal
            )
        finally:
            self._in_flight = False
        if result is None:  # cancelled before anything was committed
            return
        for event in parsed_events:
            yield event

    # -- the call ----------------------------------------------------------------------------
    async def _generate(
        self,
        messages: list[dict[str, Any]],
        tool_specs: list[dict[str, Any]] | None,
        system: str | None,
        cancel_signal: threading.Event | None,
    ) -> tuple[GenerationResult | None, list[dict[str, Any]]]:
        call_index = len(self.episode.calls)
        if self._pending_stop is not None:
            raise self._pending_stop
        if call_index >= self.budget.max_turns:
            raise EpisodeStop(Termination.MAX_TURNS, f"max_turns={self.budget.max_turns} reached")
        remaining_s = self._deadline - time.monotonic()
        if remaining_s <= 0:
            raise EpisodeTimeout(f"wall-clock budget of {self.budget.wall_clock_s}s used up")

        new_ids = self._new_prompt_ids(messages, tool_specs, system)
        first = call_index == 0
        context_len = len(self._context) + len(new_ids)
        if first and self.budget.max_prompt_tokens is not None and len(new_ids) > self.budget.max_prompt_tokens:
            raise ContextOverflow(
                f"initial prompt has {len(new_ids)} tokens > max_prompt_tokens={self.budget.max_prompt_tokens}"
            )
        max_tokens = self.budget.max_total_tokens - context_len
        if self.budget.max_response_tokens is not None:
            response_so_far = context_len - (len(new_ids) if first else self._prompt_len)
            max_tokens = min(max_tokens, self.budget.max_response_tokens - response_so_far)
        if self.sampling.max_tokens_per_call is not None:
            max_tokens = min(max_tokens, self.sampling.max_tokens_per_call)
        if max_tokens < 1:
            if first:  # the task alone does not fit: not the policy's doing
                raise ContextOverflow(f"the initial prompt ({context_len} tokens) leaves no token budget")
            # The policy's turns (and the tool results they asked for) used the budget up: the same
            # ending as a generation cut by max_tokens, wherever the budget happens to run out.
            raise EpisodeStop(
                Termination.MAX_TOKENS,
                f"token budget used up before call {call_index}: the context is {context_len} tokens "
                f"({len(new_ids)} new after the last response)",
            )

        prompt = self._context + new_ids
        request = GenerationRequest(
            prompt_ids=prompt,
            sampling=self.sampling,
            max_tokens=max_tokens,
            request_id=self.episode.id,
            stop_token_ids=self.template.stop_token_ids,
            timeout_s=None if self._off_clock else remaining_s,
            group_id=self.group_id,
        )
        started = time.monotonic()
        self._request_window = (started, None)
        try:
            result = await self._await_generation(request, cancel_signal)
        except BackendContextOverflow as exc:
            if first:
                raise
            raise EpisodeStop(
                Termination.MAX_TOKENS, f"the server refused call {call_index}'s prompt of {len(prompt)} tokens: {exc}"
            ) from exc
        finally:
            self._request_window = (started, time.monotonic())
            latency = time.monotonic() - started
            self.model_time_s += latency  # a hung or cancelled request counts too
            if self._off_clock:
                self._deadline += latency
        if result is None:
            return None, []
        self._validate(result, request)

        # Commit: only a complete, validated response reaches the trajectory.
        new_bytes = array("q", new_ids).tobytes()
        sent = self._context_hash.copy()
        sent.update(new_bytes)
        digest = sent.hexdigest()  # == episode.token_digest(prompt), without rehashing the context
        kind = SegmentKind.PROMPT if first else SegmentKind.ENV
        self.episode.append(Segment(kind, new_ids, call_index))
        self.episode.append(Segment(SegmentKind.MODEL, list(result.token_ids), call_index, result.logprobs))
        if first:
            self._prompt_len = len(new_ids)
        self._context.extend(new_ids)
        self._context.extend(result.token_ids)
        self._context_hash.update(new_bytes)
        self._context_hash.update(array("q", result.token_ids).tobytes())
        self._consumed = len(messages) + 1

        _, parsed = self.template.parse(result.token_ids)
        call = ModelCall(
            index=call_index,
            context_tokens=len(prompt),
            new_tokens=len(new_ids),
            completion_tokens=len(result.token_ids),
            max_tokens=max_tokens,
            finish_reason=result.finish_reason,
            sent_digest=digest,
            latency_s=latency,
            request_id=request.request_id,
            stop_reason=result.stop_reason,
            server=result.server,
            weight_version=result.weight_version,
            tool_calls=len(parsed.calls),
            parse_errors=parsed.parse_errors,
            reasoning_unclosed=parsed.reasoning_unclosed,
            message_index=len(messages),
        )
        truncated = result.finish_reason == FINISH_LENGTH
        if truncated:  # the cut-off calls are never executed: no parse error reached the model
            call.parse_errors, call.tool_calls = 0, 0
        self.episode.calls.append(call)
        self.episode.parse_errors += call.parse_errors
        if not truncated and call_index == self.budget.max_turns - 1:
            # The last call the budget allows: its tool calls would run, but their results could
            # never reach the trajectory (no call follows). They are not executed.
            self._turn_limit_calls.update(f"call_{call_index}_{i}" for i in range(len(parsed.calls)))
        events = self._events(
            call_index, parsed.reasoning, parsed.content, [] if truncated else parsed.calls, truncated
        )
        events.append(
            {
                "metadata": {
                    "usage": {
                        "inputTokens": len(prompt),
                        "outputTokens": len(result.token_ids),
                        "totalTokens": len(prompt) + len(result.token_ids),
                    },
                    "metrics": {"latencyMs": int(latency * 1000)},
                }
            }
        )
        logger.debug("episode %s call %d: +%d prompt, %d completion, finish=%s, %d calls (%d bad)",
                     self.episode.id, call_index, len(new_ids), len(result.token_ids), result.finish_reason,
                     len(parsed.calls), parsed.parse_errors)  # fmt: skip
        return result, events

    def _new_prompt_ids(
        self, messages: list[dict[str, Any]], tool_specs: list[dict[str, Any]] | None, system: str | None
    ) -> list[int]:
        tools = tool_specs_to_openai(tool_specs)
        if not self._frozen:
            self._frozen = True
            self._system, self._tools = system, tools
            self._tool_names = [t["function"]["name"] for t in tools or []]
            hf = system_message(system) + strands_to_hf(messages)
            return self.template.initial_prompt(hf, tools, now=self._started_at)
        if system != self._system:
            raise TrajectoryDivergence("the system prompt changed mid-episode")
        if tools != self._tools:
            raise TrajectoryDivergence("the tool list changed mid-episode (tools are rendered once per episode)")
        n = len(messages)
        if n == self._consumed - 1:
            raise TrajectoryDivergence(
                "the model was called again without the previous response in the history "
                "(a hook retried a completed model call, or the response was discarded)"
            )
        if n < self._consumed or messages[self._consumed - 1].get("role") != "assistant":
            raise TrajectoryDivergence("the message history no longer contains the responses of this episode")
        new = messages[self._consumed :]
        if not new:
            raise TrajectoryDivergence("the model was called again with no new message")
        self.synthetic_messages += sum(1 for m in new if m.get("role") == "assistant")
        last = self._context[-1] if self._context else None
        return self.template.continuation(strands_to_hf(new), last, now=self._started_at)

    async def _await_generation(
        self, request: GenerationRequest, cancel_signal: threading.Event | None
    ) -> GenerationResult | None:
        task = asyncio.ensure_future(self.backend.generate(request))
        off_clock = self._off_clock
        try:
            while True:
                remaining = self._deadline - time.monotonic()
                wait_s: float | None = remaining if cancel_signal is None else min(_CANCEL_POLL_S, remaining)
                if off_clock:
                    wait_s = None if cancel_signal is None else _CANCEL_POLL_S
                wait_s = None if wait_s is None else max(0.0, wait_s)
                done, _ = await asyncio.wait({task}, timeout=None if wait_s is None else wait_s + 0.001)
                if done:
                    result = task.result()
                    break
                if cancel_signal is not None and cancel_signal.is_set():
                    task.cancel()
                    return None
                if not off_clock and time.monotonic() > self._deadline:
                    task.cancel()
                    raise BackendTimeout("the wall-clock budget ran out while waiting for the inference server")
        except BaseException:
            if not task.done():
                task.cancel()
            raise
        if cancel_signal is not None and cancel_signal.is_set():
            return None
        return result

    def _validate(self, result: GenerationResult, request: GenerationRequest) -> None:
        ids = result.token_ids
        if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise BackendError("the backend returned token ids that are not non-negative integers")
        if len(ids) > request.max_tokens:
            raise BackendError(f"the backend returned {len(ids)} tokens for max_tokens={request.max_tokens}")
        if result.finish_reason not in (FINISH_STOP, FINISH_LENGTH):
            raise BackendError(f"unexpected finish reason {result.finish_reason!r}")
        if self.sampling.logprobs:
            if result.logprobs is None:
                raise BackendError("logprobs were requested but the backend returned none")
            if len(result.logprobs) != len(ids):
                raise BackendError("the backend returned logprobs misaligned with the token ids")
        if result.prompt_token_ids is not None and result.prompt_token_ids != request.prompt_ids:
            raise TrajectoryDivergence("the server reports a different prompt than the one sent")

    # -- events --------------------------------------------------------------------------------
    def _events(
        self,
        call_index: int,
        reasoning: str | None,
        content: str,
        calls: list[ParsedCall],
        truncated: bool,
    ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = [{"messageStart": {"role": "assistant"}}]
        if reasoning:
            events += [
                {"contentBlockStart": {"start": {}}},
                {"contentBlockDelta": {"delta": {"reasoningContent": {"text": reasoning}}}},
                {"contentBlockStop": {}},
            ]
        if content:
            events += [
                {"contentBlockStart": {"start": {}}},
                {"contentBlockDelta": {"delta": {"text": content}}},
                {"contentBlockStop": {}},
            ]
        for i, parsed in enumerate(calls):
            tool_use_id = f"call_{call_index}_{i}"
            if parsed.ok:
                name, arguments = parsed.name, parsed.arguments or {}
            else:
                name = parsed.name if parsed.name and TOOL_NAME_RE.match(parsed.name) else INVALID_CALL_NAME
                arguments = {}
                hint = _FORMAT_HINTS.get(self.template.parser.name, "")
                self._call_errors[tool_use_id] = f"Error: invalid tool call: {parsed.error}. {hint}".strip()
            events += [
                {"contentBlockStart": {"start": {"toolUse": {"toolUseId": tool_use_id, "name": name}}}},
                {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(arguments, ensure_ascii=False)}}}},
                {"contentBlockStop": {}},
            ]
        if truncated:
            stop = "max_tokens"
        elif calls:
            stop = "tool_use"
        else:
            stop = "end_turn"
        events.append({"messageStop": {"stopReason": stop}})
        return events


class TrajectoryHooks(HookProvider):
    """Strands hooks that belong to a :class:`TokenModel`: turn parse errors and unknown tools into
    error results, count tool calls and errors per tool, enforce the tool-error budget, and end the
    episode on :class:`~agentboost.errors.ToolFatalError`.

    Stops requested by tools are not raised inside the hook (Strands would turn that into one more
    error result); the model raises them at its next call, right after the tool batch, which is a
    clean message boundary."""

    def __init__(self, model: TokenModel) -> None:
        self.model = model

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self._before_tool)
        registry.add_callback(AfterToolCallEvent, self._after_tool)

    def _before_tool(self, event: BeforeToolCallEvent) -> None:
        tool_use_id = str(event.tool_use.get("toolUseId"))
        if tool_use_id in self.model._turn_limit_calls:
            limit = self.model.budget.max_turns
            event.cancel_tool = f"Error: not executed: the turn limit (max_turns={limit}) is reached."
            self.model._cancelled_calls.add(tool_use_id)
            self.model._call_errors.pop(tool_use_id, None)
            return
        error = self.model._call_errors.pop(tool_use_id, None)
        if error is not None:
            event.cancel_tool = error
            self.model._cancelled_calls.add(tool_use_id)
            return
        if event.selected_tool is None:
            name = event.tool_use.get("name", "")
            available = ", ".join(self.model._tool_names) or "none"
            event.cancel_tool = f"Error: unknown tool {name!r}. Available tools: {available}."
            self.model._cancelled_calls.add(tool_use_id)
            self.model.episode.unknown_tool_calls += 1

    def _after_tool(self, event: AfterToolCallEvent) -> None:
        episode = self.model.episode
        if str(event.tool_use.get("toolUseId")) not in self.model._cancelled_calls:
            stats = episode.tools.setdefault(event.tool_use.get("name", ""), ToolStats())
            stats.calls += 1
            stats.total_time_s += float(event.duration or 0.0)
            if event.result.get("status") == "error" or event.exception is not None:
                stats.errors += 1
        if self.model._pending_stop is not None:
            return
        if isinstance(event.exception, ToolFatalError):
            name = event.tool_use.get("name")
            self.model._pending_stop = EpisodeStop(
                event.exception.termination, f"tool {name!r} failed fatally: {event.exception}"
            )
            return
        limit = self.model.budget.max_tool_errors
        if limit is not None:
            failed = episode.tool_errors + episode.parse_errors + episode.unknown_tool_calls
            if failed > limit:
                detail = f"{failed} failed tool calls > max_tool_errors={limit}"
                self.model._pending_stop = EpisodeStop(Termination.TOOL_ERROR, detail)


def tool_limits_middleware(model: TokenModel) -> Any:
    """A Strands ``ExecuteToolStage`` middleware enforcing the budget's per-call tool timeout and
    output cap. A timed-out call returns an error result to the agent (the episode goes on). The
    timeout runs from the moment the tool starts: a synchronous tool's wait for a thread does not count
    (:class:`~agentboost.tool_executor.ToolClock`); its thread cannot be killed and is left to finish in
    the background, abandoned and accounted by :mod:`agentboost.tool_executor` where that routes the
    loop's tools (the worker pool recycles processes that accumulate such threads)."""
    timeout_s = model.budget.tool_timeout_s
    max_chars = model.budget.max_tool_output_chars

    async def limit(context: Any, next_fn: Any) -> AsyncIterator[Any]:
        name = context.tool_use.get("name", "")
        stream = next_fn(context).__aiter__()
        started = time.monotonic()
        clock = ToolClock(timeout_s) if timeout_s else None
        try:
            while True:
                # Each step runs in this task (no wait_for task per step): the tool's tracing
                # spans attach and detach in one context.
                try:
                    async with clock.step() if clock is not None else contextlib.nullcontext():
                        event = await stream.__anext__()
                except StopAsyncIteration:
                    return
                except (TimeoutError, asyncio.TimeoutError):
                    if clock is not None:
                        clock.abandon()
                    model.episode.tools.setdefault(name, ToolStats()).timeouts += 1
                    text = f"Error: tool {name!r} timed out after {timeout_s:g} s"
                    tool_use_id = str(context.tool_use.get("toolUseId"))
                    yield ToolResultEvent({"toolUseId": tool_use_id, "status": "error", "content": [{"text": text}]})
                    return
                if isinstance(event, ToolResultEvent) and max_chars is not None:
                    capped = cap_tool_result(event.tool_result, max_chars)
                    if capped is not event.tool_result:
                        model.episode.tools.setdefault(name, ToolStats()).truncated += 1
                        event = ToolResultEvent(capped, event.exception)
                yield event
        except asyncio.CancelledError:
            # Cut off by the end of the episode (wall clock): Strands reports no result for it, but
            # the call ran and counts (as an error that timed out, like a tool timeout).
            if clock is not None:
                clock.abandon()
            if str(context.tool_use.get("toolUseId")) not in model._cancelled_calls:
                stats = model.episode.tools.setdefault(name, ToolStats())
                stats.calls += 1
                stats.errors += 1
                stats.timeouts += 1
                stats.total_time_s += time.monotonic() - started
            raise
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()

    return limit


@contextlib.asynccontextmanager
async def _deadline(deadline: float | None) -> AsyncIterator[None]:
    """Cancel the current task at ``deadline`` (monotonic) and raise ``TimeoutError`` (3.10-compatible
    ``asyncio.timeout``)."""
    if deadline is None:
        yield
        return
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(remaining):
            yield
        return
    task = asyncio.current_task()
    assert task is not None
    fired = False

    def fire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    handle = asyncio.get_running_loop().call_later(remaining, fire)
    try:
        yield
    except asyncio.CancelledError:
        if fired:
            raise TimeoutError from None
        raise
    finally:
        handle.cancel()


def cap_tool_result(result: dict[str, Any], max_chars: int) -> dict[str, Any]:
    """``result`` with its text cut to ``max_chars`` in total (same object if it fits)."""
    total = 0
    for item in result.get("content", []):
        total += len(item["text"]) if "text" in item else len(json.dumps(item.get("json"), ensure_ascii=False))
    if total <= max_chars:
        return result
    kept: list[dict[str, Any]] = []
    room = max_chars
    for item in result.get("content", []):
        text = item["text"] if "text" in item else json.dumps(item.get("json"), ensure_ascii=False)
        if room <= 0:
            break
        kept.append({"text": text[:room]})
        room -= len(text[:room])
    kept.append({"text": f"\n[... output truncated: {total - max_chars} more characters]"})
    return {**result, "content": kept}


def _system_text(system_prompt: str | None, content: list[dict[str, Any]] | None) -> str | None:
    if system_prompt is not None:
        return system_prompt
    if content:
        return "".join(block.get("text", "") for block in content)
    return None
