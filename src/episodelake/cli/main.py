"""The ``episodelake`` command line.

Each subcommand is a function ``cmd_<name>(args) -> int`` registered in
:func:`build_parser`; output goes to stdout, ``--json`` where a script wants it.
Every command that reads or writes a dataset takes its storage options as JSON
(``--options``; ``copy``: ``--src-options`` / ``--dst-options``).

Exit status: 0 on success, 1 on an error (one line ``episodelake: error: ...``
on stderr, a raw storage error in the words of :func:`faults.storage_fault`,
and how to pass credentials when object storage found none or refused them;
``--debug`` raises it with its traceback instead) and when
``validate`` finds a problem or ``check`` a failing episode, 2 for a command line that does not parse, 130 on
Ctrl-C and 141 (128 + SIGPIPE, as for coreutils) when the reader of stdout
went away (``episodelake info X | head -4``), quietly.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from .. import __version__

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141


def _json_options(text: str) -> dict[str, Any]:
    """An ``--options`` value: a JSON object of storage options."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(value).__name__}")
    return value


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(args.path, episodes=args.episodes, seed=args.seed, storage_options=args.options, overwrite=args.overwrite)
    return 0


def cmd_copy(args: argparse.Namespace) -> int:
    from ..dataset import Dataset

    src = Dataset.open(args.src, args.version, storage_options=args.src_options, read_only=True)
    collection = src.where(args.where) if args.where else src
    options = {}
    if args.chunk_rows is not None:
        options["chunk_rows"] = args.chunk_rows
    if args.compression is not None:
        options["compression"] = None if args.compression == "none" else args.compression
    if args.no_checks:
        options["checks"] = ()
    if args.no_capacity:
        options["capacity"] = None
    progress = False if args.quiet else None
    copy = collection.copy_to(args.dst, args.dst_options, overwrite=args.overwrite, progress=progress, **options)
    print(f"copied {len(copy)} episodes ({copy.num_steps} steps) to {copy.location.url}, verified")
    return 0


def dropped_settings(p: argparse.ArgumentParser, verb: str) -> None:
    """``--no-checks`` / ``--no-capacity``: DST without the settings it would otherwise carry."""
    p.add_argument(
        "--no-checks", action="store_true", help=f"store no quality check in DST (default: {verb} the stored ones)"
    )
    p.add_argument(
        "--no-capacity", action="store_true", help=f"no capacity in DST (default: {verb} the capacity of SRC)"
    )


def _csv(value: str | None) -> list[str] | None:
    return None if value is None else [v for v in value.split(",") if v]


_MEMMAP_ROLES = {"observations", "actions", "rewards", "terminated", "truncated", "next_observations", "extras"}
_IMPORT_OPTIONS = {
    "minari": {"infos"},
    "d4rl": {"strict"},
    "memmap-replay": {"strict", *_MEMMAP_ROLES},
    "episodata": set(),
    "lerobot": set(),
    "rosbag": {"topics", "rate", "clock", "split", "method", "tolerance", "on_gap", "time", "max_sync", "sync_on_fail"},
}


def cmd_import(args: argparse.Namespace) -> int:
    from ..core.quality import Check
    from ..importers import import_report

    options: dict = {"progress": False if args.quiet else None, "overwrite": args.overwrite}
    if args.options:
        options["storage_options"] = args.options
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
    for name in ("rate", "clock", "split", "method", "tolerance", "on_gap", "time", "max_sync", "sync_on_fail"):
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    if args.topic:
        options["topics"] = args.topic
    if args.check:
        options["checks"] = [Check(name, predicate, on_fail=args.on_fail) for name, predicate in args.check]
    if args.next_observations is not None:
        options["next_observations"] = dict(pair.split("=", 1) for pair in _csv(args.next_observations) or [])
    allowed = _IMPORT_OPTIONS[args.format] | {"progress", "overwrite", "storage_options", "checks"}
    if set(options) - allowed:
        args.parser.error(f"option(s) {sorted(set(options) - allowed)} do not apply to {args.format}")
    report = import_report(
        args.format, args.src, args.dst, dry_run=args.dry_run, on_reject=args.on_reject, **options
    )  # the summary: episodes, steps, bytes in/out, skipped and why (docs/ecosystem.md)
    print(report)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ..exporters import formats as exporters

    src = _open_read_only(args, args.src)
    collection = src.where(args.where) if args.where else src
    if args.format == "minari":
        exporters.to_minari(collection, args.dst, args.dataset_id, progress=False if args.quiet else None)
    elif args.format == "lerobot":
        from ..exporters.lerobot import to_lerobot

        to_lerobot(collection, args.dst, fps=args.fps, vcodec=args.vcodec, progress=False if args.quiet else None)
    elif args.format == "parquet":
        exporters.to_parquet(collection, args.dst)
    else:
        exporters.to_arrow_file(collection, args.dst)
    print(f"exported {len(collection)} episodes to {args.format} {args.dst}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Audit a dataset; exit status 1 when a problem was found."""
    ds = _open_read_only(args)
    report = ds.maintenance.validate(tensors=not args.no_tensors)
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


def _check_arg(text: str) -> tuple[str, str]:
    """``NAME=PREDICATE`` of ``--check`` as (name, predicate)."""
    name, sep, predicate = text.partition("=")
    if not sep or not name.strip() or not predicate.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=PREDICATE, got {text!r}")
    return name.strip(), predicate


def cmd_check(args: argparse.Namespace) -> int:
    """Audit episodes against quality checks (the stored ones, or ``--check``); exit status 1 when one fails."""
    from ..core.quality import Check

    ds = _open_read_only(args)
    checks = [Check(name, predicate, level=args.level) for name, predicate in args.check] or None
    report = ds.quality.check(checks, where=args.where)
    print(json.dumps(report.to_json(), indent=2) if args.json else report)
    return 0 if report.ok else 1


def cmd_vacuum(args: argparse.Namespace) -> int:
    """Remove unreferenced table files and crash leftovers (``--dry-run`` lists them)."""
    from ..dataset import Dataset

    ds = Dataset.open(args.path, storage_options=args.options, read_only=args.dry_run)
    report = ds.maintenance.vacuum(
        dry_run=args.dry_run, retention_hours=args.retention_hours, break_old_versions=args.break_old_versions
    )
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
        f"{len(report.truncated)} array tails; {report.unreferenced_rows} unreferenced rows "
        f"({report.unreclaimed_rows} cannot be reclaimed)"
    )
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """Remove the episodes matching ``--where`` (or every episode with ``--all``) in one commit."""
    from ..dataset import Dataset

    if (args.where is None) == (not args.all):
        args.parser.error("give --where PREDICATE or --all, exactly one")
    ds = Dataset.open(args.path, storage_options=args.options)
    removed = ds.delete(all=True) if args.all else ds.delete(where=args.where)
    if args.json:
        print(json.dumps({"deleted": removed, "version": ds.version}))
    else:
        print(f"deleted {removed} episodes; version {ds.version} (older versions keep them until vacuum)")
    return 0


def cmd_edit(args: argparse.Namespace) -> int:
    """``edit trim|split|set-meta PATH ...``: one edit, one commit (``--dry-run``: report it, commit nothing)."""
    from ..dataset import Dataset
    from ..ops.schema_edit import SchemaEditReport

    ds = Dataset.open(args.path, storage_options=args.options, read_only=args.dry_run)
    report = args.edit(ds, args)
    if args.json:
        print(json.dumps(report.to_json()))
        return 0
    if isinstance(report, SchemaEditReport):  # drop-field, rename-field
        print(report.describe())
        return 0
    verb = "would edit" if report.dry_run else "edited"
    new = f" into {report.new_ids}" if report.new_ids else ""
    steps = f", {report.steps_removed} steps removed" if report.steps_removed else ""
    print(f"{report.operation}: {verb} {len(report.episode_ids)} episodes{new}{steps}; version {report.version}")
    return 0


def _edit_trim(ds: Any, args: argparse.Namespace) -> Any:
    if args.episode:
        if args.head or args.tail or args.where:
            args.parser.error("give --episode ID:START:STOP, or --head/--tail with --where, not both")
        cuts = {}
        for text in args.episode:
            try:
                eid, start, stop = (int(v) for v in text.split(":"))
            except ValueError:
                args.parser.error(f"--episode {text!r}: expected ID:START:STOP (three ints)")
            cuts[eid] = (start, stop)
        return ds.edit.trim(cuts, dry_run=args.dry_run)
    return ds.edit.trim(head=args.head, tail=args.tail, where=args.where, dry_run=args.dry_run)


def _edit_split(ds: Any, args: argparse.Namespace) -> Any:
    return ds.edit.split(args.episode_id, args.at, dry_run=args.dry_run)


def _edit_set_meta(ds: Any, args: argparse.Namespace) -> Any:
    values = {}
    for text in args.values:
        name, sep, raw = text.partition("=")
        if not sep or not name:
            args.parser.error(f"{text!r}: expected FIELD=VALUE")
        try:
            values[name] = json.loads(raw)  # numbers, true/false, null, lists; anything else is a string
        except json.JSONDecodeError:
            values[name] = raw
    if args.ids is not None and args.where is not None:
        args.parser.error("give --ids or --where, not both")
    ids = None if args.ids is None else [int(v) for v in _csv(args.ids) or []]
    return ds.edit.set_meta(values, ids, where=args.where, dry_run=args.dry_run)


def _edit_drop_field(ds: Any, args: argparse.Namespace) -> Any:
    return ds.columns.drop(*args.keys, dry_run=args.dry_run)


def _edit_rename_field(ds: Any, args: argparse.Namespace) -> Any:
    return ds.columns.rename(args.old, args.new, dry_run=args.dry_run)


def cmd_merge(args: argparse.Namespace) -> int:
    """``merge SRC... DST``: the episodes of every SRC in one new dataset (``--dry-run``: check and count)."""
    from ..dataset import Dataset, merge
    from ..ops.merge import merged_schema

    sources = [Dataset.open(src, storage_options=args.src_options, read_only=True) for src in args.src]
    chosen = [s.where(args.where) if args.where else s for s in sources]
    counts = [len(c) for c in chosen]
    if args.dry_run:
        schema = merged_schema([(s.location.url, s.schema) for s in sources])
        report = {"dry_run": True, "episodes": sum(counts), "sources": dict(zip(args.src, counts, strict=True))}
        if args.json:
            print(json.dumps({**report, "fields": [f.key for f in schema.fields]}))
        else:
            print(f"would merge {sum(counts)} episodes ({', '.join(map(str, counts))} per source) into {args.dst}")
        return 0
    progress = False if args.quiet else None
    settings: dict[str, Any] = {"checks": ()} if args.no_checks else {}
    if args.no_capacity:
        settings["capacity"] = None
    merged = merge(chosen, args.dst, args.dst_options, overwrite=args.overwrite, progress=progress, **settings)
    if args.json:
        print(json.dumps({"dry_run": False, "episodes": len(merged), "dest": merged.location.url}))
    else:
        print(f"merged {len(merged)} episodes from {len(sources)} datasets into {merged.location.url}, verified")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from ..integrations.plots import episode_histograms

    src = _open_read_only(args)
    collection = src.where(args.where) if args.where else src
    episode_histograms(collection, args.out, bins=args.bins)
    print(f"wrote return/length histograms of {len(collection)} episodes to {args.out}")
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    """Serve the viewer (docs/viewer.md) until Ctrl-C, which ends it with status 0."""
    from ..dataset import Dataset
    from ..viewer import start

    ds = Dataset.open(args.path, args.version, storage_options=args.options, read_only=True, cache_dir=args.cache_dir)
    server = start(ds, args.where, args.host, args.port, query_timeout=args.query_timeout)
    print(f"episodelake viewer of {ds.location.url} at {server.url} (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
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
    from decimal import Decimal

    def plain(v: object) -> object:  # DuckDB sums of BIGINT are HUGEINT, i.e. Decimal in Arrow
        if isinstance(v, Decimal):
            return int(v) if v == v.to_integral_value() else float(v)
        return str(v)

    print(json.dumps(value, indent=2, default=plain))


def _open_read_only(args: argparse.Namespace, path: str | None = None):
    """The dataset at ``path`` (default ``args.path``), pinned to ``--version``, opened with ``--options``."""
    from ..dataset import Dataset

    return Dataset.open(path or args.path, args.version, storage_options=args.options, read_only=True)


def _stored_in(f) -> str:
    return "meta" if f.role == "meta" else ("tensor" if f.in_tensor else "table")


def cmd_info(args: argparse.Namespace) -> int:
    """Schema, counts, versions and size of a dataset."""
    from ..storage.arrays import tensors_size
    from ..storage.table import EpisodeTable

    ds = _open_read_only(args)
    # history() of a dataset pinned to --version ends at that version: the latest is the table's own
    latest = ds.version if args.version is None else EpisodeTable.open(ds.location).version
    adds = ds._store.table.add_actions()
    table_bytes = sum(add["size_bytes"] for add in adds)
    tensor_bytes = tensors_size(ds.location)
    info = {
        "url": ds.location.url,
        "version": ds.version,
        "latest_version": latest,
        "episodes": len(ds),
        "steps": ds.num_steps,
        "partition_by": ds.maintenance.descriptor.get("partition_by", []),
        "table_files": len(adds),
        "table_bytes": table_bytes,
        "tensor_bytes": tensor_bytes,
        "created_at": ds.maintenance.descriptor.get("created_at"),
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


def _sql_param(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` of ``--param``: the value as JSON (``10``, ``0.5``, ``true``, ``"a"``), else as a string."""
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"--param takes NAME=VALUE (for $NAME in the SQL), not {text!r}")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def cmd_sql(args: argparse.Namespace) -> int:
    """Run SQL over the ``episodes`` and ``steps`` views; print a table or JSON rows."""
    from ..core.errors import QueryError

    if (args.query is None) == (args.file is None):
        args.parser.error("give the SQL as QUERY or as --file PATH, one of the two")
    if args.file is not None:
        with open(args.file, encoding="utf-8") as f:
            query = f.read()
    else:
        query = args.query
    params = dict(args.param) or None
    ds = _open_read_only(args)
    collection = ds.where(args.where) if args.where else ds
    result = collection.sql(query, params)
    if result is None:
        raise QueryError(f"query {args.file or query!r} returns no rows to show")
    tbl = result.to_arrow_table()
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

    ds = _open_read_only(args)
    collection = ds.where(args.where) if args.where else ds
    stats = collection.stats(_csv(args.fields))
    if args.plot:
        from ..integrations.plots import episode_histograms

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
        rows.append([h["version"], when, h["operation"], h.get("episodes_added"), h.get("episodes_removed")])
    _print_table(["version", "time (UTC)", "operation", "episodes added", "episodes removed"], rows)
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    """What a saved stream state (``el.save_state``) was trained on and where it stands; no dataset is opened."""
    from ..lineage import describe, lineage_of, load_state

    state = load_state(args.state)
    if args.json:
        keys = ("mode", "epoch", "consumed", "finished", "version")
        _print_json({"lineage": lineage_of(state), "position": {k: state.get(k) for k in keys}})
        return 0
    print(describe(state))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="episodelake", description="A lakehouse for RL / robotics episodes.")
    parser.add_argument("--debug", action="store_true", help="on an error, raise it with its full traceback")
    parser.add_argument("--version", action="version", version=f"episodelake {__version__}")
    # --debug is also accepted after the subcommand; SUPPRESS keeps it from overriding the global flag
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, func: Any, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, parents=[common])
        p.set_defaults(func=func, parser=p)
        return p

    def options(p: argparse.ArgumentParser, flag: str = "--options", of: str = "the dataset") -> None:
        p.add_argument(flag, type=_json_options, default={}, help=f"storage options of {of}, as a JSON object")

    p = command("demo", cmd_demo, "collect CartPole episodes, query them with SQL, sample a batch")
    p.add_argument("path", nargs="?", default="episodelake-demo", help="where to write the demo dataset")
    options(p)
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset at PATH (a previous demo); other files are never touched",
    )

    p = command("copy", cmd_copy, "copy a dataset between memory, local disk and object storage (verified)")
    p.add_argument("src", help="source path or URL (s3://bucket/path, gs://..., file://..., a local path)")
    p.add_argument("dst", help="destination path or URL")
    options(p, "--src-options", "SRC")
    options(p, "--dst-options", "DST")
    p.add_argument("--version", type=int, default=None, help="copy this table version of SRC (default: latest)")
    p.add_argument("--where", default=None, help="copy only episodes matching this SQL predicate")
    p.add_argument("--chunk-rows", type=int, default=None, help="rows per tensor chunk in DST")
    p.add_argument(
        "--compression",
        choices=["zstd", "none"],
        default=None,
        help="tensor compression in DST (lossless fields; lossy camera codecs keep theirs)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a dataset that exists at DST")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    dropped_settings(p, "copy")

    p = command(
        "import", cmd_import, "import a Minari, D4RL, memmap-replay-buffer, episodata, LeRobot v3 dataset or ROS bags"
    )
    p.add_argument("format", choices=["minari", "d4rl", "memmap-replay", "episodata", "lerobot", "rosbag"])
    p.add_argument(
        "src", help="source: Minari folder or id, D4RL .hdf5/.npz, replay-buffer folder, episodata path, LeRobot folder"
    )
    p.add_argument("dst", help="new episodelake dataset path or URL")
    options(p, of="DST")
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
    p.add_argument("--topic", action="append", help="rosbag: TOPIC[:PATH][=ROLE/NAME], repeated (one an action)")
    p.add_argument("--rate", type=float, default=None, help="rosbag: control clock rate in Hz")
    p.add_argument("--clock-topic", dest="clock", default=None, help="rosbag: one clock tick per message on TOPIC")
    p.add_argument(
        "--split", default=None, help="rosbag: episodes per 'bag' (default), per TOPIC message, TOPIC:PATH==V"
    )
    p.add_argument("--method", choices=["latest", "nearest", "linear"], default=None, help="rosbag: alignment method")
    p.add_argument("--tolerance", type=float, default=None, help="rosbag: largest alignment error, seconds")
    p.add_argument("--on-gap", choices=["raise", "mask"], default=None, help="rosbag: a gap beyond the tolerance")
    p.add_argument("--time", choices=["header", "log"], default=None, help="rosbag: header stamps or receive time")
    p.add_argument("--max-sync", type=float, default=None, help="rosbag: largest alignment error a step may have, s")
    p.add_argument(
        "--sync-on-fail", choices=["quarantine", "reject", "warn"], default=None, help="rosbag: beyond --max-sync"
    )
    p.add_argument("--dry-run", action="store_true", help="read, convert and validate everything; write nothing")
    p.add_argument(
        "--check", type=_check_arg, action="append", help="a quality check NAME=PREDICATE the new dataset keeps"
    )
    p.add_argument("--on-fail", choices=["reject", "quarantine", "warn"], default="reject", help="what --check does")
    p.add_argument(
        "--on-reject", choices=["skip", "raise"], default="skip", help="a rejected episode: count it and go on, or stop"
    )

    p = command("export", cmd_export, "export the episode table (parquet, arrow) or the dataset (minari, lerobot)")
    p.add_argument("format", choices=["parquet", "arrow", "minari", "lerobot"])
    p.add_argument("src", help="episodelake dataset path or URL")
    p.add_argument("dst", help="output file (parquet, arrow) or new Minari / LeRobot dataset folder")
    options(p, of="SRC")
    p.add_argument("--version", type=int, default=None, help="export this table version (default: latest)")
    p.add_argument("--where", default=None, help="export only episodes matching this SQL predicate")
    p.add_argument("--dataset-id", default=None, help="minari: dataset id (default: <folder name>-v0)")
    p.add_argument("--fps", type=int, default=None, help="lerobot: frames per second (default: the imported one)")
    p.add_argument("--vcodec", choices=["libsvtav1", "h264"], default="libsvtav1", help="lerobot: video codec")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = command("validate", cmd_validate, "audit a dataset: table files, log, lengths, flags, stats, tensor checksums")
    p.add_argument("path", help="dataset path or URL")
    p.add_argument("--version", type=int, default=None, help="audit this table version (default: latest)")
    options(p)
    p.add_argument("--no-tensors", action="store_true", help="check tensor references only, do not read rows")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = command("check", cmd_check, "audit episodes against quality checks: the stored ones, or --check NAME=PREDICATE")
    p.add_argument("path", help="dataset path or URL")
    p.add_argument("--version", type=int, default=None, help="audit this table version (default: latest)")
    options(p)
    p.add_argument(
        "--check",
        type=_check_arg,
        action="append",
        default=[],
        metavar="NAME=PREDICATE",
        help="a SQL check instead of the stored ones, e.g. 'ok=NOT success OR \"return\" > 0' (repeatable)",
    )
    p.add_argument(
        "--level", choices=["episode", "step"], default="episode", help="--check predicates are over episodes or steps"
    )
    p.add_argument("--where", default=None, help="audit only episodes matching this SQL predicate")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = command("vacuum", cmd_vacuum, "delete unreferenced table files and tensor data left by crashes")
    p.add_argument("path", help="dataset path or URL")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    p.add_argument("--retention-hours", type=float, default=168.0, help="keep anything newer (default 168)")
    p.add_argument(
        "--break-old-versions",
        action="store_true",
        help="allow --retention-hours below 1: versions superseded since then lose their files "
        "(time travel and readers pinned to them fail)",
    )
    options(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = command("delete", cmd_delete, "remove episodes matching a SQL predicate, in one commit")
    p.add_argument("path", help="dataset path or URL")
    p.add_argument("--where", default=None, help='SQL predicate over the episodes view, e.g. "return < 0"')
    p.add_argument("--all", action="store_true", help="remove every episode (clear)")
    options(p)
    p.add_argument("--json", action="store_true", help='print {"deleted": N, "version": V}')

    p = command("edit", cmd_edit, "edit episodes in one commit, tensors untouched (trim, split, set-meta, ...)")
    edits = p.add_subparsers(dest="edit_command", required=True)

    def edit(name: str, func: Any, help: str) -> argparse.ArgumentParser:
        e = edits.add_parser(name, help=help, parents=[common])
        e.set_defaults(edit=func, parser=e)
        e.add_argument("path", help="dataset path or URL")
        options(e)
        e.add_argument("--dry-run", action="store_true", help="report what would change, commit nothing")
        e.add_argument("--json", action="store_true", help="print the edit report as JSON")
        return e

    e = edit("trim", _edit_trim, "keep transitions [start, stop) of episodes (the rest is cut; frames stay in place)")
    e.add_argument("--head", type=int, default=0, help="steps to remove from the start of each matching episode")
    e.add_argument("--tail", type=int, default=0, help="steps to remove from the end of each matching episode")
    e.add_argument("--where", default=None, help="trim only episodes matching this SQL predicate (default: all)")
    e.add_argument("--episode", action="append", metavar="ID:START:STOP", help="keep [START, STOP) of episode ID")
    e = edit("split", _edit_split, "split one episode in two at a step: [0, at) truncated and [at, T)")
    e.add_argument("episode_id", type=int, help="the episode to split")
    e.add_argument("at", type=int, help="the first step of the second episode")
    e = edit("set-meta", _edit_set_meta, "set meta fields (task labels, operator, success) of episodes")
    e.add_argument("values", nargs="+", metavar="FIELD=VALUE", help="a JSON value (null unsets) or plain text")
    e.add_argument("--where", default=None, help="the episodes matching this SQL predicate (default: all)")
    e.add_argument("--ids", default=None, help="episode ids, comma-separated")
    e = edit("drop-field", _edit_drop_field, "drop fields in one commit (older versions keep reading them)")
    e.add_argument("keys", nargs="+", metavar="KEY", help="field keys (task, observation/camera, ...)")
    e = edit("rename-field", _edit_rename_field, "rename a field in one commit (same role; tensors stay in place)")
    e.add_argument("old", help="the field's key")
    e.add_argument("new", help="its new key")

    p = command("merge", cmd_merge, "merge datasets into one new dataset (new ids, a source column; verified)")
    p.add_argument("src", nargs="+", help="source paths or URLs")
    p.add_argument("dst", help="destination path or URL")
    options(p, "--src-options", "every SRC")
    options(p, "--dst-options", "DST")
    p.add_argument("--where", default=None, help="merge only episodes matching this SQL predicate")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset that exists at DST")
    p.add_argument("--dry-run", action="store_true", help="check the schemas and count the episodes, write nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    dropped_settings(p, "merge")

    p = command("plot", cmd_plot, "write return and length histograms of a dataset to an image (png, svg, pdf)")
    p.add_argument("path", help="dataset path or URL")
    p.add_argument("out", help="image file to write")
    options(p)
    p.add_argument("--version", type=int, default=None, help="plot this table version (default: latest)")
    p.add_argument("--where", default=None, help="plot only episodes matching this SQL predicate")
    p.add_argument("--bins", type=int, default=30)

    def dataset_args(p: argparse.ArgumentParser, json_help: str = "print JSON") -> None:
        p.add_argument("path", help="dataset path or URL")
        p.add_argument("--version", type=int, default=None, help="use this table version (default: latest)")
        options(p)
        p.add_argument("--json", action="store_true", help=json_help)

    p = command("info", cmd_info, "schema, episode and step counts, versions and size of a dataset")
    dataset_args(p)

    p = command("sql", cmd_sql, "run SQL over the episodes and steps views")
    dataset_args(p, "print the rows as a JSON list of objects")
    p.add_argument(
        "query", nargs="?", default=None, help='SQL, e.g. "SELECT task, avg(return) FROM episodes GROUP BY task"'
    )
    p.add_argument("--file", default=None, metavar="FILE.sql", help="read the SQL from a file (e.g. sql/*.sql)")
    p.add_argument(
        "--param",
        action="append",
        type=_sql_param,
        default=[],
        metavar="NAME=VALUE",
        help="bind $NAME in the SQL to VALUE (JSON: 10, 0.5, true; else a string); repeatable",
    )
    p.add_argument("--where", default=None, help="restrict both views to episodes matching this SQL predicate")
    p.add_argument("--max-rows", type=int, default=100, help="rows to print in table form (default 100)")

    p = command("stats", cmd_stats, "mean/std/min/max per field and channel, episode length and return")
    dataset_args(p)
    p.add_argument("--where", default=None, help="statistics of the episodes matching this SQL predicate")
    p.add_argument("--fields", default=None, help="field keys, comma-separated (default: all numeric fields)")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="also write return/length histograms there")

    p = command("history", cmd_history, "the table's commit history (versions for --version / time travel)")
    dataset_args(p)

    p = command("view", cmd_view, "browse episodes in a local web app: list, filter, videos, plots (Ctrl-C stops)")
    p.add_argument("path", help="dataset path or URL")
    p.add_argument("--version", type=int, default=None, help="view this table version (default: latest)")
    options(p)
    p.add_argument("--cache-dir", default=None, help="object stores: cache tensor bytes on disk there")
    p.add_argument("--where", default=None, help="open the list filtered by this SQL predicate")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port to listen on (default 8765; 0: any free port)")
    p.add_argument(
        "--query-timeout",
        type=float,
        default=5.0,
        help="seconds each query of a request may run before it is cancelled (default 5; 0: no limit)",
    )

    p = command("lineage", cmd_lineage, "what a saved stream state trains on: dataset, version, sampler, position")
    p.add_argument("state", help="a state file written by el.save_state(stream.state_dict(), path)")
    p.add_argument("--json", action="store_true", help="print the lineage and position as JSON")

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (see the module docstring)."""
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()  # buffered output meets a closed pipe here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _closed_pipe()
    except SystemExit as exc:  # a usage error found after parsing (parser.error): its status, not an exit
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("episodelake: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug:
            raise
        from ..storage.faults import storage_fault

        error = storage_fault(exc) or exc  # a raw engine error (botocore, deltalake) in the words of a StorageError
        print(f"episodelake: error: {_one_line(error)}{_storage_hint(args, error)}", file=sys.stderr)
        return EXIT_ERROR


def _storage_hint(args: argparse.Namespace, error: BaseException) -> str:
    """How to give credentials, when object storage refused or found none (nothing for local paths)."""
    from ..core.errors import StorageError
    from ..storage.faults import NO_CREDENTIALS

    if not isinstance(error, StorageError) or error.errno != errno.EACCES:
        return ""
    urls = [v for v in vars(args).values() if isinstance(v, str) and "://" in v and not v.startswith("file://")]
    if NO_CREDENTIALS not in error.message and not urls:
        return ""
    flags = "--src-options / --dst-options" if args.command in ("copy", "merge") else "--options"
    return (
        f'; give the storage\'s credentials with {flags} \'{{"key": "...", "secret": "..."}}\' '
        '(add "endpoint_url" for a server other than AWS) or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY '
        "(docs/object-storage.md)"
    )


def _one_line(exc: BaseException) -> str:
    """The error as one line: episodelake's own errors by message, others prefixed with their type."""
    from ..core.errors import EpisodeLakeError

    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if isinstance(exc, EpisodeLakeError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _closed_pipe() -> int:
    """The reader of stdout went away: send what is still buffered to /dev/null so exit stays quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_CLOSED_PIPE
