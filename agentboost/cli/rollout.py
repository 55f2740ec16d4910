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
from ..evaluation.presets import PRESETS
from ..execution import run_specs
from ..report import markdown, summarize
from ..rollout import RolloutSettings
from ..runs import AgentSpec, EpisodeSpec, expand
from ..types import Budget, SamplingParams
from . import contract
from .contract import BadInput

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
    (an unnamed environment would add its own tools, reward and prompt to the user's rows). Bad input
    raises :class:`~agentboost.cli.contract.BadInput`."""
    if not args.env and not args.example:
        raise BadInput(
            f"no environment given: pass --env module:Class, e.g. `agentboost {command} --data tasks.jsonl "
            f"--env {GENERIC_ENV}` (tools and reward_fn from each row, as module:attr), or --example NAME "
            f"({', '.join(sorted(PRESETS))}), e.g. `agentboost {command} --example arithmetic`"
        )
    contract.check_positive(limit=args.limit)
    preset = PRESETS[args.example] if args.example else None
    env = args.env or preset.env
    system_prompt = args.system_prompt
    if system_prompt is None and args.agent is None and preset is not None:
        system_prompt = preset.resolved_system_prompt()
    if args.data:
        rows = contract.read_rows(args.data, limit=args.limit)
    elif preset is not None and not preset.needs_data and preset.tasks:
        make_tasks = contract.resolve_ref(preset.tasks, f"--example {args.example}")
        rows = make_tasks(args.limit or default_limit, seed=0, split=split)
    else:
        raise BadInput(f"--data is required for {'--env ' + args.env if args.env else '--example ' + args.example}")
    if not args.env:
        contract.check_example(args.example)
    agent_factory = args.agent or (preset.agent_factory if preset is not None and system_prompt is None else None)
    agent = AgentSpec(env=env, env_args=dict(args.env_arg), agent_factory=agent_factory, system_prompt=system_prompt)
    return agent, rows


def plan_episodes(
    args: argparse.Namespace, command: str, *, split: str, default_limit: int
) -> tuple[AgentSpec, list[dict[str, Any]], list[EpisodeSpec]]:
    """Everything ``rollout`` and ``eval`` check before a run (the CLI contract): the model spec, the
    environment and rows, the episode specs, the first row's environment built here, the backend checked
    (tokenizer loaded once, server asked once). Raises ``BadInput`` / ``InfraFailure``."""
    contract.check_positive(n=args.n, concurrency=args.concurrency)
    if args.workers < 0:
        raise BadInput(f"--workers must be >= 0, got {args.workers}")
    if args.worker_memory_mb is not None and args.worker_memory_mb < 1:
        raise BadInput(f"--worker-memory-mb must be >= 1, got {args.worker_memory_mb}")
    model = model_spec_from_args(args)
    agent, rows = select_environment(args, command, split=split, default_limit=default_limit)
    try:
        specs = expand(rows, agent, model, settings_from_args(args), n=args.n)
    except ValueError as exc:  # duplicate task ids, impossible budgets or sampling
        raise BadInput(str(exc)) from exc
    contract.build_first_env(agent, rows[0])
    contract.check_model(model, workers=args.workers)
    return agent, rows, specs


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
    parser.add_argument("--out", default="runs/rollout", help="output directory (one that holds a rollout is refused)")
    parser.add_argument("--overwrite", action="store_true", help="replace the rollout already in --out")
    add_model_arguments(parser)
    add_rollout_arguments(parser)
    parser.set_defaults(func=run)


def model_spec_from_args(args: argparse.Namespace) -> ModelSpec:
    api_key = None
    if getattr(args, "api_key_env", None):
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise BadInput(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    if getattr(args, "strands_model", None):
        return _strands_model_spec(args, api_key)
    backend = args.backend or "tiny"
    contract.backend_kind(backend)
    if backend.startswith("strands:"):
        raise BadInput(
            f"--backend {backend}: use --strands-model {backend[len(PREFIX) :]} for a Strands model provider"
        )
    return ModelSpec(
        backend=backend,
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
        raise BadInput(f"--strands-model replaces the token backend: drop {', '.join(clashes)}")
    # A malformed spec, a missing key, a missing package or an unimportable factory is an input error,
    # before anything runs.
    what = f"--strands-model {args.strands_model}"
    try:
        StrandsProviderBackend(parse_provider(args.strands_model), api_key=api_key)
    except ValueError as exc:
        raise BadInput(f"{what}: {exc}") from exc
    except Exception as exc:
        raise contract.bad_reference(exc, what) from exc
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


OUTPUTS = ("episodes.jsonl", "summary.json", "summary.md")


def run(args: argparse.Namespace) -> int:
    out = contract.output_dir(args.out)
    earlier = [name for name in OUTPUTS if (out / name).exists()]
    if earlier and not args.overwrite:
        raise BadInput(f"--out {out} already holds a rollout ({', '.join(earlier)}): choose another --out, or pass "
                       "--overwrite to replace it")  # fmt: skip
    _, _, specs = plan_episodes(args, "rollout", split="rollout", default_limit=8)
    model = specs[0].model
    with contract.Outputs(out) as outputs:  # a run stopped for infrastructure reasons leaves nothing behind
        out.mkdir(parents=True, exist_ok=True)
        episodes_path = outputs.claim(out / "episodes.jsonl")
        for name in OUTPUTS[1:]:
            outputs.claim(out / name)
        try:
            episodes = asyncio.run(
                _run(specs, args.concurrency, episodes_path, workers=args.workers,
                     memory_limit_mb=args.worker_memory_mb)
            )  # fmt: skip
        except OSError as exc:  # writing episodes.jsonl (a full disk); the episodes' own failures are caught
            raise contract.write_failure(exc, out) from exc
        summary = summarize(episodes)
        baseline = is_provider_backend(model.backend)
        if baseline:  # no tokens: say so wherever the numbers are read; turns are the provider's calls
            from ..evaluation.report import turns_of

            summary["turns_mean"] = sum(turns_of(e) for e in episodes) / max(1, len(episodes))
            summary = {"token_exact": False, "not_training_data": NOT_TOKEN_EXACT,
                       "strands_model": model.backend[len(PREFIX):], **summary}  # fmt: skip
        text = markdown(summary, title=f"Rollout summary ({len(episodes)} episodes)")
        if baseline:
            text = f"**{NOT_TOKEN_EXACT}**: {model.backend[len(PREFIX) :]} through a Strands model provider.\n\n" + text
        try:
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
            (out / "summary.md").write_text(text)
        except OSError as exc:
            raise contract.write_failure(exc, out) from exc
    sys.stdout.write(text + f"\nepisodes: {episodes_path}\nsummary: {out / 'summary.json'}\n")
    failure = contract.infra_summary(episodes)
    if failure is not None:  # results, but not all of them: the summary counts these as failures
        raise contract.InfraFailure(
            f"{failure}; they count as failures in {out / 'summary.md'}: fix the cause and run again"
        )
    return 0


async def _run(
    specs: list, concurrency: int, path: Path, *, workers: int = 0, memory_limit_mb: int | None = None
) -> list:
    """Run ``specs``, appending each episode to ``path`` as it finishes; stops (``InfraFailure``) when the
    first episodes all end in ``infra_error``."""
    from tqdm import tqdm

    bar = tqdm(total=len(specs), desc="episodes", unit="ep", file=sys.stderr, disable=None)  # a terminal only
    watch = contract.InfraWatch(len(specs))
    with open(path, "w", encoding="utf-8") as fh:

        def done(episode: Any) -> None:
            fh.write(episode.to_json() + "\n")
            fh.flush()
            bar.update(1)
            bar.set_postfix(reward=f"{episode.reward:.2f}", end=episode.termination.value)
            watch.seen(episode)

        try:
            return await watch.run(
                run_specs(
                    specs, concurrency=concurrency, workers=workers, on_done=done, memory_limit_mb=memory_limit_mb
                )
            )
        finally:
            bar.close()
