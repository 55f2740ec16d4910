"""A deterministic environment for the evaluator tests (importable by pool workers).

Rows ``{"task_id": "t3", "prompt": "CALL slow {...}"}`` make the directed policy of
:mod:`tests.pool_tools` call the slow tool once and answer. The reward is a fixed function of the
episode id: sample ``k`` of task ``i`` succeeds iff ``(i + k) % 3 == 0``. Every reward computation
appends the episode id to ``$AGENTBOOST_TEST_EVAL_LOG`` so tests can see what ran.
"""

from __future__ import annotations

import os
from typing import Any

from agentboost.environments.strands_env import StrandsEnv
from agentboost.types import RewardOutput
from tests.pool_tools import slow


def succeeds(episode_id: str) -> bool:
    task, _, sample = episode_id.partition(":")
    return (int(task.lstrip("t")) + int(sample)) % 3 == 0


def logged_reward(task: dict[str, Any], episode: Any) -> RewardOutput:
    log = os.environ.get("AGENTBOOST_TEST_EVAL_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(episode.id + "\n")
    ok = succeeds(episode.id)
    return RewardOutput(float(ok), is_correct=ok)


class LoggedEnv(StrandsEnv):
    def __init__(self, task: dict[str, Any] | None = None, tools: Any = None, reward_fn: Any = None, **kw: Any):
        super().__init__(task, [slow], logged_reward, **kw)


def rows(count: int, seconds: float) -> list[dict[str, Any]]:
    return [{"task_id": f"t{i}", "prompt": f'CALL slow {{"seconds": {seconds}}}'} for i in range(count)]


def flaky_reward(task: dict[str, Any], episode: Any) -> RewardOutput:
    """``logged_reward``, except that it fails for the tasks named in ``$AGENTBOOST_TEST_FLAKY`` (an
    infrastructure failure: the episode ends in ``infra_error``)."""
    if task.get("task_id") in os.environ.get("AGENTBOOST_TEST_FLAKY", "").split(","):
        raise ConnectionError("reward service unreachable")
    return logged_reward(task, episode)


class FlakyEnv(StrandsEnv):
    def __init__(self, task: dict[str, Any] | None = None, tools: Any = None, reward_fn: Any = None, **kw: Any):
        super().__init__(task, [slow], flaky_reward, **kw)
