"""Sampling throughput from a local S3 server (SeaweedFS) vs local disk, with and without the chunk cache.

One run builds one dataset (uint8 camera [3, 64, 64] as a tensor field + small
state/action/reward), writes it to local disk, copies it to S3 with
``copy_to`` (timed too) and then draws the same segment_stream batches
(``batch_size`` x ``sequence_length`` transitions) from:

* local disk, without and with the cache (warm);
* S3, no cache (every read: a shard-index GET + a chunk GET);
* S3 with ``cache_bytes`` (TensorStore's in-memory chunk cache): first pass
  (cold, fills it) and a second pass over the same batches (warm).

Prints segments/s and the ratio to local disk, plus TensorStore's S3 request
counts per configuration. ``--quick`` shrinks everything.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tensorstore as ts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.s3server import S3Server

import episodelake as el


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("camera", (3, 64, 64), "uint8", layout="CHW", storage="tensor", chunk_rows=64),
            el.FieldSpec("state", (8,), "float32"),
            el.FieldSpec("action", (4,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def episodes(n: int, length: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield {
            "observations": {
                "camera": rng.integers(0, 256, (length + 1, 3, 64, 64), dtype=np.uint8),
                "state": rng.standard_normal((length + 1, 8)).astype(np.float32),
            },
            "actions": rng.standard_normal((length, 4)).astype(np.float32),
            "rewards": rng.standard_normal(length).astype(np.float32),
        }


def s3_requests() -> int:
    for m in ts.experimental_collect_matching_metrics("/tensorstore/kvstore/s3/read"):
        if m["name"].endswith("/read") and m["values"]:
            return int(m["values"][0]["value"])
    return 0


def sample(ds: el.Dataset, batches: int, batch_size: int, seq: int) -> tuple[float, int]:
    """Segments/s over ``batches`` batches (after one warm-up batch) and the S3 GETs they issued."""
    stream = iter(ds.segment_stream(batch_size=batch_size, sequence_length=seq, seed=1))
    next(stream)
    before = s3_requests()
    t0 = time.perf_counter()
    for _ in range(batches):
        batch = next(stream)
        assert batch.obs.camera.shape[:2] == (batch_size, seq)
    dt = time.perf_counter() - t0
    return batches * batch_size / dt, s3_requests() - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small dataset, few batches")
    ap.add_argument("--episodes", type=int, default=None)
    args = ap.parse_args()
    n_eps = args.episodes or (24 if args.quick else 120)
    length, batch_size, seq = 200, 32, 16
    batches = 10 if args.quick else 40
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp, S3Server(Path(tmp) / "s3") as server:
        server.create_bucket("bench")
        opts = server.storage_options
        t0 = time.perf_counter()
        local = el.Dataset.from_episodes(episodes(n_eps, length), f"{tmp}/local", schema=schema())
        t_write = time.perf_counter() - t0
        nbytes = n_eps * (length + 1) * 3 * 64 * 64
        t0 = time.perf_counter()
        local.copy_to("s3://bench/ds", opts, progress=False)
        t_copy = time.perf_counter() - t0
        print(f"dataset: {n_eps} episodes x {length} steps, camera {nbytes / 2**20:.0f} MiB")
        print(
            f"write to local disk: {nbytes / t_write / 2**20:.0f} MiB/s; copy_to S3 (+verify): "
            f"{nbytes / t_copy / 2**20:.0f} MiB/s"
        )
        print(f"sampling: segment_stream batch_size={batch_size} sequence_length={seq}, {batches} batches\n")

        rows = []
        disk, _ = sample(el.Dataset.open(f"{tmp}/local", read_only=True), batches, batch_size, seq)
        rows.append(("local disk", disk, 0))
        disk_cached = el.Dataset.open(f"{tmp}/local", read_only=True, cache_bytes=2 * nbytes)
        sample(disk_cached, batches, batch_size, seq)
        rows.append(("local disk + cache, warm", *sample(disk_cached, batches, batch_size, seq)))
        s3 = el.Dataset.open("s3://bench/ds", storage_options=opts, read_only=True)
        rows.append(("S3, no cache", *sample(s3, batches, batch_size, seq)))
        cached = el.Dataset.open("s3://bench/ds", storage_options=opts, read_only=True, cache_bytes=2 * nbytes)
        rows.append(("S3 + cache, cold", *sample(cached, batches, batch_size, seq)))
        rows.append(("S3 + cache, warm", *sample(cached, batches, batch_size, seq)))

        print(f"{'source':<26}{'segments/s':>12}{'vs disk':>10}{'S3 GETs':>10}")
        for name, rate, gets in rows:
            print(f"{name:<26}{rate:>12.0f}{rate / disk:>10.2f}{gets:>10}")
        print(f"\nS3 cache speed-up (warm vs no cache): {rows[4][1] / rows[2][1]:.1f}x")


if __name__ == "__main__":
    main()
