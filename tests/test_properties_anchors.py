"""Weighted anchors (issue 39): the distribution of drawn segments against a naive NumPy reference.

The reference lists every anchored segment with a loop over the raw episodes'
steps (:func:`tests.test_anchors.reference`) and gives each its probability by
hand: episode weight times anchor weight, normalised, over the anchors of the
shard drawn from. The draws are seeded, so each chi-square test is
deterministic; the number of draws makes a wrong distribution fail by a wide
margin (the p-values on the planted bugs are below 1e-100).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import chisquare

import episodelake as el

from .test_anchors import items, raw_episodes, reference, write

THRESHOLD = 0.4
ANCHOR_WEIGHT_SQL = "CAST(1 + t % 3 AS DOUBLE)"  # over the steps view: step t's weight


def anchor_weight(t: int) -> float:
    return 1.0 + t % 3


EPISODE_WEIGHT_SQL = "CASE WHEN n % 4 = 0 THEN 6 WHEN n % 4 = 1 THEN 0.5 ELSE 2 END"  # over the episodes view


def episode_weight(n: int) -> float:
    return {0: 6.0, 1: 0.5}.get(n % 4, 2.0)


@pytest.fixture(scope="module")
def lake():
    raw = raw_episodes(39, [12, 3, 20, 7, 1, 16, 9, 14, 5, 11])
    return raw, write(raw)


def expected_shares(raw, offset: int, L: int, episode_weights: bool, shard=(0, 1)) -> dict[tuple[int, int], float]:
    """``(episode n, start) -> probability`` of one draw from shard ``shard`` (rank, world), by hand."""
    rank, world = shard
    segments = reference(raw, THRESHOLD, offset, L, "suffix")  # every kept anchor, in (episode, step) order
    mine = segments[rank::world]  # the shard holds global anchor ids congruent to its rank
    mass = np.array(
        [(episode_weight(n) if episode_weights else 1.0) * anchor_weight(s - offset) for n, s in mine], np.float64
    )
    return dict(zip(mine, mass / mass.sum(), strict=True))


def chi_square(drawn: Counter, shares: dict[tuple[int, int], float]) -> float:
    """The p-value of ``drawn`` against ``shares`` (every key of ``drawn`` must be in ``shares``)."""
    assert set(drawn) <= set(shares), sorted(set(drawn) - set(shares))[:5]
    keys = [k for k, p in shares.items() if p > 0]
    total = sum(drawn.values())
    observed = np.array([drawn[k] for k in keys], np.float64)
    return float(chisquare(observed, np.array([shares[k] for k in keys]) * total).pvalue)


@pytest.mark.parametrize("offset", [0, -2])
def test_draws_follow_episode_weight_times_anchor_weight(lake, offset):
    """Kills "anchor weights ignored when episode weights are given" (and the reverse)."""
    raw, ds = lake
    L = 3
    stream = ds.segment_stream(
        L,
        batch_size=4096,
        seed=39,
        sampler=el.Weighted(EPISODE_WEIGHT_SQL),
        anchors=el.Anchors(f"reward > {THRESHOLD}", offset=offset, weights=ANCHOR_WEIGHT_SQL),
    )
    drawn = Counter(items(next(stream) for _ in range(6)))
    shares = expected_shares(raw, offset, L, episode_weights=True)
    assert len(shares) > 20  # enough anchors that the weights matter
    assert chi_square(drawn, shares) > 1e-4
    # the wrong models are far off at these draw counts: the test tells them apart
    anchors_only = expected_shares(raw, offset, L, episode_weights=False)
    assert chi_square(drawn, anchors_only) < 1e-10


def test_sample_transitions_follow_episode_weight_times_anchor_weight(lake):
    raw, ds = lake
    anchors = el.Anchors(f"reward > {THRESHOLD}", weights=ANCHOR_WEIGHT_SQL)
    tr = ds.sample_transitions(24576, seed=40, sampler=el.Weighted(EPISODE_WEIGHT_SQL), anchors=anchors)
    drawn = Counter(zip(tr.buffers["meta/n"].tolist(), tr.buffers["start"].tolist(), strict=True))
    assert chi_square(drawn, expected_shares(raw, 0, 1, episode_weights=True)) > 1e-4


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("episode_weights", [False, True])
def test_a_weighted_shard_draws_only_its_own_anchors_by_weight(lake, world, episode_weights):
    """Kills "weighted anchors on a sharded stream use every shard's anchors": shard k draws only the anchors
    :meth:`el.Shard` deals it (global ids congruent to k), each by its weight, and the shards' draws cover every
    anchor with a nonzero weight."""
    raw, ds = lake
    L, offset = 2, -1
    seen: set[tuple[int, int]] = set()
    for rank in range(world):
        sampler = el.Weighted(EPISODE_WEIGHT_SQL) if episode_weights else el.Uniform()
        stream = ds.segment_stream(
            L,
            batch_size=4096,
            seed=7 + rank,
            sampler=sampler,
            shard=el.Shard(rank, world),
            anchors=el.Anchors(f"reward > {THRESHOLD}", offset=offset, weights=ANCHOR_WEIGHT_SQL),
        )
        drawn = Counter(items(next(stream) for _ in range(3)))
        shares = expected_shares(raw, offset, L, episode_weights, (rank, world))
        assert set(drawn) <= set(shares), f"rank {rank} drew another shard's anchors"
        assert chi_square(drawn, shares) > 1e-4
        seen |= set(drawn)
    everything = reference(raw, THRESHOLD, offset, L, "suffix")
    assert seen == set(everything)  # every weight here is positive: the shards together draw every anchor
