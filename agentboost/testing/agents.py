"""Agent factories for tests and smoke runs that must make episodes of several trajectories whatever the
model answers: a random tiny model calls no tool and never stops on its own (every reply is cut by
``max_tokens``), so neither a sliding window nor an agent used as a tool would ever get a turn: these factories
make the extra trajectories themselves."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from strands import Agent
from strands.hooks import AfterModelCallEvent
from strands.types.exceptions import MaxTokensReachedException


def retry_first_call(*, model: Any, tools: list[Any], task: Any, **defaults: Any) -> Any:
    """A Strands agent with a hook that retries its first model call once (``AfterModelCallEvent.retry``,
    which Strands honours before it looks at the stop reason): the retry's history no longer holds the
    first response, so every episode is at least two trajectories with the same prompt. The first reply
    was discarded: its trajectory is recorded, not trained (one row per episode)."""
    retried: list[bool] = []

    def retry_once(event: AfterModelCallEvent) -> None:
        if event.stop_response is not None and not retried:
            retried.append(True)
            event.retry = True

    return Agent(model=model, tools=tools, hooks=[retry_once], **defaults)


_EPISODES = itertools.count()


class _AfterHelpers(Agent):
    """An agent that, before it answers, has ``helpers`` other agents on its model answer the same prompt once
    each (their replies cut by ``max_tokens`` or not)."""

    def __init__(self, *, helpers: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.helpers = helpers

    async def invoke_async(self, prompt: Any = None, **kwargs: Any) -> Any:
        for i in range(self.helpers):
            helper = Agent(name=f"helper{i}", model=self.model, callback_handler=None)
            with contextlib.suppress(MaxTokensReachedException):
                await helper.invoke_async(prompt)
        return await super().invoke_async(prompt, **kwargs)


def one_or_three_trajectories(*, model: Any, tools: list[Any], task: Any, **defaults: Any) -> Any:
    """Episodes of one and of three trajectories, alternately (counted per process): every other agent first has
    two helper agents on the same model answer the task (two more trajectories, opened ``new_agent``, trained),
    whatever the model answers. Needs ``max_turns >= 3``."""
    return _AfterHelpers(model=model, tools=tools, helpers=2 * (next(_EPISODES) % 2), **defaults)
