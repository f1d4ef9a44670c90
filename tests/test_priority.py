"""Prioritized replay: the sum tree, ``el.Prioritized`` on streams and transitions, update_priorities, resume.

References are computed here, independently of the library: naive ``np.cumsum``
search for the tree, and ``p ** alpha / sum(p ** alpha)`` over the items
enumerated from the episodes as written, checked by chi-square on many draws
(fixed seeds: each test is deterministic).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import episodelake as el
from episodelake.sampling.sumtree import SumTree

ALPHA, BETA = 0.7, 0.5
P_MIN = 1e-4  # a seeded chi-square p-value below this means the distribution is wrong


# ---- the sum tree against naive cumsum search


def naive_find(leaves: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Leaf i with S(i) <= u < S(i + 1); u past the total: the last positive leaf."""
    cs = np.cumsum(leaves)
    last = int(np.flatnonzero(leaves > 0)[-1])
    return np.minimum(np.searchsorted(cs, u, side="right"), last)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.lists(st.integers(0, 9), min_size=1, max_size=40)),
        st.tuples(st.just("update"), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 9)), max_size=30)),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, block=st.sampled_from([2, 3, 4, 32]), top=st.sampled_from([1, 4, 7, 4096]))
def test_sum_tree_search_equals_naive_cumsum(ops, block, top):
    """After any extends and batched updates (repeats: last wins), every prefix search equals the naive one.

    Integer leaves make every sum exact, so the comparison is exact at every
    boundary ``S(i)``, inside every unit interval, and past the total.
    """
    tree, ref = SumTree(block=block, top=top), np.zeros(0)
    for kind, arg in ops:
        if kind == "extend":
            tree.extend(np.array(arg, float))
            ref = np.concatenate([ref, arg])
        elif len(ref):
            slots = np.array([i % len(ref) for i, _ in arg], dtype=np.int64)
            values = np.array([v for _, v in arg], dtype=float)
            tree.update(slots, values)
            for i, v in zip(slots, values, strict=True):
                ref[i] = v
    assert np.array_equal(tree.leaves, ref)
    assert tree.total == ref.sum()
    if ref.sum() == 0:
        return
    total = int(ref.sum())
    u = np.concatenate([np.arange(total) + 0.5, np.cumsum(ref)[:-1], [0.0, total, total + 3.0]])
    assert np.array_equal(tree.find(u), naive_find(ref, u))
    assert (ref[tree.find(u)] > 0).all()


@settings(max_examples=200, deadline=None)
@given(
    leaves=st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 1e3, allow_nan=False)), min_size=1, max_size=120).filter(
        lambda v: sum(v) > 0
    ),
    fractions=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20),
    block=st.sampled_from([2, 3, 4, 16]),
)
def test_sum_tree_float_search_never_returns_a_zero_leaf(leaves, fractions, block):
    """Float leaves (rounding everywhere): no search ends on a zero leaf, also at every block end and
    just below the total; away from rounding distance of a boundary the leaf is the naive one."""
    ref = np.array(leaves)
    tree = SumTree(block=block, top=2)
    tree.extend(ref)
    total = tree.total
    cs = np.cumsum(ref)
    near = cs[:, None] * (1 - np.array([0.0, 1, 2, 4, 8]) * np.finfo(float).eps)  # a few ulps below each boundary
    u = np.concatenate([np.array(fractions) * total, near.ravel(), [np.nextafter(total, 0), total]])
    got = tree.find(u)
    assert (ref[got] > 0).all()
    far = np.abs(u[:, None] - cs[None, :]).min(axis=1) > 1e-9 * total
    assert np.array_equal(got[far & (u < total)], naive_find(ref, u)[far & (u < total)])


def test_sum_tree_draws_follow_the_leaves():
    """200k draws from a 3-level tree of float leaves (some zero) match leaf / total by chi-square."""
    rng = np.random.default_rng(0)
    leaves = rng.random(300) * (rng.random(300) > 0.2)
    tree = SumTree(block=4, top=8)
    tree.extend(leaves)
    tree.update(np.arange(0, 300, 7), leaves[::7] * 3)  # then change some
    leaves[::7] *= 3
    counts = np.bincount(tree.sample(np.random.default_rng(1), 200_000), minlength=300)
    assert counts[leaves == 0].sum() == 0
    expected = leaves / leaves.sum() * counts.sum()
    assert stats.chisquare(counts[leaves > 0], expected[leaves > 0]).pvalue > P_MIN


# ---- data: a few episodes with a numeric meta field and non-negative rewards


def make_dataset(lengths=(6, 9, 4, 12), difficulty=(1.0, 3.0, 0.5, 2.0), path=None, storage_options=None):
    rng = np.random.default_rng(7)
    schema = el.DatasetSchema(
        [
            el.FieldSpec("observation", (3,), "float32"),
            el.FieldSpec("action", (), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("difficulty", (), "float64", role="meta"),
        ]
    )
    episodes = [
        {
            "observations": rng.standard_normal((T + 1, 3), dtype=np.float32),
            "actions": rng.standard_normal(T, dtype=np.float32),
            "rewards": rng.random(T, dtype=np.float32) + 0.05,
            "terminated": True,
            "meta": {"difficulty": d},
        }
        for T, d in zip(lengths, difficulty, strict=True)
    ]
    if path is None:
        ds = el.Dataset.from_episodes(episodes, schema=schema)
    else:
        ds = el.Dataset.create(schema, str(path), storage_options=storage_options)
        ds.append_episodes(episodes)
        ds.flush()
    return ds, episodes


def segments_of(ds, lengths, L):
    """Reference enumeration of the segments (all episodes >= L): (episode_id, start) -> position."""
    ids = ds.episode_ids
    keys = [(int(ids[e]), s) for e, T in enumerate(lengths) for s in range(T - L + 1)]
    return {k: i for i, k in enumerate(keys)}, keys


def chi_square(counts: np.ndarray, probabilities: np.ndarray) -> float:
    return float(stats.chisquare(counts, probabilities * counts.sum()).pvalue)


# ---- streams


@pytest.mark.parametrize("kind", ["memory", "disk", "s3"])
def test_stream_draws_p_alpha_and_weights_follow_the_formula(request, tmp_path, kind):
    """P(segment) = difficulty**alpha / sum, weights = (N P)**-beta / batch max, then updates change P."""
    lengths, difficulty = (6, 9, 4, 12), np.array([1.0, 3.0, 0.5, 2.0])
    path, opts = {"memory": None, "disk": tmp_path / "ds"}.get(kind), None
    if kind == "s3":
        path, opts = request.getfixturevalue("s3_url"), request.getfixturevalue("s3_server").storage_options
    ds, _ = make_dataset(lengths, tuple(difficulty), path, opts)
    L = 3
    where, keys = segments_of(ds, lengths, L)
    raw = np.repeat(difficulty, [T - L + 1 for T in lengths])
    stream = ds.segment_stream(L, batch_size=512, seed=0, sampler=el.Prioritized("difficulty", alpha=ALPHA, beta=BETA))
    slot_of = {}

    def draw(n_batches, raw):
        P = raw**ALPHA / (raw**ALPHA).sum()
        counts = np.zeros(len(keys))
        for _ in range(n_batches):
            b = stream.sample()
            item = np.array([where[(int(e), int(s))] for e, s in zip(b.episode_id, b.start, strict=True)])
            for i, slot in zip(item.tolist(), b.indices.tolist(), strict=True):
                assert slot_of.setdefault(i, slot) == slot  # one stable slot per segment
            np.add.at(counts, item, 1)
            w = (len(keys) * P[item]) ** -BETA
            np.testing.assert_allclose(b.weights, w / w.max(), rtol=1e-6)
            assert b.weights.dtype == np.float32
        return counts, P

    counts, P = draw(200, raw)
    assert chi_square(counts, P) > P_MIN
    assert len(slot_of) == len(keys)
    # new priorities for every segment, given through the slots the batches reported
    new = np.random.default_rng(3).random(len(keys)) * 5 + 0.1
    items = np.arange(len(keys))
    stream.update_priorities(np.array([slot_of[i] for i in items]), new)
    counts, P = draw(200, new)
    assert chi_square(counts, P) > P_MIN
    assert chi_square(counts, raw**ALPHA / (raw**ALPHA).sum()) < P_MIN  # the change is detectable


def test_stream_resume_is_exact_with_priorities():
    """state_dict holds generator and priorities: a new stream continues with the same batches and weights."""
    ds, _ = make_dataset()

    def make():
        return ds.segment_stream(2, batch_size=16, seed=5, sampler=el.Prioritized("reward", alpha=ALPHA, beta=BETA))

    def learn(stream, steps):
        out = []
        for _ in range(steps):
            b = stream.sample()
            stream.update_priorities(b.indices, np.abs(b.reward[:, 0]) * 3 + b.start * 0.1)
            out.append((b.indices.copy(), b.weights.copy(), b.episode_id.copy(), b.start.copy()))
        return out

    a = make()
    learn(a, 7)
    state = a.state_dict()
    expected = learn(a, 5)
    b = make()
    b.load_state_dict(state)
    got = learn(b, 5)
    for x, y in zip(expected, got, strict=True):
        for u, v in zip(x, y, strict=True):
            assert np.array_equal(u, v)
    with pytest.raises(el.ArgumentError, match="no priorities saved"):
        make().load_state_dict({k: v for k, v in state.items() if k != "priorities"})
    with pytest.raises(el.ArgumentError, match="mode"):
        ds.segment_stream(2, batch_size=16, seed=5).load_state_dict(state)


def test_stream_priority_from_an_array_and_zero_is_never_drawn():
    ds, _ = make_dataset()
    stream = ds.segment_stream(2, batch_size=256, seed=1, sampler=el.Prioritized([1.0, 0.0, 2.0, 0.0]))
    ids = ds.episode_ids
    seen = np.concatenate([stream.sample().episode_id for _ in range(20)])
    assert set(seen.tolist()) == {int(ids[0]), int(ids[2])}


def test_priority_from_derived_columns_per_episode_and_per_step():
    """A derived per-episode column (set by update) and a derived per-step column drive the draws (chi-square)."""
    lengths = (6, 9, 4, 12)
    ds, _ = make_dataset(lengths)
    ds.columns.add(
        el.FieldSpec("td", (), "float64", role="meta"), el.FieldSpec("td", (), "float32", role="extra", derived=True)
    )
    per_episode = np.array([2.0, 0.0, 1.0, 4.0])
    per_step = [np.arange(T, dtype=np.float32) % 3 + 0.5 for T in lengths]
    ds.columns.update({"td": per_episode, "extra/td": per_step})
    L = 1
    where, keys = segments_of(ds, lengths, L)
    for priority, raw in (("td", np.repeat(per_episode, lengths)), ("extra/td", np.concatenate(per_step))):
        stream = ds.segment_stream(L, batch_size=512, seed=4, sampler=el.Prioritized(priority, alpha=ALPHA))
        counts = np.zeros(len(keys))
        for _ in range(100):
            b = stream.sample()
            np.add.at(counts, [where[(int(e), int(s))] for e, s in zip(b.episode_id, b.start, strict=True)], 1)
        raw = raw.astype(np.float64)
        P = raw**ALPHA / (raw**ALPHA).sum()
        assert counts[P == 0].sum() == 0
        assert chi_square(counts[P > 0], P[P > 0] / P[P > 0].sum()) > P_MIN


def test_sharded_prioritized_streams_draw_their_own_share():
    ds, _ = make_dataset()
    starts = []
    for rank in range(2):
        s = ds.segment_stream(2, batch_size=64, seed=2, sampler=el.Prioritized(1.0), shard=(rank, 2))
        b = s.sample()
        assert (b.indices < len(s.index)).all()
        starts.append(set(zip(b.episode_id.tolist(), b.start.tolist(), strict=True)))
    assert not starts[0] & starts[1]


# ---- transitions


def transitions_of(ds, episodes):
    ids = ds.episode_ids
    keys = [(int(ids[e]), t) for e, ep in enumerate(episodes) for t in range(len(ep["rewards"]))]
    rewards = np.concatenate([ep["rewards"] for ep in episodes]).astype(np.float64)
    return {k: i for i, k in enumerate(keys)}, rewards


def count(where, tr, n):
    item = np.array([where[(int(e), int(t))] for e, t in zip(tr.episode_id, tr.start, strict=True)])
    return np.bincount(item, minlength=n), item


def test_transitions_priority_from_a_step_field():
    """el.Prioritized("reward") (a per-step field): P(transition) = reward**alpha / sum; weights by the formula."""
    ds, episodes = make_dataset()
    where, reward = transitions_of(ds, episodes)
    P = reward**ALPHA / (reward**ALPHA).sum()
    rng = np.random.default_rng(0)
    counts = np.zeros(len(reward))
    for _ in range(100):
        tr = ds.sample_transitions(512, sampler=el.Prioritized("reward", alpha=ALPHA, beta=BETA), rng=rng)
        c, item = count(where, tr, len(reward))
        counts += c
        w = (len(reward) * P[item]) ** -BETA
        np.testing.assert_allclose(tr.weights, w / w.max(), rtol=1e-6)
    assert chi_square(counts, P) > P_MIN


def test_kept_sampler_updates_grows_and_narrows(tmp_path):
    """A PrioritizedSampler kept across calls: updates change P, new episodes start at the max seen,
    episodes outside the selection are never drawn and keep their priorities."""
    ds, episodes = make_dataset(path=tmp_path / "ds")
    per = el.PrioritizedSampler(alpha=ALPHA, beta=BETA, seed=4)
    tr = ds.sample_transitions(64, sampler=per)
    n = len(per.priorities)
    assert n == sum(len(e["rewards"]) for e in episodes) and (per.priorities == 1.0).all()
    where, _ = transitions_of(ds, episodes)
    slot_item = {}
    while len(slot_item) < n:  # learn every slot's transition
        tr = ds.sample_transitions(256, sampler=per)
        _, item = count(where, tr, n)
        slot_item.update(zip(tr.indices.tolist(), item.tolist(), strict=True))
    slots = np.array(sorted(slot_item))
    items = np.array([slot_item[s] for s in slots])
    new = np.random.default_rng(1).random(n) * 4 + 0.5
    per.update_priorities(np.concatenate([slots, slots[:3]]), np.concatenate([new[items] * 0 + 9.0, new[items][:3]]))
    raw = np.full(n, 9.0)
    raw[items[:3]] = new[items][:3]  # repeated slots: the last value wins
    assert np.allclose(per.priorities[slots], raw[items])
    counts = np.zeros(n)
    for _ in range(60):
        counts += count(where, ds.sample_transitions(512, sampler=per), n)[0]
    assert chi_square(counts, raw**ALPHA / (raw**ALPHA).sum()) > P_MIN
    # narrowing: the first episode is never drawn, and keeps its slots and priorities
    first = int(ds.episode_ids[0])
    narrow = ds.sample_transitions(2000, sampler=per, where=f"episode_id <> {first}")
    assert first not in narrow.episode_id.tolist()
    assert len(per.priorities) == n
    # growth: a new episode's transitions start at the largest priority seen (9.0)
    more = make_dataset(lengths=(5,), difficulty=(1.0,))[1]
    ds.append_episodes(more)
    ds.flush()
    ds.sample_transitions(8, sampler=per)
    assert np.array_equal(per.priorities[n:], np.full(5, 9.0))
    # state_dict round trip: a fresh sampler continues with the same draws
    state = per.state_dict()
    twin = el.PrioritizedSampler(seed=99)
    twin.load_state_dict(state)
    a, b = ds.sample_transitions(32, sampler=per), ds.sample_transitions(32, sampler=twin)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.weights, b.weights)


def test_transitions_weights_and_custom_sampler():
    """el.Weighted draws episodes in proportion to weight * length; a Sampler object gets the transition index."""
    ds, episodes = make_dataset()
    lengths = np.array([len(e["rewards"]) for e in episodes])
    difficulty = np.array([e["meta"]["difficulty"] for e in episodes])
    tr = ds.sample_transitions(40_000, sampler=el.Weighted("difficulty"), seed=0)
    ids = ds.episode_ids
    counts = np.array([(tr.episode_id == i).sum() for i in ids])
    assert chi_square(counts, difficulty * lengths / (difficulty * lengths).sum()) > P_MIN

    class Firsts:
        def sample(self, index, batch_size):
            return index.cum[:-1][:batch_size]  # the first transition of each episode

    tr = ds.sample_transitions(4, sampler=Firsts())
    assert tr.start.tolist() == [0, 0, 0, 0] and tr.episode_id.tolist() == ids.tolist()
    assert tr.indices is None and tr.weights is None


def test_bad_priority_input_names_the_item():
    ds, _ = make_dataset()
    with pytest.raises(el.ArgumentError, match=r"priority of episode #1 is -1.0"):
        ds.segment_stream(2, sampler=el.Prioritized([1.0, -1.0, 1.0, 1.0]))
    with pytest.raises(el.ArgumentError, match=r"expected one value per episode \(4\) or per item"):
        ds.sample_transitions(2, sampler=el.Prioritized([1.0, 2.0]))
    per = el.PrioritizedSampler()
    ds.sample_transitions(2, sampler=per)
    before = per.priorities
    with pytest.raises(el.ArgumentError, match=r"priority of item #1 is nan"):
        per.update_priorities([0, 1], [1.0, np.nan])
    with pytest.raises(el.ArgumentError, match="out of range"):
        per.update_priorities([10_000], [1.0])
    assert np.array_equal(per.priorities, before)


def test_each_batch_sees_the_updates_before_it():
    """With the default prefetch, a prioritized batch is drawn when requested: an update applies to the next one."""
    ds, _ = make_dataset()
    stream = ds.segment_stream(2, batch_size=64, seed=0, sampler=el.Prioritized(1.0))
    b = stream.sample()
    keep = int(b.indices[0])
    stream.update_priorities(b.indices, np.where(b.indices == keep, 1.0, 0.0))  # zero all but one seen slot
    others = np.setdiff1d(np.arange(len(stream.index)), b.indices)
    stream.update_priorities(others, np.zeros(len(others)))
    after = stream.sample()
    assert set(after.indices.tolist()) == {keep}
    assert np.array_equal(after.weights, np.ones(64, np.float32))


def test_alpha_zero_is_uniform_over_positive_priorities():
    ds, episodes = make_dataset()
    where, reward = transitions_of(ds, episodes)
    per = el.PrioritizedSampler(alpha=0.0, beta=1.0, seed=0)
    first = ds.sample_transitions(8, sampler=per)
    per.update_priorities(first.indices[:1], [0.0])  # one transition out, the rest uniform
    counts = np.zeros(len(reward))
    for _ in range(40):
        counts += count(where, ds.sample_transitions(512, sampler=per), len(reward))[0]
    gone = where[(int(first.episode_id[0]), int(first.start[0]))]
    assert counts[gone] == 0
    expected = np.ones(len(reward))
    expected[gone] = 0
    keep = expected > 0
    assert chi_square(counts[keep], expected[keep] / expected.sum()) > P_MIN


def test_a_given_prioritized_sampler_drives_a_stream():
    ds, _ = make_dataset()
    per = el.PrioritizedSampler(alpha=1.0, beta=0.0, seed=3)
    stream = ds.segment_stream(3, batch_size=16, sampler=per)
    b = stream.sample()
    assert stream.prioritized and (b.weights == 1.0).all()  # beta = 0: no correction
    stream.update_priorities(b.indices, np.full(16, 7.0))
    assert (per.priorities[b.indices] == 7.0).all()


def test_weights_convert_with_the_batch_and_indices_stay_numpy():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from episodelake.integrations.torch import to_torch

    ds, _ = make_dataset()
    b = ds.segment_stream(2, batch_size=8, seed=0, sampler=el.Prioritized("difficulty")).sample()
    tb = to_torch(b)
    assert isinstance(tb.weights, torch.Tensor) and torch.equal(tb.weights, torch.from_numpy(b.weights))
    assert isinstance(tb.indices, np.ndarray) and np.array_equal(tb.indices, b.indices)
    tr = ds.sample_transitions(8, sampler=el.Prioritized(1.0), seed=0)
    tt = to_torch(tr)
    assert isinstance(tt.weights, torch.Tensor) and np.array_equal(tt.indices, tr.indices)


def test_sum_tree_sample_values_are_the_drawn_leaves():
    """sample_values draws what sample draws (same generator state) and returns those leaves' values."""
    rng = np.random.default_rng(3)
    leaves = rng.random(5000) * (rng.random(5000) > 0.3)
    tree = SumTree(block=16, top=64)
    tree.extend(leaves)
    got, values = tree.sample_values(np.random.default_rng(5), 1000)
    assert np.array_equal(got, tree.sample(np.random.default_rng(5), 1000))
    assert np.array_equal(values, leaves[got]) and (values > 0).all()


def test_a_kept_sampler_switching_selections_draws_from_the_current_one():
    """Alternating where= selections (each call rebinds unless the selection is the cached one): every draw
    comes from the current selection, and the full one again reaches every episode."""
    ds, _ = make_dataset()
    per = el.PrioritizedSampler(alpha=ALPHA, beta=BETA, seed=6)
    ids = ds.episode_ids.tolist()
    for _ in range(3):
        for kept in (ids[:1], ids[1:], ids):
            where = f"episode_id IN ({', '.join(map(str, kept))})"
            tr = ds.sample_transitions(400, sampler=per, where=where)
            assert set(tr.episode_id.tolist()) == set(kept)
        assert set(ds.sample_transitions(400, sampler=per).episode_id.tolist()) == set(ids)
