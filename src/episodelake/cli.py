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


def cmd_copy(args: argparse.Namespace) -> int:
    import json

    from .dataset import Dataset

    src = Dataset.open(args.src, args.version, storage_options=json.loads(args.src_options), read_only=True)
    collection = src.where(args.where) if args.where else src
    options = {}
    if args.chunk_rows is not None:
        options["chunk_rows"] = args.chunk_rows
    if args.compression is not None:
        options["compression"] = None if args.compression == "none" else args.compression
    copy = collection.copy_to(
        args.dst, json.loads(args.dst_options), overwrite=args.overwrite, progress=False if args.quiet else None, **options
    )
    print(f"copied {len(copy)} episodes ({copy.num_steps} steps) to {copy.location.url}, verified")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="episodelake", description="A lakehouse for RL / robotics episodes.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="collect CartPole episodes, query them with SQL, sample a batch")
    p.add_argument("path", nargs="?", default="episodelake-demo", help="where to write the demo dataset")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("copy", help="copy a dataset between memory, local disk and object storage (verified)")
    p.add_argument("src", help="source path or URL (s3://bucket/path, gs://..., file://..., a local path)")
    p.add_argument("dst", help="destination path or URL")
    p.add_argument("--src-options", default="{}", help="fsspec-style storage options of SRC, as JSON")
    p.add_argument("--dst-options", default="{}", help="fsspec-style storage options of DST, as JSON")
    p.add_argument("--version", type=int, default=None, help="copy this table version of SRC (default: latest)")
    p.add_argument("--where", default=None, help="copy only episodes matching this SQL predicate")
    p.add_argument("--chunk-rows", type=int, default=None, help="rows per tensor chunk in DST")
    p.add_argument("--compression", choices=["zstd", "none"], default=None, help="tensor compression in DST")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset that exists at DST")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_copy)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
