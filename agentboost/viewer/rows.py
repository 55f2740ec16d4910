"""Sample trajectories as W&B table rows, shared by the built-in trainer's eval steps and the veRL
validation hook.

W&B is optional: without the ``wandb`` package or without an active run no table is logged and
nothing fails. A W&B error while logging a table is logged as a warning and never stops training.
"""

from __future__ import annotations

import logging
import sys
from collections import defaultdict
from typing import Any

from ..episode import Episode
from .transcript import finite, prompt_text, response_text, tool_summary

logger = logging.getLogger(__name__)

TABLE_COLUMNS = [
    "step", "episode_id", "task_id", "prompt", "response", "reward", "termination",
    "tool_calls", "tool_errors", "tools", "turns", "masked",
]  # fmt: skip
MAX_ROWS = 32
MAX_CHARS = 4000


def pick(episodes: list[Episode], max_rows: int) -> list[Episode]:
    """Up to ``max_rows`` episodes, taken in turn from each termination (in order of first
    appearance), so rare endings (tool errors, timeouts) are in the table, not only the common one."""
    by_end: dict[str, list[Episode]] = defaultdict(list)
    for episode in episodes:
        by_end[episode.termination.value].append(episode)
    queues = list(by_end.values())
    chosen: list[Episode] = []
    depth = 0
    while len(chosen) < max_rows and any(depth < len(q) for q in queues):
        chosen.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return chosen[:max_rows]


def trajectory_rows(
    episodes: list[Episode], *, step: int, max_rows: int = MAX_ROWS, max_chars: int = MAX_CHARS
) -> list[list[Any]]:
    """Rows in :data:`TABLE_COLUMNS` order for a sample of ``episodes`` (see :func:`pick`)."""
    rows = []
    for e in pick(episodes, max_rows):
        rows.append([
            int(step), e.id, e.task_id, prompt_text(e, max_chars=max_chars), response_text(e, max_chars=max_chars),
            finite(e.reward), e.termination.value, e.tool_calls, e.tool_errors, tool_summary(e), len(e.calls),
            bool(e.masked),
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
    max_rows: int = MAX_ROWS,
) -> bool:
    """Log a table of sample trajectories under ``key`` at ``step``; ``wandb``/``run`` default to the
    active run of this process. True when a table was logged."""
    if wandb is None or run is None:
        active = active_wandb()
        if active is None:
            logger.debug("no active W&B run: trajectory table %s not logged", key)
            return False
        wandb, run = active
    if not episodes:
        return False
    try:
        table = wandb.Table(columns=list(TABLE_COLUMNS), data=trajectory_rows(episodes, step=step, max_rows=max_rows))
        run.log({key: table}, step=int(step))
    except Exception as exc:  # W&B trouble must not end a training run
        logger.warning("could not log the W&B trajectory table %s at step %s: %s: %s",
                       key, step, type(exc).__name__, exc)  # fmt: skip
        return False
    return True
