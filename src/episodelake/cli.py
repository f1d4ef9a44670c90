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
    progress = False if args.quiet else None
    opts = json.loads(args.dst_options)
    copy = collection.copy_to(args.dst, opts, overwrite=args.overwrite, progress=progress, **options)
    print(f"copied {len(copy)} episodes ({copy.num_steps} steps) to {copy.location.url}, verified")
    return 0


def _csv(value: str | None) -> list[str] | None:
    return None if value is None else [v for v in value.split(",") if v]


_MEMMAP_ROLES = {"observations", "actions", "rewards", "terminated", "truncated", "next_observations", "extras"}
_IMPORT_OPTIONS = {
    "minari": {"infos"},
    "d4rl": {"strict"},
    "memmap-replay": {"strict", *_MEMMAP_ROLES},
    "episodata": set(),
}


def cmd_import(args: argparse.Namespace) -> int:
    from .importers import import_dataset

    options: dict = {"progress": False if args.quiet else None, "overwrite": args.overwrite}
    if args.lenient:
        options["strict"] = False
    if args.no_infos:
        options["infos"] = False
    for name in ("observations", "actions", "extras"):
        if getattr(args, name) is not None:
            options[name] = _csv(getattr(args, name))
    for name in ("rewards", "terminated", "truncated"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.next_observations is not None:
        options["next_observations"] = dict(pair.split("=", 1) for pair in _csv(args.next_observations) or [])
    allowed = _IMPORT_OPTIONS[args.format] | {"progress", "overwrite"}
    if set(options) - allowed:
        print(f"error: option(s) {sorted(set(options) - allowed)} do not apply to {args.format}", file=sys.stderr)
        return 2
    ds = import_dataset(args.format, args.src, args.dst, **options)
    print(f"imported {len(ds)} episodes ({ds.num_steps} steps) from {args.format} {args.src} to {ds.location.url}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from . import exporters
    from .dataset import Dataset

    src = Dataset.open(args.src, args.version, read_only=True)
    collection = src.where(args.where) if args.where else src
    if args.format == "minari":
        exporters.to_minari(collection, args.dst, args.dataset_id, progress=False if args.quiet else None)
    elif args.format == "parquet":
        exporters.to_parquet(collection, args.dst)
    else:
        exporters.to_arrow_file(collection, args.dst)
    print(f"exported {len(collection)} episodes to {args.format} {args.dst}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Audit a dataset; exit status 1 when a problem was found."""
    import json

    from .dataset import Dataset

    ds = Dataset.open(args.path, args.version, storage_options=json.loads(args.options), read_only=True)
    report = ds.validate(tensors=not args.no_tensors)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(
            f"{report.url} version {report.version}: {report.episodes} episodes, {report.steps} steps, "
            f"{report.table_files} table files, {report.log_entries} log entries, {report.tensor_rows} tensor rows"
        )
        for problem in report.problems:
            print(f"  {problem}")
        print("OK" if report.ok else f"{len(report.problems)} problem(s)")
    return 0 if report.ok else 1


def cmd_vacuum(args: argparse.Namespace) -> int:
    """Remove unreferenced table files and crash leftovers (``--dry-run`` lists them)."""
    import json

    from .dataset import Dataset

    ds = Dataset.open(args.path, storage_options=json.loads(args.options), read_only=args.dry_run)
    report = ds.vacuum(dry_run=args.dry_run, retention_hours=args.retention_hours)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0
    verb = "would remove" if report.dry_run else "removed"
    for path in report.table_files + report.tensor_arrays + report.temp_files:
        print(f"{verb} {path}")
    for t in report.truncated:
        print(f"{verb} rows [{t['kept']}, {t['rows']}) of {t['array']}")
    print(
        f"{verb} {len(report.table_files)} table files, {len(report.tensor_arrays)} tensor arrays, "
        f"{len(report.truncated)} array tails; {report.unreclaimed_rows} unreferenced rows left inside arrays"
    )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from .dataset import Dataset
    from .plots import episode_histograms

    src = Dataset.open(args.path, args.version, read_only=True)
    collection = src.where(args.where) if args.where else src
    episode_histograms(collection, args.out, bins=args.bins)
    print(f"wrote return/length histograms of {len(collection)} episodes to {args.out}")
    return 0


def _print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Rows as aligned text columns (numbers right-aligned)."""
    cells = [[str(h) for h in header]] + [["NULL" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    numeric = [all(isinstance(row[i], int | float) for row in rows if row[i] is not None) for i in range(len(header))]
    for n, row in enumerate(cells):
        padded = [
            c.rjust(w) if numeric[i] and n else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(padded).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _print_json(value: object) -> None:
    import json
    from decimal import Decimal

    def plain(v: object) -> object:  # DuckDB sums of BIGINT are HUGEINT, i.e. Decimal in Arrow
        if isinstance(v, Decimal):
            return int(v) if v == v.to_integral_value() else float(v)
        return str(v)

    print(json.dumps(value, indent=2, default=plain))


def _open_read_only(args: argparse.Namespace):
    import json

    from .dataset import Dataset

    return Dataset.open(args.path, args.version, storage_options=json.loads(args.options), read_only=True)


def _stored_in(f) -> str:
    return "meta" if f.role == "meta" else ("tensor" if f.in_tensor else "table")


def cmd_info(args: argparse.Namespace) -> int:
    """Schema, counts, versions and size of a dataset."""
    ds = _open_read_only(args)
    adds = ds._table.dt.get_add_actions(flatten=True)
    table_bytes = int(sum(adds.column("size_bytes").to_pylist()))
    tensors = ds.location.child("tensors")
    tensor_bytes = int(ds.location.fs.du(tensors)) if ds.location.fs.exists(tensors) else 0
    info = {
        "url": ds.location.url,
        "version": ds.version,
        "latest_version": max(h["version"] for h in ds.history()),
        "episodes": len(ds),
        "steps": ds.num_steps,
        "partition_by": ds.descriptor.get("partition_by", []),
        "table_files": adds.num_rows,
        "table_bytes": table_bytes,
        "tensor_bytes": tensor_bytes,
        "created_at": ds.descriptor.get("created_at"),
        "info": ds.info,
        "schema": [{**f.to_json(), "key": f.key, "storage": _stored_in(f)} for f in ds.schema],
    }
    if args.json:
        _print_json(info)
        return 0
    print(f"{info['url']}  version {info['version']} (latest {info['latest_version']})")
    print(f"{info['episodes']} episodes, {info['steps']} steps, partitioned by {info['partition_by'] or 'nothing'}")
    print(f"table: {info['table_files']} files, {table_bytes / 1e6:.2f} MB; tensors: {tensor_bytes / 1e6:.2f} MB")
    _print_table(
        ["key", "role", "dtype", "shape", "stored in"],
        [(f["key"], f["role"], f["dtype"], tuple(f["shape"]), f["storage"]) for f in info["schema"]],
    )
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    """Run SQL over the ``episodes`` and ``steps`` views; print a table or JSON rows."""
    from .errors import QueryError

    ds = _open_read_only(args)
    collection = ds.where(args.where) if args.where else ds
    try:
        tbl = collection.sql_arrow(args.query)
    except QueryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = tbl.to_pylist()
    if args.json:
        _print_json(rows)
        return 0
    shown = rows if args.max_rows is None else rows[: args.max_rows]
    _print_table(tbl.column_names, [list(r.values()) for r in shown])
    print(f"({len(rows)} rows{'' if len(shown) == len(rows) else f', {len(shown)} shown'})")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Mean/std/min/max per field (per channel), episode length and return, optionally of a subset."""
    import numpy as np

    from .errors import QueryError

    ds = _open_read_only(args)
    try:
        collection = ds.where(args.where) if args.where else ds
        stats = collection.stats(_csv(args.fields))
    except QueryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        from .plots import episode_histograms

        episode_histograms(collection, args.plot)
    if args.json:
        _print_json({k: {m: np.asarray(v).tolist() for m, v in entry.items()} for k, entry in stats.items()})
        return 0
    if args.plot:
        print(f"wrote return/length histograms to {args.plot}")
    print(f"{stats['episodes']['count']} episodes" + (f" where {args.where}" if args.where else ""))
    rows = []
    for key, entry in stats.items():
        if key == "episodes":
            continue
        means = np.atleast_1d(entry["mean"])
        for c in range(len(means)):
            pick = [np.atleast_1d(entry[m])[c] for m in ("mean", "std", "min", "max")]
            rows.append([key, c if np.ndim(entry["mean"]) else "", entry["count"], *(float(f"{v:.6g}") for v in pick)])
    _print_table(["quantity", "channel", "count", "mean", "std", "min", "max"], rows)
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """The table's commit history, newest first."""
    from datetime import UTC, datetime

    ds = _open_read_only(args)
    entries = ds.history()
    if args.json:
        _print_json(entries)
        return 0
    rows = []
    for h in entries:
        when = datetime.fromtimestamp(h["timestamp"] / 1e3, UTC).isoformat(timespec="seconds")
        metrics = h.get("operationMetrics", {})
        rows.append([h["version"], when, h["operation"], metrics.get("num_added_rows"), metrics.get("num_added_files")])
    _print_table(["version", "time (UTC)", "operation", "rows added", "files added"], rows)
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

    p = sub.add_parser("import", help="import a Minari, D4RL, memmap-replay-buffer or episodata dataset")
    p.add_argument("format", choices=["minari", "d4rl", "memmap-replay", "episodata"])
    p.add_argument("src", help="source: Minari folder or id, D4RL .hdf5/.npz, replay-buffer folder, episodata path")
    p.add_argument("dst", help="new episodelake dataset path or URL")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset that exists at DST")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--lenient", action="store_true", help="d4rl/memmap: accept next observations that differ")
    p.add_argument("--no-infos", action="store_true", help="minari: skip per-step infos")
    p.add_argument("--observations", help="memmap-replay: observation fields, comma-separated")
    p.add_argument("--actions", help="memmap-replay: action fields, comma-separated")
    p.add_argument("--rewards", help="memmap-replay: the reward field")
    p.add_argument("--terminated", help="memmap-replay: the terminal-flag field")
    p.add_argument("--truncated", help="memmap-replay: the truncation-flag field")
    p.add_argument("--next-observations", help="memmap-replay: obs=next_obs pairs, comma-separated")
    p.add_argument("--extras", help="memmap-replay: extra per-step fields, comma-separated")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("export", help="export the episode table (parquet, arrow) or the dataset (minari)")
    p.add_argument("format", choices=["parquet", "arrow", "minari"])
    p.add_argument("src", help="episodelake dataset path or URL")
    p.add_argument("dst", help="output file (parquet, arrow) or new Minari dataset folder")
    p.add_argument("--version", type=int, default=None, help="export this table version (default: latest)")
    p.add_argument("--where", default=None, help="export only episodes matching this SQL predicate")
    p.add_argument("--dataset-id", default=None, help="minari: dataset id (default: <folder name>-v0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("validate", help="audit a dataset: table files, log, lengths, flags, stats, tensor checksums")
    p.add_argument("path", help="dataset path or URL")
    p.add_argument("--version", type=int, default=None, help="audit this table version (default: latest)")
    p.add_argument("--options", default="{}", help="fsspec-style storage options, as JSON")
    p.add_argument("--no-tensors", action="store_true", help="check tensor references only, do not read rows")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("vacuum", help="delete unreferenced table files and tensor data left by crashes")
    p.add_argument("path", help="dataset path or URL")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    p.add_argument("--retention-hours", type=float, default=168.0, help="keep anything newer (default 168)")
    p.add_argument("--options", default="{}", help="fsspec-style storage options, as JSON")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_vacuum)

    p = sub.add_parser("plot", help="write return and length histograms of a dataset to an image (png, svg, pdf)")
    p.add_argument("path", help="dataset path or URL")
    p.add_argument("out", help="image file to write")
    p.add_argument("--version", type=int, default=None, help="plot this table version (default: latest)")
    p.add_argument("--where", default=None, help="plot only episodes matching this SQL predicate")
    p.add_argument("--bins", type=int, default=30)
    p.set_defaults(func=cmd_plot)

    def dataset_args(p: argparse.ArgumentParser, json_help: str = "print JSON") -> None:
        p.add_argument("path", help="dataset path or URL")
        p.add_argument("--version", type=int, default=None, help="use this table version (default: latest)")
        p.add_argument("--options", default="{}", help="fsspec-style storage options, as JSON")
        p.add_argument("--json", action="store_true", help=json_help)

    p = sub.add_parser("info", help="schema, episode and step counts, versions and size of a dataset")
    dataset_args(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("sql", help="run SQL over the episodes and steps views")
    dataset_args(p, "print the rows as a JSON list of objects")
    p.add_argument("query", help='SQL, e.g. "SELECT task, avg(return) FROM episodes GROUP BY task"')
    p.add_argument("--where", default=None, help="restrict both views to episodes matching this SQL predicate")
    p.add_argument("--max-rows", type=int, default=100, help="rows to print in table form (default 100)")
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("stats", help="mean/std/min/max per field and channel, episode length and return")
    dataset_args(p)
    p.add_argument("--where", default=None, help="statistics of the episodes matching this SQL predicate")
    p.add_argument("--fields", default=None, help="field keys, comma-separated (default: all numeric fields)")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="also write return/length histograms there")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("history", help="the table's commit history (versions for --version / time travel)")
    dataset_args(p)
    p.set_defaults(func=cmd_history)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
