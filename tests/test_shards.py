"""Rank-equal shards of finite passes, exact resume (also on a new world size) and state validation.

Reference: every segment enumerated by ``reference.segment_starts`` (naive NumPy/Python), dealt to ranks
the way ``torch.utils.data.DistributedSampler`` does (positions past the end wrap to the start of the
pass, or the tail is dropped), then cut into batches.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

from .reference import segment_starts

POOL_LENGTHS = [3, 1, 7, 12, 5, 9, 2, 16, 4, 11, 6, 8]


def small_schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (2,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("group", (), "int64", role="meta"),
        ]
    )


def episodes(lengths, groups=None):
    rng = np.random.default_rng(3)
    return [
        {
            "observations": {"state": rng.standard_normal((T + 1, 2), dtype=np.float32)},
            "actions": np.arange(T, dtype=np.int64),
            "rewards": rng.standard_normal(T, dtype=np.float32),
            "meta": {"group": i if groups is None else groups[i]},
        }
        for i, T in enumerate(lengths)
    ]


@pytest.fixture(scope="module")
def pool():
    ds = el.Dataset.from_episodes(episodes(POOL_LENGTHS), schema=small_schema())
    ids = [ds.episode(i).episode_id for i in range(len(POOL_LENGTHS))]
    return ds, ids


def run(stream):
    """Every batch of the stream's current pass as a list of (episode_id, start)."""
    return [list(zip(b.episode_id.tolist(), b.start.tolist(), strict=True)) for b in stream]


def drain(stream):
    """The rest of the pass under way (``next`` until StopIteration; a ``for`` loop would start a new pass)."""
    out = []
    while True:
        try:
            b = next(stream)
        except StopIteration:
            return out
        out.append(list(zip(b.episode_id.tolist(), b.start.tolist(), strict=True)))


def reference_batches(seq, world, rank, batch, policy, drop_last, consumed=0):
    """Rank ``rank``'s batches of the pass over ``seq`` from global position ``consumed`` (naive)."""
    n, left = len(seq), len(seq) - consumed
    per_rank = max(-(-left // world) if policy == "wrap" else left // world, 0)
    positions = list(range(consumed, consumed + per_rank * world))  # wrap: past the end -> start of the pass
    mine = [seq[p % n] for p in positions][rank::world]
    out = [mine[i : i + batch] for i in range(0, len(mine), batch)]
    return [b for b in out if len(b) == batch] if drop_last else out


def make(ds, keep_ids, window, **kw):
    kw.setdefault("prefetch", 0)
    return ds.segment_stream(window, filter=lambda ref: ref.episode_id in keep_ids, **kw)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keep=st.lists(st.booleans(), min_size=len(POOL_LENGTHS), max_size=len(POOL_LENGTHS)).filter(any),
    L=st.integers(1, 6),
    pad=st.sampled_from(["suffix", "prefix", None]),
    stride=st.integers(1, 3),
    world=st.integers(1, 5),
    batch=st.integers(1, 6),
    policy=st.sampled_from(["wrap", "drop"]),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    prefetch=st.sampled_from([0, 2]),
    data=st.data(),
)
def test_sharded_passes_are_rank_equal_and_resume_on_any_world(
    pool, keep, L, pad, stride, world, batch, policy, drop_last, shuffle, prefetch, data
):
    ds, ids = pool
    keep_ids = {i for i, k in zip(ids, keep, strict=True) if k}
    lengths = [T for T, k in zip(POOL_LENGTHS, keep, strict=True) if k]
    kept = [i for i in ids if i in keep_ids]
    every = [(kept[e], s) for e, s in segment_starts(lengths, L, pad, stride)]
    if not every:
        return
    window = el.Window(L, pad=pad, stride=stride)
    common = dict(seed=5, sampler=el.Uniform(replacement=False) if shuffle else el.Sequential())
    # the pass's global sequence: world size 1 yields it in order (a permutation of every segment)
    seq = [s for b in run(make(ds, keep_ids, window, batch_size=7, **common)) for s in b]
    assert sorted(seq) == sorted(every) and len(seq) == len(every)
    if not shuffle:
        assert seq == every

    kw = dict(common, batch_size=batch, drop_last=drop_last, prefetch=prefetch)
    streams = [make(ds, keep_ids, window, shard=el.Shard(r, world, policy=policy), **kw) for r in range(world)]
    passes = [run(s) for s in streams]
    counts = [len(p) for p in passes]
    assert counts == [len(s) for s in streams] and len(set(counts)) == 1  # rank-equal
    for r in range(world):
        assert passes[r] == reference_batches(seq, world, r, batch, policy, drop_last)
    got = [s for p in passes for b in p for s in b]
    if not drop_last:
        if policy == "wrap":  # every segment once, plus the pass's first positions again (cyclically)
            padding = [seq[p % len(seq)] for p in range(-len(seq) % world)]
            assert sorted(got) == sorted(seq + padding) and set(got) == set(seq)
        else:  # disjoint; only the last len % world positions are left out
            assert sorted(got) == sorted(seq[: len(seq) - len(seq) % world])

    # resume after k batches: any rank's state, same world and a new world at the same global batch size
    k = data.draw(st.integers(0, counts[0]), label="k")
    first = make(ds, keep_ids, window, shard=el.Shard(0, world, policy=policy), **kw)
    for _ in range(k):
        next(first)
    state = pickle.loads(pickle.dumps(first.state_dict()))
    consumed = sum(len(b) for b in passes[0][:k]) * world
    finished = k == counts[0]
    for r in range(world):
        again = make(ds, keep_ids, window, shard=el.Shard(r, world, policy=policy), **kw)
        again.load_state_dict(state)
        assert drain(again) == passes[r][k:]
    G = batch * world
    w2 = data.draw(st.sampled_from([d for d in range(1, G + 1) if G % d == 0]), label="new world")
    for r in range(w2):
        again = make(ds, keep_ids, window, shard=el.Shard(r, w2, policy=policy), **dict(kw, batch_size=G // w2))
        again.load_state_dict(state)
        want = [] if finished else reference_batches(seq, w2, r, G // w2, policy, drop_last, consumed)
        assert drain(again) == want


def test_issue_reproduction_181_segments_world_5(tmp_path):
    """7 episodes, 181 segments, world 5, batch 4: every rank yields 10 batches, covering every segment."""
    lengths = [20, 31, 25, 27, 30, 22, 26]
    ds = el.Dataset.from_episodes(episodes(lengths), schema=small_schema())
    streams = [ds.segment_stream(1, batch_size=4, sampler=el.Sequential(), shard=(r, 5)) for r in range(5)]
    passes = [run(s) for s in streams]
    assert [len(p) for p in passes] == [10] * 5
    got = [s for p in passes for b in p for s in b]
    ids = [ds.episode(i).episode_id for i in range(7)]
    every = [(ids[e], s) for e, s in segment_starts(lengths, 1)]
    assert len(got) == 185 and set(got) == set(every)
    assert sorted(got) == sorted(every + every[:4])  # the 4 padding items are the pass's first 4 segments
    dropped = [
        run(ds.segment_stream(1, batch_size=4, sampler=el.Sequential(), shard=el.Shard(r, 5, policy="drop")))
        for r in range(5)
    ]
    flat = [s for p in dropped for b in p for s in b]
    assert [len(p) for p in dropped] == [9] * 5 and len(flat) == 180 and len(set(flat)) == 180
    # a pass that ended stays ended on another world size (here one rank could still take the dropped segment)
    ended = ds.segment_stream(1, batch_size=4, sampler=el.Sequential(), shard=el.Shard(2, 5, policy="drop"))
    run(ended)
    one = ds.segment_stream(1, batch_size=20, sampler=el.Sequential(), shard=el.Shard(0, 1, policy="drop"))
    one.load_state_dict(ended.state_dict())
    assert drain(one) == [] and len(run(one)) == 10  # ... and the next pass starts on iteration


def test_epochs_restart_and_reshuffle_and_an_end_state_loads_as_finished(pool):
    ds, ids = pool
    kw = dict(batch_size=4, sampler=el.Uniform(replacement=False), seed=9, shard=(1, 3))
    stream = ds.segment_stream(3, **kw)
    epoch0 = run(stream)
    state = stream.state_dict()
    with pytest.raises(StopIteration):  # the pass stays ended until iterated again
        stream.sample()
    epoch1 = run(stream)
    assert len(epoch0) == len(epoch1) == len(stream) and epoch0 != epoch1 and stream.epoch == 1
    resumed = ds.segment_stream(3, **kw)
    resumed.load_state_dict(state)  # taken at the end of epoch 0: loads as finished
    assert drain(resumed) == []
    assert run(resumed) == epoch1 and resumed.epoch == 1
    # every rank's second pass together covers every segment again
    got = []
    for r in range(3):
        s = ds.segment_stream(3, **dict(kw, shard=(r, 3)))
        run(s)
        got += [x for b in run(s) for x in b]
    every = [(ids[e], t) for e, t in segment_starts(POOL_LENGTHS, 3)]
    assert set(got) == set(every)


def test_random_shards_sample_only_their_share_with_decorrelated_generators(pool):
    ds, ids = pool
    every = [(ids[e], t) for e, t in segment_starts(POOL_LENGTHS, 2)]
    seen = []
    for r in range(3):
        stream = ds.segment_stream(2, batch_size=64, seed=4, shard=(r, 3), prefetch=0)
        got = [x for _ in range(3) for x in run_one(stream)]
        assert set(got) <= set(every[r::3])
        seen.append([every.index(x) // 3 for x in got])  # shard-local ids
    assert seen[0] != seen[1] != seen[2]  # not the same local draw on every rank


def run_one(stream):
    b = stream.sample()
    return list(zip(b.episode_id.tolist(), b.start.tolist(), strict=True))


def test_permutation_shards_need_a_seed(pool):
    ds, _ = pool
    with pytest.raises(el.ValidationError, match="seed"):
        ds.segment_stream(2, batch_size=4, sampler=el.Uniform(replacement=False), shard=(0, 2))
    with pytest.raises(el.ValidationError, match="shard policy must be 'wrap' or 'drop', got 'pad'"):
        ds.segment_stream(2, batch_size=4, sampler=el.Sequential(), shard=el.Shard(0, 1, policy="pad"))


# ---- a state loads only into a stream that produces the same sequence

BASE = dict(window=3, batch_size=4, seed=1, prefetch=0)
ONCE = el.Uniform(replacement=False)
ORDERED = el.Sequential()

MISMATCHES = [
    ("pad", dict(window=el.Window(3, pad="suffix")), dict(window=el.Window(3, pad="prefix"))),
    ("sequence_length", dict(), dict(window=4)),
    ("stride", dict(), dict(window=el.Window(3, stride=2))),
    ("seed", dict(), dict(seed=2)),
    ("seed", dict(sampler=ONCE), dict(sampler=ONCE, seed=2)),
    ("mode", dict(), dict(sampler=ONCE)),
    ("mode", dict(), dict(sampler=ORDERED)),
    ("mode", dict(sampler=ONCE), dict(sampler=ORDERED)),
    ("shard rank", dict(shard=(0, 2)), dict(shard=(1, 2))),
    ("shard world", dict(shard=(0, 2)), dict(shard=(0, 3))),
    ("batch_size", dict(), dict(batch_size=5)),
    ("batch_size", dict(sampler=ORDERED, shard=(0, 2)), dict(sampler=ORDERED, shard=(1, 2), batch_size=5)),
    ("global batch size", dict(sampler=ORDERED, shard=(0, 2)), dict(sampler=ORDERED, shard=(0, 3))),
    ("drop_last", dict(sampler=ORDERED), dict(sampler=ORDERED, drop_last=True)),
    ("shard_policy", dict(sampler=ORDERED, shard=(0, 2)), dict(sampler=ORDERED, shard=el.Shard(0, 2, policy="drop"))),
    (
        "weights",
        dict(sampler=el.Weighted(np.ones(len(POOL_LENGTHS)))),
        dict(sampler=el.Weighted(np.arange(1.0, len(POOL_LENGTHS) + 1))),
    ),
    ("weights", dict(), dict(sampler=el.Weighted(np.ones(len(POOL_LENGTHS))))),
    ("segments", dict(where="length > 3"), dict(where="length > 4")),
    ("episodes", dict(where='"group" = 0'), dict(where='"group" = 1')),
]


@pytest.mark.parametrize(("name", "saved", "loaded"), MISMATCHES, ids=[f"{m[0]}-{i}" for i, m in enumerate(MISMATCHES)])
def test_a_mismatched_state_is_rejected_naming_the_parameter_and_changes_nothing(name, saved, loaded):
    # groups 0 and 1 hold one episode each of the same length: same segment count, different episodes
    lengths = [*POOL_LENGTHS, 10, 10]
    ds = el.Dataset.from_episodes(episodes(lengths, groups=[2] * len(POOL_LENGTHS) + [0, 1]), schema=small_schema())

    def built(kw):
        kw = dict(BASE, **kw)
        if isinstance(kw.get("sampler"), el.Weighted):  # one weight for each of the two extra episodes
            kw["sampler"] = el.Weighted(np.append(kw["sampler"].weights, [1.0, 1.0]))
        return ds.segment_stream(kw.pop("window"), **kw)

    a = built(saved)
    next(a)
    b = built(loaded)
    twin = built(loaded)
    next(b), next(twin)
    with pytest.raises(el.ValidationError, match=name):
        b.load_state_dict(a.state_dict())
    assert run_one(b) == run_one(twin)  # the rejected load left b where it was
    # the same arguments do load
    same = built(saved)
    same.load_state_dict(a.state_dict())
    assert run_one(same) == run_one(a)


def test_unseeded_streams_adopt_the_saved_seed_and_broken_states_are_rejected(pool):
    ds, _ = pool
    a = ds.segment_stream(2, batch_size=3, prefetch=0)
    next(a)
    b = ds.segment_stream(2, batch_size=3, prefetch=0)
    b.load_state_dict(a.state_dict())
    assert run_one(b) == run_one(a)
    state = a.state_dict()
    for broken, match in (
        ({**state, "format": 1}, "format"),
        ({**state, "consumed": -1}, "consumed"),
        ({k: v for k, v in state.items() if k != "rng"}, "rng"),
        ("nope", "dict"),
    ):
        with pytest.raises(el.ValidationError, match=match):
            b.load_state_dict(broken)


# ---- "wrapping like DistributedSampler": an ordered pass against torch's own sampler


@pytest.mark.parametrize("policy", ["wrap", "drop"])
def test_ordered_shards_deal_segments_like_torch_distributed_sampler(pool, policy):
    """el.Sequential(): rank r gets exactly DistributedSampler(shuffle=False, drop_last=policy == "drop")'s indices.

    The global order is the reference enumeration (episode order, then start); torch pads a short pass by
    repeating its first indices (wrap) or cuts the last ``N % world`` (drop), like our two policies.
    """
    torch = pytest.importorskip("torch")
    from torch.utils.data import DistributedSampler

    torch.set_num_threads(1)
    ds, ids = pool
    cases = [  # (kept episodes, L, pad, stride): many segments, stride/no padding, fewer segments than ranks
        (range(len(ids)), 1, "suffix", 1),
        (range(len(ids)), 3, None, 2),
        ([2, 7], 5, None, 3),
        ([1], 1, "suffix", 1),
    ]
    for kept, L, pad, stride in cases:
        keep_ids = {ids[i] for i in kept}
        every = [(ids[kept[e]], s) for e, s in segment_starts([POOL_LENGTHS[i] for i in kept], L, pad, stride)]
        for world in range(1, 6):
            for batch in (1, 3, 4):
                for rank in range(world):
                    stream = make(
                        ds,
                        keep_ids,
                        el.Window(L, pad=pad, stride=stride),
                        sampler=el.Sequential(),
                        batch_size=batch,
                        shard=el.Shard(rank, world, policy=policy),
                    )
                    got = [s for b in run(stream) for s in b]
                    sampler = DistributedSampler(
                        range(len(every)), num_replicas=world, rank=rank, shuffle=False, drop_last=policy == "drop"
                    )
                    assert got == [every[i] for i in sampler], (kept, L, world, batch, rank)
