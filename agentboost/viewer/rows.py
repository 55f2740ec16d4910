"""Sample trajectories as W&B table rows, shared by the built-in trainer's eval steps and the veRL
validation hook.

One row per trajectory: an episode of one trajectory is one row (its task as the prompt, everything
after it as the response); an episode of several gives a row for each of its first and last
``max_trajectories`` trajectories, consecutive and keyed by ``episode_id`` and ``trajectory``, each with
what that trajectory's model was given (its prompt renders that history) and what followed, its agent,
why it opened, and its agent's reward. Rows rather than one episode row with a nested column because
W&B shows a table cell as text: a trajectory's own prompt and response are readable only in their own
cells, and rows can be filtered and sorted by agent or ``opened_by``.

W&B is optional: without the ``wandb`` package or without an active run no table is logged and
nothing fails. A W&B error while logging a table is logged as a warning and never stops training.
"""

from __future__ import annotations

import logging
import sys
from collections import defaultdict
from typing import Any

from ..episode import Episode
from .transcript import ends, finite, prompt_text, response_text, tool_summary, trajectory_texts

logger = logging.getLogger(__name__)

TABLE_COLUMNS = [
    "step", "episode_id", "task_id", "trajectory", "trajectories", "agent", "opened_by", "prompt", "response",
    "reward", "termination", "tool_calls", "tool_errors", "tools", "turns", "masked",
]  # fmt: skip
"""``trajectory``: its index in the episode, of ``trajectories``; ``reward``: its agent's (the episode's
unless the reward function gave the agent a role reward); ``turns``: its model calls; ``masked``: it
carries no gradient (a masked episode, or a trajectory left out of training); ``tool_calls``,
``tool_errors``, ``tools`` and ``termination``: the episode's."""
MAX_EPISODES = 32
MAX_TRAJECTORIES = 4
"""Rows per episode of several trajectories (its first and last ones)."""
MAX_CHARS = 4000


def pick(episodes: list[Episode], max_episodes: int) -> list[Episode]:
    """Up to ``max_episodes`` episodes, taken in turn from each termination (in order of first
    appearance), so rare endings (tool errors, timeouts) are in the table, not only the common one."""
    by_end: dict[str, list[Episode]] = defaultdict(list)
    for episode in episodes:
        by_end[episode.termination.value].append(episode)
    queues = list(by_end.values())
    chosen: list[Episode] = []
    depth = 0
    while len(chosen) < max_episodes and any(depth < len(q) for q in queues):
        chosen.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return chosen[:max_episodes]


def trajectory_rows(
    episodes: list[Episode],
    *,
    step: int,
    max_episodes: int = MAX_EPISODES,
    max_trajectories: int = MAX_TRAJECTORIES,
    max_chars: int = MAX_CHARS,
) -> list[list[Any]]:
    """Rows in :data:`TABLE_COLUMNS` order for a sample of ``episodes`` (see :func:`pick` and the module doc)."""
    rows = []
    for e in pick(episodes, max_episodes):
        n = e.num_trajectories
        ending = [e.termination.value, e.tool_calls, e.tool_errors, tool_summary(e)]  # the episode's
        if n <= 1:
            info = e.trajectory_info[0] if e.trajectory_info else None
            rows.append([
                int(step), e.id, e.task_id, 0, n, info.agent if info else "", info.opened_by if info else "",
                prompt_text(e, max_chars=max_chars), response_text(e, max_chars=max_chars), finite(e.reward),
                *ending, len(e.calls), bool(e.masked or (info is not None and not info.trained)),
            ])  # fmt: skip
            continue
        calls = [0] * n
        for call in e.calls:
            calls[call.trajectory] += 1
        for t in ends(n, max_trajectories):
            info = e.trajectory_info[t]
            prompt, response = trajectory_texts(e, t, max_chars=max_chars)
            rows.append([
                int(step), e.id, e.task_id, t, n, info.agent, info.opened_by, prompt, response,
                finite(e.role_rewards.get(info.agent, e.reward)), *ending, calls[t], bool(e.masked or not info.trained),
            ])  # fmt: skip
    return rows


def active_wandb() -> tuple[Any, Any] | None:
    """``(wandb module, run)`` when this process already imported wandb and started a run, else None
    (never imports wandb: a process that does not use it pays nothing)."""
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    return (wandb, run) if run is not None else None


def log_trajectory_table(
    key: str,
    episodes: list[Episode],
    *,
    step: int,
    wandb: Any = None,
    run: Any = None,
    max_episodes: int = MAX_EPISODES,
    wandb_step: int | None = None,
) -> bool:
    """Log a table of sample trajectories under ``key`` at ``step`` (at W&B step ``wandb_step``, default
    ``step``); ``wandb``/``run`` default to the active run of this process. True when a table was logged."""
    if wandb is None or run is None:
        active = active_wandb()
        if active is None:
            logger.debug("no active W&B run: trajectory table %s not logged", key)
            return False
        wandb, run = active
    if not episodes:
        return False
    try:
        rows = trajectory_rows(episodes, step=step, max_episodes=max_episodes)
        table = wandb.Table(columns=list(TABLE_COLUMNS), data=rows)
        run.log({key: table}, step=int(step if wandb_step is None else wandb_step))
    except Exception as exc:  # W&B trouble must not end a training run
        logger.warning("could not log the W&B trajectory table %s at step %s: %s: %s",
                       key, step, type(exc).__name__, exc)  # fmt: skip
        return False
    return True
