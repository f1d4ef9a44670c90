"""Warm local sampling (issue 25.2): rows announced to the kernel once, large batches copied by threads.

Every batch is checked against the generated episodes (a naive NumPy window
of each), never against the reader under test.
"""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.read import batching

L = 24
LENGTHS = [40, 7, 90, 33, 120, 61, 25, 88, 12, 70]
CAM = (3, 32, 32)  # 3 KiB a row: a batch of 64 x 25 rows is ~4.9 MB, above PARALLEL_BYTES


def make_episode(i: int, n: int) -> dict:
    rng = np.random.default_rng([11, i])
    return {
        "initial_observation": {
            "state": rng.standard_normal(3, dtype=np.float32),
            "camera": rng.integers(0, 256, CAM, dtype=np.uint8),
        },
        "observations": {
            "state": rng.standard_normal((n, 3), dtype=np.float32),
            "camera": rng.integers(0, 256, (n, *CAM), dtype=np.uint8),
        },
        "actions": rng.standard_normal((n, 2), dtype=np.float32),
        "rewards": rng.standard_normal(n, dtype=np.float32),
        "terminated": True,
    }


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    schema = el.DatasetSchema(
        [
            el.FieldSpec("state", (3,), "float32"),
            el.FieldSpec("camera", CAM, "uint8", layout="CHW", storage="tensor", chunk_rows=50),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    path = str(tmp_path_factory.mktemp("warm") / "ds")
    eps = [make_episode(i, n) for i, n in enumerate(LENGTHS)]
    ds = el.Dataset.create(schema, path)
    ds.append_episodes(eps)
    ds.flush()
    ds = el.Dataset.open(path, read_only=True)
    for ep in eps:  # the reference frames of each episode: initial observation, then one per step
        ep["frames"] = np.concatenate([ep["initial_observation"]["camera"][None], ep["observations"]["camera"]])
    by_id = {ds.episode(i).episode_id: eps[i] for i in range(len(ds))}
    return path, by_id


@pytest.fixture(scope="module")
def segments(lake):
    return el.Dataset.open(lake[0], read_only=True).segments(L)


def expected_cameras(ep: dict, start: int) -> np.ndarray:
    """The naive window: observation rows ``start .. start + L`` of the episode, zeros past its end."""
    out = np.zeros((L + 1, *CAM), np.uint8)
    real = ep["frames"][start : start + L + 1]
    out[: len(real)] = real
    return out


def check(batch, by_id: dict) -> None:
    for b in range(len(batch.episode_id)):
        ep, start = by_id[int(batch.episode_id[b])], int(batch.start[b])
        np.testing.assert_array_equal(batch.all_obs.camera[b], expected_cameras(ep, start))
        n = int(batch.mask[b].sum())
        np.testing.assert_array_equal(batch.action[b, :n], ep["actions"][start : start + n])


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), threads=st.integers(1, 4), split_mb=st.sampled_from([1, 4, 64]))
def test_batches_copied_by_any_number_of_threads_equal_the_episodes(lake, segments, seed, threads, split_mb):
    _, by_id = lake
    saved = batching.COPY_THREADS, batching.PARALLEL_BYTES
    batching.COPY_THREADS, batching.PARALLEL_BYTES = threads, split_mb << 20
    try:
        segs = segments
        rng = np.random.default_rng(seed)
        first = segs.__getitems__(rng.integers(0, len(segs), 64))
        kept = first.all_obs.camera.copy()
        check(first, by_id)
        for _ in range(2):  # later batches (copied into pooled buffers) never touch a batch still held
            check(segs.__getitems__(rng.integers(0, len(segs), 64)), by_id)
        np.testing.assert_array_equal(first.all_obs.camera, kept)
    finally:
        batching.COPY_THREADS, batching.PARALLEL_BYTES = saved


def drop_page_cache(root: str) -> None:
    os.sync()
    for d, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def test_rows_read_once_stay_exact_after_the_page_cache_drops_them(lake):
    # the second read of the same rows announces nothing to the kernel: the pages fault in on their own
    path, by_id = lake
    segs = el.Dataset.open(path, read_only=True).segments(L)
    ids = np.arange(0, len(segs), 3)
    check(segs.__getitems__(ids), by_id)
    drop_page_cache(path)
    check(segs.__getitems__(ids), by_id)
    check(segs.__getitems__(ids[::-1]), by_id)


def _child(segs, seed: int, conn) -> None:
    batch = segs.__getitems__(np.random.default_rng(seed).integers(0, len(segs), 64))
    conn.send((batch.episode_id, batch.start, batch.all_obs.camera, batch.action, batch.mask))
    conn.close()


def test_a_forked_child_copies_with_its_own_threads(lake):
    path, by_id = lake
    # the parent copied with threads first: the child must not wait on the parent's pool threads (absent there)
    saved = batching.COPY_THREADS, batching.PARALLEL_BYTES
    batching.COPY_THREADS, batching.PARALLEL_BYTES = 3, 1 << 20
    try:
        segs = el.Dataset.open(path, read_only=True).segments(L)
        check(segs.__getitems__(np.arange(64) % len(segs)), by_id)
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(segs, 5, child))
        proc.start()
        child.close()
        assert parent.poll(120), f"the forked child sent no batch (exit code {proc.exitcode})"
        eid, start, camera, action, mask = parent.recv()
        proc.join(timeout=60)
        assert proc.exitcode == 0
    finally:
        batching.COPY_THREADS, batching.PARALLEL_BYTES = saved
    for b in range(len(eid)):
        ep = by_id[int(eid[b])]
        np.testing.assert_array_equal(camera[b], expected_cameras(ep, int(start[b])))
        n = int(mask[b].sum())
        np.testing.assert_array_equal(action[b, :n], ep["actions"][int(start[b]) : int(start[b]) + n])
