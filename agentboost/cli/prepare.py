"""``agentboost prepare``: any rows and environment -> the GPU routes' datasets.

Every row is first checked to build its environment (the class imports, its tools and reward resolve, the
prompt is found; task ids unique); nothing is written unless every row passes. Then, in ``--out``:

* ``verl/train.parquet``, ``verl/test.parquet``: verl's dataset format for the verl route
  (``examples/custom/train_verl.sh``; the system prompt, if any, is the parquet's chat prompt);
* ``train.jsonl``, ``test.jsonl``: the rLLM route's dataset, registered with rLLM's ``DatasetRegistry`` as
  ``--name`` when rLLM is installed (``agentboost eval`` and ``train`` read these files too);
* ``prepare.json``: the environment and its arguments.

    agentboost prepare --data tasks.jsonl --env agentboost.environments.strands_env:StrandsEnv --out data/mytasks
    ENV_CLASS=agentboost.environments.strands_env:StrandsEnv DATA=data/mytasks bash examples/custom/train_verl.sh
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from ..train.configfile import parse_kv
from . import contract
from .contract import BadInput


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("prepare", help="check rows and write the verl and rLLM routes' datasets",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--data", default=None, help="rows (.jsonl, .json, .parquet); optional with --example "
                        "arithmetic/capitals (generated tasks)")  # fmt: skip
    parser.add_argument("--eval-data", default=None, help="held-out rows (the test split)")
    parser.add_argument(
        "--eval-fraction",
        type=float,
        default=0.1,
        help="without --eval-data, the seeded share of --data held out as the test split (default 0.1)",
    )
    parser.add_argument("--limit", type=int, default=None, help="use the first N rows")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out split (default 0)")
    parser.add_argument("--example", default=None, help="an example's environment and system prompt")
    parser.add_argument("--env", default=None, help="environment class, module:Class (overrides --example)")
    parser.add_argument("--env-arg", action="append", type=parse_kv, default=[], metavar="KEY=VALUE",
                        help="given to the environment with every row (the launch script's ENV_ARGS)")  # fmt: skip
    parser.add_argument(
        "--agent",
        default=None,
        help="Strands agent factory, module:function (printed as the launch script's AGENT_ARGS)",
    )
    parser.add_argument("--system-prompt", default=None, help="the agent's system prompt (written into the parquet)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--name", default=None, help="rLLM dataset name (default: the --out directory's name)")
    parser.add_argument("--register", choices=["auto", "yes", "no"], default="auto",
                        help="register with rLLM's DatasetRegistry (auto: when rLLM is installed)")  # fmt: skip
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        env, train, test, written = _prepare(args)
    except (ValueError, OSError) as exc:  # rows that do not build, unreadable data, parquet refusing a row
        raise BadInput(str(exc)) from exc
    except SystemExit as exc:  # --register yes without rLLM
        raise BadInput(str(exc)) from exc
    launch = [f"ENV_CLASS={shlex.quote(env)}"]
    if args.env_arg:
        launch.append("ENV_ARGS=" + shlex.quote(" ".join(f"{k}={json.dumps(v)}" for k, v in args.env_arg)))
    if args.agent:
        launch.append("AGENT_ARGS=" + shlex.quote(f"agent_factory={args.agent}"))
    refs = [env, args.agent, *(v for _, v in args.env_arg if isinstance(v, str) and ":" in v)]
    root = _source_root(*refs)
    if root is not None:
        launch.append(f"PYTHONPATH={shlex.quote(root)}")
    launch += [f"DATA={shlex.quote(str(Path(args.out).resolve()))}", f"bash {_launch_script()}"]
    sys.stdout.write(
        f"checked {len(train) + len(test)} rows: every one builds {env}\n"
        + "".join(f"wrote {path}\n" for path in written.values())
        + f"train on GPUs (verl route): {' '.join(launch)}\n"
    )
    return 0


def _launch_script() -> str:
    """The verl route's launch script by its absolute path (the command works from any directory); an
    install without the repository's examples says where it is."""
    script = Path(__file__).resolve().parents[2] / "examples" / "custom" / "train_verl.sh"
    if script.is_file():
        return shlex.quote(str(script))
    return "examples/custom/train_verl.sh (in a clone of the agentboost repository)"


def _source_root(*refs: str | None) -> str | None:
    """The directory to put on PYTHONPATH for the ``module:attr`` references a fresh interpreter elsewhere
    cannot import (a package in the user's working tree), so the launch command works from any directory."""
    import importlib.util
    import os
    import subprocess

    modules = sorted({(ref or "").partition(":")[0] for ref in refs} - {""})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import importlib.util as u, sys\n"
        "def found(m):\n    try:\n        return u.find_spec(m) is not None\n"
        "    except Exception:\n        return False\n"
        "print(' '.join(m for m in sys.argv[1:] if not found(m)))"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code, *modules], check=False, cwd=os.path.abspath(os.sep), env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    for module in done.stdout.split():
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            continue
        root = Path(spec.origin).resolve().parent
        for _ in range(module.count(".") + spec.origin.endswith("__init__.py")):
            root = root.parent
        return str(root)
    return None


def _prepare(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    from ..data_prep import prepare_dataset, split_rows
    from ..evaluation.presets import PRESETS
    from ..utils.refs import resolve

    if args.example is not None and args.example not in PRESETS:
        raise ValueError(f"--example {args.example}: unknown (choose from {', '.join(sorted(PRESETS))})")
    preset = PRESETS.get(args.example) if args.example else None
    env = args.env or (preset.env if preset else None)
    if env is None:
        raise ValueError("no environment given: pass --env module:Class or --example NAME")
    if not 0.0 <= args.eval_fraction < 1.0:
        raise ValueError(f"--eval-fraction must be in [0, 1), got {args.eval_fraction}")
    contract.output_dir(args.out, "--out")
    system_prompt = args.system_prompt
    if system_prompt is None and args.agent is None and preset is not None:
        system_prompt = preset.resolved_system_prompt()
    if args.agent:
        contract.resolve_ref(args.agent, f"--agent {args.agent}", "module:function")
    if args.data:
        rows = contract.read_rows(args.data, limit=args.limit)
        from ..runs import AgentSpec

        contract.build_first_env(AgentSpec(env=env, env_args=dict(args.env_arg), agent_factory=args.agent), rows[0])
    elif preset is not None and preset.tasks:
        rows = resolve(preset.tasks)(args.limit or 256, seed=args.seed, split="train")
    else:
        raise ValueError("--data is required")
    if args.eval_data:
        train, test = rows, contract.read_rows(args.eval_data, flag="--eval-data")
    elif not args.data and preset is not None and preset.tasks:
        train, test = rows, resolve(preset.tasks)(64, seed=args.seed, split="eval")
    else:
        train, test = split_rows(rows, args.eval_fraction, seed=args.seed)
    written = prepare_dataset(train, test, args.out, env=env, env_args=dict(args.env_arg),
                              system_prompt=system_prompt, name=args.name, register=args.register)  # fmt: skip
    return env, train, test, written
