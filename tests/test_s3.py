"""Datasets on a real local S3 server (SeaweedFS): round trip, sharding, conditional PUT, concurrency, cache."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import s3fs
import tensorstore as ts
from deltalake import DeltaTable, write_deltalake

import episodelake as el
from episodelake.storage.arrays import split_ref
from episodelake.storage.location import resolve

from .conftest import robot_schema
from .reference import RawEpisode, expected_segment, random_episode
from .workers.common import write_stepwise as collect


def make_episodes(seed: int, n: int) -> list[RawEpisode]:
    rng = np.random.default_rng(seed)
    return [random_episode(rng, int(rng.integers(1, 40))) for _ in range(n)]


def assert_episode(ref: el.EpisodeRef, raw: RawEpisode) -> None:
    """``ref`` reads back exactly ``raw`` (reference computed from the generated arrays)."""
    seg = ref.read()
    want = expected_segment(raw, 0, raw.length)
    for k in raw.obs:
        np.testing.assert_array_equal(seg.obs[k], want[f"obs/{k}"])
        np.testing.assert_array_equal(seg.next_obs[k], want[f"next_obs/{k}"])
    np.testing.assert_array_equal(seg.action, want["action/action"])
    np.testing.assert_array_equal(seg.reward, want["reward"])
    np.testing.assert_array_equal(seg.terminated, want["terminated"])
    np.testing.assert_array_equal(seg.truncated, want["truncated"])
    assert seg.meta == raw.meta


def s3_metrics() -> dict[str, int]:
    """TensorStore's cumulative S3 request counters (process-wide)."""
    out = {}
    for m in ts.experimental_collect_matching_metrics("/tensorstore/kvstore/s3/"):
        if m["values"] and "value" in m["values"][0]:
            out[m["name"].rsplit("/", 1)[1]] = int(m["values"][0]["value"])
    return out


def metrics_delta(before: dict[str, int]) -> dict[str, int]:
    after = s3_metrics()
    return {k: after.get(k, 0) - before.get(k, 0) for k in ("read", "bytes_read", "write")}


@pytest.fixture
def s3_dataset(s3_server, s3_url):
    """12 reference episodes on S3 in two commits: 6 collected step by step, 6 appended in dict form."""
    eps = make_episodes(7, 12)
    ds = el.Dataset.create(robot_schema(), s3_url, storage_options=s3_server.storage_options, partition_by=["task"])
    for raw in eps[:6]:
        collect(ds, raw)
    ds.flush()
    ds.append_episodes(e.as_dict(unwrap_action=True) for e in eps[6:])
    ds.flush()
    return ds, eps


def test_round_trip_on_s3(s3_server, s3_dataset, tmp_path):
    ds, eps = s3_dataset
    opts = s3_server.storage_options
    again = el.Dataset.open(ds.location.url, storage_options=opts)
    assert len(again) == 12 and again.version == ds.version
    for i, raw in enumerate(eps):
        assert_episode(again.episode(i), raw)

    first = el.Dataset.open(ds.location.url, version=ds.version - 1, storage_options=opts)  # time travel
    assert len(first) == 6
    for i, raw in enumerate(eps[:6]):
        assert_episode(first.episode(i), raw)

    tasks = [e.meta["task"] for e in eps]
    rows = again.sql("select task, count(*), sum(length) from episodes group by task order by task").fetchall()
    assert rows == [(t, tasks.count(t), sum(e.length for e in eps if e.meta["task"] == t)) for t in sorted(set(tasks))]

    picks = again.where("task = 'pick'")
    expected = [raw for raw in eps if raw.meta["task"] == "pick"]
    assert len(picks) == len(expected)
    for i, raw in enumerate(expected):
        assert_episode(picks.episode(i), raw)

    local = again.copy_to(str(tmp_path / "local"), progress=False)
    assert local.location.is_local and len(local) == 12
    for i, raw in enumerate(eps):
        assert_episode(el.Dataset.open(str(tmp_path / "local")).episode(i), raw)


def test_zarr_python_reads_the_sharded_tensors(s3_server, s3_dataset):
    zarr = pytest.importorskip("zarr")
    ds, eps = s3_dataset
    snap = ds.snapshot()
    fs = s3fs.S3FileSystem(asynchronous=True, **s3_server.storage_options)
    arrays = {}
    for i, raw in enumerate(eps):
        writer = str(snap.index["writer"][i])
        commit, start = split_ref(snap.index["ref/observation/camera"][i])
        if (writer, commit) not in arrays:
            path = f"{ds.location.path}/tensors/{writer}/{commit}/observation/camera"
            array = zarr.open_array(zarr.storage.FsspecStore(fs, path=path, read_only=True), mode="r")
            assert array.metadata.codecs[0].__class__.__name__ == "ShardingCodec"
            arrays[(writer, commit)] = array
        np.testing.assert_array_equal(arrays[(writer, commit)][start : start + raw.length + 1], raw.obs["camera"])


def test_each_commit_writes_its_own_array(s3_server, s3_url):
    """A second commit writes a new array sized to its rows and never reads back (or rewrites) the first."""
    eps = make_episodes(3, 8)
    ds = el.Dataset.create(robot_schema(), s3_url, storage_options=s3_server.storage_options)
    ds.append_episodes(e.as_dict(unwrap_action=True) for e in eps[:4])
    ds.flush()
    first_bytes = sum(e.obs["camera"].nbytes for e in eps[:4])
    before = s3_metrics()
    ds.append_episodes(e.as_dict(unwrap_action=True) for e in eps[4:])
    ds.flush()
    delta = metrics_delta(before)
    assert delta["bytes_read"] < first_bytes // 4  # metadata only, not the first shard
    snap = ds.snapshot()
    refs = snap.index["ref/observation/camera"]
    assert [split_ref(r) for r in refs[[0, 4]]] == [(1, 0), (2, 0)]
    fs = s3fs.S3FileSystem(**s3_server.storage_options)
    writer = snap.index["writer"][0]
    for commit, part in ((1, eps[:4]), (2, eps[4:])):
        shards = fs.find(f"{ds.location.path}/tensors/{writer}/{commit}/observation/camera/c")
        assert len(shards) == 1  # a commit smaller than SHARD_CHUNKS chunks is one object
        array = ts.open(
            {
                "driver": "zarr3",
                "kvstore": resolve(ds.location.url, s3_server.storage_options).kvstore(
                    "tensors", writer, str(commit), "observation", "camera"
                ),
            }
        ).result()
        assert array.shape[0] == sum(e.length + 1 for e in part)
    for i, raw in enumerate(eps):
        assert_episode(ds.episode(i), raw)


def test_commit_never_overwrites_a_log_entry(s3_server, s3_url):
    """Conditional PUT: a writer holding a stale version cannot replace the entry another writer made."""
    loc = resolve(s3_url, s3_server.storage_options)
    uri, opts = loc.delta_uri(), loc.delta_options()
    write_deltalake(uri, _rows(0), storage_options=opts)
    stale = DeltaTable(uri, storage_options=opts)
    write_deltalake(DeltaTable(uri, storage_options=opts), _rows(1), mode="append")
    entry = f"{loc.path}/episodes/_delta_log/{1:020d}.json"
    fs = s3fs.S3FileSystem(**s3_server.storage_options)
    original = fs.cat(entry)
    write_deltalake(stale, _rows(2), mode="append")
    assert fs.cat(entry) == original
    final = DeltaTable(uri, storage_options=opts)
    assert final.version() == 2
    assert sorted(final.to_pyarrow_table()["x"].to_pylist()) == [0, 1, 2]


def _rows(x: int):
    import pyarrow as pa

    return pa.table({"x": [x]})


def _append_worker(url: str, opts: dict, seed: int, n: int, barrier) -> None:
    ds = el.Dataset.open(url, storage_options=opts, commit_episodes=1)
    eps = make_episodes(seed, n)
    barrier.wait(timeout=600)
    for e in eps:  # one append per episode: with commit_episodes=1 each is its own (racing) commit
        ds.append_episodes([e.as_dict(unwrap_action=True)])
    ds.flush()


@pytest.mark.slow
def test_two_writer_processes_append_concurrently(s3_server, s3_url):
    opts = s3_server.storage_options
    el.Dataset.create(robot_schema(), s3_url, storage_options=opts)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    n = 6
    procs = [ctx.Process(target=_append_worker, args=(s3_url, opts, 100 + i, n, barrier)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    assert [p.exitcode for p in procs] == [0, 0]
    ds = el.Dataset.open(s3_url, storage_options=opts)
    assert len(ds) == 2 * n and ds.version == 2 * n  # one commit per episode, none lost
    assert len(set(ds.episode_ids.tolist())) == 2 * n
    raw = {e.obs["state"][0].tobytes(): e for seed in (100, 101) for e in make_episodes(seed, n)}
    seen = set()
    for ref in ds.episodes():
        key = ref.read().obs["state"][0].tobytes()
        assert key in raw and key not in seen  # each written episode exactly once
        seen.add(key)
        assert_episode(ref, raw[key])


def test_chunk_cache_serves_repeated_reads_without_gets(s3_server, s3_dataset):
    ds, eps = s3_dataset
    cached = el.Dataset.open(ds.location.url, storage_options=s3_server.storage_options, cache_bytes=64 << 20)
    plain = el.Dataset.open(ds.location.url, storage_options=s3_server.storage_options)
    for d in (cached, plain):
        for i, raw in enumerate(eps):
            assert_episode(d.episode(i), raw)  # first pass: fills the cache
    before = s3_metrics()
    for i, raw in enumerate(eps):
        assert_episode(cached.episode(i), raw)
    assert metrics_delta(before)["read"] == 0
    before = s3_metrics()
    for i in range(len(eps)):
        plain.episode(i).read()
    assert metrics_delta(before)["read"] >= len(eps)


def test_segment_stream_on_s3(s3_server, s3_dataset):
    ds, eps = s3_dataset
    again = el.Dataset.open(ds.location.url, storage_options=s3_server.storage_options, read_only=True)
    by_id = dict(zip(again.episode_ids.tolist(), eps, strict=True))
    stream = iter(again.segment_stream(5, batch_size=8, seed=0))
    for _ in range(3):
        batch = next(stream)
        for b in range(8):
            raw = by_id[int(batch.episode_id[b])]
            want = expected_segment(raw, int(batch.start[b]), 5)
            np.testing.assert_array_equal(batch.mask[b], want["mask"])
            np.testing.assert_array_equal(batch.obs.camera[b], want["obs/camera"])
            np.testing.assert_array_equal(batch.next_obs.state[b], want["next_obs/state"])
            np.testing.assert_array_equal(batch.reward[b], want["reward"])


def test_wrong_credentials_fail_and_create_nothing(s3_server, s3_url):
    bad = {**s3_server.storage_options, "secret": "wrong"}
    with pytest.raises(PermissionError):
        el.Dataset.create(robot_schema(), s3_url, storage_options=bad)
    assert not s3fs.S3FileSystem(**s3_server.storage_options).exists(s3_url[len("s3://") :])
