"""Sampling throughput from a local S3 server (SeaweedFS) vs local disk: the server's ceiling, latency, disk cache.

One run builds one dataset (uint8 camera [3, 64, 64] as a tensor field + small
state/action/reward), writes it to local disk, copies it to S3 with
``copy_to`` (timed too) and then draws ``segment_stream`` batches
(``batch_size`` segments of ``SEQ`` transitions, default prefetch) from:

* the copy limit: the same random windows gathered by NumPy from in-memory
  arrays of the dataset's geometry, one thread (every row is printed beside
  it, so none can exceed it unnoticed);
* local disk (memory-mapped chunk files);
* the server's bare ranged-GET ceiling: random segment-sized byte ranges
  (``SEQ + 1`` camera rows) of the dataset's shard objects read
  with ``KvStore.read(byte_range=...)``, 64 in flight;
* S3 without a cache, straight to the server, through the latency proxy
  (``tests/latency_proxy.py``) adding nothing, and adding 30 and 100 ms per
  request (``--latency``; ceiling too), each latency row printed as a ratio
  to the +0 ms row of the same run;
* S3 through the fault proxy (``tests/fault_proxy.py``) answering 10% of
  requests ``503 SlowDown`` (``--slow-down``), beside the same proxy with no
  faults: retries start at tens of milliseconds
  (:class:`~episodelake.storage.location.StorageTimeouts`), so the ratio shows what
  the 503s cost;
* S3 with the disk cache (``cache_dir``): cold (empty cache) and warm (the
  same batches again, in a fresh ``Dataset``);
* 2 processes sharing one cold disk cache, sampling the same batches at the
  same time, then a third process afterwards (it should download nothing).

The configurations are measured in interleaved rounds (``--rounds``) and the
median run of each is printed, so load from other processes on the machine
hits them alike. Prints segments/s, ratios, requests per batch and bytes read
per byte used (both count the batches built ahead when a run stops: up to the
prefetcher's target past the last one returned). ``--quick`` shrinks
everything; ``--prefetch`` sets how many batches ``segment_stream`` keeps
ahead at least; ``--faults-only`` measures only the clean and the 503 rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorstore as ts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fault_proxy import FaultProxy
from tests.latency_proxy import LatencyProxy
from tests.s3server import S3Server

import episodelake as el
from copy_limit import window_sampler  # benchmarks/ is on sys.path when run as a script
from episodelake.storage import fetch
from episodelake.storage.location import resolve

BATCH, SEQ = 32, 16
ROW_BYTES = 3 * 64 * 64


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


PREFETCH = 2  # segment_stream's default; --prefetch sets it
LIMIT = "copy limit (in-memory gather)"


def sample(ds: el.Dataset, batches: int, seed: int = 1) -> dict[str, float]:
    """Segments/s over ``batches`` batches (after one warm-up batch), with the fetcher's requests and bytes."""
    stream = iter(ds.segment_stream(SEQ, batch_size=BATCH, seed=seed, prefetch=PREFETCH))
    next(stream)
    stats = fetch.fetcher(ds.location).stats
    before = (stats.requests, stats.bytes)
    t0 = time.perf_counter()
    for _ in range(batches):
        batch = next(stream)
        assert batch.obs.camera.shape[:2] == (BATCH, SEQ)
    dt = time.perf_counter() - t0
    stream.close()
    requests, nbytes = stats.requests - before[0], stats.bytes - before[1]
    used = batches * BATCH * (SEQ + 1) * ROW_BYTES
    return {"rate": batches * BATCH / dt, "req": requests / batches, "ratio": nbytes / used, "bytes": nbytes}


def ceiling(url: str, opts: dict, seconds: float, in_flight: int = 64) -> float:
    """Segment-sized random ranged GETs per second, ``in_flight`` at once, over the dataset's shard objects."""
    loc = resolve(url, opts)
    kv = ts.KvStore.open(loc.kvstore(), context=ts.Context({"s3_request_concurrency": {"limit": 128}})).result()
    keys = [k.decode() for k in kv.list().result() if b"/c/" in k and b"/camera/" in k]
    sizes = {k: len(kv.read(k).result().value) for k in keys}
    seg = (SEQ + 1) * ROW_BYTES
    rng = np.random.default_rng(0)
    pending: list = []
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        key = keys[rng.integers(len(keys))]
        start = int(rng.integers(0, sizes[key] - seg))
        pending.append(kv.read(key, byte_range=slice(start, start + seg)))
        if len(pending) >= in_flight:
            assert len(pending.pop(0).result().value) == seg
            done += 1
    for future in pending:
        future.result()
        done += 1
    return done / (time.perf_counter() - t0)


def copy_limit(n_eps: int, length: int, seconds: float) -> float:
    """Segments/s of the bound: ``BATCH`` random windows gathered by NumPy from in-memory arrays, one thread.

    The arrays have the dataset's geometry (camera and state per observation
    row, action and reward per step row), so a segment copies what a sampled one does.
    """
    rng = np.random.default_rng(3)
    rows, steps = n_eps * (length + 1), n_eps * length
    obs = [rng.integers(0, 256, (rows, 3, 64, 64), dtype=np.uint8), rng.standard_normal((rows, 8), dtype=np.float32)]
    per_step = [rng.standard_normal((steps, 4), dtype=np.float32), rng.standard_normal(steps, dtype=np.float32)]
    sample = window_sampler(obs, per_step, n_eps, length, SEQ, BATCH)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sample()
        done += BATCH
    return done / (time.perf_counter() - t0)


def worker(url: str, opts: dict, cache_dir: str, batches: int) -> None:
    """One process of the shared-cache rows: sample, print rate and downloads as JSON."""
    ds = el.Dataset.open(url, storage_options=opts, read_only=True, cache_dir=cache_dir)
    out = sample(ds, batches)
    stats = fetch.fetcher(ds.location).stats
    print(json.dumps({**out, "requests": stats.requests, "total_bytes": stats.bytes}))


def run_workers(n: int, url: str, opts: dict, cache_dir: str, batches: int, prefetch: int) -> list[dict]:
    cmd = [sys.executable, __file__, "--worker", url, json.dumps(opts), cache_dir, str(batches), str(prefetch)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE) for _ in range(n)]
    outs = []
    for proc in procs:
        stdout, _ = proc.communicate()
        assert proc.returncode == 0, proc.returncode
        outs.append(json.loads(stdout.decode().strip().splitlines()[-1]))
    return outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small dataset, few batches")
    ap.add_argument("--episodes", type=int, default=None)
    ap.add_argument(
        "--latency", type=float, nargs="+", default=[0.03, 0.1], help="seconds the proxy adds per request (rows)"
    )
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per configuration (median)")
    ap.add_argument("--prefetch", type=int, default=2, help="segment_stream prefetch (batches ahead, at least)")
    ap.add_argument("--slow-down", type=float, default=0.10, help="fraction of requests the fault proxy answers 503")
    ap.add_argument("--faults-only", action="store_true", help="measure only the clean and the 503 rows")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global PREFETCH
    PREFETCH = args.prefetch
    if args.worker:
        url, opts, cache_dir, batches, PREFETCH = *args.worker[:4], int(args.worker[4])
        worker(url, json.loads(opts), cache_dir, int(batches))
        return
    n_eps = args.episodes or (24 if args.quick else 120)
    length = 200
    batches = 15 if args.quick else 40
    args.rounds = args.rounds or (3 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp, S3Server(Path(tmp) / "s3") as server:
        server.create_bucket("bench")
        opts = server.storage_options
        url = "s3://bench/ds"
        t0 = time.perf_counter()
        local = el.Dataset.from_episodes(episodes(n_eps, length), f"{tmp}/local", schema=schema())
        t_write = time.perf_counter() - t0
        nbytes = n_eps * (length + 1) * ROW_BYTES
        t0 = time.perf_counter()
        local.copy_to(url, opts, progress=False)
        t_copy = time.perf_counter() - t0
        print(f"dataset: {n_eps} episodes x {length} steps, camera {nbytes / 2**20:.0f} MiB")
        print(
            f"write to local disk: {nbytes / t_write / 2**20:.0f} MiB/s; copy_to S3 (+verify): "
            f"{nbytes / t_copy / 2**20:.0f} MiB/s"
        )
        print(f"sampling: segment_stream({SEQ}, batch_size={BATCH}, prefetch={PREFETCH}), ", end="")
        print(f"{batches} batches per run\n")

        delays = {f"+{delay * 1e3:.0f} ms": delay for delay in args.latency}
        seconds = 2.0 if args.quick else 5.0
        pct = f"{args.slow_down:.0%} 503 SlowDown"
        with contextlib.ExitStack() as proxies:
            proxy0 = proxies.enter_context(LatencyProxy(server.endpoint))
            slow = {ms: proxies.enter_context(LatencyProxy(server.endpoint, d)) for ms, d in delays.items()}
            clean = proxies.enter_context(FaultProxy(server.endpoint))
            faulty = proxies.enter_context(FaultProxy(server.endpoint, slow_down=args.slow_down, seed=1))
            via_clean = el.Dataset.open(url, storage_options=clean.storage_options(opts), read_only=True)
            via_503 = el.Dataset.open(url, storage_options=faulty.storage_options(opts), read_only=True)
            runs: dict[str, Callable[[int], dict[str, float]]] = {
                "S3 via fault proxy, no faults": lambda r: sample(via_clean, batches, seed=40 + r),
                f"S3 via fault proxy, {pct}": lambda r: sample(via_503, batches, seed=40 + r),
            }
            if not args.faults_only:
                s3 = el.Dataset.open(url, storage_options=opts, read_only=True)
                via0 = el.Dataset.open(url, storage_options=proxy0.storage_options(opts), read_only=True)
                latency_runs: dict[str, Callable[[int], dict[str, float]]] = {}
                for i, (ms, proxy) in enumerate(slow.items()):
                    popts = proxy.storage_options(opts)
                    via = el.Dataset.open(url, storage_options=popts, read_only=True)
                    latency_runs[f"ceiling via proxy {ms}"] = lambda r, o=popts: point(ceiling(url, o, seconds))
                    latency_runs[f"S3 via proxy {ms}"] = lambda r, v=via, s=30 + 30 * i: sample(v, batches, seed=s + r)
                warm_ds = el.Dataset.open(url, storage_options=opts, read_only=True, cache_dir=f"{tmp}/warm")
                sample(warm_ds, batches)  # fills the warm cache with the batches measured below
                disk_ds = el.Dataset.open(f"{tmp}/local", read_only=True)
                runs = {
                    LIMIT: lambda r: point(copy_limit(n_eps, length, seconds)),
                    "local disk": lambda r: sample(disk_ds, batches),
                    "S3 ranged-GET ceiling (64 in flight)": lambda r: point(ceiling(url, opts, seconds)),
                    "S3, no cache": lambda r: sample(s3, batches, seed=10 + r),
                    "S3 via proxy +0 ms": lambda r: sample(via0, batches, seed=20 + r),
                    **latency_runs,
                    **runs,
                    "S3 + disk cache, cold": lambda r: sample(
                        el.Dataset.open(url, storage_options=opts, read_only=True, cache_dir=f"{tmp}/cold{r}"), batches
                    ),
                    "S3 + disk cache, warm": lambda r: sample(warm_ds, batches),
                }
            # rounds interleave the configurations, so load from other processes hits them alike; medians reported
            results: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
            for r in range(args.rounds):
                for name, run in runs.items():
                    results[name].append(run(r))
            injected = faulty.injected["503"]
        rows = [(name, median(found)) for name, found in results.items()]
        get = dict(rows)
        clean_rate = get["S3 via fault proxy, no faults"]["rate"]
        faulty_rate = get[f"S3 via fault proxy, {pct}"]["rate"]
        if args.faults_only:
            print(f"median of {args.rounds} interleaved rounds")
            print(f"S3 via fault proxy, no faults: {clean_rate:.0f} segments/s")
            print(f"S3 via fault proxy, {pct}: {faulty_rate:.0f} segments/s ({injected} requests answered 503)")
            print(f"{pct} / no faults: {faulty_rate / clean_rate:.2f}")
            return
        shared = run_workers(2, url, opts, f"{tmp}/shared", batches, PREFETCH)
        rows += [(f"2 processes, 1 cold cache: #{i + 1}", out) for i, out in enumerate(shared)]
        # no prefetch: it reads exactly the batches the two processes read (theirs may have built a few more)
        after = run_workers(1, url, opts, f"{tmp}/shared", batches, 0)[0]
        rows.append(("3rd process, same cache, prefetch=0", after))

        get = dict(rows)
        disk, top = get["local disk"]["rate"], get["S3 ranged-GET ceiling (64 in flight)"]["rate"]
        limit = get[LIMIT]["rate"]
        print(f"median of {args.rounds} interleaved rounds (the process rows: one run)")
        print(f"{LIMIT}: a NumPy gather of the same windows from arrays in memory, one thread, this run")
        head = f"{'source':<38}{'segments/s':>11}{'vs limit':>9}{'vs disk':>9}{'vs ceiling':>11}"
        print(f"{head}{'req/batch':>10}{'read/used':>10}")
        for name, row in rows:
            print(
                f"{name:<38}{row['rate']:>11.0f}{row['rate'] / limit:>9.3f}{row['rate'] / disk:>9.3f}"
                f"{row['rate'] / top:>11.2f}{row['req']:>10.1f}{row['ratio']:>10.2f}"
            )
        uncached, via0_rate = get["S3, no cache"]["rate"], get["S3 via proxy +0 ms"]["rate"]
        print(f"\nS3 no cache / ceiling: {uncached / top:.2f}")
        for ms in delays:
            rate = get[f"S3 via proxy {ms}"]["rate"]
            print(
                f"S3 {ms} / S3 via proxy +0 ms (no latency): {rate / via0_rate:.2f}; / no cache: {rate / uncached:.2f}"
            )
        print(f"S3 {pct} / no faults (fault proxy): {faulty_rate / clean_rate:.2f} ({injected} requests answered 503)")
        print(f"warm disk cache / local disk: {get['S3 + disk cache, warm']['rate'] / disk:.2f}")
        print(f"3rd process downloaded {after['total_bytes']} bytes in {after['requests']} requests in all")


def point(rate: float) -> dict[str, float]:
    """A ceiling measurement as a row: one segment-sized GET per segment, every byte used."""
    return {"rate": rate, "req": float(BATCH), "ratio": 1.0}


def median(found: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median rate."""
    return sorted(found, key=lambda row: row["rate"])[len(found) // 2]


if __name__ == "__main__":
    main()
