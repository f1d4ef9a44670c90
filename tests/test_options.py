"""The sampling option objects: one message per bad value, each strategy accepted or refused by each method."""

from __future__ import annotations

import numpy as np
import pytest

import episodelake as el
from episodelake.sampling.options import shard_of, window_of

from .conftest import build_robot_dataset


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: el.Window(), r"^window: give a length, or context and target$"),
        (lambda: el.Window(0), r"^window length must be a positive int, got 0$"),
        (lambda: el.Window(2.5), r"^window length must be a positive int, got 2\.5$"),
        (lambda: el.Window(True), r"^window length must be a positive int, got True$"),
        (lambda: el.Window(context=8), r"^window: give both context and target, got context=8, target=None$"),
        (lambda: el.Window(target=4), r"^window: give both context and target, got context=None, target=4$"),
        (lambda: el.Window(context=0, target=4), r"^window context must be a positive int, got 0$"),
        (lambda: el.Window(context=8, target=-1), r"^window target must be a positive int, got -1$"),
        (lambda: el.Window(10, context=8, target=4), r"^window: length=10 disagrees with context \+ target = 12$"),
        (lambda: el.Window(4, pad="middle"), r"^window pad must be 'suffix', 'prefix' or None, got 'middle'$"),
        (lambda: el.Window(4, stride=0), r"^window stride must be a positive int, got 0$"),
        (lambda: el.Uniform(replacement=0), r"^Uniform replacement must be a bool, got 0$"),
        (lambda: el.Weighted(None), r"^Weighted weights must be a SQL string or an array, got None$"),
        (lambda: el.Prioritized(None), r"^Prioritized priority must be a number, .* got None$"),
        (lambda: el.Prioritized(True), r"^Prioritized priority must be a number, .* got True$"),
        (lambda: el.Prioritized(alpha=-1), r"^Prioritized alpha must be a finite number >= 0, got -1$"),
        (lambda: el.Prioritized(beta=float("nan")), r"^Prioritized beta must be a finite number >= 0, got nan$"),
        (lambda: el.Shard(0, 0), r"^shard world must be a positive int, got 0$"),
        (lambda: el.Shard(2, 2), r"^shard rank must be an int in \[0, 2\), got 2$"),
        (lambda: el.Shard(-1, 2), r"^shard rank must be an int in \[0, 2\), got -1$"),
        (lambda: el.Shard(0, 2, policy="even"), r"^shard policy must be 'wrap' or 'drop', got 'even'$"),
        (lambda: window_of("16"), r"^window must be a positive int or an el\.Window, got '16'$"),
        (lambda: window_of(0), r"^window length must be a positive int, got 0$"),
        (lambda: shard_of(3), r"^shard must be \(rank, world\) or an el\.Shard, got 3$"),
        (lambda: shard_of((0, 1, 2)), r"^shard must be \(rank, world\) or an el\.Shard, got \(0, 1, 2\)$"),
        (lambda: shard_of((2, 2)), r"^shard rank must be an int in \[0, 2\), got 2$"),
    ],
)
def test_each_bad_value_has_one_message(make, message):
    with pytest.raises(el.ArgumentError, match=message):
        make()


def test_values_normalize():
    assert window_of(16) == el.Window(16) == el.Window(length=16, pad="suffix", stride=1)
    assert window_of(np.int64(3)).length == 3
    both = el.Window(context=8, target=4)
    assert both.length == both.size == 12 and (both.context, both.target) == (8, 4)
    assert el.Window(12, context=8, target=4) == both  # a length that agrees is accepted
    assert shard_of((1, 4)) == el.Shard(1, 4) and shard_of((1, 4)).policy == "wrap"
    assert shard_of(None) is None and shard_of(el.Shard(0, 2, "drop")).policy == "drop"
    assert el.Prioritized() == el.Prioritized(1.0, alpha=0.6, beta=0.4)
    with pytest.raises(AttributeError):
        both.length = 3  # frozen: one value, checked once


class FirstSegments:
    """A custom Sampler: always segment 0."""

    def sample(self, index, batch_size):
        return np.zeros(batch_size, np.int64)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("options") / "ds")
    build_robot_dataset(path, seed=3, episodes=8, per_commit=8, max_length=12)
    return el.Dataset.open(path, read_only=True)


STRATEGIES = {
    "uniform": lambda: el.Uniform(),
    "passes": lambda: el.Uniform(replacement=False),
    "sequential": lambda: el.Sequential(),
    "weighted": lambda: el.Weighted("length"),
    "prioritized": lambda: el.Prioritized("length"),
    "sampler": FirstSegments,
}
TAKES = {
    "segment_stream": set(STRATEGIES),
    "sample_transitions": {"uniform", "weighted", "prioritized", "sampler"},
    "trajectories": {"uniform", "passes", "sequential"},
    "concat segment_stream": {"uniform", "weighted"},
    "concat sample_transitions": {"uniform", "weighted"},
    "concat trajectories": {"uniform", "passes", "sequential"},
}


def call(ds, method, sampler):
    cat = el.concat([ds, ds], weights=[1, 1])  # source weights: el.Weighted within sources needs them
    calls = {
        "segment_stream": lambda: ds.segment_stream(2, batch_size=4, seed=0, sampler=sampler, prefetch=0).sample(),
        "sample_transitions": lambda: ds.sample_transitions(4, sampler=sampler),
        "trajectories": lambda: ds.trajectories(4, seed=0, sampler=sampler).sample(),
        "concat segment_stream": lambda: cat.segment_stream(2, batch_size=4, seed=0, sampler=sampler).sample(),
        "concat sample_transitions": lambda: cat.sample_transitions(4, seed=0, sampler=sampler),
        "concat trajectories": lambda: el.concat([ds, ds]).trajectories(4, seed=0, sampler=sampler).sample(),
    }
    return calls[method]()


@pytest.mark.parametrize("method", list(TAKES))
@pytest.mark.parametrize("kind", list(STRATEGIES))
def test_each_method_takes_its_strategies_and_names_them_otherwise(ds, method, kind):
    sampler = STRATEGIES[kind]()
    if kind in TAKES[method]:
        batch = call(ds, method, sampler)
        assert len(batch.episode_id) == 4
        return
    with pytest.raises(el.ArgumentError, match=r"does not apply; it takes el\.Uniform\(\)") as caught:
        call(ds, method, sampler)
    assert method.split()[-1] in str(caught.value) and repr(sampler) in str(caught.value)


def test_segments_to_ray_plans_passes_only(ds):
    from episodelake.sampling.ray_data import plan_pass

    with pytest.raises(el.ArgumentError, match=r"^segments_to_ray: sampler=Uniform\(replacement=True\) does not"):
        plan_pass(ds, 2, 4, 0, el.Uniform(), None, 0, None, False)
    shuffled = plan_pass(ds, 2, 4, 0, None, (0, 2), 0, None, False)  # None: one seeded shuffled pass
    stream = ds.segment_stream(2, batch_size=4, seed=0, sampler=el.Uniform(replacement=False), shard=(0, 2))
    assert [ids.tolist() for ids, _ in shuffled] == [b.episode_id.tolist() for b in stream]


def test_an_int_window_is_the_window_of_that_length(ds):
    a = ds.segment_stream(3, batch_size=8, seed=5, prefetch=0).sample()
    b = ds.segment_stream(el.Window(3), batch_size=8, seed=5, prefetch=0).sample()
    np.testing.assert_array_equal(a.data["observation/state"], b.data["observation/state"])
    assert len(ds.segments(3)) == len(ds.segments(el.Window(length=3)))
    assert len(ds.segments(el.Window(3, pad=None, stride=2))) < len(ds.segments(3))


def test_bad_sampler_and_shard_values_are_named(ds):
    with pytest.raises(el.ArgumentError, match=r"^sampler must be el\.Uniform, .* got 'uniform'$"):
        ds.segment_stream(2, sampler="uniform")
    with pytest.raises(el.ArgumentError, match=r"^shard must be \(rank, world\) or an el\.Shard, got '0,2'$"):
        ds.segment_stream(2, shard="0,2")
    with pytest.raises(el.ArgumentError, match=r"^seed and rng apply to the built-in draws"):
        ds.sample_transitions(4, seed=0, sampler=FirstSegments())


def record_03(**changes):
    """A lineage ``stream`` record as episodelake 0.3 wrote it: one keyword per option."""
    record = {
        "sequence_length": 3,
        "context_length": None,
        "target_length": None,
        "batch_size": 4,
        "seed": 7,
        "shuffle": True,
        "replacement": True,
        "pad": "suffix",
        "stride": 1,
        "where": None,
        "filter": None,
        "weights": None,
        "sampler": None,
        "priority": None,
        "alpha": None,
        "beta": None,
        "shard": [0, 1],
        "shard_policy": "wrap",
        "drop_last": False,
        "prefetch": 2,
        "follow": False,
        "transform": None,
    }
    return {**record, **changes}


@pytest.mark.parametrize(
    ("old", "window", "options"),
    [
        ({}, 3, {}),
        ({"shuffle": False, "shard": [1, 2]}, 3, {"sampler": el.Sequential(), "shard": (1, 2)}),
        (
            {"replacement": False, "shard": [1, 3], "shard_policy": "drop", "pad": None, "stride": 2},
            el.Window(3, pad=None, stride=2),
            {"sampler": el.Uniform(replacement=False), "shard": el.Shard(1, 3, policy="drop")},
        ),
        (
            {"sequence_length": None, "context_length": 2, "target_length": 1, "weights": "length"},
            el.Window(context=2, target=1),
            {"sampler": el.Weighted("length")},
        ),
        ({"priority": "length", "beta": 0.5}, 3, {"sampler": el.Prioritized("length", beta=0.5)}),
    ],
)
def test_a_03_lineage_record_rebuilds_with_the_option_objects(ds, old, window, options):
    """0.3's keyword record (shuffle=, replacement=, weights=, priority=, alpha/beta, shard_policy=) rebuilds."""
    by_hand = ds.segment_stream(window, batch_size=4, seed=7, prefetch=0, **options)
    next(by_hand)
    state = by_hand.state_dict()
    recorded = state["lineage"]["stream"]
    assert set(recorded) == set(record_03())  # the keys 0.3 recorded
    assert {k: v for k, v in recorded.items() if k not in ("alpha", "beta", "prefetch")} == {
        k: v for k, v in record_03(**old).items() if k not in ("alpha", "beta", "prefetch")
    }  # 0.3 recorded alpha/beta as given (None: the default); now as used
    state["lineage"]["stream"] = record_03(**old)
    rebuilt = el.stream_from_state(state, collection=ds)
    assert rebuilt.state_dict()["params"] == state["params"]
    np.testing.assert_array_equal(next(rebuilt).data["observation/state"], next(by_hand).data["observation/state"])
