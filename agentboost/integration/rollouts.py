"""Run one training (or validation) batch of Strands episodes on veRL's rollout servers.

One batch is one rollout phase: the servers are woken up first (in veRL's hybrid mode this syncs the
current actor weights into vLLM, so every rollout comes from the current policy) and put back to sleep
afterwards, also when the phase fails. Episodes run concurrently on this process's event loop through
:func:`agentboost.rollout.run_episode`, the same function the CLI and the worker pool use. Group ids
follow rLLM's interleaved repeat (rows ``k*n .. k*n+n-1`` are the ``n`` samples of prompt ``k``) so
the backend routes a GRPO group to one server while it is not overloaded.

Nothing is dropped: :func:`run_episode` turns every failure into a typed, masked, zero-reward
episode, and an exception that escapes it anyway (a bug) becomes an ``infra_error`` episode here.

rLLM's trainer takes one row per task sample, so this route trains episodes of one trajectory only: an
episode whose agent rewrote its history or that ran several agents (docs/multi-agent.md, "Agents that rewrite their
history, and multi-agent runs") is kept as a masked ``infra_error`` row that says so (its trajectories
are counted in ``metadata``), with a warning; the verl route and the built-in trainer train them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..episode import Episode
from ..rollout import RolloutSettings, run_episode
from ..types import Termination

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 30.0
SINGLE_TRAJECTORY_ONLY = (
    "this episode has {n} trajectories (its agent rewrote its history, or several agents ran): the rLLM route "
    "trains one trajectory per episode; use the verl route (train_<x>_verl.sh) or the built-in trainer "
    "(agentboost train), or give the agent a NullConversationManager and a single agent"
)
_warned_multi = False


def single_trajectory(episode: Episode, reason: str = SINGLE_TRAJECTORY_ONLY) -> Episode:
    """``episode`` itself when it is one trajectory; otherwise a masked ``infra_error`` record of it without
    tokens (one padding row), naming why (``reason``, with ``{n}`` the trajectory count) and keeping its
    messages, reward and trajectory descriptions."""
    global _warned_multi
    n = episode.num_trajectories
    if n <= 1:
        return episode
    detail = reason.format(n=n)
    if not _warned_multi:
        _warned_multi = True
        logger.warning("episode %s: %s", episode.id, detail)
    refused = Episode.failed(
        episode.id,
        Termination.INFRA_ERROR,
        detail,
        task_id=episode.task_id,
        timings=episode.timings,
        metadata={**episode.metadata, "refused_trajectories": [info.to_dict() for info in episode.trajectory_info]},
    )
    refused.messages = episode.messages
    refused.tools = episode.tools
    refused.metadata["refused_reward"] = episode.reward
    refused.metadata.pop("failed_before_rollout", None)
    return refused


def _task_id(env: Any, idx: int) -> str:
    task = getattr(env, "task", None) or {}
    for key in ("task_id", "id", "uid", "problem_id"):
        value = task.get(key) if isinstance(task, dict) else None
        if value is not None:
            return str(value)
    return f"row-{idx}"


async def run_batch(
    envs: Sequence[Any],
    agents: Sequence[Any],
    backend: Any,
    template: Any,
    settings: RolloutSettings,
    *,
    group_size: int,
    concurrency: int,
    wake_up: Callable[[], Awaitable[Any]] | None = None,
    sleep: Callable[[], Awaitable[Any]] | None = None,
    validation: bool = False,
    on_done: Callable[[int, Episode], None] | None = None,
) -> list[Episode]:
    """Run ``envs[i]`` with ``agents[i]`` for every i; episodes come back in row order."""
    if len(envs) != len(agents):
        raise ValueError(f"{len(envs)} environments but {len(agents)} agents")
    if group_size < 1:
        raise ValueError("group_size must be >= 1")
    phase = uuid.uuid4().hex[:10]
    semaphore = asyncio.Semaphore(max(1, concurrency))
    results: list[Episode | None] = [None] * len(envs)
    done = 0
    started = time.monotonic()
    last_report = started
    counts: Counter[str] = Counter()

    async def one(idx: int) -> None:
        nonlocal done, last_report
        env, agent = envs[idx], agents[idx]
        if hasattr(env, "validation"):
            env.validation = validation
        episode_id = f"{phase}-{idx}"
        group_id = f"{phase}-g{idx // group_size}"
        task_id = _task_id(env, idx)
        t0 = time.monotonic()
        async with semaphore:
            try:
                episode = await run_episode(
                    env, agent, backend, template, settings, episode_id=episode_id, group_id=group_id, task_id=task_id
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # run_episode does not raise; a bug must not lose the row
                logger.exception("episode %s escaped the runner", episode_id)
                episode = Episode.failed(
                    episode_id,
                    Termination.INFRA_ERROR,
                    f"runner error: {type(exc).__name__}: {exc}",
                    task_id=task_id,
                    timings={"wall_s": time.monotonic() - t0},
                    metadata={"group_id": group_id},
                )
        episode = single_trajectory(episode)
        episode.metadata.setdefault("group_id", group_id)
        episode.metadata["row"] = idx
        results[idx] = episode
        done += 1
        counts[episode.termination.value] += 1
        if on_done is not None:
            on_done(idx, episode)
        now = time.monotonic()
        if now - last_report >= PROGRESS_EVERY_S or done == len(envs):
            last_report = now
            logger.info(
                "%s rollouts: %d/%d episodes in %.0fs (%s)",
                "validation" if validation else "training", done, len(envs), now - started, dict(counts),
            )  # fmt: skip

    if wake_up is not None:
        await wake_up()
    try:
        await asyncio.gather(*(one(i) for i in range(len(envs))))
    finally:
        if sleep is not None:
            await sleep()
    missing = [i for i, e in enumerate(results) if e is None]
    if missing:  # gather() completed, so every row was filled; anything else is a bug worth stopping for
        raise RuntimeError(f"rows {missing[:10]} have no episode")
    return [e for e in results if e is not None]
