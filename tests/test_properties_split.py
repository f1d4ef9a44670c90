"""``ds.edit.split`` with derived columns and at capacity (issue 39), against the raw arrays the test wrote.

docs/writing.md, Split: two episodes ``[0, at)`` and ``[at, T)``; "derived
values follow: per-episode ones are copied to both halves, per-step rows cut
at ``at``"; "a capacity dataset whose episode limit a split would exceed is
refused". A per-step column follows its role's row rule: an
observation-aligned one has ``T + 1`` rows, so the halves hold rows
``[0, at]`` and ``[at, T]`` (the row at the cut is both the first half's last
observation and the second's first), an action-aligned one ``T`` rows cut into
``[0, at)`` and ``[at, T)``. Expected values are NumPy slices of what the test
set, never read back from the library first.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el

from .conftest import robot_schema
from .reference import random_episode


def build(lengths: list[int], seed: int, **options) -> tuple[el.Dataset, list]:
    rng = np.random.default_rng(seed)
    raws = [random_episode(rng, T, image=False) for T in lengths]
    ds = el.Dataset.create(robot_schema(image=False), **options)
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    return ds, raws


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(2, 9), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_split_halves_hold_the_slices_of_every_derived_column(lengths, seed, data):
    """Kills "split with an observation-aligned derived column" (its halves cut as if it had T rows)."""
    ds, raws = build(lengths, seed)
    ids = ds.episode_ids.tolist()
    ds.columns.add(
        el.FieldSpec("value", (2,), "float32", derived=True),  # observation-aligned: T + 1 rows
        el.FieldSpec("adv", (), "float32", role="reward", derived=True),  # T rows
        el.FieldSpec("label", (), "str", role="meta", derived=True),  # one per episode
    )
    rng = np.random.default_rng(seed + 1)
    value = [rng.standard_normal((T + 1, 2)).astype(np.float32) for T in lengths]
    adv = [rng.standard_normal(T).astype(np.float32) for T in lengths]
    labels = [f"ep{i}" for i in range(len(lengths))]
    ds.columns.update({"observation/value": value, "reward/adv": adv, "label": labels})
    k = data.draw(st.integers(0, len(lengths) - 1), label="episode split")
    T = lengths[k]
    at = data.draw(st.integers(1, T - 1), label="at")
    first, second = ds.edit.split(ids[k], at).new_ids
    got = {int(e.episode_id): e for e in ds.episodes()}
    halves = {first: (0, at), second: (at, T)}
    for eid, (a, b) in halves.items():
        ref = got[eid]
        assert ref.length == b - a and ref.meta["label"] == labels[k]
        d = ref.read().data
        np.testing.assert_array_equal(d["observation/value"], value[k][a : b + 1])  # T + 1 rule
        np.testing.assert_array_equal(d["reward/adv"], adv[k][a:b])
        np.testing.assert_array_equal(d["observation/state"], raws[k].obs["state"][a : b + 1])
        np.testing.assert_array_equal(d["reward"], raws[k].reward[a:b])
    for i, eid in enumerate(ids):  # the other episodes keep theirs
        if i != k:
            np.testing.assert_array_equal(got[eid].read().data["observation/value"], value[i])
            np.testing.assert_array_equal(got[eid].read().data["reward/adv"], adv[i])
    # the per-step SQL view agrees: the halves' rows of the action-aligned column, step by step
    rows = ds.sql('SELECT episode_id, t, "reward/adv" AS adv FROM steps ORDER BY episode_id, t').fetchnumpy()
    for eid, (a, b) in halves.items():
        mine = rows["episode_id"] == eid
        np.testing.assert_array_equal(rows["t"][mine], np.arange(b - a))
        np.testing.assert_array_equal(rows["adv"][mine], adv[k][a:b])


@settings(max_examples=20, deadline=None)
@given(limit=st.integers(2, 5), data=st.data())
def test_split_is_refused_iff_it_would_exceed_the_episode_capacity(limit, data):
    """Kills "split refused exactly at capacity": a split to exactly ``episodes`` is allowed, past it refused."""
    n = data.draw(st.integers(1, limit), label="episodes held")
    ds, _ = build([4] * n, 3, capacity={"episodes": limit})
    ids = ds.episode_ids.tolist()
    before = ds.version
    if n + 1 <= limit:
        first, second = ds.edit.split(ids[0], 1).new_ids
        assert ds.episode_ids.tolist() == [first, second, *ids[1:]]  # the halves take the original's place
        assert len(ds) == n + 1 <= limit
        # the next commit on a full buffer evicts the oldest: the first half (created_at copied, lower id)
        ds.append_episodes([random_episode(np.random.default_rng(9), 3, image=False).as_dict(unwrap_action=True)])
        ds.flush()
        want = [second, *ids[1:]] if n + 1 == limit else [first, second, *ids[1:]]
        assert ds.episode_ids.tolist()[: len(want)] == want
    else:
        with pytest.raises(el.ArgumentError, match=f"at most {limit} episodes"):
            ds.edit.split(ids[0], 1)
        assert ds.version == before and ds.episode_ids.tolist() == ids


def test_a_steps_capacity_buffer_full_to_the_step_splits():
    """A split adds no step: a buffer at exactly its step capacity (and no episode limit) splits."""
    ds, _ = build([5, 5], 4, capacity={"steps": 10})
    ids = ds.episode_ids.tolist()
    first, second = ds.edit.split(ids[1], 2).new_ids
    assert ds.episode_ids.tolist() == [ids[0], first, second] and ds.num_steps == 10
