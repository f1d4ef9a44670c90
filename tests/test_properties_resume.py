"""A resumed finite stream continues exactly where an uninterrupted one would, at every point of a pass (issue 39).

The reference is the same stream run without interruption: its passes, one
``for`` loop each. A state taken after ``k`` batches of pass ``p`` (every ``k``
from 0 to the pass's length, the pass boundary included), loaded into a new
stream (or rebuilt with ``el.stream_from_state``), must give, loop by loop,
the rest of pass ``p`` and then pass ``p + 1``; a state taken at the end of a
pass loads as finished, so its first loop is pass ``p + 1`` (docs/sampling.md),
never an empty epoch. Each whole pass is also checked against a naive
enumeration of the segments.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

LENGTHS = [5, 9, 2, 12, 7, 4]
L = 3


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (2,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("n", (), "int64", role="meta"),
        ]
    )


@pytest.fixture(scope="module")
def ds():
    ds = el.Dataset.create(schema())
    ds.append_episodes(
        {
            "observations": np.full((T + 1, 2), n, np.float32),
            "actions": np.arange(T),
            "rewards": np.zeros(T, np.float32),
            "meta": {"n": n},
        }
        for n, T in enumerate(LENGTHS)
    )
    ds.flush()
    return ds


def segments() -> list[tuple[int, int]]:
    """Every ``(episode n, start)`` of a window of ``L`` (pad suffix, stride 1): a loop over episodes."""
    return [(n, s) for n, T in enumerate(LENGTHS) for s in range(max(T - L + 1, 1))]


def batches(loop) -> list[list[tuple[int, int]]]:
    return [list(zip(b.meta["n"].tolist(), b.start.tolist(), strict=True)) for b in loop]


def make(ds, sampler: str, batch_size: int, drop_last: bool, prefetch: int, shard: tuple[int, int]):
    chosen = el.Sequential() if sampler == "sequential" else el.Uniform(replacement=False)
    return ds.segment_stream(
        L,
        batch_size=batch_size,
        sampler=chosen,
        seed=5,
        drop_last=drop_last,
        prefetch=prefetch,
        shard=el.Shard(*shard),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sampler=st.sampled_from(["sequential", "shuffled"]),
    batch_size=st.integers(1, 8),
    drop_last=st.booleans(),
    prefetch=st.sampled_from([0, 2]),
    shard=st.sampled_from([(0, 1), (0, 2), (1, 2), (2, 3)]),
    p=st.integers(0, 1),
    data=st.data(),
)
def test_a_state_taken_anywhere_in_a_pass_resumes_as_the_uninterrupted_run(
    ds, sampler, batch_size, drop_last, prefetch, shard, p, data
):
    """Kills "a state taken at the end of a pass resumes into an empty epoch"."""
    args = (ds, sampler, batch_size, drop_last, prefetch, shard)
    whole = make(*args)
    passes = [batches(whole) for _ in range(p + 3)]  # one for loop per pass
    assert all(len(loop) == len(whole) for loop in passes)
    if shard == (0, 1) and not drop_last:
        for loop in passes:  # each pass: every segment once
            assert sorted(item for batch in loop for item in batch) == segments()
    # the pass boundary (k = len) drawn on purpose half the time, any point of the pass otherwise
    k = data.draw(st.one_of(st.just(len(whole)), st.integers(0, len(whole))), label="batches taken in pass p")
    first = make(*args)
    for _ in range(p):
        batches(first)  # whole passes before pass p
    it = iter(first)
    head = batches(next(it) for _ in range(k))
    assert head == passes[p][:k]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    at_boundary = k == len(whole)
    expected = [passes[p + 1], passes[p + 2]] if at_boundary else [passes[p][k:], passes[p + 1]]
    resumed = make(*args)
    resumed.load_state_dict(state)
    assert resumed.epoch == p
    got = [batches(resumed)]
    assert resumed.epoch == (p + 1 if at_boundary else p)
    got.append(batches(resumed))
    assert got == expected
    rebuilt = el.stream_from_state(state, collection=ds)  # the lineage record rebuilds the same stream
    assert [batches(rebuilt), batches(rebuilt)] == expected


@pytest.mark.parametrize("sampler", ["sequential", "shuffled"])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_state_taken_after_the_loop_ended_resumes_at_the_next_pass(ds, sampler, prefetch):
    """The pass boundary as a training loop meets it: the state is taken after the ``for`` loop ended."""
    args = (ds, sampler, 4, False, prefetch, (0, 1))
    whole = make(*args)
    passes = [batches(whole) for _ in range(3)]
    first = make(*args)
    assert batches(first) == passes[0]
    state = first.state_dict()
    assert state["finished"] and state["epoch"] == 0
    resumed = make(*args)
    resumed.load_state_dict(state)
    assert [batches(resumed), batches(resumed)] == passes[1:]
    assert batches(first) == passes[1]  # the uninterrupted stream agrees
