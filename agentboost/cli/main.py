"""``agentboost`` command line.

Exit statuses: 0 done, 2 bad input (found before anything runs or is written), 3 infrastructure
failure (a server, a worker, episodes ending in infra_error), 130 interrupted. Every failure is one
line on stderr (see :mod:`agentboost.cli.contract`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

# transformers' advice at import that it found no torch is noise for a core install (an HTTP backend needs
# none), and a second line on stderr where the contract promises one; set before anything imports it.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from .. import __version__
from . import contract, export, init_model, prepare, quickstart, rollout, train, view
from . import eval as eval_cmd


def main(argv: list[str] | None = None) -> int:
    parser = contract.ArgumentParser(
        prog="agentboost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"agentboost {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)
    rollout.add_parser(sub)
    quickstart.add_parser(sub)
    eval_cmd.add_parser(sub)
    view.add_parser(sub)
    train.add_parser(sub)
    export.add_parser(sub)
    init_model.add_parser(sub)
    prepare.add_parser(sub)
    args = parser.parse_args(argv)
    level = getattr(logging, str(args.log_level).upper(), None)
    if not isinstance(level, int):
        return contract.report("agentboost", contract.BadInput(f"--log-level {args.log_level}: not a logging level"))
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return contract.guarded(f"agentboost {args.command}", args.func, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
