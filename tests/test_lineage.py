"""Stream lineage: state files rebuild identical streams in fresh processes; ``ds.changes`` against recorded truth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import episodelake as el
from episodelake.dataset import DatasetView
from episodelake.lineage import describe, dumps_state, loads_state

from .conftest import build_robot_dataset, robot_schema
from .reference import random_episode
from .scripts import lineage_resume as worker

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "lineage_resume.py"
K, N = 3, 4  # batches before the checkpoint, batches after it


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=300)


def reference(ds: el.Dataset, case: str, seed: int) -> list[dict[str, np.ndarray]]:
    """Batches K .. K+N-1 of an uninterrupted run of ``case`` in this process."""
    steps, kwargs = worker.CASES[case]
    worker.CASES[case] = (steps, {**kwargs, "seed": seed})
    try:
        stream = worker.build(ds, case)
    finally:
        worker.CASES[case] = (steps, kwargs)
    batches = [worker.arrays(worker.step(stream)) for _ in range(K + N)]
    return batches[K:]


@pytest.mark.slow
def test_checkpoint_resumes_bit_identically_in_a_fresh_process(tmp_path):
    path = str(tmp_path / "ds")
    build_robot_dataset(path, seed=4, episodes=30, per_commit=10, max_length=20)
    states = tmp_path / "states"
    states.mkdir()
    done = run(str(SCRIPT), "checkpoint", path, str(K), str(states))
    assert done.returncode == 0, done.stderr
    assert sorted(p.stem for p in states.glob("*.json")) == sorted(worker.CASES)
    out = tmp_path / "resumed.npz"
    done = run(str(SCRIPT), "resume", str(states), str(N), str(out))
    assert done.returncode == 0, done.stderr
    resumed = np.load(out)
    ds = el.Dataset.open(path, read_only=True)
    for case in worker.CASES:
        state = el.load_state(states / f"{case}.json")
        want = reference(ds, case, state["lineage"]["stream"]["seed"])
        for i, batch in enumerate(want):
            assert {k for k in resumed.files if k.startswith(f"{case}/{i}/")} == {f"{case}/{i}/{k}" for k in batch}
            for key, value in batch.items():
                np.testing.assert_array_equal(resumed[f"{case}/{i}/{key}"], value, err_msg=f"{case} batch {i} {key}")
        # the old path: a stream built by hand with the same arguments loads the state (as saved before lineage)
        steps, kwargs = worker.CASES[case]
        worker.CASES[case] = (steps, {**kwargs, "seed": state["lineage"]["stream"]["seed"]})
        try:
            by_hand = worker.build(ds, case)
        finally:
            worker.CASES[case] = (steps, kwargs)
        by_hand.load_state_dict({k: v for k, v in state.items() if k != "lineage"})
        for batch in want:
            got = worker.arrays(worker.step(by_hand))
            for key, value in batch.items():
                np.testing.assert_array_equal(got[key], value, err_msg=f"{case} by hand {key}")


@pytest.fixture
def disk_dataset(tmp_path):
    path = str(tmp_path / "ds")
    build_robot_dataset(path, seed=2, episodes=12, per_commit=6, max_length=12)
    return el.Dataset.open(path)


def test_lineage_names_everything_and_travels_as_json(disk_dataset):
    ds = disk_dataset
    view = ds.where("length > $n", {"n": 3}).select_episodes("SELECT episode_id FROM episodes WHERE task = 'pick'")
    stream = view.segment_stream(3, batch_size=2, shard=(1, 2), sampler=el.Prioritized("length", alpha=0.5))
    next(stream)
    lineage = stream.state_dict()["lineage"]
    assert json.loads(json.dumps(lineage)) == lineage
    assert lineage["url"] == ds.location.url and lineage["version"] == ds.version
    assert lineage["selection"] == [
        {"where": "length > $n", "params": {"n": 3}},
        {"select_episodes": "SELECT episode_id FROM episodes WHERE task = 'pick'", "params": None},
    ]
    args = lineage["stream"]
    assert args["shard"] == [1, 2] and args["priority"] == "length" and args["alpha"] == 0.5
    assert isinstance(args["seed"], int) and args["seed"] == stream.state_dict()["params"]["seed"]  # fresh entropy
    text = describe(stream.state_dict())
    assert "length > $n" in text and "rank 1 of 2" in text and f"seed={args['seed']}" in text


def test_arguments_that_cannot_travel_must_be_passed_again(disk_dataset):
    ds = disk_dataset
    weights = np.linspace(1.0, 2.0, len(ds))
    stream = ds.segment_stream(2, batch_size=3, seed=1, sampler=el.Weighted(weights), prefetch=0)
    next(stream)
    state = stream.state_dict()
    assert state["lineage"]["stream"]["weights"]["given"] == "array"
    with pytest.raises(el.ArgumentError, match="weights"):
        el.stream_from_state(state)
    with pytest.raises(el.ArgumentError, match="filter"):
        el.stream_from_state(state, sampler=el.Weighted(weights), filter=lambda e: True)
    again = el.stream_from_state(state, sampler=el.Weighted(weights))
    np.testing.assert_array_equal(next(again).data["observation/state"], next(stream).data["observation/state"])
    with pytest.raises(el.ArgumentError, match="weights"):  # other weights: the fingerprint differs
        el.stream_from_state(state, sampler=el.Weighted(weights[::-1].copy()))

    def long(e: el.EpisodeRef) -> bool:
        return e.length > 4

    filtered = ds.segment_stream(2, batch_size=2, seed=3, filter=long)
    state = filtered.state_dict()
    assert state["lineage"]["stream"]["filter"] == {"given": "callable " + long.__qualname__}
    with pytest.raises(el.ArgumentError, match="filter"):
        el.stream_from_state(state)
    np.testing.assert_array_equal(
        next(el.stream_from_state(state, filter=long)).data["reward"], next(filtered).data["reward"]
    )

    def flip(frames: np.ndarray) -> np.ndarray:
        return frames[..., ::-1]

    flipped = ds.segment_stream(2, batch_size=2, seed=3, transform={"observation/camera": flip})
    state = flipped.state_dict()
    assert state["lineage"]["stream"]["transform"] == {"given": "transform"}
    with pytest.raises(el.ArgumentError, match="transform"):
        el.stream_from_state(state)
    again = el.stream_from_state(state, transform={"observation/camera": flip})
    np.testing.assert_array_equal(next(again).data["observation/camera"], next(flipped).data["observation/camera"])


def test_unrecorded_sources_need_the_collection(disk_dataset):
    ds = disk_dataset
    view = DatasetView(ds, ds.snapshot(), np.arange(0, len(ds), 2))  # chosen by means lineage cannot see
    stream = view.segment_stream(2, batch_size=2, seed=0)
    state = stream.state_dict()
    assert state["lineage"]["selection"] is None
    with pytest.raises(el.ArgumentError, match="collection="):
        el.stream_from_state(state)
    np.testing.assert_array_equal(
        next(el.stream_from_state(state, collection=view)).data["reward"], next(stream).data["reward"]
    )
    memory = el.Dataset.create(build_schema())
    rng = np.random.default_rng(0)
    memory.append_episodes(random_episode(rng, 4, image=False).as_dict(unwrap_action=True) for _ in range(3))
    state = memory.segment_stream(2, batch_size=2, seed=0).state_dict()
    with pytest.raises(el.ArgumentError, match="in-memory"):
        el.stream_from_state(state)
    with pytest.raises(el.ArgumentError, match="lineage"):
        el.stream_from_state({k: v for k, v in state.items() if k != "lineage"})
    with pytest.raises(el.ArgumentError, match="version"):  # a version the table never had
        el.stream_from_state({**state, "lineage": {**state["lineage"], "url": ds.location.url, "version": 99}})


@pytest.fixture(scope="module")
def shared_dataset(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("lineage") / "ds")
    build_robot_dataset(path, seed=8, episodes=16, per_commit=8, max_length=14)
    return el.Dataset.open(path, read_only=True)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mode=st.sampled_from(["random", "permutation", "ordered", "weighted", "prioritized"]),
    length=st.integers(1, 6),
    batch=st.integers(1, 7),
    stride=st.integers(1, 3),
    pad=st.sampled_from(["suffix", "prefix", None]),
    shard=st.integers(1, 3).flatmap(lambda w: st.tuples(st.integers(0, w - 1), st.just(w))),
    where=st.sampled_from([None, "length > 3", "task = 'pick'"]),
    taken=st.integers(0, 9),
)
def test_any_stream_rebuilds_from_its_state(shared_dataset, mode, length, batch, stride, pad, shard, where, taken):
    """Whatever the arguments, stream_from_state(state) continues exactly as the original stream does."""
    sampler = {
        "random": el.Uniform(),
        "permutation": el.Uniform(replacement=False),
        "ordered": el.Sequential(),
        "weighted": el.Weighted("length"),
        "prioritized": el.Prioritized("1.0 + length", alpha=0.7),
    }[mode]
    window = el.Window(length, pad=pad, stride=stride)
    kwargs = {"batch_size": batch, "sampler": sampler, "shard": shard, "where": where, "seed": 17, "prefetch": 0}
    try:
        stream = shared_dataset.segment_stream(window, **kwargs)
    except el.ArgumentError:  # e.g. nothing to sample with this length, pad and where
        assume(False)
    for _ in range(taken):
        worker.step(stream)
    state = loads_state(dumps_state(stream.state_dict()))  # through the JSON a state file holds
    again = el.stream_from_state(state)
    for _ in range(3):
        want, got = worker.arrays(worker.step(stream)), worker.arrays(worker.step(again))
        assert want.keys() == got.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@settings(max_examples=40, deadline=None)
@given(
    arrays=st.lists(
        hnp.arrays(
            st.sampled_from([np.float64, np.float32, np.int64, np.uint8, np.bool_]),
            hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
        ),
        max_size=3,
    ),
    big=st.integers(min_value=0, max_value=2**128),
)
def test_state_files_keep_arrays_and_big_ints_exactly(arrays, big):
    state = {"rng": {"state": {"state": big}}, "items": arrays, "nested": {"a": arrays[:1], "s": "x"}}
    back = loads_state(dumps_state(state))
    assert back["rng"]["state"]["state"] == big and back["nested"]["s"] == "x"
    for got, want in zip(back["items"] + back["nested"]["a"], arrays + arrays[:1], strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_cli_lineage_prints_the_state(disk_dataset, tmp_path):
    ds = disk_dataset
    stream = ds.where("task = 'place'").segment_stream(
        2, batch_size=2, seed=9, sampler=el.Uniform(replacement=False), shard=(0, 2)
    )
    next(stream)
    state_file = tmp_path / "state.json"
    el.save_state(stream.state_dict(), state_file)
    text = run("-m", "episodelake.cli", "lineage", str(state_file))
    assert text.returncode == 0, text.stderr
    for expected in (ds.location.url, f"version    {ds.version}", "where: task = 'place'", "seed=9", "rank 0 of 2"):
        assert expected in text.stdout
    assert "positions consumed" in text.stdout
    as_json = run("-m", "episodelake.cli", "lineage", str(state_file), "--json")
    assert as_json.returncode == 0, as_json.stderr
    parsed = json.loads(as_json.stdout)
    assert parsed["lineage"] == stream.state_dict()["lineage"]
    assert parsed["position"]["consumed"] == stream.state_dict()["consumed"] == 4
    state_file.write_text("{not json")
    bad = run("-m", "episodelake.cli", "lineage", str(state_file))
    assert bad.returncode == 1 and bad.stderr.startswith("episodelake: error: state: not JSON")


# ---- ds.changes(since_version) against a ground truth recorded by the test


def _derived_schema() -> el.DatasetSchema:
    fields = [*build_schema().fields, el.FieldSpec("score", (), "float64", role="meta", derived=True)]
    return el.DatasetSchema(fields)


def build_schema() -> el.DatasetSchema:
    return robot_schema(image=False)


@pytest.mark.parametrize("seed", [0, 1])
def test_changes_match_the_recorded_truth(tmp_path, seed):
    rng = np.random.default_rng(seed)
    ds = el.Dataset.create(_derived_schema(), str(tmp_path / "ds"))
    live: dict[int, float | None] = {}  # episode id -> score: the truth, kept by the test
    truth = {ds.version: dict(live)}
    ops = ["append", *rng.permutation(["append"] * 3 + ["update"] * 3 + ["delete"] * 2 + ["compact"])]
    for op in ops:
        if op == "append" or not live:
            before = set(live)
            ds.append_episodes(
                random_episode(rng, int(rng.integers(1, 6)), image=False).as_dict(unwrap_action=True)
                for _ in range(int(rng.integers(1, 5)))
            )
            ds.flush()
            for eid in set(map(int, ds.episode_ids)) - before:
                live[eid] = None
        elif op == "delete":
            doomed = rng.choice(sorted(live), size=int(rng.integers(1, len(live) + 1)), replace=False)
            ds.delete([int(i) for i in doomed])
            for eid in doomed:
                del live[int(eid)]
        elif op == "update":
            chosen = [int(i) for i in rng.choice(sorted(live), size=int(rng.integers(1, len(live) + 1)), replace=False)]
            values = [float(rng.choice([0.5, 1.5, float("nan")])) for _ in chosen]
            ds.columns.update({"score": values}, chosen)
            live.update(zip(chosen, values, strict=True))
        else:
            ds.maintenance.compact()
        truth[ds.version] = dict(live)
    now = truth[ds.version]
    for since, then in truth.items():
        got = ds.changes(since)
        both = set(then) & set(now)

        def same(a: float | None, b: float | None) -> bool:
            return a == b or (a is not None and b is not None and np.isnan(a) and np.isnan(b))

        assert got.since == since and got.version == ds.version
        assert got.added.tolist() == sorted(set(now) - set(then)), since
        assert got.removed.tolist() == sorted(set(then) - set(now)), since
        assert got.updated.tolist() == sorted(e for e in both if not same(then[e], now[e])), since
        assert bool(got) == bool(len(got.added) or len(got.removed) or len(got.updated))


def test_changes_see_evictions_and_reject_bad_versions(tmp_path):
    rng = np.random.default_rng(5)
    ds = el.Dataset.create(build_schema(), str(tmp_path / "buf"), capacity={"episodes": 4})
    order: list[int] = []  # ids in the order they were appended: the truth of FIFO eviction
    versions = {}
    for _ in range(4):
        before = set(map(int, ds.episode_ids))
        ds.append_episodes(random_episode(rng, 3, image=False).as_dict(unwrap_action=True) for _ in range(3))
        ds.flush()
        order += sorted(set(map(int, ds.episode_ids)) - before)
        versions[ds.version] = list(order[-4:])
    first = min(versions)
    got = ds.changes(first)
    assert got.removed.tolist() == sorted(set(versions[first]) - set(order[-4:]))
    assert got.added.tolist() == sorted(set(order[-4:]) - set(versions[first]))
    for bad in (-1, ds.version + 1, "1", True):
        with pytest.raises(el.ArgumentError, match="since_version"):
            ds.changes(bad)


def test_changes_read_only_the_files_that_differ(tmp_path, monkeypatch):
    from episodelake.storage import table

    ds = el.Dataset.create(build_schema(), str(tmp_path / "ds"))
    rng = np.random.default_rng(2)
    for _ in range(5):
        ds.append_episodes(random_episode(rng, 3, image=False).as_dict(unwrap_action=True) for _ in range(2))
        ds.flush()
    since = ds.version
    ds.append_episodes(random_episode(rng, 3, image=False).as_dict(unwrap_action=True) for _ in range(2))
    ds.flush()
    read: list[str] = []
    real = table.read_table_file

    def spy(loc, path, columns=None):
        read.append(path)
        return real(loc, path, columns)

    monkeypatch.setattr(table, "read_table_file", spy)
    got = ds.changes(since)
    assert len(got.added) == 2 and len(read) == 1  # the one file the last commit added, of 6 live files
    assert len(ds._store.table.file_uris()) == 6


def test_a_follow_stream_is_rebuilt_at_its_version(tmp_path):
    path = str(tmp_path / "ds")
    raws = build_robot_dataset(path, seed=6, episodes=6, per_commit=6, max_length=10)
    ds = el.Dataset.open(path)
    stream = ds.segment_stream(2, batch_size=2, seed=4, follow=True)
    next(stream)
    state = stream.state_dict()
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws[:2])
    ds.flush()
    again = el.stream_from_state(state)
    next(again)
    assert again.version == state["version"] < ds.version
