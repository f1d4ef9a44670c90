"""Segment index, SegmentDataset and SegmentStream against the naive NumPy reference."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.sampling.segment_index import SegmentIndex

from .conftest import robot_schema
from .reference import expected_all_obs, expected_segment, random_episode, segment_starts

LENGTHS = [1, 2, 3, 5, 8, 9, 13, 17, 24, 31, 40, 6, 2, 19]


def make_dataset(path, compression=None, writers=1, storage_options=None):
    """Episodes with LENGTHS (several shorter than the tested sequence lengths), optionally split over writers."""
    rng = np.random.default_rng(7)
    raw = [random_episode(rng, n) for n in LENGTHS]
    schema = robot_schema()
    if compression:
        schema = el.DatasetSchema(
            [
                el.FieldSpec(
                    f.name,
                    f.shape,
                    f.dtype,
                    role=f.role,
                    layout=f.layout,
                    storage=f.storage,
                    chunk_rows=f.chunk_rows,
                    compression=compression if f.storage == "tensor" else None,
                )
                for f in schema
            ]
        )
    ds = el.Dataset.create(schema, path, commit_episodes=4, storage_options=storage_options)
    parts = np.array_split(np.arange(len(raw)), writers)
    for i, part in enumerate(parts):
        handle = ds if i == 0 else el.Dataset.open(path, storage_options=storage_options)
        for k in range(0, len(part), 4):  # groups of commit_episodes: several commits (arrays) per writer
            handle.append_episodes([raw[j].as_dict(unwrap_action=True) for j in part[k : k + 4]])
        handle.flush()
    ds.refresh()
    return ds, raw


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return make_dataset(str(tmp_path_factory.mktemp("sampling") / "ds"), writers=2)


@pytest.fixture(scope="module")
def zstd_lake():
    return make_dataset(None, compression="zstd")


def raw_by_id(ds, raw):
    return {ds.episode(i).episode_id: raw[i] for i in range(len(raw))}


def check_batch(batch, by_id, L):
    """Every item of a batch equals the reference window of its episode at its start."""
    assert batch.time_axis == 1 and len(batch) == L
    for b in range(batch.mask.shape[0]):
        ep = by_id[int(batch.episode_id[b])]
        first = int(batch.start[b])
        want = expected_segment(ep, 0, L, pad="prefix") if first < 0 else expected_segment(ep, first, L)
        for key in ("mask", "terminated", "truncated", "reward"):
            np.testing.assert_array_equal(getattr(batch, key)[b], want[key], err_msg=key)
        np.testing.assert_array_equal(batch.action[b], want["action/action"])
        mask = want["mask"]
        for name, arr in expected_all_obs(ep, first, L).items():
            np.testing.assert_array_equal(batch.all_obs[name][b], arr)
            np.testing.assert_array_equal(batch.obs[name][b][mask], want[f"obs/{name}"][mask])
            np.testing.assert_array_equal(batch.next_obs[name][b][mask], want[f"next_obs/{name}"][mask])
        assert batch.meta["task"][b] == ep.meta["task"]
        assert batch.meta["success"][b] == ep.meta["success"]


def starts_of(batch):
    return list(zip(batch.episode_id.tolist(), batch.start.tolist(), strict=True))


def reference_ids(ds, raw, keep, L, pad, stride):
    """(episode_id, start) of every reference segment over the episodes ``keep`` selects."""
    ids = [ds.episode(i).episode_id for i in range(len(raw)) if keep(raw[i])]
    lengths = [raw[i].length for i in range(len(raw)) if keep(raw[i])]
    return [(ids[e], s) for e, s in segment_starts(lengths, L, pad, stride)]


# ---- the index alone


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), max_size=25),
    L=st.integers(1, 12),
    pad=st.sampled_from(["suffix", "prefix", None]),
    stride=st.integers(1, 5),
    world=st.integers(1, 4),
)
def test_index_matches_reference_and_shards_partition(lengths, L, pad, stride, world):
    ref = segment_starts(lengths, L, pad, stride)
    positions = np.arange(len(lengths)) * 3 + 1  # arbitrary snapshot positions
    seen = []
    for rank in range(world):
        idx = SegmentIndex(positions, np.array(lengths, dtype=np.int64), L, pad, stride, shard=(rank, world))
        assert len(idx) == len(ref[rank::world])
        k, first = idx.locate(np.arange(len(idx)))
        got = list(zip((positions[k] - 1) // 3, first, strict=True))
        assert got == ref[rank::world]
        seen += got
    assert sorted(seen) == sorted(ref)  # disjoint and covering


def test_weighted_index_frequencies_follow_episode_weights():
    lengths = np.array([10, 3, 20, 0, 7])
    idx = SegmentIndex(np.arange(5), lengths, 4, pad="suffix")
    weights = np.array([1.0, 5.0, 0.0, 2.0, 0.5])
    mass = idx.episode_weights_table(weights)
    k, _ = idx.locate(idx.sample_weighted(np.random.default_rng(0), 200_000, mass))
    counts = np.array([len(range(0, n - 3)) if n >= 4 else int(n > 0) for n in lengths])
    expect = weights * counts / (weights * counts).sum()
    freq = np.bincount(k, minlength=5) / len(k)
    np.testing.assert_allclose(freq, expect, atol=0.005)
    assert freq[2] == 0


def test_index_rejects_bad_arguments():
    with pytest.raises(el.ValidationError, match="pad"):
        SegmentIndex(np.arange(2), np.array([3, 4]), 2, pad="middle")
    with pytest.raises(el.ValidationError, match="sequence_length"):
        SegmentIndex(np.arange(2), np.array([3, 4]), 0)
    with pytest.raises(el.ValidationError, match="rank"):
        SegmentIndex(np.arange(2), np.array([3, 4]), 2, shard=(2, 2))
    idx = SegmentIndex(np.arange(2), np.array([3, 4]), 2)
    with pytest.raises(IndexError, match="out of range"):
        idx.locate(np.array([len(idx)]))
    with pytest.raises(el.ValidationError, match="weight"):
        idx.episode_weights_table(np.array([1.0, -1.0]))


# ---- SegmentDataset


@pytest.mark.parametrize("pad", ["suffix", "prefix", None])
@pytest.mark.parametrize("L", [1, 4, 9])
def test_every_segment_matches_reference(lake, pad, L):
    ds, raw = lake
    segs = ds.segments(el.Window(L, pad=pad))
    want = reference_ids(ds, raw, lambda e: True, L, pad, 1)
    assert len(segs) == len(want)
    batch = segs.__getitems__(list(range(len(segs))))
    assert starts_of(batch) == want
    check_batch(batch, raw_by_id(ds, raw), L)


def test_single_items_and_collate_match_batched_read(lake):
    ds, raw = lake
    segs = ds.segments(el.Window(6, pad="prefix", stride=2))
    ids = [0, 3, len(segs) - 1, -1]
    items = [segs[i] for i in ids]
    batch = segs.collate(items)
    assert starts_of(batch) == starts_of(segs.__getitems__([i % len(segs) for i in ids]))
    check_batch(batch, raw_by_id(ds, raw), 6)
    one = items[0]
    assert one.time_axis == 0 and one.obs.state.shape == (6, 5) and one.all_obs.camera.shape == (7, 3, 8, 8)
    assert isinstance(one.meta["task"], str) and isinstance(one.episode_id, int)
    with pytest.raises(IndexError):
        segs[len(segs)]


def test_pickled_dataset_reads_the_same(lake):
    ds, _ = lake
    segs = ds.segments(5)
    clone = pickle.loads(pickle.dumps(segs))
    ids = list(range(0, len(segs), 3))
    a, b = segs.__getitems__(ids), clone.__getitems__(ids)
    for key, arr in a.buffers().items():
        np.testing.assert_array_equal(b.buffers()[key], arr, err_msg=key)


def test_compressed_tensors_read_through_tensorstore(zstd_lake):
    ds, raw = zstd_lake
    segs = ds.segments(el.Window(7, pad="suffix"))
    batch = segs.__getitems__(list(range(len(segs))))
    assert starts_of(batch) == reference_ids(ds, raw, lambda e: True, 7, "suffix", 1)
    check_batch(batch, raw_by_id(ds, raw), 7)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    L=st.integers(1, 12),
    pad=st.sampled_from(["suffix", "prefix", None]),
    stride=st.integers(1, 4),
    world=st.integers(1, 3),
    view=st.sampled_from(["all", "where", "filter", "view"]),
)
def test_views_and_shards_match_reference(lake, L, pad, stride, world, view):
    ds, raw = lake
    keep, source, kwargs = (lambda e: True), ds, {}
    if view == "where":
        keep, kwargs = (lambda e: e.meta["task"] == "pick"), {"where": "task = 'pick'"}
    elif view == "filter":
        keep, kwargs = (lambda e: e.meta["success"]), {"filter": lambda ref: ref.meta["success"]}
    elif view == "view":
        keep, source = (lambda e: e.length >= 5), ds.where("length >= 5")
    want = reference_ids(ds, raw, keep, L, pad, stride)
    got = []
    for rank in range(world):
        segs = source.segments(el.Window(L, pad=pad, stride=stride), shard=(rank, world), **kwargs)
        assert len(segs) == len(want[rank::world])
        if len(segs):
            batch = segs.__getitems__(list(range(len(segs))))
            assert starts_of(batch) == want[rank::world]
            check_batch(batch, raw_by_id(ds, raw), L)
            got += starts_of(batch)
    assert sorted(got) == sorted(want)


# ---- SegmentStream


def take(stream, n):
    return [next(stream) for _ in range(n)]


def test_random_stream_batches_match_reference_and_are_seeded(lake):
    ds, raw = lake
    by_id = raw_by_id(ds, raw)
    valid = set(reference_ids(ds, raw, lambda e: True, 8, "suffix", 1))
    a = take(ds.segment_stream(8, batch_size=16, seed=3), 6)
    b = take(ds.segment_stream(8, batch_size=16, seed=3, prefetch=0), 6)
    c = take(ds.segment_stream(8, batch_size=16, seed=4), 6)
    for x, y in zip(a, b, strict=True):
        assert starts_of(x) == starts_of(y)
        check_batch(x, by_id, 8)
        assert set(starts_of(x)) <= valid
    assert [starts_of(x) for x in a] != [starts_of(x) for x in c]


def test_ordered_pass_is_finite_and_in_segment_order(lake):
    ds, raw = lake
    want = reference_ids(ds, raw, lambda e: True, 5, None, 2)
    stream = ds.segment_stream(el.Window(5, pad=None, stride=2), batch_size=7, sampler=el.Sequential())
    batches = list(stream)
    assert len(batches) == len(stream) == -(-len(want) // 7)
    assert [s for b in batches for s in starts_of(b)] == want
    check_batch(batches[-1], raw_by_id(ds, raw), 5)
    dropped = list(
        ds.segment_stream(el.Window(5, pad=None, stride=2), batch_size=7, sampler=el.Sequential(), drop_last=True)
    )
    assert len(dropped) == len(want) // 7


def test_shuffled_pass_without_replacement_covers_each_segment_once(lake):
    ds, raw = lake
    want = reference_ids(ds, raw, lambda e: True, 4, "prefix", 1)
    got = [
        s
        for b in ds.segment_stream(
            el.Window(4, pad="prefix"), batch_size=10, sampler=el.Uniform(replacement=False), seed=1
        )
        for s in starts_of(b)
    ]
    assert sorted(got) == sorted(want) and got != want


def test_stream_shards_are_disjoint_and_cover(lake):
    ds, raw = lake
    want = reference_ids(ds, raw, lambda e: True, 3, "suffix", 1)
    got = []
    for rank in range(3):
        got += [
            s
            for b in ds.segment_stream(3, batch_size=8, sampler=el.Sequential(), shard=(rank, 3))
            for s in starts_of(b)
        ]
    assert sorted(got) == sorted(want) and len(got) == len(set(got))


class CountingSampler:
    """Picks ids in a seeded random order and can save/restore its state."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def sample(self, index, batch_size):
        return self.rng.integers(len(index), size=batch_size)

    def state_dict(self):
        return self.rng.bit_generator.state

    def load_state_dict(self, state):
        self.rng.bit_generator.state = state


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prefetch": 0},
        {"prefetch": 3},
        {"sampler": el.Uniform(replacement=False), "prefetch": 2},
        {"sampler": el.Sequential()},
        {"sampler": el.Weighted(np.linspace(0.0, 2.0, len(LENGTHS)))},
        {"sampler": "counting"},
    ],
    ids=["random", "random-prefetch", "permutation", "ordered", "weighted", "sampler"],
)
def test_state_dict_resumes_exactly(lake, kwargs):
    ds, _ = lake

    def make():
        kw = dict(kwargs)
        if kw.get("sampler") == "counting":
            kw["sampler"] = CountingSampler(5)
        return ds.segment_stream(4, batch_size=5, seed=11, **kw)

    first = make()
    take(first, 3)
    state = first.state_dict()
    rest = [starts_of(b) for b in take(first, 4)]
    resumed = make()
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert [starts_of(b) for b in take(resumed, 4)] == rest
    first.load_state_dict(state)  # rewinding the same (prefetching) stream works too
    assert [starts_of(b) for b in take(first, 4)] == rest
    first.close()


def test_state_dict_of_another_stream_is_rejected(lake):
    ds, _ = lake
    a = ds.segment_stream(4, batch_size=5, seed=1)
    b = ds.segment_stream(6, batch_size=5, seed=1)
    with pytest.raises(el.ValidationError, match="segments"):
        b.load_state_dict(a.state_dict())


def test_sql_where_and_weights_select_episodes(lake):
    ds, raw = lake
    by_id = raw_by_id(ds, raw)
    picks = ds.segment_stream(4, batch_size=32, seed=0, where="task = 'pick'")
    weighted = ds.segment_stream(
        4, batch_size=32, seed=0, sampler=el.Weighted("CASE WHEN success THEN 1.0 ELSE 0.0 END")
    )
    for _ in range(3):
        b = next(picks)
        assert {by_id[int(e)].meta["task"] for e in b.episode_id} == {"pick"}
        check_batch(b, by_id, 4)
        w = next(weighted)
        assert all(by_id[int(e)].meta["success"] for e in w.episode_id)
    zero = np.zeros(len(raw))
    zero[3] = 1.0
    only = ds.segment_stream(2, batch_size=20, seed=0, sampler=el.Weighted(zero), where="length > 2")
    assert set(next(only).episode_id.tolist()) == {ds.episode(3).episode_id}


def test_custom_sampler_ids_pick_those_segments(lake):
    ds, _raw = lake

    class Fixed:
        def sample(self, index, batch_size):
            return np.arange(batch_size) * 2

    stream = ds.segment_stream(3, batch_size=6, sampler=Fixed(), prefetch=0)
    segs = ds.segments(3)
    assert starts_of(next(stream)) == starts_of(segs.__getitems__(list(range(0, 12, 2))))


def test_context_target_split_views(lake):
    ds, raw = lake
    stream = ds.segment_stream(el.Window(context=3, target=5), batch_size=8, seed=2)
    b = next(stream)
    assert len(b) == 8
    check_batch(b, raw_by_id(ds, raw), 8)
    ctx, tgt = b.context, b.target
    assert ctx.obs.camera.shape == (8, 3, 3, 8, 8) and tgt.obs.camera.shape == (8, 5, 3, 8, 8)
    np.testing.assert_array_equal(ctx.obs.state, b.obs.state[:, :3])
    np.testing.assert_array_equal(tgt.next_obs.state, b.next_obs.state[:, 3:])
    np.testing.assert_array_equal(ctx.next_obs.state[:, -1], tgt.obs.state[:, 0])
    np.testing.assert_array_equal(tgt.mask, b.mask[:, 3:])
    np.testing.assert_array_equal(tgt.start, b.start + 3)
    assert np.shares_memory(ctx.obs.camera, b.all_obs.camera) and np.shares_memory(tgt.obs.camera, b.all_obs.camera)
    mapped = b.map(np.copy)
    np.testing.assert_array_equal(mapped.target.action, tgt.action)
    with pytest.raises(AttributeError, match="context_length"):
        _ = next(ds.segment_stream(4, batch_size=2, seed=0)).context


def test_held_batches_are_never_overwritten(lake):
    ds, _raw = lake
    stream = ds.segment_stream(6, batch_size=8, seed=9, prefetch=2)
    held = [next(stream) for _ in range(3)]
    copies = [{k: np.copy(v) for k, v in b.buffers().items()} for b in held]
    cam = held[0].obs.camera  # a view alone keeps its buffer alive
    cam_copy = cam.copy()
    del held[0]
    for _ in range(12):
        next(stream)
    for b, c in zip(held, copies[1:], strict=True):
        for k, v in b.buffers().items():
            np.testing.assert_array_equal(v, c[k])
    np.testing.assert_array_equal(cam, cam_copy)


def test_short_episodes_and_bad_arguments(lake):
    ds, raw = lake
    longest = max(LENGTHS)
    assert len(ds.segments(el.Window(longest + 1, pad=None))) == 0
    assert len(ds.segments(longest + 1)) == len(raw)  # one padded segment per episode
    with pytest.raises(el.ValidationError, match="no segments"):
        ds.segment_stream(el.Window(longest + 1, pad=None))
    with pytest.raises(el.ValidationError, match="give both context and target"):
        ds.segment_stream(el.Window(context=3))
    with pytest.raises(el.ValidationError, match="sampler"):
        ds.segment_stream(3, sampler=object())
    with pytest.raises(el.ValidationError, match="batch_size"):
        ds.segment_stream(3, batch_size=0)
    with pytest.raises(el.ValidationError, match="weights"):
        ds.segment_stream(3, sampler=el.Weighted(np.ones(2)))


def test_uniform_sampling_is_uniform_over_segments(lake):
    ds, raw = lake
    stream = ds.segment_stream(10, batch_size=512, seed=0, prefetch=0)
    counts = Counter(s for _ in range(40) for s in starts_of(next(stream)))
    want = reference_ids(ds, raw, lambda e: True, 10, "suffix", 1)
    assert set(counts) == set(want)
    freq = np.array([counts[s] for s in want]) / sum(counts.values())
    np.testing.assert_allclose(freq, 1 / len(want), atol=0.25 / len(want) + 0.003)


def test_corrupt_chunks_are_reported(tmp_path):
    import glob
    from pathlib import Path

    path = str(tmp_path / "ds")
    make_dataset(path)
    chunk = Path(sorted(glob.glob(f"{path}/tensors/*/observation/camera/c/0/0/0/0"))[0])
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF  # same size, one flipped byte in episode 0's first rows
    chunk.write_bytes(bytes(data))
    with pytest.raises(el.CorruptionError, match="CRC"):
        el.Dataset.open(path, verify=True).segments(3).__getitems__([0])
    assert len(el.Dataset.open(path).segments(3).__getitems__([0]).episode_id) == 1  # unverified reads go on
    chunk.write_bytes(bytes(data[:-7]))  # truncated chunk file
    with pytest.raises(el.CorruptionError, match="chunk file"):
        el.Dataset.open(path).segments(3).__getitems__([0])


def test_object_storage_sampling_reads_sharded_tensors(s3_server, s3_url):
    ds, raw = make_dataset(s3_url, writers=2, storage_options=s3_server.storage_options)
    segs = ds.segments(el.Window(6, pad="prefix"))
    batch = segs.__getitems__(list(range(len(segs))))
    assert starts_of(batch) == reference_ids(ds, raw, lambda e: True, 6, "prefix", 1)
    check_batch(batch, raw_by_id(ds, raw), 6)
