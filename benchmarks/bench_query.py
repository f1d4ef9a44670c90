"""SQL over a large episode table: open, filtered query, where(), stats() of a subset.

Builds an episode table of N episodes (default 1,000,000; ``--quick``: 100,000)
partitioned by ``task`` over four values, written straight to Delta in a few big
commits with the dataset's own table schema. Per-step fields are tensor fields
whose tensors are never written (their ``ref``/``crc`` and commit-time statistics
columns are filled), so the build is cheap and the table is what a real dataset
of that many episodes holds. Then, in one process and on the same files:

* open: ``Dataset.open`` and the first ``count(*)``;
* a filtered query (partition + meta filter) via ``ds.sql``, against DuckDB's
  own ``read_parquet`` over the Delta files and a pyarrow dataset scan;
* ``where()`` to a view, against the bare DuckDB id query it wraps; open + the
  first ``where()`` the first time ever (the table cache removed first: it
  reads, sorts and caches the order keys), then on new ``Dataset`` objects
  (mapping them), with the cache off, and in fresh processes;
* ``stats()`` of that view, against one DuckDB aggregate over the raw stats
  list columns of the Arrow dataset: its first-ever call (the statistics cache
  removed first: it decodes the files holding the view and writes their
  entries), the first call of new snapshots (mapping those entries) against
  what decoding costs (Arrow's decode of the statistics columns of those
  files, memory-mapped, nothing kept), the same with the cache off
  (``EPISODELAKE_TABLE_CACHE=0``, 0.7.1's read), and in fresh processes;
* ``stats()`` of the whole dataset (warm: a merge of per-file totals), against
  the same aggregate without the filter.

"cold" is the first call on a freshly opened dataset (the first ``where()`` reads
the order keys and runs over the table files; the first ``where()`` on the view
makes the snapshot's one index scan; the first ``stats()`` reads the statistics
of the table files holding the view's episodes), "warm" the median of repeats. Ratios
are peer / ours. The goals of issues #15 and #25 (1M episodes) are printed with
the rows they apply to.
Run: ``.venv/bin/python benchmarks/bench_query.py [--quick] [--episodes N] [--dir PATH]`` (``--dir``: the
table is kept there and the next run of the same size reuses it, skipping the build).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import write_deltalake

import episodelake as el
from episodelake.core.stats import STAT_PARTS, stat_column
from episodelake.storage import layout, table_cache
from episodelake.storage.table import arrow_schema

TASKS = np.array(["pick", "place", "push", "stack"])
PREDICATE = "task = 'pick' AND success"
COMMITS = 4
REPEATS = 5


def bench_schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (7,), "float32", storage="tensor"),
            el.FieldSpec("camera", (3, 64, 64), "uint8", layout="CHW", storage="tensor"),
            el.FieldSpec("action", (7,), "float32", role="action", storage="tensor"),
            el.FieldSpec("reward", (), "float32", role="reward", storage="tensor"),
            el.FieldSpec("task", (), "str", role="meta"),
            el.FieldSpec("success", (), "bool", role="meta"),
            el.FieldSpec("operator", (), "str", role="meta"),
        ]
    )


def _lists(values: np.ndarray) -> pa.Array:
    n, c = values.shape
    return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * c), pa.array(values.reshape(-1)))


def build(path: str, episodes: int, seed: int = 0) -> el.Dataset:
    """An N-episode table written directly with the dataset's table schema, in a few big commits."""
    schema = bench_schema()
    ds = el.Dataset.create(schema, path, partition_by=["task"], overwrite=True)
    target = arrow_schema(schema)
    rng = np.random.default_rng(seed)
    start = np.datetime64("2026-01-01T00:00:00", "us")
    per_commit = -(-episodes // COMMITS)
    for lo in range(0, episodes, per_commit):
        n = min(per_commit, episodes - lo)
        lengths = rng.integers(10, 500, n)
        cols: dict[str, pa.Array] = {
            "episode_id": pa.array(np.arange(lo, lo + n, dtype=np.int64)),
            "writer": pa.array(np.full(n, "w0")),
            "length": pa.array(lengths),
            "terminated": pa.array(rng.random(n) < 0.5),
            "truncated": pa.array(np.zeros(n, dtype=bool)),
            "return": pa.array(rng.standard_normal(n) * 10),
            "created_at": pa.array(start + np.arange(lo, lo + n)),
            "task": pa.array(TASKS[rng.integers(0, len(TASKS), n)]),
            "success": pa.array(rng.random(n) < 0.3),
            "operator": pa.array(np.array(["ann", "bob", "cy"])[rng.integers(0, 3, n)]),
        }
        for f in schema.step_fields:
            cols[f"ref/{f.key}"] = pa.array(np.zeros(n, dtype=np.int64))
            cols[f"crc/{f.key}"] = pa.array(np.zeros(n, dtype=np.int64))
            count = (lengths + (f.role == "observation")) * (f.step_bytes // f.np_dtype.itemsize // f.stat_channels)
            mean = rng.standard_normal((n, f.stat_channels))
            cols[stat_column(f, "count")] = pa.array(count)
            cols[stat_column(f, "sum")] = _lists(mean * count[:, None])
            cols[stat_column(f, "sumsq")] = _lists((mean**2 + 1) * count[:, None])
            cols[stat_column(f, "min")] = _lists(mean - 3)
            cols[stat_column(f, "max")] = _lists(mean + 3)
        write_deltalake(ds._store.table.dt, pa.table(cols).select(target.names).cast(target), mode="append")
        ds._store.table.refresh()
    ds.maintenance.compact()
    return ds


def timed(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    """Median wall time of ``fn`` in ms."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def once(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


@contextlib.contextmanager
def patched_env(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


FRESH = """
import sys, time
import episodelake as el
path, predicate, what = sys.argv[1:]
t0 = time.perf_counter()
view = el.Dataset.open(path).where(predicate)
if what == "stats":
    view.where("return > 0")
    t0 = time.perf_counter()
    view.stats()
print((time.perf_counter() - t0) * 1e3)
"""


def fresh_process(path: str, what: str) -> float:
    """ms, in a new Python process, of ``Dataset.open`` + the first ``where()`` (``what="where"``) or of the
    view's first stats() (``"stats"``, its index scan made first)."""
    out = subprocess.run(
        [sys.executable, "-c", FRESH, path, PREDICATE, what], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 episodes")
    parser.add_argument("--episodes", type=int, default=None)
    parser.add_argument(
        "--dir",
        default=None,
        help="where to build the table, kept there and reused by the next run of the same size "
        "(default: a temporary directory, removed)",
    )
    args = parser.parse_args()
    episodes = args.episodes or (100_000 if args.quick else 1_000_000)
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench_query_"))
    path = str(root / f"ds{episodes}")
    try:
        if args.dir and Path(path, "episodes").exists():
            print(f"reusing the {episodes:,}-episode table in {path}")
        else:
            t_build, _ = once(lambda: build(path, episodes))
            print(f"built {episodes:,} episodes over {len(TASKS)} partitions in {t_build / 1e3:.1f} s")
        run(path)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


def run(path: str) -> None:
    rows: list[tuple[str, float, str, float | None]] = []

    # ---- open
    t_open, ds = once(lambda: el.Dataset.open(path))
    t_count, _ = once(lambda: ds.sql("SELECT count(*) FROM episodes").fetchall())
    rows.append(("open (Dataset.open)", t_open, "", None))
    rows.append(("open + first count(*)", t_open + t_count, "", None))

    # ---- filtered query
    query = f"SELECT count(*), avg(return), avg(length) FROM episodes WHERE {PREDICATE}"
    ours = timed(lambda: ds.sql(query).fetchall())
    files = ds._store.table.file_uris()
    raw = duckdb.connect()
    listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    raw.execute(f"CREATE VIEW episodes AS SELECT * FROM read_parquet([{listed}], hive_partitioning = true)")
    peer = timed(lambda: raw.sql(query).fetchall())
    rows.append(("filtered query (ds.sql)", ours, "DuckDB read_parquet", peer))
    arrow_ds = ds.snapshot().arrow_dataset()
    flt = (pc.field("task") == "pick") & pc.field("success")

    def pyarrow_scan() -> None:
        tbl = arrow_ds.to_table(columns=["return", "length"], filter=flt)
        (tbl.num_rows, pc.mean(tbl["return"]), pc.mean(tbl["length"]))

    rows.append(("filtered query (ds.sql)", ours, "pyarrow dataset scan", timed(pyarrow_scan)))
    assert ds.sql(query).fetchall()[0][0] == raw.sql(query).fetchall()[0][0]

    # ---- where() to a view (cache off first: it also opens the sandboxed database every where() runs in)

    def open_where() -> tuple[float, el.Dataset, el.DatasetView]:
        t_open, fresh = once(lambda: el.Dataset.open(path))
        t_cold, view = once(lambda: fresh.where(PREDICATE))
        return t_open + t_cold, fresh, view

    with patched_env("EPISODELAKE_TABLE_CACHE", "0"):
        uncached = [open_where()[0] for _ in range(3)]
    shutil.rmtree(Path(path, *layout.CACHE), ignore_errors=True)  # the first-ever where() and stats() decode
    first_ever, _, _ = open_where()
    opened = [open_where() for _ in range(REPEATS)]  # each maps the order keys the first one cached
    _, fresh, view = opened[-1]
    rows.append(("first-ever open + where() (keys read, sorted, cached)", first_ever, "", None))
    rows.append(("open + first where(), cache off (0.7.1's read)", statistics.median(uncached), "", None))
    rows.append(("Dataset.open + first where() [goal 100]", statistics.median(t for t, _, _ in opened), "", None))
    in_process = statistics.median(fresh_process(path, "where") for _ in range(3))
    rows.append(("the same in a fresh process", in_process, "", None))
    ours = timed(lambda: ds.where(PREDICATE))
    cur = duckdb.connect()
    cur.register("episodes", arrow_ds)
    peer = timed(lambda: cur.sql(f"SELECT episode_id FROM episodes WHERE {PREDICATE}").to_arrow_table())
    rows.append((f"where() warm -> {len(view):,} episodes", ours, "bare DuckDB id query", peer))
    rows.append(("first view.where() (makes the index scan)", once(lambda: view.where("return > 0"))[0], "", None))
    rows.append(("view.where('return > 0')", timed(lambda: view.where("return > 0")), "", None))
    rows.append(("view.sql(count(*))", timed(lambda: view.sql("SELECT count(*) FROM episodes").fetchall()), "", None))

    # ---- stats() of the filtered subset (the cache holds no statistics yet: the first-ever read decodes)
    t_cold, _ = once(view.stats)
    ours = timed(view.stats)

    def new_view() -> el.DatasetView:  # a new snapshot, its index scan made: what a first stats() meets
        again = el.Dataset.open(path).where(PREDICATE)
        again.where("return > 0")
        return again

    table_cache.wait()  # the entries the first call decoded, written in the background meanwhile
    colds = [once(new_view().stats)[0] for _ in range(REPEATS)]  # each maps them
    with patched_env("EPISODELAKE_TABLE_CACHE", "0"):
        uncached = [once(new_view().stats)[0] for _ in range(3)]
    in_process = [fresh_process(path, "stats") for _ in range(3)]
    schema = ds.schema
    aggs = []
    for f in schema.step_fields:
        aggs.append(f'sum("{stat_column(f, "count")}")')
        for c in range(1, f.stat_channels + 1):
            parts = zip(STAT_PARTS[1:], ("sum", "sum", "min", "max"), strict=True)
            aggs += [f'{agg}("{stat_column(f, p)}"[{c}])' for p, agg in parts]
    naive_all = f"SELECT count(*), sum(length), sum(return), {', '.join(aggs)} FROM episodes"
    naive = f"{naive_all} WHERE {PREDICATE}"
    peer = timed(lambda: cur.sql(naive).fetchall(), repeats=3)
    stat_columns = [stat_column(f, p) for f in schema.step_fields for p in STAT_PARTS]
    view_files = [f for f in files if "task=pick" in f]

    def decode() -> None:  # what any reader of these files decodes first: their statistics columns, mapped
        for f in view_files:
            pq.ParquetFile(f, memory_map=True).read(columns=stat_columns)

    bound = timed(decode, repeats=3)
    first = statistics.median(colds)
    rows.append(("first-ever stats() of the view (decode + cache)", t_cold, "one aggregate over raw stats lists", peer))
    rows.append(("first stats(), cache off (0.7.1's read)", statistics.median(uncached), "", None))
    rows.append(("first stats() of a new snapshot [goal 100]", first, "one aggregate over raw stats lists", peer))
    rows.append(("first stats() of a new snapshot [goal 100]", first, "Arrow decode of its files' stats", bound))
    rows.append(("first stats() in a fresh process", statistics.median(in_process), "", None))
    rows.append(("stats() of the where() view, warm", ours, "one aggregate over raw stats lists", peer))
    both = timed(lambda: fresh.where(PREDICATE).stats())
    rows.append(("warm where() + stats() [goal 50]", both, "", None))
    t_whole, _ = once(fresh.stats)
    peer = timed(lambda: cur.sql(naive_all).fetchall(), repeats=3)
    rows.append(("first stats() whole dataset", t_whole, "the same aggregate, whole table", peer))
    rows.append(("stats() whole dataset, warm [goal 20]", timed(fresh.stats), "the same aggregate, whole table", peer))

    print(f"{'measure':44s} {'ours ms':>9s}   {'peer':36s} {'peer ms':>9s} {'ratio':>7s}")
    for name, ms, peer_name, peer_ms in rows:
        tail = f"{peer_name:36s} {peer_ms:9.1f} {peer_ms / ms:6.1f}x" if peer_ms is not None else ""
        print(f"{name:44s} {ms:9.1f}   {tail}")


if __name__ == "__main__":
    main()
