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
    """The next prompt does not fit the context or response budget."""

    termination = Termination.CONTEXT_OVERFLOW


class EpisodeTimeout(AgentboostError):
    termination = Termination.TIMEOUT


class BackendError(AgentboostError):
    """The generation backend failed (connection, 5xx after retries, malformed reply...)."""

    termination = Termination.INFRA_ERROR


class BackendContextOverflow(BackendError):
    """The server rejected the prompt as longer than its context window."""

    termination = Termination.CONTEXT_OVERFLOW


class BackendTimeout(BackendError):
    termination = Termination.TIMEOUT


class TrajectoryDivergence(AgentboostError):
    """The token trajectory and the agent's message history no longer describe the same episode
    (a hook re-ran a completed model call, a synthetic message replaced a response, the server
    echoed a different prompt than the one sent...). Never trained on."""

    termination = Termination.INFRA_ERROR


class TemplateError(AgentboostError):
    """The chat template cannot be used incrementally (checked when a :class:`ChatTemplate` is built)."""

    termination = Termination.INFRA_ERROR


class ToolFatalError(AgentboostError):
    """Raise from a tool to end the episode with ``tool_error`` (e.g. its sandbox is gone)."""

    termination = Termination.TOOL_ERROR


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
        if isinstance(current, EpisodeStop):
            return current.termination, current.detail
        if isinstance(current, AgentboostError):
            return current.termination, f"{type(current).__name__}: {current}"
        current = current.__cause__ or current.__context__
    return Termination.INFRA_ERROR, f"{type(exc).__name__}: {exc}"
