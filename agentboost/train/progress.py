"""One progress display per phase of a run (warm start, held-out evaluation, GRPO), on stderr when it is a
terminal.

A phase whose length is known shows its total and tqdm's ETA. A phase that may end early (a warm start
that stops at the first passing check) shows its ceiling as what it is, an upper bound: "300 of at most
1500 steps", and the time left to that ceiling as "at most". ETAs use the phase's average rate so far
(tqdm's ``smoothing=0``): the warm start's checks and GRPO's evaluations come every N steps, and a
recent-rate estimate swings with them.
"""

from __future__ import annotations

import sys
from typing import Any

UPPER_BOUND_FORMAT = (
    "{desc}: {n_fmt} of at most {total_fmt} {unit} |{bar}| {elapsed} elapsed, at most {remaining} left{postfix}"
)


def phase_bar(desc: str, total: int, *, unit: str, progress: bool, initial: int = 0, upper_bound: bool = False) -> Any:
    """A tqdm bar for one phase: on a terminal only (stderr redirected to a file or a pipe gets the log's lines
    and the result, not the bar's redraws), never when ``progress`` is False."""
    from tqdm import tqdm

    return tqdm(
        total=total, initial=initial, desc=desc, unit=unit, disable=None if progress else True, file=sys.stderr,
        dynamic_ncols=True,
        bar_format=UPPER_BOUND_FORMAT if upper_bound else None, smoothing=0.0,
    )  # fmt: skip
