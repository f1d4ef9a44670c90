"""Grain data source over ``segments()`` (issue 42, items 4 and 5), with the real ``grain`` package, in process.

Records are plain dicts of arrays equal to the raw episodes (:mod:`tests.reference`); Grain batches them
(the ``TypeError: Segment keys are str`` of handing Grain ``Segment`` items is gone); the source pickles;
``_getitems`` equals item-by-item reads; two datasets mix through ``grain.MapDataset.mix`` with fixed weights
and are normalized with ``el.concat(...).stats()``, checked against NumPy over the union. Resume with
``grain.DataLoader`` workers across processes: ``tests/test_trainer_resume.py``.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

grain = pytest.importorskip("grain")

import episodelake as el  # noqa: E402
from episodelake.integrations.grain import GrainSource  # noqa: E402

from .conftest import robot_schema  # noqa: E402
from .reference import expected_all_obs, expected_segment, random_episode  # noqa: E402

L = 5


def build(seed: int, episodes: int) -> tuple[el.Dataset, dict[int, object]]:
    rng = np.random.default_rng(seed)
    raws = [random_episode(rng, int(rng.integers(1, 20))) for _ in range(episodes)]
    ds = el.Dataset.create(robot_schema(), None)
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    ids = sorted(ep.episode_id for ep in ds.episodes())
    return ds, dict(zip(ids, raws, strict=True))


def check_record(rec: dict, raws: dict) -> None:
    ep = raws[int(rec["episode_id"])]
    want = expected_segment(ep, int(rec["start"]), L)
    obs = expected_all_obs(ep, int(rec["start"]), L)
    real = int(want["mask"].sum())
    for name in ("state", "camera"):
        np.testing.assert_array_equal(rec[f"observation/{name}"][: real + 1], obs[name][: real + 1])
    np.testing.assert_array_equal(rec["action"], want["action/action"])
    for key in ("reward", "terminated", "truncated", "mask"):
        np.testing.assert_array_equal(rec[key], want[key])
    assert str(rec["meta/task"]) == ep.meta["task"] and bool(rec["meta/success"]) == ep.meta["success"]


def test_records_are_plain_dicts_equal_to_the_raw_episodes_and_grain_batches_them():
    ds, raws = build(0, 10)
    segs = ds.segments(L)
    with pytest.raises(TypeError, match="Segment keys are str"):  # what Grain's batching did with Segment items
        segs[0][0]
    source = GrainSource(segs)
    assert len(source) == len(segs)
    for i in range(len(source)):
        rec = source[i]
        assert all(isinstance(v, np.ndarray) for v in rec.values())
        check_record(rec, raws)
    ids = [3, 0, len(source) - 1, 3]
    for a, b in zip(source._getitems(ids), [source[i] for i in ids], strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    again = pickle.loads(pickle.dumps(source))
    assert all(np.array_equal(again[5][k], source[5][k]) for k in source[5])
    batched = grain.MapDataset.source(source).shuffle(seed=0).batch(4)
    first = batched[0]
    assert first["observation/camera"].shape == (4, L + 1, 3, 8, 8) and first["meta/task"].shape == (4,)
    for j in range(4):
        check_record({k: v[j] for k, v in first.items()}, raws)
    with pytest.raises(IndexError):
        source[len(source)]


def test_data_loader_without_workers_resumes_from_its_state():
    ds, _ = build(1, 8)
    source = GrainSource(ds.segments(L))
    sampler = grain.samplers.IndexSampler(
        len(source), shard_options=grain.sharding.NoSharding(), shuffle=True, num_epochs=1, seed=3
    )
    loader = grain.DataLoader(data_source=source, sampler=sampler, operations=[grain.transforms.Batch(3)])
    it = iter(loader)
    next(it), next(it)
    state = it.get_state()
    rest = [b["start"].tolist() + b["episode_id"].tolist() for b in it]
    again = iter(loader)
    again.set_state(state)
    assert [b["start"].tolist() + b["episode_id"].tolist() for b in again] == rest


def test_mixing_with_fixed_weights_and_union_statistics():
    """Item 5 through Grain: sources mixed 3:1, normalized with the statistics of the union."""
    a, raws_a = build(2, 12)
    b, raws_b = build(3, 4)
    stats = el.concat([a, b], weights=[3, 1]).stats(["observation/state"])["observation/state"]
    union = np.concatenate([r.obs["state"] for r in [*raws_a.values(), *raws_b.values()]])
    np.testing.assert_allclose(stats["mean"], union.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["std"], union.std(0), rtol=1e-4, atol=1e-6)
    parts = [grain.MapDataset.source(GrainSource(d.segments(L))).shuffle(seed=0).repeat() for d in (a, b)]
    mixed = grain.MapDataset.mix(parts, weights=[3, 1])
    norm = mixed.map(lambda r: {**r, "state": (r["observation/state"] - stats["mean"]) / stats["std"]})
    recs = [norm[i] for i in range(400)]
    from_b = np.mean([int(r["episode_id"]) in raws_b for r in recs])
    assert from_b == pytest.approx(0.25, abs=0.01)
    for r in recs[:40]:
        raws = raws_b if int(r["episode_id"]) in raws_b else raws_a
        check_record(r, raws)
        np.testing.assert_allclose(r["state"], (r["observation/state"] - union.mean(0)) / union.std(0), rtol=1e-4)
