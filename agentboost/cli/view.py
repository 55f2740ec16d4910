"""``agentboost view``: one self-contained HTML page to read episodes (no server, no network).

Give it an ``episodes.jsonl`` (``agentboost rollout``, ``agentboost eval``, an rLLM training run's
``episodes/<step>.jsonl``, the built-in trainer's ``episodes/eval_step<N>.jsonl``) or an
``agentboost eval`` output directory. The page shows every episode's
conversation (tool calls and results, tool errors), termination and reward, its tokens coloured by
loss mask with the token id, mask and sampling log-prob on hover, filters by termination and reward,
and two samples of one task side by side. An episode of several trajectories (a conversation manager
trimmed or summarised the history, several agents ran) lists its trajectories (agent, why each
opened, calls, tokens, re-rendered tokens, trained or not) and shows each one's conversation and
tokens. Open it in any browser; it loads nothing from anywhere.

Tokens are decoded with ``--tokenizer`` (``offline:<family>``, a local directory or a hub id); for an
eval directory the tokenizer recorded in its ``manifest.json`` is used when it is available locally;
otherwise the page shows token ids. What is embedded is capped (episodes; tokens and characters per
trajectory; trajectories shown per episode) and the page says where it cut.

Examples::

    agentboost view runs/eval                                  # writes runs/eval/view.html
    agentboost view runs/rollout/episodes.jsonl --tokenizer offline:qwen2.5 --out /tmp/episodes.html
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..viewer.page import Caps, page_data, write_page
from ..viewer.source import episodes_path, load, tokenizer_ref
from ..viewer.tokens import PieceDecoder, open_tokenizer
from . import contract
from .contract import BadInput

logger = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("view", help="write a self-contained HTML page to read episodes",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("path", help="an episodes .jsonl file or an agentboost eval output directory")
    parser.add_argument("--out", default=None,
                        help="HTML file to write (default: <dir>/view.html, or the .jsonl with .html)")  # fmt: skip
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--tokenizer", default=None, help="offline:<family>, a local directory or a hub id")
    group.add_argument("--no-tokenizer", action="store_true", help="show token ids, never decode")
    caps = Caps()
    parser.add_argument("--max-episodes", type=int, default=caps.episodes, help="episodes embedded (the first N)")
    parser.add_argument("--skip", type=int, default=0, help="pass over the first N episodes (see later ones)")
    parser.add_argument("--max-tokens", type=int, default=caps.tokens,
                        help="tokens shown per episode (per trajectory in an episode of several)")  # fmt: skip
    parser.add_argument("--max-prompt-tokens", type=int, default=caps.prompt_tokens,
                        help="of which prompt tokens (its tail)")  # fmt: skip
    parser.add_argument("--max-chars", type=int, default=caps.chars, help="characters shown per message block")
    parser.add_argument("--max-trajectories", type=int, default=caps.trajectories,
                        help="trajectories of an episode whose conversation and tokens are shown (the first and "
                        "the last ones; every trajectory is listed)")  # fmt: skip
    parser.add_argument("--title", default=None)
    parser.set_defaults(func=main)


EXPECTED = "expected an episodes .jsonl of agentboost rollout or eval, or an eval directory"
NOT_EPISODES = {".safetensors", ".bin", ".pt", ".pth", ".gguf", ".parquet", ".npz", ".zip", ".gz", ".html", ".png"}


def check_episodes_file(file: Path) -> None:
    """Refuse what is plainly not an episodes file before reading it through (a model's weights, a
    dataset in another format, a binary file): its suffix, or a first line that is not a JSON object."""
    if file.suffix.lower() in NOT_EPISODES:
        raise ValueError(f"{file}: a {file.suffix} file, not episodes; {EXPECTED}")
    with open(file, "rb") as fh:
        head = fh.read(4096)
    text = head.lstrip()
    if b"\0" in head or (text and not text.startswith(b"{")):
        raise ValueError(f"{file}: not JSON lines (it starts with {head[:24]!r}); {EXPECTED}")


def default_out(path: Path) -> Path:
    return path / "view.html" if path.is_dir() else path.with_suffix(".html")


def _decoder(args: argparse.Namespace, guess: str | None) -> tuple[PieceDecoder | None, str]:
    """The piece decoder and a line saying which tokenizer is used, or why none is."""
    if args.no_tokenizer:
        return None, "none (--no-tokenizer): token ids shown"
    ref = args.tokenizer or guess
    if ref is None:
        return None, "none given (--tokenizer offline:<family> or a path): token ids shown"
    try:
        tokenizer = open_tokenizer(ref, local_only=args.tokenizer is None)
    except Exception as exc:
        if args.tokenizer is not None:
            extra = contract.missing_extra(exc, f"--tokenizer {ref}")
            why = exc if isinstance(exc, OSError | ValueError) else contract.describe(exc)
            raise extra or BadInput(f"cannot load tokenizer {ref!r}: {why}") from exc
        logger.warning("the evaluation's tokenizer %r is not available here (%s): token ids shown", ref, exc)
        return None, f"{ref} (from the evaluation's settings) is not available here: token ids shown"
    source = "" if args.tokenizer else " (from the evaluation's settings)"
    return PieceDecoder(tokenizer), f"{ref}{source}"


def main(args: argparse.Namespace) -> int:
    for name in ("max_episodes", "max_tokens", "max_chars", "max_trajectories"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} must be >= 1")
    if args.skip < 0 or args.max_prompt_tokens < 0:
        raise BadInput("--skip and --max-prompt-tokens must be >= 0")
    path = Path(args.path)
    out = contract.output_file(args.out or default_out(path))
    caps = Caps(episodes=args.max_episodes, tokens=args.max_tokens, prompt_tokens=args.max_prompt_tokens,
                chars=args.max_chars, trajectories=args.max_trajectories)  # fmt: skip
    try:
        check_episodes_file(episodes_path(path))
        source = load(path, max_episodes=caps.episodes, skip_records=args.skip)
    except (OSError, ValueError) as exc:
        raise BadInput(str(exc)) from exc
    if not source.episodes:
        if source.total and args.skip >= source.total:
            raise BadInput(f"--skip {args.skip}: {source.path} holds {source.total} episodes")
        first = f" (line {source.skipped[0].line}: {source.skipped[0].reason})" if source.skipped else ""
        raise BadInput(f"{source.path}: no episode records in it{first}; {EXPECTED}")
    decoder, status = _decoder(args, tokenizer_ref(source))
    title = args.title or f"agentboost episodes: {path.resolve().name}"
    data = page_data(source, decoder, tokenizer_status=status, caps=caps, title=title)
    try:
        written = write_page(out, data)
    except OSError as exc:
        raise BadInput(f"--out {out}: cannot write it: {exc}") from exc
    if source.skipped:
        logger.warning("%d lines of %s could not be shown (listed at the top of the page)",
                       len(source.skipped), source.path)  # fmt: skip
    sys.stdout.write(f"wrote {written} ({len(source.episodes)} of {source.total} episodes)\n")
    return 0
