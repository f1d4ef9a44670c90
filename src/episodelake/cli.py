"""The ``episodelake`` command line.

Each subcommand is a function ``cmd_<name>(args) -> int`` registered in
:func:`build_parser`; output goes to stdout, ``--json`` where a script wants it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(args.path, episodes=args.episodes, seed=args.seed)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="episodelake", description="A lakehouse for RL / robotics episodes.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="collect CartPole episodes, query them with SQL, sample a batch")
    p.add_argument("path", nargs="?", default="episodelake-demo", help="where to write the demo dataset")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
