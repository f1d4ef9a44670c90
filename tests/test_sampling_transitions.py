"""sample_transitions: n-step returns, bootstrapping flags, frame stacks, action chunks vs the reference."""

from __future__ import annotations

import numpy as np
import pytest

import episodelake as el
from episodelake.read.batching import reader_for
from episodelake.sampling.transitions import build_transitions

from .reference import expected_transition
from .test_sampling import make_dataset, raw_by_id


@pytest.fixture(scope="module")
def lake():
    return make_dataset(None)


def check_transitions(tr, by_id, n, gamma, k, h):
    for b in range(len(tr)):
        ep = by_id[int(tr.episode_id[b])]
        want = expected_transition(ep, int(tr.start[b]), n, gamma, k, h)
        for key in ("n_steps", "terminated", "truncated", "obs_mask", "next_obs_mask", "action_mask"):
            np.testing.assert_array_equal(getattr(tr, key)[b], want[key], err_msg=key)
        np.testing.assert_allclose(tr.reward[b], want["reward"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(tr.discount[b], want["discount"], rtol=1e-6)
        for name in ("state", "camera"):
            obs, nxt = want[f"obs/{name}"], want[f"next_obs/{name}"]
            np.testing.assert_array_equal(tr.obs[name][b], obs if k > 1 else obs[0])
            np.testing.assert_array_equal(tr.next_obs[name][b], nxt if k > 1 else nxt[0])
        act = want["action/action"]
        np.testing.assert_array_equal(tr.action[b], act if h > 1 else act[0])
        assert tr.meta["task"][b] == ep.meta["task"]


@pytest.mark.parametrize(
    ("n", "gamma", "k", "h"),
    [(1, 0.99, 1, 1), (3, 0.9, 1, 1), (5, 0.5, 3, 4), (1, 1.0, 4, 2), (40, 0.97, 2, 1)],
)
def test_every_transition_matches_reference(lake, n, gamma, k, h):
    ds, raw = lake
    snap = ds.snapshot()
    pos = np.repeat(np.arange(len(raw)), snap.lengths)
    t = np.concatenate([np.arange(T) for T in snap.lengths])
    tr = build_transitions(reader_for(snap), pos, t, n, gamma, k, h)
    assert len(tr) == sum(e.length for e in raw)
    check_transitions(tr, raw_by_id(ds, raw), n, gamma, k, h)


def test_bootstrap_discount_zero_only_after_termination(lake):
    ds, raw = lake
    snap = ds.snapshot()
    last = snap.lengths - 1
    tr = build_transitions(reader_for(snap), np.arange(len(raw)), last, n_step=2, gamma=0.9)
    for b, ep in enumerate(raw):
        assert bool(tr.terminated[b]) == ep.terminated and bool(tr.truncated[b]) == ep.truncated
        assert tr.discount[b] == pytest.approx(0.0 if ep.terminated else 0.9)


def test_sampled_transitions_match_reference_and_are_seeded(lake):
    ds, raw = lake
    by_id = raw_by_id(ds, raw)
    a = ds.sample_transitions(64, n_step=3, gamma=0.95, history=2, horizon=3, seed=4)
    b = ds.sample_transitions(64, n_step=3, gamma=0.95, history=2, horizon=3, seed=4)
    np.testing.assert_array_equal(a.start, b.start)
    np.testing.assert_array_equal(a.episode_id, b.episode_id)
    check_transitions(a, by_id, 3, 0.95, 2, 3)
    rng = np.random.default_rng(0)
    c, d = ds.sample_transitions(32, rng=rng), ds.sample_transitions(32, rng=rng)
    assert (c.start != d.start).any() or (c.episode_id != d.episode_id).any()
    check_transitions(d, by_id, 1, 0.99, 1, 1)
    picks = ds.sample_transitions(32, seed=1, where="task = 'place'")
    assert {by_id[int(e)].meta["task"] for e in picks.episode_id} == {"place"}


def test_obs_and_next_obs_share_one_buffer_through_map(lake):
    ds, _ = lake
    tr = ds.sample_transitions(8, history=3, seed=0)
    assert np.shares_memory(tr.obs.camera, tr.next_obs.camera)
    mapped = tr.map(lambda x: x.copy() if isinstance(x, np.ndarray) else x)
    assert np.shares_memory(mapped.obs.camera, mapped.next_obs.camera)
    np.testing.assert_array_equal(mapped.next_obs.state, tr.next_obs.state)


def test_bad_transition_arguments(lake):
    ds, _ = lake
    with pytest.raises(el.ValidationError, match="n_step"):
        ds.sample_transitions(4, n_step=0)
    with pytest.raises(el.ValidationError, match="gamma"):
        ds.sample_transitions(4, gamma=1.5)
    with pytest.raises(el.ValidationError, match="history"):
        ds.sample_transitions(4, history=-1)


def test_one_step_reward_is_the_stored_reward_exactly(lake):
    """n_step = 1: each transition's reward is the written reward, bit for bit (no float64 round trip drift)."""
    ds, raw = lake
    snap = ds.snapshot()
    pos = np.repeat(np.arange(len(raw)), snap.lengths)
    t = np.concatenate([np.arange(T) for T in snap.lengths])
    tr = build_transitions(reader_for(snap), pos, t)
    by_id = raw_by_id(ds, raw)
    want = np.array([by_id[int(e)].reward[s] for e, s in zip(tr.episode_id, tr.start, strict=True)])
    assert tr.reward.dtype == want.dtype and np.array_equal(tr.reward, want)
