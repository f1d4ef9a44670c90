"""Whole episodes: ``to_numpy()`` and padded trajectory batches, against NumPy re-assembly of what was written."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

import episodelake as el

from .conftest import robot_schema
from .reference import random_episode


def build(lengths, path=None, seed=0):
    rng = np.random.default_rng(seed)
    raws = [random_episode(rng, T) for T in lengths]
    ds = el.Dataset.create(robot_schema(), path)
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    return ds, raws


def reference_flat(raws):
    """What to_numpy() must return, assembled from the written arrays."""
    return {
        "observation/state": np.concatenate([r.obs["state"] for r in raws]),
        "observation/camera": np.concatenate([r.obs["camera"] for r in raws]),
        "action": np.concatenate([r.action["action"] for r in raws]),
        "reward": np.concatenate([r.reward for r in raws]),
        "length": np.array([r.length for r in raws]),
        "terminated": np.array([r.terminated for r in raws]),
        "truncated": np.array([r.truncated for r in raws]),
        "offsets": np.concatenate([[0], np.cumsum([r.length for r in raws])]),
        "obs_offsets": np.concatenate([[0], np.cumsum([r.length + 1 for r in raws])]),
        "meta/task": np.array([r.meta["task"] for r in raws], dtype=object),
        "meta/success": np.array([r.meta["success"] for r in raws]),
    }


@pytest.mark.parametrize("where", [None, "task = 'pick'"])
def test_to_numpy_flat_matches_the_written_episodes(tmp_path, where):
    ds, raws = build([3, 1, 7, 12, 5, 2], str(tmp_path / "ds"))
    coll = ds if where is None else ds.where(where)
    keep = [r for r in raws if where is None or r.meta["task"] == "pick"]
    got = coll.to_numpy()
    want = reference_flat(keep)
    assert set(got) == {*want, "episode_id", "meta_mask/task", "meta_mask/success"}
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
        assert got[k].dtype == v.dtype or k.startswith("meta/task") or k.endswith("offsets"), k
    np.testing.assert_array_equal(got["episode_id"], coll.episode_ids)
    assert got["meta_mask/task"].all()


def test_to_numpy_padded_matches_reference():
    ds, raws = build([3, 1, 7, 12])
    got = ds.to_numpy(pad=True)
    L = 12
    for i, r in enumerate(raws):
        T = r.length
        state = np.zeros((L + 1, 5), np.float32)
        state[: T + 1] = r.obs["state"]
        np.testing.assert_array_equal(got["observation/state"][i], state)
        reward = np.zeros(L, np.float32)
        reward[:T] = r.reward
        np.testing.assert_array_equal(got["reward"][i], reward)
        np.testing.assert_array_equal(got["mask"][i], np.arange(L) < T)
    assert got["observation/camera"].shape == (4, L + 1, 3, 8, 8)
    assert got["length"].tolist() == [3, 1, 7, 12]


def test_to_numpy_of_an_empty_view_has_schema_shapes():
    ds, _ = build([3, 4])
    got = ds.where("length > 100").to_numpy()
    assert got["observation/camera"].shape == (0, 3, 8, 8)
    assert got["offsets"].tolist() == [0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(1, 15), min_size=1, max_size=8),
    batch_size=st.integers(1, 6),
    pad_value=st.sampled_from([0, 3, 255]),
    seed=st.integers(0, 1000),
)
def test_trajectory_batches_pad_mask_and_align(lengths, batch_size, pad_value, seed):
    ds, raws = build(lengths, seed=seed)
    by_id = dict(zip(ds.episode_ids.tolist(), raws, strict=True))
    b = ds.trajectories(batch_size, seed=seed, pad_value=pad_value).sample()
    L = max(by_id[i].length for i in b.episode_id.tolist())
    assert b.mask.shape == (batch_size, L) and b.all_obs.state.shape == (batch_size, L + 1, 5)
    assert b.action.shape == (batch_size, L)
    for i, eid in enumerate(b.episode_id.tolist()):
        r = by_id[eid]
        T = r.length
        assert b.lengths[i] == T and b.start[i] == 0
        np.testing.assert_array_equal(b.mask[i], np.arange(L) < T)
        np.testing.assert_array_equal(b.all_obs.state[i, : T + 1], r.obs["state"])
        np.testing.assert_array_equal(b.all_obs.camera[i, : T + 1], r.obs["camera"])
        assert (b.all_obs.state[i, T + 1 :] == pad_value).all() and (b.all_obs.camera[i, T + 1 :] == pad_value).all()
        np.testing.assert_array_equal(b.action[i, :T], r.action["action"])
        assert (b.action[i, T:] == pad_value).all() and (b.reward[i, T:] == pad_value).all()
        # T+1 rule: next_obs at step t is obs at step t + 1, inside the episode
        np.testing.assert_array_equal(b.next_obs.state[i, : T - 1], b.obs.state[i, 1:T])
        np.testing.assert_array_equal(b.next_obs.state[i, T - 1], r.obs["state"][T])
        assert b.terminated[i, T - 1] == r.terminated and not b.terminated[i, : T - 1].any()


def test_ordered_and_shuffled_passes_visit_every_episode_once():
    ds, _ = build([2, 5, 3, 9, 1, 4, 6])
    ids = ds.episode_ids.tolist()
    ordered = ds.trajectories(3, sampler=el.Sequential())
    assert len(ordered) == 3
    assert [i for b in ordered for i in b.episode_id.tolist()] == ids
    assert [len(b.episode_id) for b in ordered] == [3, 3, 1]  # a second for loop runs the next pass
    perm = ds.trajectories(3, sampler=el.Uniform(replacement=False), seed=5, drop_last=True)
    assert len(perm) == 2
    first = [i for b in perm for i in b.episode_id.tolist()]
    assert len(first) == 6 and len(set(first)) == 6 and set(first) <= set(ids)
    second = [i for b in perm for i in b.episode_id.tolist()]
    assert first != second  # a new permutation per pass
    with pytest.raises(TypeError, match="no len"):
        len(ds.trajectories(3))


def test_with_replacement_is_uniform_over_episodes():
    ds, _ = build([2, 5, 3, 9, 1])
    stream = ds.trajectories(50, seed=0)
    ids = np.concatenate([stream.sample().episode_id for _ in range(80)])
    counts = np.array([(ids == i).sum() for i in ds.episode_ids])
    assert counts.sum() == 4000
    assert chisquare(counts).pvalue > 1e-4


def test_state_dict_resumes_exactly():
    ds, _ = build([2, 5, 3, 9, 1, 4])
    for kwargs in ({"seed": 2}, {"sampler": el.Uniform(replacement=False), "seed": 3}, {"sampler": el.Sequential()}):
        s = ds.trajectories(4, **kwargs)
        s.sample()
        state = s.state_dict()
        expected = s.sample()
        resumed = ds.trajectories(4, **kwargs)
        resumed.load_state_dict(state)
        got = resumed.sample()
        np.testing.assert_array_equal(got.episode_id, expected.episode_id)
        np.testing.assert_array_equal(got.all_obs.camera, expected.all_obs.camera)
    state = ds.trajectories(4, seed=2).state_dict()
    with pytest.raises(el.ArgumentError, match=r"batch_size is 4 in the saved state but 5 here"):
        ds.trajectories(5, seed=2).load_state_dict(state)
    with pytest.raises(el.ArgumentError, match=r"mode is 'random' in the saved state but 'ordered' here"):
        ds.trajectories(4, sampler=el.Sequential()).load_state_dict(state)


def test_where_filter_and_bad_arguments():
    ds, _ = build([2, 5, 3, 9])
    b = ds.trajectories(8, seed=0, where="length > 2", filter=lambda ep: ep.length < 9).sample()
    assert set(b.lengths.tolist()) <= {5, 3}
    with pytest.raises(el.ArgumentError, match=r"pad_value -1 does not fit field 'observation/camera' \(uint8\)"):
        ds.trajectories(2, pad_value=-1)
    with pytest.raises(el.ArgumentError, match=r"batch_size must be a positive int"):
        ds.trajectories(0)
    with pytest.raises(el.ArgumentError, match=r"nothing to sample"):
        ds.trajectories(2, where="length > 100")
