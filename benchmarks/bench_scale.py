"""Figures for docs/scale.md: the episode table and the Delta log of a robot dataset, measured at small scale.

The paper dataset (docs/scale.md): three cameras ``u8[96, 128, 3]``, state and
action ``f32[14]``, a scalar reward, every step field a tensor field (so the
table holds one row per episode, never per step), meta ``task``/``success``/
``operator``. Three measurements, each on a fresh local directory:

* **table**: ``--episodes`` episode rows written straight to Delta with the
  dataset's own table schema (``bench_query.build`` with this schema: tensor
  references, CRCs and commit-time statistics filled, tensors never written),
  compacted; then Parquet bytes per episode, ``Dataset.open`` and the first
  ``where()`` (the snapshot's one index scan) in this process.
* **log**: ``--commits`` real commits through ``append_episodes`` of
  ``--per-commit`` two-step episodes (cameras shrunk to ``u8[4, 4, 3]``: the
  log records files and statistics per channel, not pixels), with the
  writer's automatic compaction + checkpoint every 64 commits; then the
  commit entry sizes, the checkpoint size, table files, and ``Dataset.open``
  time every 64 commits.
* **sample**: segments/s of the paper geometry from local disk and S3, each
  beside the copy limit (the same windows gathered by NumPy from in-memory
  arrays, one thread, this run) and its ratio to it.

Run: ``.venv/bin/python benchmarks/bench_scale.py [--episodes N] [--commits C] [--per-commit E]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import episodelake as el
from bench_query import timed as median_ms
from copy_limit import window_sampler  # benchmarks/ is on sys.path when run as a script
from episodelake.storage import table

CAMERAS = ("cam_left", "cam_right", "cam_wrist")
BATCH, SEQ = 32, 16


def paper_schema(frame: tuple[int, int, int] = (96, 128, 3)) -> el.DatasetSchema:
    cams = [el.FieldSpec(c, frame, "uint8", layout="HWC", storage="tensor") for c in CAMERAS]
    return el.DatasetSchema(
        [
            *cams,
            el.FieldSpec("state", (14,), "float32", storage="tensor"),
            el.FieldSpec("action", (14,), "float32", role="action", storage="tensor"),
            el.FieldSpec("reward", (), "float32", role="reward", storage="tensor"),
            el.FieldSpec("task", (), "str", role="meta"),
            el.FieldSpec("success", (), "bool", role="meta"),
            el.FieldSpec("operator", (), "str", role="meta"),
        ]
    )


def dir_bytes(path: Path, suffix: str = "") -> int:
    return sum(p.stat().st_size for p in path.rglob(f"*{suffix}") if p.is_file())


def bench_table(root: Path, episodes: int) -> None:
    import bench_query  # a sibling script: its builder writes the rows

    bench_query.bench_schema = paper_schema  # its builder fills any schema's reference/statistics columns
    path = root / "table"
    t0 = time.perf_counter()
    bench_query.build(str(path), episodes)
    built = time.perf_counter() - t0
    data = dir_bytes(path / "episodes", ".parquet") - dir_bytes(path / "episodes" / "_delta_log", ".parquet")
    t_open = median_ms(lambda: el.Dataset.open(str(path), read_only=True), repeats=3)

    def open_and_where() -> None:
        el.Dataset.open(str(path), read_only=True).where("task = 'pick' AND success")

    t_where = median_ms(open_and_where, repeats=3)
    print(f"table: {episodes:,} episodes built in {built:.1f} s")
    print(f"  Parquet data: {data / 1e6:.1f} MB = {data / episodes:.0f} B per episode")
    print(f"  Dataset.open {t_open:.0f} ms; open + first where() {t_where:.0f} ms (median of 3)")


def bench_log(root: Path, commits: int, per_commit: int) -> None:
    """Commit entries, checkpoints and open time as an object-store writer leaves them: checkpoints, no compaction."""
    schema = paper_schema((4, 4, 3))
    path = root / "log"
    table.COMPACT_EVERY = 10**9  # what writers do on object stores: a checkpoint every 64 commits, compact() explicit
    ds = el.Dataset.create(schema, str(path), commit_episodes=10**9)
    rng = np.random.default_rng(0)

    def episode() -> dict:
        T = 2
        obs = {c: rng.integers(0, 255, (T + 1, 4, 4, 3), dtype=np.uint8) for c in CAMERAS}
        obs["state"] = rng.standard_normal((T + 1, 14), dtype=np.float32)
        return {
            "observations": obs,
            "actions": rng.standard_normal((T, 14), dtype=np.float32),
            "rewards": rng.standard_normal(T, dtype=np.float32),
            "meta": {"task": "pick", "success": True, "operator": "ann"},
        }

    log = path / "episodes" / "_delta_log"
    print(f"log: {commits} commits of {per_commit} episodes, a checkpoint every 64, no compaction (object stores)")
    head = ("commits", "entry B (median)", "checkpoint B", "log B", "files", "open ms")
    widths = (7, 16, 12, 10, 6, 8)
    print("  " + " ".join(f"{h:>{w}s}" for h, w in zip(head, widths, strict=True)))
    t_commit = []

    def row(label: str) -> None:
        entries = [p.stat().st_size for p in log.glob("*.json")]
        checkpoints = sorted(log.glob("*.checkpoint.parquet"), key=lambda p: int(p.name.split(".")[0]))
        last = checkpoints[-1].stat().st_size if checkpoints else 0
        files = len(el.Dataset.open(str(path), read_only=True)._store.table.file_uris())
        t_open = median_ms(lambda: len(el.Dataset.open(str(path), read_only=True)), repeats=3)
        cells = (
            label,
            f"{statistics.median(entries):.0f}",
            str(last),
            str(dir_bytes(log)),
            str(files),
            f"{t_open:.0f}",
        )
        print("  " + " ".join(f"{c:>{w}s}" for c, w in zip(cells, widths, strict=True)))

    for c in range(1, commits + 1):
        t0 = time.perf_counter()
        ds.append_episodes([episode() for _ in range(per_commit)])
        ds.flush()
        t_commit.append((time.perf_counter() - t0) * 1e3)
        if c % 64 == 0:
            ds._store.table.dt.create_checkpoint()
            row(str(c))
    print(
        f"  commit (append + flush) median {statistics.median(t_commit):.1f} ms, p90 {np.percentile(t_commit, 90):.1f}"
    )
    ds.maintenance.compact()
    row("compact")


def paper_episodes(n: int, length: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for i in range(n):
        obs = {c: rng.integers(0, 256, (length + 1, 96, 128, 3), dtype=np.uint8) for c in CAMERAS}
        obs["state"] = rng.standard_normal((length + 1, 14), dtype=np.float32)
        yield {
            "observations": obs,
            "actions": rng.standard_normal((length, 14), dtype=np.float32),
            "rewards": rng.standard_normal(length, dtype=np.float32),
            "meta": {"task": "pick" if i % 2 else "place", "success": bool(i % 3), "operator": "ann"},
        }


def segments_per_s(ds: el.Dataset, batches: int) -> float:
    stream = ds.segment_stream(SEQ, batch_size=BATCH, seed=1)
    next(stream)  # warm-up: snapshot, arrays opened
    t0 = time.perf_counter()
    for _ in range(batches):
        next(stream)
    rate = batches * BATCH / (time.perf_counter() - t0)
    stream.close()
    return rate


def copy_limit(episodes: int, length: int, batches: int) -> float:
    """Segments/s of the bound: the same ``B`` random windows gathered by NumPy from in-memory arrays, one thread.

    The arrays have the paper geometry (three cameras and the state per
    observation row, action and reward per step row), so a segment copies the
    bytes one of the lake's segments does.
    """
    rows, step_rows = episodes * (length + 1), episodes * length
    rng = np.random.default_rng(2)
    obs = [rng.integers(0, 256, (rows, 96, 128, 3), dtype=np.uint8) for _ in CAMERAS]
    obs.append(rng.standard_normal((rows, 14), dtype=np.float32))
    steps = [rng.standard_normal((step_rows, 14), dtype=np.float32), rng.standard_normal(step_rows, dtype=np.float32)]
    sample = window_sampler(obs, steps, episodes, length, SEQ, BATCH)
    sample()  # warm-up: the arrays' pages touched
    t0 = time.perf_counter()
    for _ in range(batches):
        sample()
    return batches * BATCH / (time.perf_counter() - t0)


def bench_sample(root: Path, episodes: int, length: int, batches: int, s3: bool) -> None:
    """Segments/s of the paper geometry (B=32, L=16) from local disk, default chunks vs ``chunk_rows=8``, and S3.

    Each figure is printed beside the copy limit (:func:`copy_limit`, timed in
    this run) and its ratio to it, so no row can exceed the bound unnoticed.
    """
    step_bytes = sum(f.step_bytes for f in paper_schema().step_fields)
    segment_bytes = (SEQ + 1) * step_bytes
    print(f"sample: {episodes} episodes x {length} steps, {step_bytes:,} B per step, B={BATCH}, L={SEQ}")
    limit = copy_limit(episodes, length, batches)
    print(
        f"  copy limit (NumPy gather of the same windows from memory, 1 thread): {limit:,.0f} segments/s = "
        f"{limit * segment_bytes / 1e9:.2f} GB/s"
    )
    local: dict[str, el.Dataset] = {}
    for name, rows in (("default chunks", None), ("chunk_rows=8", 8)):
        schema = paper_schema()
        if rows is not None:
            schema = el.DatasetSchema(
                [dataclasses.replace(f, chunk_rows=rows) if f.name in CAMERAS else f for f in schema.fields]
            )
        ds = el.Dataset.create(schema, str(root / name.replace("=", "")))
        ds.append_episodes(paper_episodes(episodes, length))
        ds.flush()
        local[name] = ds
        cam = ds.schema[f"observation/{CAMERAS[0]}"]
        rate = segments_per_s(ds, batches)
        read = (cam.rows_per_chunk + SEQ) / (SEQ + 1)  # c + R - 1 rows read per R = L + 1 rows used
        print(
            f"  local disk, {name} ({cam.rows_per_chunk} rows/chunk): {rate:,.0f} segments/s = "
            f"{rate * segment_bytes / 1e9:.2f} GB/s used, x{rate / limit:.2f} the copy limit; "
            f"camera rows read/used {read:.2f}"
        )
    if not s3:
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.s3server import S3Server

    with S3Server(root / "s3") as server:
        server.create_bucket("episodes")
        for name, ds in local.items():
            url = f"s3://episodes/{name.replace('=', '')}"
            ds.copy_to(url, server.storage_options, progress=False)
            remote = el.Dataset.open(url, storage_options=server.storage_options, read_only=True)
            rate = segments_per_s(remote, max(2, batches // 4))
            print(
                f"  S3 (local server), no cache, {name}: {rate:,.0f} segments/s = "
                f"{rate * segment_bytes / 1e6:.0f} MB/s used, x{rate / limit:.2f} the copy limit"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=256)
    parser.add_argument("--per-commit", type=int, default=64)
    parser.add_argument("--sample-episodes", type=int, default=12)
    parser.add_argument("--sample-length", type=int, default=100)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--no-s3", action="store_true", help="sample from local disk only")
    parser.add_argument("--only", choices=["table", "log", "sample"], default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_scale_"))
    try:
        if args.only in (None, "table"):
            bench_table(root, args.episodes)
        if args.only in (None, "log"):
            bench_log(root, args.commits, args.per_commit)
        if args.only in (None, "sample"):
            bench_sample(root, args.sample_episodes, args.sample_length, args.batches, not args.no_s3)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"(cpus: {os.cpu_count()})")


if __name__ == "__main__":
    main()
