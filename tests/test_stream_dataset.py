"""StreamDataset (segment_stream per DataLoader worker) in process: coverage of a finite pass over workers,
epochs, and the states it refuses. Resume across processes: tests/test_trainer_resume.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import episodelake as el  # noqa: E402
from episodelake.integrations.stateful import StreamDataset  # noqa: E402

from .conftest import robot_schema  # noqa: E402
from .reference import random_episode, segment_starts  # noqa: E402

torch.set_num_threads(1)
L = 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(7)
    raws = [random_episode(rng, int(rng.integers(1, 25))) for _ in range(10)]
    ds = el.Dataset.create(robot_schema(), str(tmp_path_factory.mktemp("sd") / "ds"))
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    order = sorted(ep.episode_id for ep in ds.episodes())
    return ds, raws, order


def one_epoch(sd: StreamDataset, workers: int) -> list[tuple[int, int]]:
    loader = torch.utils.data.DataLoader(
        sd, batch_size=None, num_workers=workers, multiprocessing_context="fork" if workers else None
    )
    return [(int(e), int(s)) for b in loader for e, s in zip(b.episode_id, b.start, strict=True)]


def test_a_finite_pass_over_two_workers_covers_every_segment_and_epochs_differ(data):
    ds, raws, order = data
    want = {(order[e], s) for e, s in segment_starts([r.length for r in raws], L)}
    sd = StreamDataset(ds, L, batch_size=3, seed=1, sampler=el.Uniform(replacement=False))
    first = one_epoch(sd, 2)
    assert set(first) == want  # every segment, each worker its share (wrapped to equal lengths)
    assert len(first) - len(want) < 2 * 3
    assert one_epoch(sd, 2) == first  # the same epoch again: the same batches
    sd.set_epoch(1)
    second = one_epoch(sd, 2)
    assert set(second) == want and second != first


def test_states_of_another_shard_or_epoch_or_kind_are_refused(data):
    ds, _, _ = data
    sd = StreamDataset(ds, L, batch_size=2, seed=2)
    it = iter(sd)
    next(it)
    state = sd.state_dict()
    assert state["shard"] == [0, 1] and state["stream"] is not None
    other = StreamDataset(ds, L, batch_size=2, seed=2, shard=(1, 2))
    other.load_state_dict(state)
    with pytest.raises(el.ArgumentError, match="shard"):
        iter(other)
    later = StreamDataset(ds, L, batch_size=2, seed=2)
    later.set_epoch(3)
    later.load_state_dict(state)
    with pytest.raises(el.ArgumentError, match="epoch"):
        iter(later)
    with pytest.raises(el.ArgumentError, match="StreamDataset"):
        sd.load_state_dict({"stream": None})
    with pytest.raises(el.ArgumentError):
        StreamDataset(ds, L, batch_size=2, shard=(2, 2))
    same = StreamDataset(ds, L, batch_size=2, seed=2)
    same.load_state_dict(state)
    assert (next(iter(same)).start == next(it).start).all()
