"""``runs.run_many``: one failure ends the run, and nothing of it runs on afterwards.

CI (a full disk under ``agentboost rollout``, tests/test_cli_contract.py): the first episode's ``on_done`` raised
ENOSPC, ``asyncio.gather`` passed it on while the other episodes kept running, and each of those then wrote to
the episodes file its caller had closed: "unhandled exception during asyncio.run() shutdown", a traceback.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from agentboost import runs


def test_when_on_done_raises_the_other_episodes_are_cancelled_before_run_many_returns(monkeypatch) -> None:
    async def fake_run_spec(spec: float) -> SimpleNamespace:
        await asyncio.sleep(spec)
        return SimpleNamespace(delay=spec)

    monkeypatch.setattr(runs, "run_spec", fake_run_spec)
    called: list[float] = []

    def on_done(episode: SimpleNamespace) -> None:
        called.append(episode.delay)
        raise OSError(28, "No space left on device")

    async def scenario() -> set[asyncio.Task]:
        with pytest.raises(OSError, match="No space left"):
            await runs.run_many([0.0, 0.2, 0.2, 0.2], concurrency=4, on_done=on_done)  # type: ignore[list-item]
        left = {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}
        await asyncio.sleep(0.5)  # the slower episodes would have finished (and called on_done) by now
        return left

    assert asyncio.run(scenario()) == set()
    assert called == [0.0]
