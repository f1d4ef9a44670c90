"""Priorities of items no longer in the collection are kept but never drawn.

``PrioritizedSampler``: "an index handed out stays valid while the collection
grows, narrows or loses episodes (their slots then drop out of the draw; an
update to them is kept but not drawn)". The reference is the paper's formula
evaluated naively: ``P(i) = p_i**alpha / sum_j p_j**alpha`` over the items of
the episodes currently bound, 0 for the others.
"""

from __future__ import annotations

import numpy as np
import pytest

import episodelake as el
from episodelake.sampling.samplers import PrioritizedSampler

from .reference import random_episode

ALPHA = 0.7


def naive_probabilities(raw: np.ndarray, live: np.ndarray) -> np.ndarray:
    mass = np.where(live, raw**ALPHA, 0.0)
    return mass / mass.sum()


def test_updates_to_removed_items_are_kept_and_not_drawn():
    sampler = PrioritizedSampler(alpha=ALPHA, seed=0)
    counts = {10: 2, 11: 3, 12: 4}  # episode id -> items; slots are given out in this order
    slots = {e: np.arange(s, s + n) for e, s, n in zip(counts, np.cumsum([0, 2, 3]), counts.values(), strict=True)}
    sampler.bind(np.array(list(counts)), np.array(list(counts.values())))
    raw = np.ones(9)
    sampler.update_priorities(np.arange(9), np.linspace(0.5, 2.0, 9))
    raw[:] = np.linspace(0.5, 2.0, 9)

    sampler.bind(np.array([10, 12]), np.array([2, 4]))  # episode 11 left the collection
    live = np.ones(9, bool)
    live[slots[11]] = False
    sampler.update_priorities(slots[11], np.full(3, 1000.0))  # an update for items no longer there
    raw[slots[11]] = 1000.0
    np.testing.assert_allclose(sampler.probabilities(), naive_probabilities(raw, live), rtol=1e-9)
    np.testing.assert_array_equal(sampler.priorities, raw)  # kept
    drawn = np.concatenate([sampler.draw(256)[1] for _ in range(20)])
    assert not np.isin(drawn, slots[11]).any()

    sampler.bind(np.array([10, 11, 12]), np.array([2, 3, 4]))  # back: drawn with the kept priorities
    np.testing.assert_allclose(sampler.probabilities(), naive_probabilities(raw, np.ones(9, bool)), rtol=1e-9)


def test_a_stream_never_draws_a_deleted_episode_after_its_priorities_are_raised(tmp_path):
    rng = np.random.default_rng(8)
    ds = el.Dataset.create(
        el.DatasetSchema(
            [
                el.FieldSpec("state", (2,), "float32"),
                el.FieldSpec("action", (), "int64", role="action"),
                el.FieldSpec("reward", (), "float32", role="reward"),
            ]
        ),
        str(tmp_path / "ds"),
    )
    raws = [random_episode(rng, n, image=False) for n in (4, 5, 6, 7)]
    ds.append_episodes(
        {"observations": r.obs["state"][:, :2], "actions": r.action["action"], "rewards": r.reward} for r in raws
    )
    stream = ds.segment_stream(2, batch_size=64, seed=0, prefetch=0, sampler=el.Prioritized(1.0, alpha=ALPHA))
    batch = stream.sample()
    gone = int(batch.episode_id[0])
    held = batch.indices[batch.episode_id == gone]
    ds.delete([gone])
    assert stream.refresh()
    stream.update_priorities(held, np.full(len(held), 1e6))  # accepted: the index stays valid
    drawn = {int(e) for _ in range(30) for e in stream.sample().episode_id}
    assert gone not in drawn and drawn == set(ds.episode_ids.tolist())


def test_a_step_field_priority_must_be_a_numeric_scalar(tmp_path):
    """el.Prioritized(key) names "a scalar numeric per-step field": a vector field is refused, naming it."""
    from .conftest import robot_schema

    rng = np.random.default_rng(1)
    ds = el.Dataset.create(robot_schema(image=False), str(tmp_path / "ds"))
    ds.append_episodes(random_episode(rng, 5, image=False).as_dict(unwrap_action=True) for _ in range(3))
    with pytest.raises(el.ArgumentError, match=r"observation/state.*numeric scalar"):
        ds.segment_stream(2, sampler=el.Prioritized("observation/state")).sample()
