"""Exception types. Each carries the :class:`Termination` it maps to, so the episode runner can turn
any failure (however deeply Strands wrapped it) into a typed termination."""

from __future__ import annotations

from .types import Termination


class AgentboostError(Exception):
    """Base class; ``termination`` says how an episode that hit this error ends."""

    termination: Termination = Termination.INFRA_ERROR


class EpisodeStop(AgentboostError):
    """Raised inside the agent loop to stop an episode cleanly at a message boundary."""

    def __init__(self, termination: Termination, detail: str = "") -> None:
        super().__init__(detail or termination.value)
        self.termination = termination
        self.detail = detail or termination.value


class ContextOverflow(AgentboostError):
    """The task's initial prompt does not fit the context or prompt budget (masked: not the policy's doing).
    Running out of room later in an episode is ``EpisodeStop(MAX_TOKENS)``."""

    termination = Termination.CONTEXT_OVERFLOW


def _context_window_overflow() -> type[Exception]:
    try:
        from strands.types.exceptions import ContextWindowOverflowException
    except ImportError:  # pragma: no cover - strands is a core dependency
        return Exception
    return ContextWindowOverflowException


class ContextWindowFull(_context_window_overflow()):  # type: ignore[misc]
    """A trajectory's context has no room left for the next call (its budget or the server's window):
    Strands' ``ContextWindowOverflowException``, so an agent's conversation manager can reduce the history
    (the next call then opens a new trajectory). An agent that cannot ends ``max_tokens``: the policy's
    turns filled the context."""

    termination = Termination.MAX_TOKENS

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class EpisodeTimeout(AgentboostError):
    """The wall clock ran out while the agent was acting (its tools, the loop between calls)."""

    termination = Termination.TIMEOUT


class BackendError(AgentboostError):
    """The generation backend failed (connection, 5xx after retries, malformed reply...)."""

    termination = Termination.INFRA_ERROR


class BackendContextOverflow(BackendError):
    """The server rejected the prompt as longer than its context window. On the first call that is
    the task's prompt (``context_overflow``); later the :class:`~agentboost.model.TokenModel` turns it
    into ``max_tokens`` (the policy's turns filled the context)."""

    termination = Termination.CONTEXT_OVERFLOW


class BackendTimeout(BackendError):
    """No answer from the server in time: an infrastructure timeout (masked), never the policy's."""

    termination = Termination.INFRA_ERROR


class TrajectoryDivergence(AgentboostError):
    """The token trajectory and the agent's message history no longer describe the same episode
    (a hook re-ran a completed model call, a synthetic message replaced a response, the server
    echoed a different prompt than the one sent...). Never trained on."""

    termination = Termination.INFRA_ERROR


class TemplateError(AgentboostError):
    """The chat template cannot be used incrementally (checked when a :class:`ChatTemplate` is built)."""

    termination = Termination.INFRA_ERROR


class ToolFatalError(AgentboostError):
    """Raise from a tool to end the episode at once.

    By default the tool's infrastructure failed (its sandbox or database is gone): ``infra_error``,
    masked. With ``caused_by_policy=True`` the policy did something that ends the episode (a
    forbidden action): ``tool_error``, which keeps its reward and its place in the GRPO group."""

    termination = Termination.INFRA_ERROR

    def __init__(self, *args: object, caused_by_policy: bool = False) -> None:
        super().__init__(*args)
        self.caused_by_policy = caused_by_policy
        if caused_by_policy:
            self.termination = Termination.TOOL_ERROR


class UnsupportedContent(AgentboostError):
    """Content agentboost cannot put into a token trajectory (images, documents...)."""

    termination = Termination.INFRA_ERROR


def termination_of(exc: BaseException) -> tuple[Termination, str]:
    """Find the most specific agentboost error in ``exc``'s cause/context chain.

    Strands re-wraps exceptions at every event-loop cycle (``EventLoopException``), so the original
    error can be several links deep.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, EpisodeStop | ContextWindowFull):
            return current.termination, current.detail
        if isinstance(current, AgentboostError):
            return current.termination, f"{type(current).__name__}: {current}"
        current = current.__cause__ or current.__context__
    return Termination.INFRA_ERROR, f"{type(exc).__name__}: {exc}"
