"""Every valid start is reachable, and nothing else is drawn, whatever chooses the draws.

The reference is a naive enumeration of valid starts (``reference.segment_starts``:
every ``(episode, start)`` a segment may begin at, padding and stride
included; for transitions every ``(episode, t)``, ``t < length``). A stream
with a fixed seed runs until it has drawn every reference start (a few
thousand draws over a few dozen starts: a missed one has probability far
below 1e-9 with any of these samplers, and the seed makes it deterministic)
and must then have drawn exactly that set: uniform, weighted (a SQL
expression or one number per episode), prioritized (fresh and after priority
updates), and single transitions.
"""

from __future__ import annotations

import numpy as np
import pytest

import episodelake as el

from .reference import random_episode, segment_starts

LENGTHS = [1, 2, 3, 4, 7, 12, 5]
L = 3
MAX_BATCHES = 80


@pytest.fixture(scope="module")
def lake():
    rng = np.random.default_rng(5)
    raws = [random_episode(rng, n, image=False) for n in LENGTHS]
    ds = el.Dataset.from_episodes([r.as_dict(unwrap_action=True) for r in raws])
    return ds, [int(e) for e in ds.episode_ids]


def reference(ids: list[int], pad: str | None, stride: int) -> set[tuple[int, int]]:
    return {(ids[e], s) for e, s in segment_starts(LENGTHS, L, pad=pad, stride=stride)}


def drawn_until_covered(next_batch, expected: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Draw batches until every expected start was seen (or MAX_BATCHES ran out); everything drawn."""
    seen: set[tuple[int, int]] = set()
    for _ in range(MAX_BATCHES):
        batch = next_batch()
        seen |= set(zip(batch.episode_id.tolist(), batch.start.tolist(), strict=True))
        if expected <= seen:
            break
    return seen


SAMPLING = {
    "uniform": el.Uniform(),
    "weights-sql": el.Weighted("1 + length % 3"),
    "weights-array": el.Weighted(np.arange(1.0, len(LENGTHS) + 1)),
    "prioritized": el.Prioritized(1.0, alpha=0.6),
}


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("pad", ["suffix", "prefix", None])
@pytest.mark.parametrize("how", list(SAMPLING))
def test_every_valid_start_is_drawn_and_nothing_else(lake, how, pad, stride):
    ds, ids = lake
    window = el.Window(L, pad=pad, stride=stride)
    stream = ds.segment_stream(window, batch_size=64, seed=3, prefetch=0, sampler=SAMPLING[how])
    expected = reference(ids, pad, stride)
    assert drawn_until_covered(stream.sample, expected) == expected


def test_prioritized_starts_stay_reachable_after_priority_updates(lake):
    """Updates move probabilities, never to zero for a positive priority: every start is still drawn."""
    ds, ids = lake
    stream = ds.segment_stream(
        el.Window(L, pad="suffix"), batch_size=64, seed=4, prefetch=0, sampler=el.Prioritized(1.0)
    )
    rng = np.random.default_rng(0)
    for _ in range(5):
        batch = stream.sample()
        stream.update_priorities(batch.indices, rng.uniform(0.2, 5.0, len(batch.indices)))
    expected = reference(ids, "suffix", 1)
    assert drawn_until_covered(stream.sample, expected) == expected


def test_every_pass_without_replacement_yields_every_start_once(lake):
    ds, ids = lake
    for pad in ("suffix", "prefix", None):
        stream = ds.segment_stream(
            el.Window(L, pad=pad), batch_size=5, seed=1, sampler=el.Uniform(replacement=False), prefetch=0
        )
        got = [(int(e), int(s)) for b in stream for e, s in zip(b.episode_id, b.start, strict=True)]
        assert sorted(got) == sorted(reference(ids, pad, 1))


@pytest.mark.parametrize("how", ["uniform", "weights-sql", "prioritized"])
def test_every_transition_is_drawn_and_nothing_else(lake, how):
    ds, ids = lake
    rng = np.random.default_rng(2)
    expected = {(ids[e], t) for e, n in enumerate(LENGTHS) for t in range(n)}
    sampler = SAMPLING[how]
    assert drawn_until_covered(lambda: ds.sample_transitions(64, rng=rng, sampler=sampler), expected) == expected


def test_a_batch_the_caller_holds_never_changes_while_the_stream_goes_on(tmp_path):
    """Batches reuse buffers only nobody references: the arrays of every held batch keep their values."""
    from .conftest import build_robot_dataset

    path = str(tmp_path / "ds")
    build_robot_dataset(path, seed=2, episodes=8, per_commit=4, max_length=20)
    # 96 x 5 camera rows of 192 B: above batching.SMALL_BYTES, so the camera buffers come from the pool
    stream = el.Dataset.open(path).segment_stream(4, batch_size=96, seed=0, prefetch=0)
    held = []
    for _ in range(12):
        batch = stream.sample()
        arrays = {"camera": batch.all_obs["camera"], "state": batch.all_obs["state"], "reward": batch.reward}
        held.append((arrays, {k: v.copy() for k, v in arrays.items()}))  # the copy: what it held when handed out
    for _ in range(12):
        stream.sample()
    for arrays, at_receipt in held:
        for key, values in arrays.items():
            np.testing.assert_array_equal(values, at_receipt[key], err_msg=key)
