"""TorchRL replay buffers over episodelake data (issue 42, items 1 and 5), with the real ``torchrl`` package.

Samples are checked against the raw episodes in NumPy (:mod:`tests.reference`), not against episodelake:
observations, next observations, actions, rewards, TorchRL's done/terminated/truncated semantics, slices
inside one episode; ``where=``/``weights=``/``el.concat`` source weights change which slices are drawn; the
buffer's ``state_dict`` (and ``dumps``/``loads``) resumes the same draws.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")

import episodelake as el  # noqa: E402
from episodelake.integrations.torchrl import EpisodeStorage, SliceSampler, identity, replay_buffer  # noqa: E402

from .conftest import robot_schema  # noqa: E402
from .reference import random_episode  # noqa: E402

torch.set_num_threads(1)


def build(path, seed: int, episodes: int, max_length: int = 30) -> tuple[el.Dataset, dict[int, object]]:
    rng = np.random.default_rng(seed)
    raws = [random_episode(rng, int(rng.integers(2, max_length))) for _ in range(episodes)]
    ds = el.Dataset.create(robot_schema(), str(path))
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    ids = sorted(ep.episode_id for ep in ds.episodes())  # one writer: ids grow in append order
    return ds, dict(zip(ids, raws, strict=True))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchrl")
    a, raws_a = build(root / "a", 0, 24)
    b, raws_b = build(root / "b", 1, 8)
    return a, b, {**raws_a, **raws_b}


def check_transitions(td, raws) -> None:
    """Every transition of ``td`` equals the raw episode's, with TorchRL's key conventions and flags."""
    eid = td["episode_id"].numpy()
    steps = td["step_count"].squeeze(-1).numpy()
    np.testing.assert_array_equal(td["collector", "traj_ids"].numpy(), eid)
    for i, (e, t) in enumerate(zip(eid.tolist(), steps.tolist(), strict=True)):
        ep = raws[e]
        T = ep.length
        assert 0 <= t < T
        np.testing.assert_array_equal(td["observation", "state"][i].numpy(), ep.obs["state"][t])
        np.testing.assert_array_equal(td["observation", "camera"][i].numpy(), ep.obs["camera"][t])
        np.testing.assert_array_equal(td["next", "observation", "state"][i].numpy(), ep.obs["state"][t + 1])
        np.testing.assert_array_equal(td["next", "observation", "camera"][i].numpy(), ep.obs["camera"][t + 1])
        assert td["action"][i].item() == ep.action["action"][t]
        assert td["next", "reward"][i].tolist() == [ep.reward[t]]
        last = t == T - 1
        assert td["next", "terminated"][i].tolist() == [bool(last and ep.terminated)]
        assert td["next", "truncated"][i].tolist() == [bool(last and ep.truncated)]
        assert td["next", "done"][i].tolist() == [bool(last and (ep.terminated or ep.truncated))]
        assert td["done"][i].tolist() == td["terminated"][i].tolist() == td["truncated"][i].tolist() == [False]


def test_slices_equal_the_raw_episodes_with_torchrl_conventions(data):
    a, _, raws = data
    rb = replay_buffer(a, batch_size=40, slice_len=5, seed=0)
    for _ in range(5):
        td = rb.sample()
        assert td.batch_size == torch.Size([40])
        check_transitions(td, raws)
        slices = td.reshape(8, 5)
        assert (slices["episode_id"] == slices["episode_id"][:, :1]).all()  # never across an episode boundary
        assert (slices["step_count"].squeeze(-1).diff(dim=1) == 1).all()
        ids = sorted(ep.episode_id for ep in a.episodes())
        starts = dict(zip(ids, np.cumsum([0] + [raws[e].length for e in ids])[:-1].tolist(), strict=True))
        want = [
            starts[e] + t for e, t in zip(td["episode_id"].tolist(), td["step_count"].squeeze(-1).tolist(), strict=True)
        ]
        assert td["index"].tolist() == want  # the storage indices: transitions in collection order


def test_terminal_steps_are_drawn_and_flagged(data):
    a, _, raws = data
    rb = replay_buffer(a, batch_size=4000, slice_len=2, seed=1)
    td = rb.sample()
    check_transitions(td[:400], raws)
    assert td["next", "terminated"].any() and td["next", "truncated"].any()
    assert not (td["next", "terminated"] & td["next", "truncated"]).any()


def test_storage_get_any_indices_and_the_plain_replay_buffer(data):
    from torchrl.data import ReplayBuffer
    from torchrl.data.replay_buffers import ImmutableDatasetWriter

    a, _, raws = data
    storage = EpisodeStorage(a)
    assert len(storage) == sum(raws[e].length for e in storage.episode_ids.tolist())
    check_transitions(storage.get(torch.tensor([7, 0, len(storage) - 1, 3, 4])), raws)
    check_transitions(storage.get(slice(10, 20)), raws)
    assert storage.get(3).batch_size == torch.Size([])
    rb = ReplayBuffer(
        storage=storage,
        sampler=SliceSampler(num_slices=4, seed=2),
        writer=ImmutableDatasetWriter(),
        collate_fn=identity,
        batch_size=12,
    )
    check_transitions(rb.sample(), raws)
    with pytest.raises(RuntimeError, match="read-only"):
        storage.set(0, None)


def test_where_weights_and_short_episodes(data):
    a, _, raws = data
    pick = replay_buffer(a, batch_size=600, slice_len=3, where="task = 'pick'", seed=3).sample()
    assert {raws[e].meta["task"] for e in pick["episode_id"].tolist()} == {"pick"}
    success = replay_buffer(a, batch_size=600, slice_len=3, weights="CASE WHEN success THEN 1 ELSE 0 END", seed=3)
    assert all(raws[e].meta["success"] for e in success.sample()["episode_id"].tolist())
    long = replay_buffer(a, batch_size=300, slice_len=20, seed=3).sample()
    assert min(raws[e].length for e in long["episode_id"].tolist()) >= 20


def test_uniform_over_valid_slices(data):
    """Episode frequencies follow the number of valid slices, T - L + 1 (episodelake's index, checked in NumPy)."""
    a, _, raws = data
    storage, L = EpisodeStorage(a), 4
    sampler = SliceSampler(slice_len=L, seed=4)
    ids, _ = sampler.sample(storage, L * 20000)
    starts = ids.numpy()[::L]
    ep = np.searchsorted(storage.offsets, starts, side="right") - 1
    lengths = np.array([raws[e].length for e in sorted(ep.episode_id for ep in a.episodes())])
    counts = np.maximum(lengths - L + 1, 0)
    want = counts / counts.sum()
    got = np.bincount(ep, minlength=len(counts)) / len(ep)
    assert np.abs(got - want).max() < 0.01


def test_state_dict_and_checkpoint_round_trip(data, tmp_path):
    a, _, _ = data
    rb = replay_buffer(a, batch_size=12, slice_len=4, seed=5)
    for _ in range(3):
        rb.sample()
    state = rb.state_dict()
    rb.dumps(tmp_path / "ckpt")
    expected = [rb.sample()["index"] for _ in range(3)]
    for restore in ("state_dict", "loads"):
        again = replay_buffer(a, batch_size=12, slice_len=4, seed=99)
        if restore == "state_dict":
            again.load_state_dict(state)
        else:
            again.loads(tmp_path / "ckpt")
        assert all(torch.equal(again.sample()["index"], e) for e in expected)
    with pytest.raises(el.ArgumentError):
        replay_buffer(a.where("task = 'pick'"), batch_size=12, slice_len=4).load_state_dict(state)


def test_concat_mix_with_fixed_weights_and_union_statistics(data):
    """Item 5: two datasets mixed 3:1 through TorchRL, normalized with one set of statistics over the union."""
    a, b, raws = data
    mix = el.concat([a, b], weights=[3, 1])
    rb = replay_buffer(mix, batch_size=8000, slice_len=2, seed=6)
    td = rb.sample()
    check_transitions(td[:200], raws)
    from_b = np.isin(td["episode_id"].numpy(), [ep.episode_id for ep in b.episodes()])
    assert abs(from_b.mean() - 0.25) < 0.02  # source weights, whatever the sources' sizes
    stats = mix.stats(["observation/state"])["observation/state"]
    union = np.concatenate([r.obs["state"] for r in raws.values()])
    np.testing.assert_allclose(stats["mean"], union.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["std"], union.std(0), rtol=1e-4, atol=1e-6)
