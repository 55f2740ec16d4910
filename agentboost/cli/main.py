"""``agentboost`` command line."""

from __future__ import annotations

import argparse
import logging
import sys

from . import eval as eval_cmd
from . import export, prepare, quickstart, rollout, train, view


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentboost", description=__doc__)
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)
    rollout.add_parser(sub)
    quickstart.add_parser(sub)
    eval_cmd.add_parser(sub)
    view.add_parser(sub)
    train.add_parser(sub)
    export.add_parser(sub)
    prepare.add_parser(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        logging.getLogger("agentboost").warning("interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
