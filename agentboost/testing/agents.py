"""Agent factories for tests and smoke runs that must make episodes of several trajectories whatever the
model answers: a random tiny model calls no tool and never stops on its own (every reply is cut by
``max_tokens``), so neither a sliding window nor a second agent would ever get a turn."""

from __future__ import annotations

from typing import Any

from strands.hooks import AfterModelCallEvent


def retry_first_call(*, model: Any, tools: list[Any], task: Any, **defaults: Any) -> Any:
    """A Strands agent with a hook that retries its first model call once (``AfterModelCallEvent.retry``,
    which Strands honours before it looks at the stop reason): the retry's history no longer holds the
    first response, so every episode is at least two trajectories with the same prompt."""
    from strands import Agent

    retried: list[bool] = []

    def retry_once(event: AfterModelCallEvent) -> None:
        if event.stop_response is not None and not retried:
            retried.append(True)
            event.retry = True

    return Agent(model=model, tools=tools, hooks=[retry_once], **defaults)
