"""One self-contained HTML page for a set of episodes: data as inert JSON, the inlined script renders it.

Escaping has one rule: nothing from an episode is ever written into the HTML as markup. The data
goes into a ``<script type="application/json">`` block whose JSON has every ``<``, ``>`` and ``&``
written as a ``\\u`` escape (so no ``</script>`` or comment can close the block), and the script reads
it with ``JSON.parse`` and shows it with ``textContent``. Non-finite numbers (JSON has none) become null.

An episode of one trajectory embeds its conversation and tokens; an episode of several embeds a row
per trajectory (agent, why it opened, calls, tokens, re-rendered tokens, trained, reward) and, for up
to ``Caps.trajectories`` of them (the first and the last ones), each one's conversation
(``Episode.messages_of``) and tokens under the same caps as a whole episode's.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..episode import Episode, TokenTrajectory
from ..types import Termination
from .source import Source
from .static import CSS, JS
from .tokens import MAX_PROMPT_TOKENS, MAX_TOKENS, PieceDecoder, token_view, trained_tokens
from .transcript import MAX_CHARS, MAX_ITEMS, clip, conversation, ends, finite

MAX_SKIPPED_SHOWN = 50
MAX_DETAIL_CHARS = 2000
MAX_META_CHARS = 4000
MAX_NAME_CHARS = 200
MAX_TRAJECTORIES = 32
"""Default cap on the trajectories of one episode whose conversation and tokens are embedded."""
MAX_TRAJECTORY_ROWS = 1000
"""Trajectories of one episode listed (a row each) at most."""
MAX_CALLS_LISTED = 50
"""Call numbers listed per trajectory row (the count is always given)."""


@dataclass
class Caps:
    """What is embedded per page, per episode and per trajectory (the page says so wherever a cut
    happens). ``tokens``, ``prompt_tokens``, ``chars`` and ``items`` apply to each trajectory shown."""

    episodes: int = 500
    tokens: int = MAX_TOKENS
    prompt_tokens: int = MAX_PROMPT_TOKENS
    chars: int = MAX_CHARS
    items: int = MAX_ITEMS
    trajectories: int = MAX_TRAJECTORIES
    """Trajectories of one episode whose conversation and tokens are embedded."""


def episode_data(episode: Episode, decoder: PieceDecoder | None, caps: Caps) -> dict[str, Any]:
    """What the page shows of one episode (plain JSON values, capped)."""
    several = episode.num_trajectories > 1
    if several:  # shown trajectory by trajectory
        items, left_out, tokens = [], 0, None
    else:
        items, left_out = conversation(episode, max_chars=caps.chars, max_items=caps.items)
        tokens = token_view(episode, decoder, max_tokens=caps.tokens, max_prompt_tokens=caps.prompt_tokens).to_dict()
    meta, cut = clip(json.dumps(episode.metadata, ensure_ascii=False, indent=1, sort_keys=True, default=repr),
                     MAX_META_CHARS)  # fmt: skip
    trajectories = episode.trajectories if several else []
    trained = sum(trained_tokens(t) for t in trajectories) if several else trained_tokens(episode)
    return {
        "id": episode.id,
        "task": None if episode.task_id is None else str(episode.task_id),
        "term": episode.termination.value,
        "detail": clip(episode.termination_detail or "", MAX_DETAIL_CHARS)[0],
        "reward": finite(episode.reward),
        "correct": episode.is_correct if isinstance(episode.is_correct, bool) else None,
        "masked": bool(episode.masked),
        "batch_cut": "batch_cut" in episode.metadata,
        "turns": len(episode.calls),
        "calls": [[c.index, str(c.finish_reason), c.completion_tokens, c.trajectory] for c in episode.calls],
        "tool_calls": episode.tool_calls,
        "tool_errors": episode.tool_errors,
        "parse_errors": episode.parse_errors,
        "unknown_tools": episode.unknown_tool_calls,
        "tools": [[name, s.calls, s.errors, s.timeouts, s.truncated] for name, s in sorted(episode.tools.items())],
        "reward_metrics": {str(k): finite(v) for k, v in episode.reward_metrics.items()},
        "wall_s": finite(episode.timings.get("wall_s")),
        "trained": trained,
        "n_traj": episode.num_trajectories,
        "prompt_tokens": episode.num_prompt_tokens,
        "response_tokens": episode.num_response_tokens,
        "rerendered": episode.rerendered_tokens,
        "trajs": trajectory_data(episode, trajectories, decoder, caps),
        "items": [item.to_dict() for item in items],
        "items_left_out": left_out,
        "tok": tokens,
        "meta": meta + (f"\n... {cut} more characters not shown" if cut else ""),
    }


def trajectory_data(
    episode: Episode, trajectories: list[TokenTrajectory], decoder: PieceDecoder | None, caps: Caps
) -> list[dict[str, Any]]:
    """One row per trajectory of an episode of several (none for an episode of one: it is the episode),
    with its conversation and tokens for the first and last ``caps.trajectories`` (:func:`ends`)."""
    shown = set(ends(len(trajectories), caps.trajectories))
    rows = []
    for t in trajectories[:MAX_TRAJECTORY_ROWS]:
        info = t.info
        view = None
        if t.index in shown:
            items, left_out = conversation(episode, trajectory=t.index, max_chars=caps.chars, max_items=caps.items)
            tokens = token_view(t, decoder, max_tokens=caps.tokens, max_prompt_tokens=caps.prompt_tokens)
            first = t.calls[0].message_index if t.calls else -1
            view = {"items": [item.to_dict() for item in items], "items_left_out": left_out,
                    "first_message": first, "tok": tokens.to_dict()}  # fmt: skip
        rows.append({
            "index": t.index,
            "agent": clip(str(info.agent), MAX_NAME_CHARS)[0],
            "opened_by": clip(str(info.opened_by), MAX_NAME_CHARS)[0],
            "detail": clip(str(info.detail or ""), MAX_DETAIL_CHARS)[0],
            "calls": [c.index for c in t.calls[:MAX_CALLS_LISTED]],
            "n_calls": len(t.calls),
            "prompt": len(t.segments[0].token_ids) if t.segments else 0,
            "response": sum(len(s.token_ids) for s in t.segments[1:]),
            "model": t.num_model_tokens,
            "rerendered": int(info.rerendered_tokens),
            "trained": bool(info.trained),
            "loss": trained_tokens(t),
            "reward": finite(episode.reward_of(info.agent)),
            "view": view,
        })  # fmt: skip
    return rows


def page_data(source: Source, decoder: PieceDecoder | None, *, tokenizer_status: str, caps: Caps,
              title: str) -> dict[str, Any]:  # fmt: skip
    """Everything the page embeds."""
    return {
        "title": title,
        "source": str(source.path),
        "total": source.total,
        "embedded": len(source.episodes),
        "replaced": source.replaced,
        "terminations": dict(source.terminations),
        "all_terminations": [t.value for t in Termination],
        "skipped": [[s.line, s.reason] for s in source.skipped[:MAX_SKIPPED_SHOWN]],
        "skipped_total": len(source.skipped),
        "tokenizer": {"ok": decoder is not None, "status": tokenizer_status},
        "caps": {
            "episodes": caps.episodes,
            "tokens": caps.tokens,
            "prompt_tokens": caps.prompt_tokens,
            "chars": caps.chars,
            "trajectories": caps.trajectories,
        },
        "episodes": [episode_data(e, decoder, caps) for e in source.episodes],
    }


def script_json(data: Any) -> str:
    """``data`` as JSON that is inert inside a ``<script>`` element (see module doc)."""
    text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def render(data: dict[str, Any]) -> str:
    """The HTML page for ``data`` (from :func:`page_data`)."""
    policy = (
        f"default-src 'none'; script-src '{_sha256(JS)}'; style-src '{_sha256(CSS)}'; "
        "img-src 'none'; connect-src 'none'; base-uri 'none'; form-action 'none'"
    )
    title = html.escape(str(data.get("title", "agentboost episodes")), quote=True)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{policy}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{CSS}</style>
</head>
<body>
<header>
<h1>{title}</h1>
<div id="overview" class="muted"></div>
<noscript><p class="note">This page renders its episodes with JavaScript.</p></noscript>
</header>
<main>
<section id="filters" class="panel">
<h2>Filters <span id="visible-count"></span></h2>
<div class="row" id="term-filters">termination: </div>
<div class="row">
<label>reward &ge; <input type="number" id="reward-min" step="any"></label>
<label>reward &le; <input type="number" id="reward-max" step="any"></label>
<label><input type="checkbox" id="tool-errors-only"> with tool errors only</label>
<label><input type="checkbox" id="masked-hide"> hide masked</label>
<label><input type="checkbox" id="several-only"> several trajectories only</label>
<label>id or task contains <input type="search" id="search"></label>
</div>
</section>
<details id="compare" class="panel">
<summary><h2>Side by side: two samples of one task</h2></summary>
<div id="compare-controls" class="row">
<label>task <select id="compare-task"></select></label>
<label>left <select id="compare-a"></select></label>
<label>right <select id="compare-b"></select></label>
</div>
<div id="compare-view"></div>
</details>
<section id="episodes"></section>
</main>
<script type="application/json" id="episode-data">{script_json(data)}</script>
<script>{JS}</script>
</body>
</html>
"""


def write_page(path: str | Path, data: dict[str, Any]) -> Path:
    """Write the page atomically (a viewer open on the old file never sees half a page)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(data), encoding="utf-8")
    tmp.replace(path)
    return path
