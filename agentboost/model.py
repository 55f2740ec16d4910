"""``TokenModel``: a Strands ``Model`` provider that speaks token ids to the inference server.

One ``TokenModel`` per episode (plus any :meth:`TokenModel.sibling` sharing its record). It owns the
episode's token trajectories:

* the first call of a trajectory renders the full prompt with the model's own chat template (system
  prompt, tools converted from the Strands tool specs, the history) -> ``prompt`` segment;
* a later call renders only the messages Strands appended since the previous response (tool results,
  user turns) plus the generation prompt -> ``env`` segment (loss 0);
* every response is kept exactly as the server returned it, end-of-turn token included -> ``model``
  segment (loss 1), with its sampling logprobs. Assistant text is never re-encoded.

Each agent that calls the model has its own conversation (keyed through the ``model_state`` Strands
keeps per agent). A call continues its conversation's trajectory only if the history it is given is
an extension of what the previous call saw: the same system prompt and tools, the same messages
(compared whole), the previous response, then new messages. Anything else (a conversation manager
trimmed or summarised the history, a hook edited it or retried a completed call, the system prompt or
tools changed, the call samples otherwise than the trajectory's earlier calls) closes that trajectory
and opens a new one whose prompt renders the whole history; so does the first call of another agent
(an agent used as a tool, a Swarm or Graph node) or a call made without an agent (a summariser calling
the model directly). Every trajectory stays token-exact.

Tool calls are parsed client-side, strictly (:mod:`agentboost.chat.parsers`). Malformed, unclosed
and unknown-tool calls are turned into error tool results the agent sees (through a Strands
``BeforeToolCallEvent`` hook, see :class:`TrajectoryHooks`) and are counted.

Budgets are enforced before each call: turns per episode, and per trajectory its context
(``max_total_tokens``), prompt and response tokens; each call's ``max_tokens`` is what the trajectory
has left. A trajectory whose context is full raises :class:`~agentboost.errors.ContextWindowFull`, a
Strands ``ContextWindowOverflowException``: an agent whose conversation manager reduces the history
goes on in a new trajectory, any other ends ``max_tokens``. The task's own first prompt not fitting is
``context_overflow``. A stop raises :class:`~agentboost.errors.EpisodeStop` (or a typed error) that
the episode runner maps to a :class:`~agentboost.types.Termination`. State is committed only after a
complete response.
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
import weakref
from array import array
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from strands.hooks import (
    AfterToolCallEvent,
    BeforeModelCallEvent,
    BeforeToolCallEvent,
    HookProvider,
    HookRegistry,
    MessageAddedEvent,
)
from strands.middleware import ToolResultEvent
from strands.models.model import Model

from .backends.base import FINISH_LENGTH, FINISH_STOP, GenerationBackend, GenerationRequest, GenerationResult
from .chat.messages import strands_to_hf, system_message, tool_specs_to_openai
from .chat.parsers import TOOL_NAME_RE, ParsedCall
from .chat.template import ChatTemplate
from .episode import Episode, ModelCall, Segment, SegmentKind, ToolStats, TrajectoryInfo
from .errors import (
    AgentboostError,
    BackendContextOverflow,
    BackendError,
    BackendTimeout,
    ContextOverflow,
    ContextWindowFull,
    EpisodeStop,
    EpisodeTimeout,
    ToolFatalError,
    TrajectoryDivergence,
)
from .tool_executor import ToolClock
from .types import Budget, SamplingParams, Termination, call_seed

logger = logging.getLogger(__name__)

INVALID_CALL_NAME = "invalid_tool_call"
AUX_AGENT = "aux"
"""The agent name of calls made without an agent (a conversation manager's summariser)."""
_CANCEL_POLL_S = 0.2
_STATE_KEY = "agentboost_conversation"
"""Where a TokenModel keeps an agent's conversation id in the ``model_state`` Strands keeps per agent."""
AGENT_NAME_KEY = "agentboost_agent"
"""Where an agent's ``model_state`` carries its name (the trajectory's ``agent``)."""

_FORMAT_HINTS = {
    "hermes": 'Call tools as <tool_call>{"name": <tool-name>, "arguments": {<json-object>}}</tool_call>.',
    "llama3_json": 'Call tools by answering only {"name": <tool-name>, "parameters": {<json-object>}}.',
}


@dataclass
class _Conversation:
    """One agent's open trajectory: what its last call sent and got back."""

    trajectory: int
    call: int
    """Its last call (``Episode.calls``)."""
    agent: str
    system: str | None
    tools: list[dict[str, Any]] | None
    context: list[int]
    context_hash: Any
    prompt_len: int
    seen: list[dict[str, Any]]
    """The messages the last call was given (compared whole with the next call's)."""
    response: tuple[str, list[str]]
    """(text, tool use ids) of the last response: the next call's history must hold it right after ``seen``."""
    response_message: dict[str, Any]
    """The last response as a Strands message (what the trajectory record shows)."""
    sampling: SamplingParams
    """What its calls were sampled with: a call sampled otherwise opens a new trajectory."""
    observed: bool = False
    """Its agent has the episode's hooks: whether the last reply entered the agent's history is known."""
    acted: bool = False
    """The last reply entered its agent's history (Strands' ``MessageAddedEvent``): the agent acted on it."""


@dataclass
class _Pending:
    """A call between its request and its commit: what it sends and what it opens or continues."""

    key: Any
    previous: _Conversation | None
    """The conversation it continues, or the one of its agent it closes (None: its agent's first)."""
    opens: TrajectoryInfo | None
    new_ids: list[int]
    prompt: list[int]
    system: str | None
    tools: list[dict[str, Any]] | None
    messages: list[dict[str, Any]]
    agent: str
    sampling: SamplingParams
    """What it is sampled with (the model's settings when it was prepared)."""


@dataclass
class _EpisodeState:
    """Everything a TokenModel and its siblings share: the record and the budgets."""

    backend: GenerationBackend
    template: ChatTemplate
    budget: Budget
    episode: Episode
    group_id: str | None
    train_aux_calls: bool = True
    conversations: dict[Any, _Conversation] = field(default_factory=dict)
    in_flight: set[Any] = field(default_factory=set)
    deadline: float = 0.0
    call_errors: dict[str, str] = field(default_factory=dict)
    cancelled_calls: set[str] = field(default_factory=set)
    turn_limit_calls: set[str] = field(default_factory=set)
    windows: dict[int, tuple[float, float | None]] = field(default_factory=dict)
    last_window: tuple[float, float | None] | None = None
    started_at: datetime | None = None
    """The episode's moment for templates that print the date: every render of the episode uses it (set
    when the model is built, through this module's ``datetime``)."""
    pending_stop: EpisodeStop | None = None
    policy_sampling: SamplingParams | None = None
    """The episode's own sampling (its first TokenModel's): what a trainer takes the samples to come from."""
    lock: Any = field(default_factory=threading.RLock)
    """Held while a call is prepared and while it is committed (never across an ``await``)."""
    fatal: AgentboostError | None = None
    """The first error a model call of the episode raised (a server failure, a divergence, a budget stop):
    what ends the episode, also where Strands turned it into a tool result (an agent used as a tool) or a
    failed node (a Swarm); every later call raises it again."""
    requests: int = 0
    """Requests sent so far: request ``k`` of a seeded episode is sent the seed ``call_seed(seed, k)``."""
    synthetic_messages: int = 0
    model_time_s: float = 0.0
    server_busy_since: float = 0.0
    """When the calls now with the server began waiting (for backends whose waits are off the clock)."""


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
        train_aux_calls: whether calls made without an agent (a summariser calling the model directly)
            are trained on; kept in the record either way.
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
        train_aux_calls: bool = True,
    ) -> None:
        budget = budget or Budget()
        self._st = _EpisodeState(
            backend=backend,
            template=template,
            budget=budget,
            episode=Episode(id=episode_id or uuid.uuid4().hex),
            group_id=group_id,
            train_aux_calls=train_aux_calls,
            deadline=time.monotonic() + budget.wall_clock_s,
            started_at=datetime.now(),
        )
        self.sampling = sampling or SamplingParams()
        self._st.policy_sampling = self.sampling
        self.model_id = model_id
        self.hooks = TrajectoryHooks(self)

    def sibling(self, *, sampling: SamplingParams | None = None, model_id: str | None = None) -> TokenModel:
        """Another TokenModel of this episode (same backend, record, budgets and hooks) with its own
        sampling settings: for a sub-agent that samples differently. Its calls are this episode's; with
        sampling other than the episode's (temperature, top-p/k, min-p, repetition penalty, log-probs) its
        trajectories are recorded but not trained (``TrajectoryInfo.trained``): a trainer scores every row
        at the policy's own temperature from its sampling log-probs. (The same holds for any TokenModel
        whose ``update_config`` changed its sampling: checked on every call.)"""
        twin = object.__new__(TokenModel)
        twin._st = self._st
        twin.sampling = sampling or self.sampling
        twin.model_id = model_id or self.model_id
        twin.hooks = self.hooks
        return twin

    def shares_episode(self, other: Any) -> bool:
        """Whether ``other`` is a TokenModel recording into this one's episode."""
        return isinstance(other, TokenModel) and other._st is self._st

    # -- shared state ------------------------------------------------------------------------
    @property
    def backend(self) -> GenerationBackend:
        return self._st.backend

    @property
    def template(self) -> ChatTemplate:
        return self._st.template

    @property
    def budget(self) -> Budget:
        return self._st.budget

    @property
    def episode(self) -> Episode:
        return self._st.episode

    @property
    def group_id(self) -> str | None:
        return self._st.group_id

    @property
    def synthetic_messages(self) -> int:
        return self._st.synthetic_messages

    @synthetic_messages.setter
    def synthetic_messages(self, value: int) -> None:
        self._st.synthetic_messages = value

    @property
    def model_time_s(self) -> float:
        return self._st.model_time_s

    @model_time_s.setter
    def model_time_s(self, value: float) -> None:
        self._st.model_time_s = value

    @property
    def _deadline(self) -> float:
        return self._st.deadline

    @_deadline.setter
    def _deadline(self, value: float) -> None:
        self._st.deadline = value

    @property
    def _request_window(self) -> tuple[float, float | None] | None:
        """The latest request's (sent, answered) window (subclasses that call their own provider set it)."""
        return self._st.last_window

    @_request_window.setter
    def _request_window(self, value: tuple[float, float | None] | None) -> None:
        self._st.last_window = value

    @property
    def _pending_stop(self) -> EpisodeStop | None:
        return self._st.pending_stop

    @_pending_stop.setter
    def _pending_stop(self, value: EpisodeStop | None) -> None:
        self._st.pending_stop = value

    @property
    def _call_errors(self) -> dict[str, str]:
        return self._st.call_errors

    @property
    def _cancelled_calls(self) -> set[str]:
        return self._st.cancelled_calls

    @property
    def _turn_limit_calls(self) -> set[str]:
        return self._st.turn_limit_calls

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

    def start_clock(self, deadline: float) -> None:
        """Share the episode deadline (monotonic seconds) set by the runner."""
        self._st.deadline = deadline

    @property
    def deadline(self) -> float:
        """The episode's deadline (monotonic seconds). With a backend whose waits are off the episode's
        clock (``server_time_off_clock``: verl's servers, which queue requests and pause for weight
        updates) it moves later by the time its calls spent with the server; each call is then bounded by the
        backend alone."""
        return self._st.deadline

    @property
    def _off_clock(self) -> bool:
        return bool(getattr(self.backend, "server_time_off_clock", False))

    def waiting_on_server_at(self, moment: float) -> bool:
        """Whether a request was with the server at ``moment`` (monotonic): a deadline that passed
        then was used up by the server, not by the policy."""
        windows = list(self._st.windows.values())
        if self._st.last_window is not None:
            windows.append(self._st.last_window)
        return any(sent <= moment and (answered is None or answered > moment) for sent, answered in windows)

    def close_trajectories(self, final_messages: list[dict[str, Any]] | None = None, *, always: bool = False) -> None:
        """Write each trajectory's messages into its record: for episodes of several trajectories, for
        ``always`` (a multi-agent episode, whose ``Episode.messages`` are its last node's), and for an
        episode of one trajectory whose ``final_messages`` no longer hold what its calls were given (a
        conversation manager trimmed the history after the last call). Called by the runner when the
        episode ends."""
        st = self._st
        infos = st.episode.trajectory_info
        if len(infos) == 1 and not always and final_messages is not None:
            (conversation,) = [c for c in st.conversations.values() if c.trajectory == 0] or [None]
            if conversation is not None:
                n = len(conversation.seen)
                always = not (
                    len(final_messages) > n
                    and final_messages[:n] == conversation.seen
                    and _is_response(final_messages[n], conversation.response)
                )
        if len(infos) <= 1 and not always:
            return
        for conversation in st.conversations.values():
            info = infos[conversation.trajectory]
            if info.messages is None:
                info.messages = [*conversation.seen, conversation.response_message]

    async def stream(  # type: ignore[override]
        self,
        messages: list[dict[str, Any]],
        tool_specs: list[dict[str, Any]] | None = None,
        system_prompt: str | None = None,
        *,
        cancel_signal: threading.Event | None = None,
        system_prompt_content: list[dict[str, Any]] | None = None,
        model_state: dict[str, Any] | None = None,
        invocation_state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[dict[str, Any]]:
        key, agent = _conversation_of(model_state, invocation_state)
        if key in self._st.in_flight:
            raise RuntimeError("an agent called its TokenModel again while a call of it was in flight")
        st = self._st
        if st.fatal is not None:
            raise st.fatal
        st.in_flight.add(key)
        try:
            result, parsed_events = await self._generate(
                messages, tool_specs, _system_text(system_prompt, system_prompt_content), cancel_signal,
                conversation=(key, agent),
            )  # fmt: skip
        except AgentboostError as exc:
            # (a prompt that does not fit is the agent's to reduce, or ends the episode where it is raised)
            if st.fatal is None and not isinstance(exc, BackendContextOverflow | ContextOverflow):
                st.fatal = exc
            raise
        finally:
            st.in_flight.discard(key)
        if result is None:  # cancelled before anything was committed
            return
        for event in parsed_events:
            yield event

    # -- the call ----------------------------------------------------------------------------
    @property
    def fatal_error(self) -> AgentboostError | None:
        """The error that ends this episode, raised by one of its model calls (see ``_EpisodeState.fatal``)."""
        return self._st.fatal

    async def _generate(
        self,
        messages: list[dict[str, Any]],
        tool_specs: list[dict[str, Any]] | None,
        system: str | None,
        cancel_signal: threading.Event | None,
        *,
        conversation: tuple[Any, str],
    ) -> tuple[GenerationResult | None, list[dict[str, Any]]]:
        st = self._st
        key, agent = conversation
        episode = st.episode
        remaining_s = st.deadline - time.monotonic()
        stop: AgentboostError | None = st.pending_stop
        if stop is None and len(episode.calls) + len(st.windows) >= self.budget.max_turns:
            stop = EpisodeStop(Termination.MAX_TURNS, f"max_turns={self.budget.max_turns} reached")
        if stop is None and remaining_s <= 0:
            stop = EpisodeTimeout(f"wall-clock budget of {self.budget.wall_clock_s}s used up")
        if stop is not None:
            with st.lock:  # (a retried call ends the episode here: its discarded sample is still not trained)
                previous = st.conversations.get(key)
                # (what the history says of the last reply: its system prompt and tools taken as unchanged)
                if previous is not None and _discarded(
                    previous, _extension(previous, messages, previous.system, previous.tools)
                ):
                    self._discard(previous)
            raise stop

        with st.lock:  # (agents a sync tool builds run their calls on other threads, on this same record)
            pending = self._prepare(messages, tool_specs, system, key, agent, sampling=self.sampling)
            number, st.requests = st.requests, st.requests + 1
        max_tokens = self._max_tokens(pending)
        sampling = pending.sampling
        if sampling.seed is not None:  # every call draws its own numbers
            sampling = sampling.replace(seed=call_seed(sampling.seed, number))
        request = GenerationRequest(
            prompt_ids=pending.prompt,
            sampling=sampling,
            max_tokens=max_tokens,
            request_id=episode.id,
            stop_token_ids=self.template.stop_token_ids,
            timeout_s=None if self._off_clock else remaining_s,
            group_id=st.group_id,
        )
        started = time.monotonic()
        window = id(pending)
        if not st.windows:
            st.server_busy_since = started
        st.windows[window] = (started, None)
        try:
            result = await self._await_generation(request, cancel_signal)
        except BackendContextOverflow as exc:
            if self._is_task_prompt(pending):
                raise
            raise ContextWindowFull(
                f"the server refused call {len(st.episode.calls)}'s prompt of {len(pending.prompt)} tokens: {exc}"
            ) from exc
        finally:
            st.windows.pop(window, None)
            st.last_window = (started, time.monotonic())
            latency = time.monotonic() - started
            st.model_time_s += latency  # a hung or cancelled request counts too
            if self._off_clock and not st.windows:
                # off the clock: the time some call of the episode was with the server (calls of agents
                # running at once overlap: their union)
                st.deadline += time.monotonic() - st.server_busy_since
        if result is None:
            return None, []
        self._validate(result, request)
        with st.lock:
            call_index, parsed, truncated = self._commit(pending, request, result, latency)

        events = self._events(
            call_index, parsed.reasoning, parsed.content, [] if truncated else parsed.calls, truncated
        )
        prompt_len = len(pending.prompt)
        events.append(
            {
                "metadata": {
                    "usage": {
                        "inputTokens": prompt_len,
                        "outputTokens": len(result.token_ids),
                        "totalTokens": prompt_len + len(result.token_ids),
                    },
                    "metrics": {"latencyMs": int(latency * 1000)},
                }
            }
        )
        logger.debug("episode %s call %d (%s): +%d prompt, %d completion, finish=%s, %d calls (%d bad)",
                     episode.id, call_index, agent, len(pending.new_ids), len(result.token_ids),
                     result.finish_reason, len(parsed.calls), parsed.parse_errors)  # fmt: skip
        return result, events

    def _is_task_prompt(self, pending: _Pending) -> bool:
        """Whether ``pending`` sends the task's own first prompt (the episode's first call)."""
        return pending.opens is not None and not self._st.episode.calls and not self._st.conversations

    def _prepare(
        self,
        messages: list[dict[str, Any]],
        tool_specs: list[dict[str, Any]] | None,
        system: str | None,
        key: Any,
        agent: str,
        *,
        sampling: SamplingParams,
    ) -> _Pending:
        """What this call sends: its conversation's context plus the new messages when the history
        extends it and the call samples as its trajectory's calls did, else a new trajectory's prompt
        rendering the whole history."""
        st = self._st
        tools = tool_specs_to_openai(tool_specs)
        conversation = st.conversations.get(key)
        if conversation is not None:
            agent = conversation.agent  # named at its first call (later calls may see another agent's state)
        reason, detail = "start" if not st.episode.calls and not st.conversations else "new_agent", ""
        if conversation is not None:
            extension = _extension(conversation, messages, system, tools)
            reason, detail, _ = extension
            if _discarded(conversation, extension):
                self._discard(conversation)
            before = conversation.sampling
            if not reason and not (sampling is before or _samples_like(sampling, before)):
                reason = "sampling_changed"
                detail = f"sampled otherwise than its trajectory's calls ({_sampling_change(before, sampling)})"
            if not reason:
                new = messages[len(conversation.seen) + 1 :]
                st.synthetic_messages += sum(1 for m in new if m.get("role") == "assistant")
                last = conversation.context[-1] if conversation.context else None
                new_ids = self.template.continuation(strands_to_hf(new), last, now=st.started_at)
                return _Pending(key, conversation, None, new_ids, conversation.context + new_ids,
                                system, tools, list(messages), agent, conversation.sampling)  # fmt: skip
        hf = system_message(system) + strands_to_hf(messages)
        new_ids = self.template.initial_prompt(hf, tools, now=st.started_at)
        own = _samples_like(sampling, st.policy_sampling)
        if not own:
            detail = (f"{detail}; " if detail else "") + (
                f"sampled otherwise than the episode's policy ({_sampling_change(st.policy_sampling, sampling)}): "
                "recorded, not trained"
            )
        info = TrajectoryInfo(
            agent=agent,
            opened_by=reason,
            detail=detail,
            rerendered_tokens=len(new_ids) if conversation is not None else 0,
            trained=own and (st.train_aux_calls or agent != AUX_AGENT),
        )
        if conversation is not None or st.episode.calls:
            logger.debug("episode %s: %s opens a new trajectory (%s%s)", st.episode.id, agent, reason,
                         f": {detail}" if detail else "")  # fmt: skip
        return _Pending(key, conversation, info, new_ids, list(new_ids), system, tools, list(messages), agent, sampling)

    def _discard(self, conversation: _Conversation) -> None:
        """Mark ``conversation``'s last call discarded: Strands dropped its reply (a hook retried the call), the
        agent never acted on it. Kept in the record, never trained (loss mask 0); a trajectory made only of
        discarded calls is not trained at all. (Known at the agent's next call, see :func:`_discarded`.)"""
        episode = self._st.episode
        call = episode.calls[conversation.call]
        if call.discarded:
            return
        call.discarded = True
        info = episode.trajectory_info[conversation.trajectory]
        logger.debug("episode %s: call %d's reply was discarded (%s)", episode.id, call.index, info.agent)
        if info.trained and all(c.discarded for c in episode.calls if c.trajectory == conversation.trajectory):
            info.trained = False
            info.detail = (f"{info.detail}; " if info.detail else "") + "every reply discarded: not trained"

    def _max_tokens(self, pending: _Pending) -> int:
        """This call's ``max_tokens``: what its trajectory's budgets leave. Raises when nothing is left."""
        budget = self.budget
        context_len = len(pending.prompt)
        opening = pending.opens is not None
        if opening and budget.max_prompt_tokens is not None and context_len > budget.max_prompt_tokens:
            detail = f"prompt of {context_len} tokens > max_prompt_tokens={budget.max_prompt_tokens} ({pending.agent})"
            if self._is_task_prompt(pending):
                raise ContextOverflow(f"initial {detail}")
            raise ContextWindowFull(f"a new trajectory's {detail}")
        max_tokens = budget.max_total_tokens - context_len
        if budget.max_response_tokens is not None:
            prompt_len = context_len if opening else pending.previous.prompt_len  # type: ignore[union-attr]
            max_tokens = min(max_tokens, budget.max_response_tokens - (context_len - prompt_len))
        if pending.sampling.max_tokens_per_call is not None:
            max_tokens = min(max_tokens, pending.sampling.max_tokens_per_call)
        if max_tokens >= max(1, budget.min_call_tokens if not self._is_task_prompt(pending) else 1):
            return max_tokens
        if self._is_task_prompt(pending):  # the task alone does not fit: not the policy's doing
            raise ContextOverflow(f"the initial prompt ({context_len} tokens) leaves no token budget")
        room = f" (room for {max_tokens}, min_call_tokens={budget.min_call_tokens})" if max_tokens > 0 else ""
        # The policy's turns (and the tool results they asked for) used the trajectory's budget up: a
        # conversation manager may reduce the history (a new trajectory); otherwise the episode ends
        # max_tokens, as a generation cut by max_tokens does.
        raise ContextWindowFull(
            f"token budget used up before call {len(self._st.episode.calls)}: the context is {context_len} "
            f"tokens ({len(pending.new_ids)} new{' in a new trajectory' if opening else ' after the last response'})"
            f"{room}"
        )

    def _commit(
        self, pending: _Pending, request: GenerationRequest, result: GenerationResult, latency: float
    ) -> tuple[int, Any, bool]:
        """Record a complete, validated response; only these reach the trajectory."""
        st = self._st
        episode = st.episode
        call_index = len(episode.calls)
        opening = pending.opens is not None
        if opening:
            trajectory = len(episode.trajectory_info)
            context_hash = hashlib.blake2b(digest_size=16)
            info = pending.opens
            assert info is not None
            if info.opened_by == "start" and trajectory:  # agents that started at once: one is first
                info.opened_by = "new_agent"
            if pending.previous is not None and pending.previous.trajectory < len(episode.trajectory_info):
                closed = episode.trajectory_info[pending.previous.trajectory]
                closed.messages = [*pending.previous.seen, pending.previous.response_message]
        else:
            assert pending.previous is not None
            trajectory = pending.previous.trajectory
            context_hash = pending.previous.context_hash
        new_bytes = array("q", pending.new_ids).tobytes()
        sent = context_hash.copy()
        sent.update(new_bytes)
        digest = sent.hexdigest()  # == episode.token_digest(prompt), without rehashing the context
        _, parsed = self.template.parse(result.token_ids)
        call = ModelCall(
            index=call_index,
            context_tokens=len(pending.prompt),
            new_tokens=len(pending.new_ids),
            completion_tokens=len(result.token_ids),
            max_tokens=request.max_tokens,
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
            message_index=len(pending.messages),
            trajectory=trajectory,
        )
        truncated = result.finish_reason == FINISH_LENGTH
        if truncated:  # the cut-off calls are never executed: no parse error reached the model
            call.parse_errors, call.tool_calls = 0, 0
        kind = SegmentKind.PROMPT if opening else SegmentKind.ENV
        episode.commit_call(
            pending.opens,
            Segment(kind, pending.new_ids, call_index),
            Segment(SegmentKind.MODEL, list(result.token_ids), call_index, result.logprobs),
            call,
        )
        episode.parse_errors += call.parse_errors
        context_hash.update(new_bytes)
        context_hash.update(array("q", result.token_ids).tobytes())
        calls = [] if truncated else parsed.calls
        tool_ids = [f"call_{call_index}_{i}" for i in range(len(calls))]
        text = parsed.content or ""
        st.conversations[pending.key] = _Conversation(
            trajectory=trajectory,
            call=call_index,
            agent=pending.agent,
            system=pending.system,
            tools=pending.tools,
            context=pending.prompt + list(result.token_ids),
            context_hash=context_hash,
            prompt_len=len(pending.prompt) if opening else pending.previous.prompt_len,  # type: ignore[union-attr]
            seen=pending.messages,
            response=(text, tool_ids),
            response_message=_response_message(parsed.reasoning, text, calls, tool_ids),
            sampling=pending.sampling,
            observed=self.hooks.observes(pending.key),
        )
        if not truncated and call_index == self.budget.max_turns - 1:
            # The last call the budget allows: its tool calls would run, but their results could
            # never reach the trajectory (no call follows). They are not executed.
            st.turn_limit_calls.update(tool_ids)
        return call_index, parsed, truncated

    async def _await_generation(
        self, request: GenerationRequest, cancel_signal: threading.Event | None
    ) -> GenerationResult | None:
        task = asyncio.ensure_future(self.backend.generate(request))
        off_clock = self._off_clock
        try:
            while True:
                remaining = self._st.deadline - time.monotonic()
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
                if not off_clock and time.monotonic() > self._st.deadline:
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
        if request.sampling.logprobs:
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
    """Strands hooks that belong to a :class:`TokenModel`: name each model call's agent and conversation,
    turn parse errors and unknown tools into error results, count tool calls and errors per tool, enforce
    the tool-error budget, and end the episode on :class:`~agentboost.errors.ToolFatalError`.

    Before each model call of an agent they are registered on, the agent's conversation id and name (set
    at its first call, kept per agent object for the episode) are written into the ``model_state`` Strands
    hands that call. Strands replaces that state when it resets an agent (a Swarm node before each run, a
    Graph node revisited with ``reset_on_revisit``: a copy taken when the graph was built) and runs a
    Graph's parallel nodes with one shared invocation state: neither gives a call another agent's name,
    nor makes a reset agent another one.

    Stops requested by tools are not raised inside the hook (Strands would turn that into one more
    error result); the model raises them at its next call, right after the tool batch, which is a
    clean message boundary."""

    def __init__(self, model: TokenModel) -> None:
        self.model = model
        self._agents: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()
        """(conversation id, name) per agent, from its first model call on."""
        self._keys: set[str] = set()

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeModelCallEvent, self._before_model)
        registry.add_callback(MessageAddedEvent, self._message_added)
        registry.add_callback(BeforeToolCallEvent, self._before_tool)
        registry.add_callback(AfterToolCallEvent, self._after_tool)

    def observes(self, key: Any) -> bool:
        """Whether the conversation ``key`` is an agent's these hooks are registered on."""
        return key in self._keys

    def _message_added(self, event: MessageAddedEvent) -> None:
        """A reply entering its agent's history: the agent acts on it (see :func:`_discarded`)."""
        message = event.message
        identity = self._agents.get(event.agent)
        if identity is None or not isinstance(message, dict) or message.get("role") != "assistant":
            return
        st = self.model._st
        with st.lock:
            conversation = st.conversations.get(identity[0])
            if conversation is not None and _is_response(message, conversation.response):
                conversation.acted = True

    def _before_model(self, event: BeforeModelCallEvent) -> None:
        agent = event.agent
        state = getattr(agent, "_model_state", None)
        if not isinstance(state, dict):
            return
        identity = self._agents.get(agent)
        if identity is None:
            key, name = state.get(_STATE_KEY), getattr(agent, "name", None)
            identity = (key if isinstance(key, str) else uuid.uuid4().hex, name if isinstance(name, str) else "")
            self._agents[agent] = identity
            self._keys.add(identity[0])
        state[_STATE_KEY], state[AGENT_NAME_KEY] = identity

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
            names = getattr(event.agent, "tool_names", None)
            if not isinstance(names, list):
                names = list(getattr(self.model, "_tool_names", []))
            available = ", ".join(str(n) for n in names) or "none"
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


_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "logprobs")


def _samples_like(sampling: SamplingParams, policy: SamplingParams | None) -> bool:
    """Whether calls made with ``sampling`` sample the policy as the episode does: a trainer computes every
    row's log-probs at one temperature and reads the sampling log-probs, so a call at another temperature,
    top-p/top-k/min-p or repetition penalty, or without log-probs, is not its data."""
    if policy is None:
        return True
    return all(getattr(sampling, k) == getattr(policy, k) for k in _SAMPLING_KEYS)


def _sampling_change(before: SamplingParams | None, after: SamplingParams) -> str:
    """What differs between two sampling settings, e.g. ``temperature 1.0 -> 0.2``."""
    if before is None:
        return ""
    return ", ".join(f"{k} {getattr(before, k)} -> {getattr(after, k)}"
                     for k in _SAMPLING_KEYS if getattr(before, k) != getattr(after, k))  # fmt: skip


def _conversation_of(model_state: dict[str, Any] | None, invocation_state: dict[str, Any] | None) -> tuple[Any, str]:
    """(conversation key, agent name) of a call. Strands hands every model call the ``model_state`` of
    the agent making it (kept per agent, written back after a successful call): the key lives there,
    written by :class:`TrajectoryHooks` before each call of the agents they are registered on. A call
    without one (a summariser calling ``model.stream`` directly) is the ``aux`` conversation."""
    if not isinstance(model_state, dict):
        return None, AUX_AGENT
    key = model_state.get(_STATE_KEY)
    if not isinstance(key, str):
        key = model_state[_STATE_KEY] = uuid.uuid4().hex
    name = model_state.get(AGENT_NAME_KEY)
    if not isinstance(name, str):
        # an agent without the episode's hooks (built by a tool at run time): its invocation's agent (a
        # Graph's parallel nodes share one invocation state, each writing itself there: theirs have hooks)
        agent = invocation_state.get("agent") if isinstance(invocation_state, dict) else None
        name = getattr(agent, "name", None)
    return key, name if isinstance(name, str) and name else "agent"


def _extension(
    conversation: _Conversation, messages: list[dict[str, Any]], system: str | None, tools: Any
) -> tuple[str, str, bool]:
    """("", "", False) when ``messages`` (with ``system`` and ``tools``) extend what ``conversation``'s last
    call saw, else (why a new trajectory opens, detail, whether the history holds what that call saw but not
    its response after it)."""
    seen = conversation.seen
    n = len(seen)
    kept = len(messages) >= n and messages[:n] == seen  # one comparison in C (identical messages compare by identity)
    missing = kept and (len(messages) == n or not _is_response(messages[n], conversation.response))
    if system != conversation.system:
        return "system_prompt_changed", "the system prompt changed", missing
    if tools != conversation.tools:
        return "tools_changed", "the tool list changed (tools are rendered once per trajectory)", missing
    if not kept:
        pairs = zip(messages, seen, strict=False)
        first = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(messages), n))
        detail = f"the history changed from message {first} on ({n} messages seen, {len(messages)} given)"
        return "history_rewritten", f"{detail}: trimmed, summarised, edited or reset", False
    if missing:
        why = "reset or replaced" if conversation.acted else "discarded (a hook retried the call) or replaced"
        return "history_rewritten", f"the previous response is not next in the history: {why}", True
    if len(messages) == n + 1:
        return "history_rewritten", "called again with no new message after the previous response", False
    return "", "", False


def _discarded(conversation: _Conversation, extension: tuple[str, str, bool]) -> bool:
    """Whether the agent never acted on ``conversation``'s last reply, at its next call (``extension``: what
    :func:`_extension` says of that call). An agent with the episode's hooks: the reply never entered its
    history (Strands dropped it: a hook retried the call). Any other: the call is given what the last one
    saw without the reply after it. A history that extends the reply keeps it, whatever added it."""
    reason, _, missing = extension
    if conversation.acted or not reason:
        return False
    return conversation.observed or missing


def _is_response(message: Any, expected: tuple[str, list[str]]) -> bool:
    """Whether ``message`` is the assistant message Strands built from a response (its text and its tool
    use ids)."""
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return False
    text, tool_ids = expected
    blocks = [b for b in message.get("content") or [] if isinstance(b, dict)]
    ids = [str(b["toolUse"].get("toolUseId")) for b in blocks if isinstance(b.get("toolUse"), dict)]
    if ids != tool_ids:
        return False
    texts = "".join(b["text"] for b in blocks if isinstance(b.get("text"), str))
    return texts.strip() == text.strip() or (not text and texts == "[blank text]")


def _response_message(reasoning: str | None, text: str, calls: list[ParsedCall], tool_ids: list[str]) -> dict[str, Any]:
    """The assistant message a response becomes (for the trajectory record)."""
    content: list[dict[str, Any]] = []
    if reasoning:
        content.append({"reasoningContent": {"reasoningText": {"text": reasoning}}})
    if text:
        content.append({"text": text})
    for parsed, tool_use_id in zip(calls, tool_ids, strict=True):
        name = parsed.name if parsed.ok else (parsed.name or INVALID_CALL_NAME)
        content.append({"toolUse": {"toolUseId": tool_use_id, "name": name, "input": parsed.arguments or {}}})
    return {"role": "assistant", "content": content}


def _system_text(system_prompt: str | None, content: list[dict[str, Any]] | None) -> str | None:
    if system_prompt is not None:
        return system_prompt
    if content:
        return "".join(block.get("text", "") for block in content)
    return None
