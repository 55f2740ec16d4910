"""Flat per-call cost in long Strands episodes: a version-checked adapter applied when an agent is built.

strands-agents 1.62 does four things per model call whose cost grows with the history, which makes an
episode's CPU cost quadratic in its length (instant model and tool: 4 ms between consecutive calls
at call 10, 40-60 ms at call 150; ``benchmarks/long_episode.py``):

1. it deep-copies the whole history into the model-call middleware context
   (``event_loop._handle_model_execution``);
2. it deep-copies that copy again to normalise blank text and tool names (``streaming._normalize_messages``);
3. its tracer serialises every message into span events of the cycle span and the model span
   (``Tracer._add_event_messages``), also when the span records nothing (no tracer provider configured);
4. its loop recurses once per cycle through nested async generators (``recurse_event_loop``), so every
   event of cycle *k* is handed up through about 3*k* generator frames (and a ``RecursionError`` ends
   the episode after about 320 calls unless the recursion limit is raised).

strands-agents has no public setting for any of them (telemetry runs whenever strands is imported; with
no tracer provider the spans only stop recording). :func:`adapt_agent` therefore wraps them for the
agent it is given, leaving every other agent of the process on upstream's code:

* the history: ``agent.messages`` becomes a :class:`list` subclass holding the same message objects.
  Only the deep copy Strands makes for a model call changes. With no model-call middleware
  (``InvokeModelStage``) registered, nothing but the tracer and the normalisation reads that copy, and
  the normalisation copies what it hands to the model, so the history's own messages stand in for it.
  With model-call middleware, per-message copies are handed out again while they still equal the
  history's message (one ``==`` over the history per call, which runs in C). Every other deep copy of
  the history (snapshots, sessions) is upstream's;
* the normalisation runs per message and its result is reused while neither the message nor the
  normalised copy has changed (the same ``==`` check over the history, in C), so an unchanged message
  is handed to the model as the same object from call to call (agentboost's ``TokenModel`` then compares
  the history with what it saw by identity, and sees every edit of an old message);
* the tracer skips building span events for this agent's messages when the span is not recording (a
  non-recording span drops them anyway); with a tracer provider configured nothing changes;
* the event loop is driven by a trampoline: when a cycle recurses, the next cycle's generator is driven
  directly and the suspended outer cycles are resumed (or have its exception thrown into them) when it
  ends, so the same code runs in the same order at a constant generator depth.

What the model, the hooks, the tools and the episode record see is unchanged (tests compare whole
episodes with the adapter on and off). Known differences: ``agent.messages`` is a new list object (a
list the factory passed as ``messages=`` is no longer the live history); the model-call copy shares the
history's messages when no model-call middleware is registered, and copies may be shared between
consecutive calls otherwise; normalisation's debug log lines are written only for messages it
processes; an abandoned (``aclose``-d) stream closes the nested cycles innermost first; an exception ending a
nested cycle is raised inside the outer cycle where it awaits that cycle's events, as upstream; and the
``RecursionError`` after about 320 calls no longer happens.

The wrapped internals were read in the strands-agents versions in :data:`SUPPORTED_VERSIONS`; on any
other version :func:`adapt_agent` warns once and leaves the agent to upstream's code.
``AGENTBOOST_STRANDS_ADAPTER=0`` turns the adapter off.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import sys
import threading
import types
import weakref
from collections.abc import AsyncGenerator, Callable
from importlib import metadata
from typing import Any

logger = logging.getLogger(__name__)

SUPPORTED_VERSIONS = frozenset({"1.62.0"})
"""strands-agents releases whose internals this adapter was written against."""
ENV_SWITCH = "AGENTBOOST_STRANDS_ADAPTER"

_FLAT_DEPTH = "_agentboost_flat_depth"
_install_lock = threading.Lock()
_installed: bool | None = None  # None: not tried yet; False: refused (version, missing internals)
_upstream: dict[str, Any] = {}
_warned: set[str] = set()


# -- the history ------------------------------------------------------------------------------
class _History(list):  # type: ignore[type-arg]
    """``agent.messages`` of an adapted agent: a plain list of the same messages, plus the caches that
    let the model-call copy and the normalisation reuse the work of earlier calls."""

    __slots__ = ("_agent", "_copies", "_norm_in", "_norm_out", "_norm_out_ref")

    def __init__(self, messages: Any = (), agent: Any = None) -> None:
        super().__init__(messages)
        self._agent: Callable[[], Any] = weakref.ref(agent) if agent is not None else (lambda: None)
        self._copies: list[Any] = []
        """Deep copies of the history's messages, position by position (with model-call middleware)."""
        self._norm_in: list[Any] = []
        """What each model-view message must equal for its normalised copy to be reused."""
        self._norm_out: list[Any] = []
        """Normalised copies, position by position."""
        self._norm_out_ref: list[Any] = []
        """What each normalised copy must still equal (itself where normalising changed nothing)."""

    def __reduce_ex__(self, protocol: Any) -> Any:  # copy.copy / pickle: a plain list, as upstream's
        return list, (list(self),)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        if memo or not _called_from_model_call():
            return [copy.deepcopy(m, memo) for m in self]
        agent = self._agent()
        if agent is not None and not _has_model_middleware(agent):
            # Nothing reads the view but the tracer and the normalisation, which copies what it hands to
            # the model: the history's own messages stand in for copies. The model is this agent's.
            view = _ModelView(self)
            view._history = self
            return view
        copies = self._copies
        del copies[len(self) :]
        if not _equal(copies, self[: len(copies)]):  # one comparison in C; per message only when one changed
            for i, message in enumerate(self[: len(copies)]):
                if not _equal(copies[i], message):
                    copies[i] = copy.deepcopy(message)
        copies.extend(copy.deepcopy(m) for m in self[len(copies) :])
        view = _ModelView(copies)
        view._history = self
        return view


class _ModelView(list):  # type: ignore[type-arg]
    """The history copy one model call works on (``InvokeModelContext.messages``)."""

    __slots__ = ("_history",)

    def __init__(self, messages: Any = ()) -> None:
        super().__init__(messages)
        self._history: _History | None = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        return list, (list(self),)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(m, memo) for m in self]


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # content whose == does not give a bool (arrays): never reused
        return False


_model_call_code: types.CodeType | None = None
_invoke_model_stage: Any = None


def _has_model_middleware(agent: Any) -> bool:
    """Whether model-call middleware is registered on ``agent`` (True when that cannot be told)."""
    handlers = getattr(getattr(agent, "_middleware_registry", None), "_handlers", None)
    return not isinstance(handlers, dict) or bool(handlers.get(_invoke_model_stage))


def _called_from_model_call() -> bool:
    """Whether the running deep copy is the one Strands makes for a model call (frames: this
    function, ``__deepcopy__``, ``copy.deepcopy``, the model-call code)."""
    try:
        return sys._getframe(3).f_code is _model_call_code
    except (AttributeError, ValueError):
        return False


def _normalize_messages(messages: Any) -> Any:
    """Strands' normalisation, run per message and reused while neither the message nor its normalised
    copy has changed since (a model-call view only; anything else goes to upstream as is)."""
    upstream = _upstream["normalize"]
    history = messages._history if type(messages) is _ModelView else None
    if history is None:
        return upstream(messages)
    want, out, out_ref = history._norm_in, history._norm_out, history._norm_out_ref
    n = len(messages)
    for cache in (want, out, out_ref):
        del cache[n:]
    kept = len(out)
    if not (_equal(messages[:kept], want) and _equal(out, out_ref)):
        for i in range(kept):
            if not (_equal(messages[i], want[i]) and _equal(out[i], out_ref[i])):
                want[i], out[i], out_ref[i] = _normalize_one(upstream, messages[i])
    for message in messages[kept:]:
        entry = _normalize_one(upstream, message)
        want.append(entry[0])
        out.append(entry[1])
        out_ref.append(entry[2])
    return list(out)


def _normalize_one(upstream: Callable[[Any], Any], message: Any) -> tuple[Any, Any, Any]:
    """(what the input must equal, the normalised copy, what that copy must equal) for one message."""
    normalized = upstream([message])[0]
    if _equal(normalized, message):
        # Unchanged by normalising: comparing the input with the copy checks that neither changed.
        return normalized, normalized, normalized
    return copy.deepcopy(message), normalized, copy.deepcopy(normalized)


# -- the tracer ----------------------------------------------------------------------------------
def _add_event_messages(self: Any, span: Any, messages: Any) -> None:
    """Upstream's span events, skipped for an adapted agent's messages when the span records nothing."""
    if type(messages) in (_History, _ModelView) and (span is None or not span.is_recording()):
        return
    _upstream["add_event_messages"](self, span, messages)


# -- the event loop ------------------------------------------------------------------------------
class _Delegate:
    """Yielded instead of the next cycle's events: the trampoline drives ``inner`` itself. If ``inner``
    raises, the trampoline stores the exception in ``error`` and resumes the outer cycle normally:
    :func:`_hand_over` raises it where the outer cycle awaits ``inner``'s events, so it travels up
    through every frame between them (tool execution, spans) as it does upstream."""

    __slots__ = ("error", "inner")

    def __init__(self, inner: AsyncGenerator[Any, None]) -> None:
        self.inner = inner
        self.error: BaseException | None = None


async def _hand_over(inner: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
    # Resumed once ``inner`` has ended: returns, or raises what ``inner`` raised, so the suspended
    # outer cycles continue exactly as if they had forwarded ``inner``'s events.
    delegate = _Delegate(inner)
    yield delegate
    if delegate.error is not None:
        error, delegate.error = delegate.error, None
        raise error


def _recurse_event_loop(agent: Any, invocation_state: Any, *args: Any, **kwargs: Any) -> Any:
    inner = _upstream["recurse"](agent, invocation_state, *args, **kwargs)
    if getattr(agent, _FLAT_DEPTH, 0) > 0:
        return _hand_over(inner)
    return inner


async def _flat_event_loop(agent: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
    """``Agent._execute_event_loop_cycle`` with nested cycles driven from one frame."""
    stack: list[AsyncGenerator[Any, None]] = [type(agent)._execute_event_loop_cycle(agent, *args, **kwargs)]
    delegates: list[_Delegate | None] = [None]  # how each generator of ``stack`` was handed over
    setattr(agent, _FLAT_DEPTH, getattr(agent, _FLAT_DEPTH, 0) + 1)
    pending: BaseException | None = None
    try:
        while stack:
            top = stack[-1]
            try:
                if pending is None:
                    event = await top.__anext__()
                else:
                    thrown, pending = pending, None
                    event = await top.athrow(thrown)
            except StopAsyncIteration:
                stack.pop()
                delegates.pop()
                continue
            except BaseException as exc:
                stack.pop()
                delegate = delegates.pop()
                if delegate is None:
                    raise
                delegate.error = exc  # raised by _hand_over inside the outer cycle, on its next step
                continue
            if type(event) is _Delegate:
                stack.append(event.inner)
                delegates.append(event)
                continue
            try:
                yield event
            except GeneratorExit:
                for gen in reversed(stack):
                    try:
                        await gen.aclose()
                    except Exception:
                        logger.debug("closing a nested Strands cycle failed", exc_info=True)
                stack.clear()
                raise
            except BaseException as exc:
                pending = exc
    finally:
        setattr(agent, _FLAT_DEPTH, getattr(agent, _FLAT_DEPTH, 1) - 1)


# -- installing ----------------------------------------------------------------------------------
@functools.cache
def strands_version() -> str | None:
    try:
        return metadata.version("strands-agents")
    except metadata.PackageNotFoundError:
        return None


def version_supported(version: str | None) -> bool:
    """Whether the adapter knows the internals of strands-agents ``version``; warns once if not."""
    if version in SUPPORTED_VERSIONS:
        return True
    _warn_once(
        f"version {version}",
        "strands-agents %s is not a version the long-episode adapter knows (%s): agents run on upstream's "
        "code, whose per-call cost grows with the length of the episode",
        version,
        ", ".join(sorted(SUPPORTED_VERSIONS)),
    )
    return False


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


def _install() -> bool:
    """Wrap the module-level internals once per process (each wrap passes through for agents that were
    not adapted). False, with a warning, when they are missing."""
    global _installed, _model_call_code, _invoke_model_stage
    with _install_lock:
        if _installed is not None:
            return _installed
        try:
            from strands.agent.agent import Agent
            from strands.event_loop import event_loop, streaming
            from strands.middleware import InvokeModelStage
            from strands.telemetry.tracer import Tracer

            targets: dict[str, tuple[Any, str]] = {
                "normalize": (streaming, "_normalize_messages"),
                "recurse": (event_loop, "recurse_event_loop"),
                "add_event_messages": (Tracer, "_add_event_messages"),
            }
            found = {key: getattr(owner, name) for key, (owner, name) in targets.items()}
            model_call = event_loop._handle_model_execution.__code__
            if not callable(getattr(Agent, "_execute_event_loop_cycle", None)):
                raise AttributeError("Agent._execute_event_loop_cycle")
        except (ImportError, AttributeError) as exc:
            _warn_once("internals", "strands-agents internals the adapter wraps are missing (%s): not adapted", exc)
            _installed = False
            return False
        _upstream.update(found)
        _model_call_code = model_call
        _invoke_model_stage = InvokeModelStage
        replacements: dict[str, Callable[..., Any]] = {
            "normalize": _normalize_messages,
            "recurse": _recurse_event_loop,
            "add_event_messages": _add_event_messages,
        }
        for key, (owner, name) in targets.items():
            setattr(owner, name, replacements[key])
        _installed = True
        return True


def adapter_enabled() -> bool:
    """Whether :func:`adapt_agent` adapts agents (``AGENTBOOST_STRANDS_ADAPTER=0`` turns it off)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def adapt_agent(agent: Any, *, enabled: bool | None = None) -> bool:
    """Give ``agent`` flat per-call costs (see the module docstring); True if it was adapted.

    ``enabled`` overrides the environment switch. Never changes what the agent does: on an unknown
    strands-agents version it warns once and returns False.
    """
    if not (adapter_enabled() if enabled is None else enabled):
        return False
    if not version_supported(strands_version()) or not _install():
        return False
    if type(agent.messages) is not _History:
        agent.messages = _History(agent.messages, agent)
    if not isinstance(agent.__dict__.get("_execute_event_loop_cycle"), types.MethodType):
        agent._execute_event_loop_cycle = types.MethodType(_flat_event_loop, agent)
    return True


def is_adapted(agent: Any) -> bool:
    return type(getattr(agent, "messages", None)) is _History
