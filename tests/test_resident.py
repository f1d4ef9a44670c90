"""Resident copies of local raw arrays (issue 25.2): warm batches gathered from process memory.

Every batch is checked against the episodes as generated (a naive NumPy
window of each), never against the reader under test; the resident budget,
growth, changed chunk files, eviction and the mapped fallback are each
exercised on their own cache (``batching.resident`` replaced per test).
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.read import batching

from .test_warm_copy import drop_page_cache

L = 6
CAM = (2, 8, 8)  # 128 B a row, 8 rows a chunk: windows cross chunks


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("observation", CAM, "uint8", layout="CHW", storage="tensor", chunk_rows=8),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def episode(k: int, n: int) -> dict:
    frames = np.random.default_rng([7, k]).integers(0, 256, (n + 1, *CAM), dtype=np.uint8)
    return {
        "initial_observation": frames[0],
        "observations": frames[1:],
        "actions": np.arange(n) + 1000 * k,
        "rewards": np.zeros(n, np.float32),
        "terminated": True,
    }


def write(ds: el.Dataset, ks: range, lengths: dict[int, int]) -> None:
    ds.append_episodes(episode(k, lengths[k]) for k in ks)
    ds.flush()


def frames_by_id(path: str, lengths: dict[int, int]) -> dict[int, np.ndarray]:
    """Each episode's frames as generated, by episode id (its actions name its k)."""
    ds = el.Dataset.open(path, read_only=True)
    out = {}
    for i in range(len(ds)):
        ref = ds.episode(i)
        k = int(ref.read().action[0]) // 1000
        out[ref.episode_id] = np.random.default_rng([7, k]).integers(0, 256, (lengths[k] + 1, *CAM), dtype=np.uint8)
    return out


def check(batch, frames: dict[int, np.ndarray]) -> None:
    """Each window equals the episode's frames from its start, zeros outside the episode."""
    for b in range(len(batch.episode_id)):
        ep, start = frames[int(batch.episode_id[b])], int(batch.start[b])
        want = np.zeros((L + 1, *CAM), np.uint8)
        lo, hi = max(start, 0), min(start + L + 1, len(ep))
        want[lo - start : hi - start] = ep[lo:hi]
        np.testing.assert_array_equal(batch.all_obs[b], want)


LENGTHS = {k: L + (7 * k) % 23 for k in range(40)}


def capacity(ks: range) -> int:
    """Bytes of the resident copy of the array holding episodes ``ks``: whole chunks of 8 rows."""
    return -(-sum(LENGTHS[k] + 1 for k in ks) // 8) * 8 * 128


@pytest.fixture
def cache(monkeypatch):
    """A fresh resident cache with room for every array of these tests."""
    fresh = batching.ResidentCache(64 << 20)
    monkeypatch.setattr(batching, "resident", fresh)
    return fresh


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """Two writers' arrays (two datasets objects appending to one path), 20 episodes each."""
    path = str(tmp_path_factory.mktemp("resident") / "ds")
    write(el.Dataset.create(schema(), path), range(20), LENGTHS)
    write(el.Dataset.open(path), range(20, 40), LENGTHS)
    return path, frames_by_id(path, LENGTHS)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One writer's array, 20 episodes."""
    path = str(tmp_path_factory.mktemp("resident-single") / "ds")
    write(el.Dataset.create(schema(), path), range(20), LENGTHS)
    return path, frames_by_id(path, LENGTHS)


def camera_files(ds: el.Dataset) -> list[batching.ChunkFiles]:
    reader = batching.reader_for(ds.snapshot())
    tf = reader._tensor["observation"]
    return [s for s in tf.sources(np.arange(len(tf.arrays)), reader.nrows(tf.field)).values()]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    pad=st.sampled_from([None, "suffix", "prefix"]),
    budget=st.sampled_from([0, 1, 2]),  # arrays that fit: none, one of the two writers' (mixed batches), both
    threads=st.integers(1, 3),
    writers=st.sampled_from([1, 2]),
)
def test_batches_equal_the_episodes_whatever_fits(lake, single, seed, pad, budget, threads, writers):
    path, frames = single if writers == 1 else lake
    one = max(capacity(range(20)), capacity(range(20, 40)))  # room for either writer's array, not both
    with pytest.MonkeyPatch.context() as m:
        m.setattr(batching, "resident", batching.ResidentCache([0, one, 64 << 20][budget]))
        m.setattr(batching, "COPY_THREADS", threads)
        m.setattr(batching, "PARALLEL_BYTES", 1 << 10)
        ds = el.Dataset.open(path, read_only=True)
        files = camera_files(ds)
        assert sum(f._resident is not None for f in files) == min(budget, writers)
        assert batching.resident.nbytes <= batching.resident.budget
        segs = ds.segments(el.Window(L, pad=pad))
        rng = np.random.default_rng(seed)
        for _ in range(3):
            check(segs.__getitems__(rng.integers(0, len(segs), 16)), frames)


def test_a_batch_held_is_never_overwritten(lake, cache):
    path, frames = lake
    segs = el.Dataset.open(path, read_only=True).segments(L)
    rng = np.random.default_rng(1)
    first = segs.__getitems__(rng.integers(0, len(segs), 64))
    kept = first.all_obs.copy()
    for _ in range(3):
        check(segs.__getitems__(rng.integers(0, len(segs), 64)), frames)
    np.testing.assert_array_equal(first.all_obs, kept)


def test_appended_rows_are_read_after_refresh_and_the_copy_grows_in_place(tmp_path, cache):
    path = str(tmp_path / "ds")
    writer = el.Dataset.create(schema(), path)
    write(writer, range(5), LENGTHS)
    learner = el.Dataset.open(path)
    stream = learner.segment_stream(L, batch_size=32, seed=0, prefetch=0)
    check(stream.sample(), frames_by_id(path, LENGTHS))
    (entry,) = cache._arrays.values()
    before = entry.capacity
    write(writer, range(5, 30), LENGTHS)  # the last chunk file is rewritten, new chunks appear
    assert stream.refresh()
    frames = frames_by_id(path, LENGTHS)
    seen = set()
    for _ in range(20):
        batch = stream.sample()
        check(batch, frames)
        seen |= set(batch.episode_id.tolist())
    assert len(seen) > 20  # new episodes too, and old ones with rows in the rewritten last chunk
    assert list(cache._arrays.values()) == [entry] and entry.capacity > before
    assert cache.nbytes <= cache.budget


def test_a_changed_chunk_file_is_read_again_by_a_new_reader(tmp_path, cache):
    path = str(tmp_path / "ds")
    write(el.Dataset.create(schema(), path), range(6), LENGTHS)
    frames = frames_by_id(path, LENGTHS)
    segs = el.Dataset.open(path, read_only=True).segments(L)
    every = np.arange(len(segs))
    check(segs.__getitems__(every), frames)
    chunk = sorted(glob.glob(f"{path}/tensors/*/observation/c/*/0/0/0"))[0]
    with open(chunk, "rb") as fh:
        raw = bytearray(fh.read())
    raw[:128] = bytes(255 - b for b in raw[:128])  # row 0, the first episode's first frame, replaced
    with open(chunk + ".new", "wb") as fh:
        fh.write(raw)
    os.replace(chunk + ".new", chunk)
    fresh = el.Dataset.open(path, read_only=True)
    batch = fresh.segments(L).__getitems__(every)
    first = int(np.flatnonzero((batch.start == 0) & (batch.episode_id == fresh.episode(0).episode_id))[0])
    np.testing.assert_array_equal(batch.all_obs[first, 0], 255 - frames[fresh.episode(0).episode_id][0])
    os.truncate(chunk, 100)
    with pytest.raises(el.CorruptionError, match=r"episode \d+: field 'observation'.*holds 100 bytes"):
        el.Dataset.open(path, read_only=True).segments(L).__getitems__(every)
    os.remove(chunk)
    with pytest.raises(el.CorruptionError, match="missing"):
        el.Dataset.open(path, read_only=True).segments(L).__getitems__(every)


def test_an_idle_copy_is_evicted_for_another_and_its_reader_maps_the_files(tmp_path, monkeypatch):
    paths = [str(tmp_path / name) for name in ("a", "b")]
    for p in paths:
        write(el.Dataset.create(schema(), p), range(10), LENGTHS)
    cache = batching.ResidentCache(capacity(range(10)))  # room for one array
    monkeypatch.setattr(batching, "resident", cache)
    monkeypatch.setattr(batching, "RESIDENT_IDLE_S", 0.0)
    a, b = (el.Dataset.open(p, read_only=True).segments(L) for p in paths)
    check(a.__getitems__(np.arange(len(a))), frames_by_id(paths[0], LENGTHS))
    check(b.__getitems__(np.arange(len(b))), frames_by_id(paths[1], LENGTHS))  # evicts a's copy
    assert [key[0] for key in cache._arrays] == [camera_files(el.Dataset.open(paths[1]))[0].directory]
    check(a.__getitems__(np.arange(len(a))[::-1]), frames_by_id(paths[0], LENGTHS))  # mapped again
    assert cache.nbytes <= cache.budget


def test_warm_batches_make_no_system_call_on_the_resident_path(lake, cache, monkeypatch):
    path, frames = lake
    segs = el.Dataset.open(path, read_only=True).segments(L)
    every = np.arange(len(segs))
    check(segs.__getitems__(every), frames)  # every chunk checked once
    calls = []
    monkeypatch.setattr(os, "stat", lambda *a, **k: calls.append(a))
    check(segs.__getitems__(every[::-1]), frames)
    assert calls == []


@pytest.mark.skipif(batching._mincore is None, reason="needs mincore")
def test_cold_rows_are_read_alone_and_cached_chunks_whole(tmp_path, cache):
    path = str(tmp_path / "ds")
    write(el.Dataset.create(schema(), path), range(10), LENGTHS)
    frames = frames_by_id(path, LENGTHS)
    drop_page_cache(path)
    segs = el.Dataset.open(path, read_only=True).segments(L)
    check(segs.__getitems__([3]), frames)
    (entry,) = cache._arrays.values()
    assert entry.filled.sum() == L + 1  # not in the page cache: the window's rows only
    cold = entry.filled.copy()
    for d, _, names in os.walk(path):  # in the page cache again
        for name in names:
            with open(os.path.join(d, name), "rb") as fh:
                fh.read()
    batch = segs.__getitems__([len(segs) - 1])
    check(batch, frames)
    warm = np.flatnonzero(entry.filled & ~cold)
    assert len(warm) > L + 1 and len(warm) % 8 == 0  # whole chunks of 8 rows: each read at once
