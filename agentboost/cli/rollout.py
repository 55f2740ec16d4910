"""``agentboost rollout``: run N episodes of an environment over a dataset against a backend.

Writes ``episodes.jsonl`` (one full :class:`~agentboost.episode.Episode` per line, as they finish),
``summary.json`` and ``summary.md`` (reward, terminations, tool usage) into ``--out``.

The environment is always named: ``--env module:Class`` (``agentboost.environments.strands_env:StrandsEnv``
takes each row's own ``tools`` and ``reward_fn``, as ``module:attr``) or ``--example NAME`` (an example's
environment and system prompt). Nothing is added silently: without either the command stops and says so.
``--example arithmetic`` (or ``capitals``) without ``--data`` runs that example's generated tasks; with
the default ``--backend tiny``, a tiny randomly initialised local model (a smoke test of the whole path,
not a good agent).

``--strands-model`` runs the same environments and rewards through a Strands model provider instead
of a token backend (a frontier-model baseline): ``openai:<model>@<base_url>`` (any OpenAI-compatible
chat endpoint: vLLM's chat API, Ollama's /v1), ``openai:<model>`` (api.openai.com),
``bedrock:<model-id>[@<region>]`` or ``py:<module>:<factory>``. Those episodes carry no tokens and
are marked and masked: not token-exact, not training data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from ..backends.factory import ModelSpec
from ..backends.strands_provider import (
    NOT_TOKEN_EXACT,
    PREFIX,
    StrandsProviderBackend,
    is_provider_backend,
    parse_provider,
)
from ..data import load_rows
from ..evaluation.presets import PRESETS
from ..execution import run_specs
from ..report import markdown, summarize
from ..rollout import RolloutSettings
from ..runs import AgentSpec, expand
from ..types import Budget, SamplingParams

logger = logging.getLogger(__name__)

GENERIC_ENV = "agentboost.environments.strands_env:StrandsEnv"
"""The environment that takes everything (tools, reward) from the row itself: the usual ``--env``."""


def _kv(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--backend",
        default=None,
        help="http(s)://host:port[,more] (vLLM-compatible server), hf:/path/to/model, or tiny (default)",
    )
    group.add_argument(
        "--strands-model",
        default=None,
        metavar="SPEC",
        help="instead of a token backend, a Strands model provider (baselines; episodes are not token-exact and "
        "never training data): openai:<model>@<base_url> (OpenAI-compatible chat API: vLLM, Ollama's /v1, ...), "
        "openai:<model> (api.openai.com, OPENAI_API_KEY), bedrock:<model-id>[@<region>] (AWS credentials), "
        "py:<module>:<factory> (factory(sampling=...) -> strands Model)",
    )
    group.add_argument("--tokenizer", default=None, help="offline:<family>, a local directory or a hub id")
    group.add_argument("--served-model", default=None, help="model name on the server (default: /v1/models)")
    group.add_argument("--template-kwarg", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                       help="chat template variable for every render, e.g. enable_thinking=false")  # fmt: skip
    group.add_argument("--tool-parser", default=None, choices=["hermes", "llama3_json"])
    group.add_argument("--device", default=None)
    group.add_argument("--api-key-env", default=None, metavar="NAME",
                       help="variable holding the server's or provider's API key (never stored)")  # fmt: skip


def add_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling and budgets")
    group.add_argument("--temperature", type=float, default=1.0)
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--top-k", type=int, default=-1)
    group.add_argument("--seed", type=int, default=None)
    group.add_argument("--max-turns", type=int, default=8)
    group.add_argument("--max-total-tokens", type=int, default=8192)
    group.add_argument("--max-tokens-per-call", type=int, default=1024)
    group.add_argument("--max-response-tokens", type=int, default=None)
    group.add_argument("--episode-timeout", type=float, default=600.0, help="wall-clock seconds per episode")
    group.add_argument("--mask-truncated", action="store_true", help="also mask max_tokens/max_turns episodes")


def add_env_arguments(parser: Any) -> None:
    """``--example`` / ``--env`` and what goes with them (shared by rollout and eval)."""
    parser.add_argument("--example", choices=sorted(PRESETS), default=None,
                        help="an example's environment + system prompt (arithmetic and capitals generate tasks "
                        "without --data)")  # fmt: skip
    parser.add_argument("--env", default=None,
                        help=f"environment class, module:Class (overrides --example); {GENERIC_ENV} takes each "
                        "row's own tools and reward_fn")  # fmt: skip
    parser.add_argument("--env-arg", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                        help="given to the environment with every row, e.g. reward_fn=mypkg.rewards:exact")  # fmt: skip
    parser.add_argument("--agent", default=None, help="Strands agent factory, module:function")
    parser.add_argument("--system-prompt", default=None)


def add_worker_memory_argument(parser: Any) -> None:
    parser.add_argument("--worker-memory-mb", type=int, default=None, metavar="MB",
                        help="with --workers N: replace a worker whose memory (RSS) exceeds MB; its episodes come "
                        "back as infra_error (default: no limit)")  # fmt: skip


def select_environment(
    args: argparse.Namespace, command: str, *, split: str, default_limit: int
) -> tuple[AgentSpec, list[dict[str, Any]]]:
    """The environment, agent and rows the user named: ``--env`` or ``--example``, never a silent default
    (an unnamed environment would add its own tools, reward and prompt to the user's rows)."""
    if not args.env and not args.example:
        raise ValueError(
            f"no environment given: pass --env module:Class, e.g. `agentboost {command} --data tasks.jsonl "
            f"--env {GENERIC_ENV}` (tools and reward_fn from each row, as module:attr), or --example NAME "
            f"({', '.join(sorted(PRESETS))}), e.g. `agentboost {command} --example arithmetic`"
        )
    preset = PRESETS[args.example] if args.example else None
    env = args.env or preset.env
    system_prompt = args.system_prompt
    if system_prompt is None and args.agent is None and preset is not None:
        system_prompt = preset.resolved_system_prompt()
    if args.data:
        rows = load_rows(args.data, limit=args.limit)
    elif preset is not None and not preset.needs_data and preset.tasks:
        from ..utils.refs import resolve

        rows = resolve(preset.tasks)(args.limit or default_limit, seed=0, split=split)
    else:
        raise ValueError(f"--data is required for {'--env ' + args.env if args.env else '--example ' + args.example}")
    agent_factory = args.agent or (preset.agent_factory if preset is not None and system_prompt is None else None)
    agent = AgentSpec(env=env, env_args=dict(args.env_arg), agent_factory=agent_factory, system_prompt=system_prompt)
    return agent, rows


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("rollout", help="run episodes of an environment and write them as JSONL",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--data", default=None, help="dataset (.jsonl, .json, .parquet); optional with --example arithmetic/capitals"
    )
    add_env_arguments(parser)
    parser.add_argument("--n", type=int, default=1, help="episodes per dataset row")
    parser.add_argument("--limit", type=int, default=None, help="use the first N rows (generated tasks: 8)")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight")
    parser.add_argument(
        "--workers", type=int, default=0, help="agent worker processes (0: run episodes in this process)"
    )
    add_worker_memory_argument(parser)
    parser.add_argument("--out", default="runs/rollout", help="output directory")
    add_model_arguments(parser)
    add_rollout_arguments(parser)
    parser.set_defaults(func=run)


def model_spec_from_args(args: argparse.Namespace) -> ModelSpec:
    api_key = None
    if getattr(args, "api_key_env", None):
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise SystemExit(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    if getattr(args, "strands_model", None):
        return _strands_model_spec(args, api_key)
    return ModelSpec(
        backend=args.backend or "tiny",
        api_key=api_key,
        tokenizer=args.tokenizer,
        served_model=args.served_model,
        template_kwargs=dict(args.template_kwarg),
        tool_parser=args.tool_parser,
        device=args.device,
    )


def _strands_model_spec(args: argparse.Namespace, api_key: str | None) -> ModelSpec:
    """The provider route: token-backend options make no sense with it and are refused, not ignored."""
    clashes = [flag for flag, value in (("--backend", args.backend), ("--tokenizer", args.tokenizer),
               ("--served-model", args.served_model), ("--template-kwarg", args.template_kwarg),
               ("--tool-parser", args.tool_parser), ("--device", args.device)) if value]  # fmt: skip
    if clashes:
        raise ValueError(f"--strands-model replaces the token backend: drop {', '.join(clashes)}")
    # A malformed spec, a missing key or an unimportable factory is an input error, before anything runs.
    try:
        StrandsProviderBackend(parse_provider(args.strands_model), api_key=api_key)
    except ImportError as exc:
        raise ValueError(f"--strands-model {args.strands_model}: {exc}") from exc
    return ModelSpec(backend=PREFIX + args.strands_model, api_key=api_key)


def settings_from_args(args: argparse.Namespace) -> RolloutSettings:
    return RolloutSettings(
        sampling=SamplingParams(
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
            max_tokens_per_call=args.max_tokens_per_call,
        ),
        budget=Budget(
            max_turns=args.max_turns, max_total_tokens=args.max_total_tokens,
            max_response_tokens=args.max_response_tokens, wall_clock_s=args.episode_timeout,
        ),
        mask_truncated=args.mask_truncated,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    try:
        model = model_spec_from_args(args)
        agent, rows = select_environment(args, "rollout", split="rollout", default_limit=8)
        if not rows:
            raise ValueError("no rows to run")
    except ValueError as exc:
        sys.stderr.write(f"agentboost rollout: {exc}\n")
        return 2
    specs = expand(rows, agent, model, settings_from_args(args), n=args.n)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    episodes_path = out / "episodes.jsonl"
    episodes = asyncio.run(
        _run(specs, args.concurrency, episodes_path, workers=args.workers, memory_limit_mb=args.worker_memory_mb)
    )
    summary = summarize(episodes)
    baseline = is_provider_backend(model.backend)
    if baseline:  # no tokens: say so wherever the numbers are read; turns are the provider's calls
        from ..evaluation.report import turns_of

        summary["turns_mean"] = sum(turns_of(e) for e in episodes) / max(1, len(episodes))
        summary = {"token_exact": False, "not_training_data": NOT_TOKEN_EXACT,
                   "strands_model": model.backend[len(PREFIX):], **summary}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    text = markdown(summary, title=f"Rollout summary ({len(episodes)} episodes)")
    if baseline:
        text = f"**{NOT_TOKEN_EXACT}**: {model.backend[len(PREFIX) :]} through a Strands model provider.\n\n" + text
    (out / "summary.md").write_text(text)
    sys.stdout.write(text + f"\nepisodes: {episodes_path}\nsummary: {out / 'summary.json'}\n")
    return 0


async def _run(
    specs: list, concurrency: int, path: Path, *, workers: int = 0, memory_limit_mb: int | None = None
) -> list:
    from tqdm import tqdm

    bar = tqdm(total=len(specs), desc="episodes", unit="ep", file=sys.stderr)
    with open(path, "w", encoding="utf-8") as fh:

        def done(episode: Any) -> None:
            fh.write(episode.to_json() + "\n")
            fh.flush()
            bar.update(1)
            bar.set_postfix(reward=f"{episode.reward:.2f}", end=episode.termination.value)

        try:
            return await run_specs(
                specs, concurrency=concurrency, workers=workers, on_done=done, memory_limit_mb=memory_limit_mb
            )
        finally:
            bar.close()
