"""A selection of a selection is the intersection, through every way a view is read.

docs/query.md: "views compose"; on a view, ``sql()``, ``where()``,
``select_episodes()`` and ``stats()`` see only the view's episodes, and
everything that reads or samples works on it. The reference is a plain Python
evaluation of each predicate over the episodes as written (length, terminated,
meta, return), never the library's own answer.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import episodelake as el

from .conftest import robot_schema
from .reference import random_episode

N = 40
# (SQL over the episodes view, the same predicate in Python over a raw episode)
PREDICATES = {
    "length": ("length > 6", lambda r: r.length > 6),
    "task": ("task = 'pick'", lambda r: r.meta["task"] == "pick"),
    "success": ("success", lambda r: r.meta["success"]),
    "terminated": ("NOT terminated", lambda r: not r.terminated),
    "return": ('"return" > 0', lambda r: float(np.sum(r.reward, dtype=np.float64)) > 0),
}
PAIRS = list(itertools.permutations(PREDICATES, 2))


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    rng = np.random.default_rng(17)
    raws = [random_episode(rng, int(rng.integers(1, 14)), image=False) for _ in range(N)]
    ds = el.Dataset.create(robot_schema(image=False), str(tmp_path_factory.mktemp("sel") / "ds"))
    for i in range(0, N, 10):  # several commits: several table files
        ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws[i : i + 10])
    ids = [int(e) for e in ds.episode_ids]  # in write order, one per raw episode
    return ds, dict(zip(ids, raws, strict=True))


def matching(raws: dict, *names: str) -> set[int]:
    return {i for i, r in raws.items() if all(PREDICATES[n][1](r) for n in names)}


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_a_filter_on_a_view_is_the_intersection(lake, a, b):
    ds, raws = lake
    expected = matching(raws, a, b)
    view = ds.where(PREDICATES[a][0]).where(PREDICATES[b][0])
    assert set(view.episode_ids.tolist()) == expected
    assert set(ds.where(f"({PREDICATES[a][0]}) AND ({PREDICATES[b][0]})").episode_ids.tolist()) == expected
    outer = ds.where(PREDICATES[a][0])
    inner = outer.select_episodes(f"SELECT episode_id FROM episodes WHERE {PREDICATES[b][0]}")
    assert set(inner.episode_ids.tolist()) == expected
    # a nested view's reads answer for its own episodes only
    assert {int(i) for i in view.sql("SELECT episode_id FROM episodes").fetchnumpy()["episode_id"]} == expected
    assert len(view) == len(expected) and view.num_steps == sum(raws[i].length for i in expected)
    if expected:
        assert view.stats()["length"]["count"] == len(expected)


@pytest.mark.parametrize(("a", "b"), PAIRS[:8], ids=[f"{a}-{b}" for a, b in PAIRS[:8]])
def test_sampling_a_view_with_where_and_filter_draws_the_intersection(lake, a, b):
    ds, raws = lake
    view = ds.where(PREDICATES[a][0])
    both = matching(raws, a, b)
    by_filter = view.segments(1, filter=lambda ref: PREDICATES[b][1](raws[ref.episode_id]))
    assert {int(by_filter[i].episode_id) for i in range(len(by_filter))} == both
    if not both:
        return
    stream = view.segment_stream(1, batch_size=64, seed=0, where=PREDICATES[b][0], prefetch=0)
    drawn = {int(e) for _ in range(20) for e in stream.sample().episode_id}
    assert drawn == both  # 1280 draws over at most 40 episodes' steps: every one is hit


def test_a_weights_query_must_return_both_columns(lake):
    """An ``el.Weighted`` query must return ``episode_id`` and ``weight`` (its docs): one of them missing is refused."""
    ds, _ = lake
    for query in ("SELECT episode_id FROM episodes", "SELECT 1.0 AS weight FROM episodes"):
        with pytest.raises(el.ArgumentError, match="episode_id and weight"):
            ds.segment_stream(1, sampler=el.Weighted(query))


def test_a_filter_that_is_not_callable_is_refused_by_name(lake):
    ds, _ = lake
    for bad in ("length > 3", 3):
        with pytest.raises(el.ArgumentError, match="filter must be callable"):
            ds.segments(1, filter=bad)
