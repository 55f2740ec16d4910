"""``agentboost eval``: evaluate an example's environment over a dataset, resumably, with pass@k.

Runs ``--n`` samples per dataset row against any backend through the worker pool (``--workers``;
0 runs in this process), with at most ``--concurrency`` episodes in flight. Every finished episode
is appended to ``<out>/episodes.jsonl`` at once, so an interrupted evaluation resumes where it
stopped when the same command is run again (finished episodes are never recomputed; changed
settings are refused, except where episodes run: server URLs, request timeouts). At the end it writes
``report.json``, ``report.md`` and ``report.png``: pass@k and pass^k (unbiased estimators), reward,
terminations and tool usage.

Infrastructure failures (termination ``infra_error``: server down, bad tokenizer, a crashed worker)
are not results. When the first episodes of a run all end that way, the run stops at once and says
why (if nothing but such failures is stored, the output directory is cleared, so the corrected
command starts afresh). A report that still holds some counts them as failures, says so, and the
command exits with status 3; ``--retry-failed`` re-runs them.

Baselines: ``--strands-model SPEC`` runs the same environment, reward and report through a Strands
model provider instead of a token backend: ``openai:<model>@<base_url>`` (any OpenAI-compatible chat
endpoint: vLLM's chat API, Ollama's /v1, ...), ``openai:<model>`` (api.openai.com, OPENAI_API_KEY),
``bedrock:<model-id>[@<region>]`` (AWS credentials) or ``py:<module>:<factory>``. Such episodes have no
tokens: they are marked "not token-exact: not training data" in every episode and in the report
header, and masked so that no trainer ever uses them.

``--compare DIR_A DIR_B`` puts two runs side by side (a policy and a frontier model, two checkpoints):
pass@k and pass^k on the tasks both ran, reward, terminations, tool use and the tasks where they
differ, into ``compare.md``, ``compare.json`` and ``compare.png`` under ``--out`` (default runs/compare).

Examples::

    agentboost eval --example arithmetic --n 4                       # generated tasks, tiny model
    agentboost eval --data tasks.jsonl --env agentboost.environments.strands_env:StrandsEnv --n 4 \\
        --backend http://localhost:8000 --tokenizer Qwen/Qwen2.5-7B-Instruct   # tools, reward_fn from each row
    agentboost eval --example math --data aime.jsonl --n 16 --k 1 --k 16 \\
        --backend http://localhost:8000 --tokenizer Qwen/Qwen3-4B --workers 4 --concurrency 64
    agentboost eval --example capitals --n 4 --out runs/frontier \\
        --strands-model openai:gpt-4o-mini --api-key-env OPENAI_API_KEY
    agentboost eval --compare runs/policy runs/frontier --out runs/policy-vs-frontier
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import sys
from typing import Any

from ..backends.strands_provider import is_provider_backend, parse_provider
from ..evaluation.passk import default_ks
from ..evaluation.report import build_report
from ..evaluation.store import EpisodeStore, ResumeMismatch, StoreLocked
from ..execution import run_specs
from ..runs import AgentSpec, EpisodeSpec
from ..types import Termination
from . import contract
from .contract import FAIL_FAST, BadInput, InfraFailure, most_common_detail
from .rollout import (
    add_env_arguments,
    add_model_arguments,
    add_rollout_arguments,
    add_worker_memory_argument,
    plan_episodes,
)

logger = logging.getLogger(__name__)

__all__ = ["FAIL_FAST", "add_parser", "fingerprint", "main"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("eval", help="evaluate an environment over a dataset (resumable, pass@k)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    what = parser.add_argument_group("what to evaluate (--env or --example is required)")
    add_env_arguments(what)
    what.add_argument("--data", default=None, help="dataset (.jsonl, .json, .parquet)")
    what.add_argument("--limit", type=int, default=None, help="use the first N rows")
    run = parser.add_argument_group("run")
    run.add_argument("--n", type=int, default=1, help="samples per row")
    run.add_argument("--k", type=int, action="append", default=None,
                     help="report pass@k and pass^k for this k (repeatable; default: 1, 2, 4, ... n)")  # fmt: skip
    run.add_argument("--threshold", type=float, default=1.0,
                     help="reward counted as success when the environment gives no verdict (default 1.0)")  # fmt: skip
    run.add_argument("--workers", type=int, default=2, help="agent worker processes (0: in this process)")
    run.add_argument("--concurrency", type=int, default=32, help="episodes in flight")
    add_worker_memory_argument(run)
    run.add_argument("--out", default=None,
                     help="output directory, resumed if it exists (default runs/eval, runs/compare)")  # fmt: skip
    run.add_argument("--overwrite", action="store_true", help="discard episodes stored in --out")
    run.add_argument("--retry-failed", action="store_true",
                     help="re-run stored episodes that ended in infra_error (e.g. a server was down)")  # fmt: skip
    run.add_argument("--no-plots", action="store_true")
    run.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"), default=None,
                     help="put two finished runs (eval or rollout directories) side by side")  # fmt: skip
    add_model_arguments(parser)
    add_rollout_arguments(parser)
    parser.set_defaults(func=main)


WHERE_FIELDS = ("request_timeout_s", "max_batch_size")
"""Model-spec fields that say where and how episodes run, not what they compute (may change on resume)."""


def fingerprint(rows: list[dict[str, Any]], args: argparse.Namespace, agent: AgentSpec, specs: list) -> dict:
    """What the stored episodes depend on (a resume must match it) and, under ``where``, what may change."""
    blob = json.dumps(rows, sort_keys=True, default=str).encode()
    model = specs[0].model.to_dict()
    model.pop("api_key", None)  # never written to disk
    where = {field: model.pop(field) for field in WHERE_FIELDS}
    if str(model["backend"]).startswith(("http://", "https://")):  # a server's address, not the model
        where["backend"] = model.pop("backend")
    elif is_provider_backend(str(model["backend"])):  # the provider's model is what; its URL/region is where
        ref = parse_provider(model["backend"])
        model["backend"], where["backend"] = ref.what(), ref.location
    return {
        "data_sha256": hashlib.sha256(blob).hexdigest(),
        "rows": len(rows),
        "n": args.n,
        "agent": agent.to_dict(),
        "model": model,
        "settings": specs[0].settings,
        "where": where,
    }


def main(args: argparse.Namespace) -> int:
    if args.compare:
        return _compare(args)
    out = contract.output_dir(args.out or "runs/eval")
    contract.check_positive(n=args.n)
    ks = sorted(set(args.k)) if args.k else default_ks(args.n)
    if max(ks) > args.n or min(ks) < 1:
        raise BadInput(f"every --k must be in 1..n={args.n}, got {ks}")
    agent, rows, specs = plan_episodes(args, "eval", split="eval", default_limit=16)
    outputs = contract.Outputs(out)  # a run that stored nothing but failures leaves nothing behind
    try:
        with EpisodeStore(out, fingerprint(rows, args, agent, specs), overwrite=args.overwrite) as store:
            todo = _todo(specs, store, retry_failed=args.retry_failed)
            stored = len(specs) - len(todo)
            if stored:
                logger.warning("resuming %s: %d of %d episodes already stored, running %d",
                               out, stored, len(specs), len(todo))  # fmt: skip
            try:
                asyncio.run(_run(todo, store, total=len(specs), done=stored, args=args))
                failure = None
            except InfraFailure as exc:
                failure = str(exc)
            stored_eps = list(store.episodes.values())
            only_failures = bool(stored_eps) and all(e.termination is Termination.INFRA_ERROR for e in stored_eps)
            if only_failures and failure is None:
                failure = f"all {len(stored_eps)} episodes ended in infra_error: {most_common_detail(stored_eps)}"
            if failure is not None:
                if only_failures:
                    store.clear()
                    outputs.discard_on_exit = True
                    raise InfraFailure(f"{failure}; nothing was evaluated and {out} was cleared, so the corrected "
                                       "command starts afresh")  # fmt: skip
                raise InfraFailure(f"{failure}; fix the cause and run the same command with --retry-failed")
            episodes = [store.episodes[s.episode_id] for s in specs if s.episode_id in store.episodes]
    except (ResumeMismatch, StoreLocked, ValueError) as exc:  # ValueError: a corrupt episodes.jsonl
        raise BadInput(str(exc)) from exc
    except InfraFailure:
        if outputs.discard_on_exit:  # the store is closed (and unlocked) by now
            outputs.discard()
        raise
    except KeyboardInterrupt:
        sys.stderr.write(f"\ninterrupted: finished episodes are in {out / 'episodes.jsonl'}; "
                         "run the same command again to resume\n")  # fmt: skip
        return contract.EXIT_INTERRUPTED
    missing = len(specs) - len(episodes)
    if missing:  # only possible if the runner lost episodes, which it must not
        raise RuntimeError(f"{missing} episodes have no record")
    title = f"agentboost eval: {args.example or args.env}"
    report = build_report(episodes, ks=ks, threshold=args.threshold, expected_per_task=args.n)
    written = report.write(out, title=title, plots=not args.no_plots)
    sys.stdout.write(report.to_markdown(title) + "\n" + "\n".join(f"wrote {p}" for p in written) + "\n")
    failed = contract.infra_summary(episodes)
    if failed is not None:
        raise InfraFailure(f"{failed} and count as failures above; fix the cause and run the same command with "
                           "--retry-failed")  # fmt: skip
    return 0


def _compare(args: argparse.Namespace) -> int:
    from ..evaluation.compare import compare_runs

    out = contract.output_dir(args.out or "runs/compare")
    try:
        comparison = compare_runs(*args.compare, ks=args.k, threshold=args.threshold)
    except (OSError, ValueError) as exc:
        raise BadInput(f"--compare: {exc}") from exc
    written = comparison.write(out, plots=not args.no_plots)
    sys.stdout.write(comparison.to_markdown() + "\n" + "\n".join(f"wrote {p}" for p in written) + "\n")
    return 0


def _todo(specs: list[EpisodeSpec], store: EpisodeStore, *, retry_failed: bool) -> list[EpisodeSpec]:
    todo = []
    for spec in specs:
        stored = store.episodes.get(spec.episode_id)
        if stored is None or (retry_failed and stored.termination is Termination.INFRA_ERROR):
            todo.append(spec)
    return todo


async def _run(todo: list[EpisodeSpec], store: EpisodeStore, *, total: int, done: int, args: argparse.Namespace):
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    bar = tqdm(total=total, initial=done, desc="eval", unit="ep", file=sys.stderr, disable=None)  # a terminal only
    successes = 0
    watch = contract.InfraWatch(len(todo))

    def finished(episode: Any) -> None:
        nonlocal successes
        store.add(episode)
        successes += bool(episode.is_correct) if episode.is_correct is not None else episode.reward >= args.threshold
        bar.update(1)
        bar.set_postfix(success=f"{successes}/{bar.n - done}", end=episode.termination.value)
        watch.seen(episode)

    with logging_redirect_tqdm():
        try:
            await watch.run(
                run_specs(
                    todo,
                    concurrency=args.concurrency,
                    workers=args.workers,
                    on_done=finished,
                    memory_limit_mb=args.worker_memory_mb,
                )
            )
        finally:
            bar.close()
