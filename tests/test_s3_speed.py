"""Object-store reads through the planned reader and the read caches, against the real local S3 server.

Batches from ``s3://`` are planned as byte ranges (shard indexes fetched once
and kept, ranges coalesced per object, every request in flight together) and
optionally cached in memory or on disk. Every test compares values with the
episodes as recorded (ground truth held separately, ``check_batch``) or with
what the same process read without a cache; request counts come from a
counting proxy in front of the server, or from the reading process's fetcher.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import episodelake as el
from episodelake.storage import fetch
from episodelake.storage.diskcache import TRAILER

from .latency_proxy import LatencyProxy
from .test_sampling import check_batch, make_dataset, raw_by_id

ROOT = Path(__file__).resolve().parents[1]
READER = ROOT / "tests" / "scripts" / "cache_reader.py"
B, L = 8, 4  # what tests/scripts/cache_reader.py samples


@pytest.fixture(scope="module")
def lakes(s3_server):
    opts = s3_server.storage_options
    tag = f"{os.getpid()}"
    raw = make_dataset(f"s3://episodes/speed-raw-{tag}", writers=2, storage_options=opts)
    zstd = make_dataset(f"s3://episodes/speed-zstd-{tag}", "zstd", writers=2, storage_options=opts)
    return {"raw": raw, "zstd": zstd}


def open_s3(ds, opts, **kw) -> el.Dataset:
    return el.Dataset.open(ds.location.url, storage_options=opts, read_only=True, **kw)


def camera_crcs(ds, batches: int, seed: int) -> list[int]:
    stream = iter(ds.segment_stream(L, batch_size=B, seed=seed))
    return [zlib.crc32(np.ascontiguousarray(next(stream).all_obs["camera"]).data) for _ in range(batches)]


def run_reader(url: str, opts: dict, cache_dir: Path, batches: int, seed: int) -> subprocess.Popen:
    env = {**os.environ, "CACHE_READER_OPTIONS": json.dumps(opts), "PYTHONPATH": str(ROOT)}
    args = [sys.executable, str(READER), url, str(cache_dir), str(batches), str(seed)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)


def reader_result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


def entries(cache_dir: Path) -> list[Path]:
    return [p for p in cache_dir.glob("*/*") if p.is_file()]


def entry_ok(path: Path) -> bool:
    blob = path.read_bytes()
    crc, length = TRAILER.unpack_from(blob, len(blob) - TRAILER.size)
    return length == len(blob) - TRAILER.size and zlib.crc32(blob[:length]) == crc


@pytest.mark.parametrize("kind", ["raw", "zstd"])
@pytest.mark.parametrize("cache", ["none", "memory", "disk"])
def test_sampled_batches_equal_the_recorded_episodes(lakes, s3_server, tmp_path, kind, cache):
    ds, raw = lakes[kind]
    kw = {"none": {}, "memory": {"cache_bytes": 1 << 26}, "disk": {"cache_dir": tmp_path / "cache"}}[cache]
    s3 = open_s3(ds, s3_server.storage_options, **kw)
    by_id = raw_by_id(s3, raw)
    for _ in range(2):  # the second pass reads through a warm cache
        stream = iter(s3.segment_stream(6, batch_size=B, seed=3))
        for _ in range(4):
            check_batch(next(stream), by_id, 6)
    segs = s3.segments(el.Window(5, pad="suffix", stride=3))  # map-style reads take the same path
    check_batch(segs.__getitems__(list(range(len(segs)))), by_id, 5)
    if cache == "disk":
        assert entries(tmp_path / "cache") and all(entry_ok(p) for p in entries(tmp_path / "cache"))


def test_each_shard_index_is_fetched_once_and_a_batch_takes_one_round(lakes, s3_server):
    ds, raw = lakes["raw"]
    with LatencyProxy(s3_server.endpoint) as proxy:
        s3 = open_s3(ds, proxy.storage_options(s3_server.storage_options))
        by_id = raw_by_id(s3, raw)
        stream = iter(s3.segment_stream(L, batch_size=B, seed=5, prefetch=0))
        proxy.reset()
        per_batch = []
        for _ in range(12):
            before = proxy.gets
            check_batch(next(stream), by_id, L)
            per_batch.append(proxy.gets - before)
        index_reads = Counter(line for line, rng in proxy.log if rng.startswith("bytes=-"))
    assert index_reads and max(index_reads.values()) == 1  # suffix reads of shard indexes: once per shard
    # one request per segment at most (index reads only while shards are new), never two per read
    assert all(n <= B for n in per_batch[4:]), per_batch


def test_reads_through_30ms_latency_are_exact(lakes, s3_server):
    ds, raw = lakes["zstd"]
    with LatencyProxy(s3_server.endpoint, delay_s=0.03) as proxy:
        s3 = open_s3(ds, proxy.storage_options(s3_server.storage_options))
        stream = s3.segment_stream(L, batch_size=B, seed=2)
        by_id = raw_by_id(s3, raw)
        batches = iter(stream)
        for _ in range(4):
            check_batch(next(batches), by_id, L)
        stream.close()  # its prefetch threads stop before the proxy they read through does
        assert proxy.gets > 0


@pytest.mark.parametrize("kind", ["raw", "zstd"])
def test_whole_episode_reads_take_the_planned_path_through_the_disk_cache(lakes, s3_server, tmp_path, kind):
    """EpisodeRef.read and to_numpy on S3 read through the planned reader: a second dataset object sharing the
    cache_dir reads every episode again without one tensor GET."""
    ds, raw = lakes[kind]
    with LatencyProxy(s3_server.endpoint) as proxy:
        opts = proxy.storage_options(s3_server.storage_options)
        for attempt in range(2):
            s3 = open_s3(ds, opts, cache_dir=tmp_path / "cache")
            proxy.reset()
            for i, ep in enumerate(raw):
                np.testing.assert_array_equal(s3.episode(i).read().all_obs["camera"], ep.obs["camera"])
            whole = s3.to_numpy()
            tensor_gets = sum("/tensors/" in line for line, _ in proxy.log)
            assert (tensor_gets > 0) if attempt == 0 else (tensor_gets == 0), (attempt, tensor_gets)
    np.testing.assert_array_equal(whole["observation/camera"], np.concatenate([ep.obs["camera"] for ep in raw]))


@pytest.mark.slow
def test_a_second_process_downloads_nothing_already_cached(lakes, s3_server, tmp_path):
    ds, _ = lakes["raw"]
    opts = s3_server.storage_options
    cache = tmp_path / "cache"
    want = camera_crcs(open_s3(ds, opts), 6, seed=11)  # no cache: the reference
    first = reader_result(run_reader(ds.location.url, opts, cache, 6, 11))
    second = reader_result(run_reader(ds.location.url, opts, cache, 6, 11))
    assert first["crcs"] == want and second["crcs"] == want
    assert first["requests"] > 0 and first["bytes"] > 0
    assert second["requests"] == 0 and second["bytes"] == 0 and second["hits"] > 0


@pytest.mark.slow
def test_a_corrupt_cache_entry_is_refetched_never_served(lakes, s3_server, tmp_path):
    ds, _ = lakes["zstd"]
    opts = s3_server.storage_options
    cache = tmp_path / "cache"
    want = camera_crcs(open_s3(ds, opts), 5, seed=4)
    assert reader_result(run_reader(ds.location.url, opts, cache, 5, 4))["crcs"] == want
    damaged = entries(cache)
    for path in damaged:  # flip one content byte of every entry (the trailer still holds the old CRC-32)
        blob = bytearray(path.read_bytes())
        blob[(len(blob) - TRAILER.size) // 2] ^= 0xFF
        path.write_bytes(bytes(blob))
    assert damaged and not any(entry_ok(p) for p in damaged)
    again = reader_result(run_reader(ds.location.url, opts, cache, 5, 4))
    assert again["crcs"] == want  # served values are the dataset's, never the damaged bytes
    assert again["corrupt"] == len(damaged) and again["requests"] > 0
    assert all(entry_ok(p) for p in entries(cache))  # refetched entries replaced the damaged ones


@pytest.mark.slow
def test_concurrent_processes_fill_one_cache(lakes, s3_server, tmp_path):
    ds, _ = lakes["zstd"]
    opts = s3_server.storage_options
    cache = tmp_path / "cache"
    want = camera_crcs(open_s3(ds, opts), 6, seed=8)
    procs = [run_reader(ds.location.url, opts, cache, 6, 8) for _ in range(3)]
    results = [reader_result(p) for p in procs]
    assert all(r["crcs"] == want for r in results)
    assert entries(cache) and all(entry_ok(p) for p in entries(cache))
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]  # no temporary file left behind
    after = reader_result(run_reader(ds.location.url, opts, cache, 6, 8))
    assert after["crcs"] == want and after["requests"] == 0


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.slow
def test_dataloader_workers_read_through_the_disk_cache(lakes, s3_server, tmp_path, context):
    torch = pytest.importorskip("torch")
    from .test_dataloader import loader_multiset, single_process_multiset

    torch.set_num_threads(1)
    ds, raw = lakes["raw"]
    with LatencyProxy(s3_server.endpoint) as proxy:
        s3 = open_s3(ds, proxy.storage_options(s3_server.storage_options), cache_dir=tmp_path / "cache")
        segs = s3.segments(el.Window(5, pad="suffix", stride=2))
        want = single_process_multiset(segs)  # the parent fills the cache (through TensorStore's kvstore)
        proxy.reset()
        batches, got = loader_multiset(segs, context, shuffle=True)
        tensor_gets = [line for line, _ in proxy.log if "/tensors/" in line]
    assert got == want
    by_id = raw_by_id(s3, raw)
    for batch in batches:
        check_batch(batch, by_id, 5)
    assert tensor_gets == []  # the workers read every tensor byte from the node's cache


def test_forked_workers_fill_a_cold_cache(lakes, s3_server, tmp_path):
    torch = pytest.importorskip("torch")
    from .test_dataloader import loader_multiset

    torch.set_num_threads(1)
    ds, raw = lakes["zstd"]
    s3 = open_s3(ds, s3_server.storage_options, cache_dir=tmp_path / "cache")
    s3.segment_stream(2, batch_size=2, seed=0).__iter__().__next__()  # TensorStore runs: fork
    segs = s3.segments(el.Window(4, pad="suffix", stride=3))
    batches, _ = loader_multiset(segs, "fork")
    by_id = raw_by_id(s3, raw)
    for batch in batches:
        check_batch(batch, by_id, 4)
    cached = entries(tmp_path / "cache")
    assert len(cached) > 2 and all(entry_ok(p) for p in cached)


def test_cache_dir_is_ignored_for_local_datasets_and_memory_bound_keeps_working(lakes, tmp_path):
    ds, raw = make_dataset(str(tmp_path / "local"))
    local = el.Dataset.open(ds.location.url, read_only=True, cache_dir=tmp_path / "cache", cache_bytes=1 << 20)
    check_batch(next(iter(local.segment_stream(L, batch_size=B, seed=0))), raw_by_id(local, raw), L)
    assert not (tmp_path / "cache").exists()
    assert local.location.read_cache is None and fetch.fetcher(local.location).caching is False


def test_a_dataset_recreated_at_the_same_url_never_reads_the_old_entries(s3_server, s3_url, tmp_path, monkeypatch):
    import secrets

    from .conftest import robot_schema
    from .reference import random_episode

    # the same writer number both times, so both incarnations write the same object paths
    monkeypatch.setattr(secrets, "randbelow", lambda n: 12345)
    opts = s3_server.storage_options
    cache = tmp_path / "cache"
    for seed in (1, 2):  # same URL, same shapes, other values: the second must not be served the first's bytes
        raw = [random_episode(np.random.default_rng(seed * 100 + i), 12) for i in range(6)]
        ds = el.Dataset.create(robot_schema(), s3_url, storage_options=opts, overwrite=True)
        ds.append_episodes([ep.as_dict(unwrap_action=True) for ep in raw])
        ds.flush()
        s3 = open_s3(ds, opts, cache_dir=cache)
        stream = iter(s3.segment_stream(L, batch_size=B, seed=0, prefetch=0))
        for _ in range(3):
            check_batch(next(stream), raw_by_id(s3, raw), L)


def test_prefetch_builds_several_batches_at_once(lakes, s3_server):
    """Two builds must meet at a barrier inside batch assembly: only concurrent builds get past it."""
    ds, raw = lakes["raw"]
    barrier = threading.Barrier(2, timeout=600)

    def meet(x: np.ndarray) -> np.ndarray:
        barrier.wait()
        return x

    s3 = open_s3(ds, s3_server.storage_options)
    stream = s3.segment_stream(L, batch_size=B, seed=0, prefetch=2, transform={"observation/camera": meet})
    batches = iter(stream)
    by_id = raw_by_id(s3, raw)
    for _ in range(4):
        check_batch(next(batches), by_id, L)
    barrier.abort()  # a build still waiting for a partner ends now
    stream.close()
