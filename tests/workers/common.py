"""Episodes that writer subprocesses and the tests derive independently from ``(seed, index)``.

A worker writes ``episode(seed, i)``; the parent recomputes the same arrays to
check what the dataset holds. Nothing here reads episodelake data back.
"""

from __future__ import annotations

import numpy as np

import episodelake as el

from ..conftest import robot_schema
from ..reference import RawEpisode, random_episode

MAX_LENGTH = 9  # short episodes: camera chunks (16 rows) are shared between episodes


def crash_schema() -> el.DatasetSchema:
    """The robot schema plus meta fields naming each episode's origin."""
    extra = [el.FieldSpec("seed", (), "int64", role="meta"), el.FieldSpec("index", (), "int64", role="meta")]
    return el.DatasetSchema([*robot_schema().fields, *extra])


def one_commit_per_episode(path: str, count: int, seed: int = 0) -> el.Dataset:
    """A new dataset at ``path`` holding ``episode(seed, 0..count-1)``, one commit each."""
    ds = el.Dataset.create(crash_schema(), path, partition_by=["task"])
    for i in range(count):
        ds.append_episodes([episode(seed, i).as_dict(unwrap_action=True)])
        ds.flush()
    return ds


def episode(seed: int, index: int) -> RawEpisode:
    rng = np.random.default_rng([seed, index])
    raw = random_episode(rng, int(rng.integers(1, MAX_LENGTH + 1)))
    raw.meta.update(seed=seed, index=index)
    return raw


def write_stepwise(ds: el.Dataset, raw: RawEpisode, held: tuple[str, ...] = (), set_held: bool = True) -> None:
    """Record ``raw`` through new_episode/add_step, as a collection loop would.

    Meta named in ``held`` (outcomes) is set only after the last step, as by a
    loop that learns the outcome at the end; ``set_held=False`` leaves it unset.
    """
    w = ds.new_episode({k: v[0] for k, v in raw.obs.items()}, **{k: v for k, v in raw.meta.items() if k not in held})
    for t in range(raw.length):
        last = t == raw.length - 1
        w.add_step(
            {
                "observations": {k: v[t + 1] for k, v in raw.obs.items()},
                "actions": raw.action["action"][t],
                "rewards": raw.reward[t],
                "terminated": raw.terminated and last,
                "truncated": raw.truncated and last,
            }
        )
    if not w.done:
        w.finish()
    if set_held:
        for key in held:
            w.meta[key] = raw.meta[key]


def assert_matches(ds: el.Dataset, pos: int, raw: RawEpisode) -> None:
    """Episode ``pos`` of ``ds`` equals ``raw`` exactly (every field, flags, meta)."""
    ref = ds.episode(pos)
    assert ref.length == raw.length
    seg = ref.read()
    np.testing.assert_array_equal(seg.all_obs.state, raw.obs["state"])
    np.testing.assert_array_equal(seg.all_obs.camera, raw.obs["camera"])
    np.testing.assert_array_equal(seg.action, raw.action["action"])
    np.testing.assert_array_equal(seg.reward, raw.reward)
    assert (ref.terminated, ref.truncated) == (raw.terminated, raw.truncated)
    assert ref.meta == raw.meta


def assert_all_match(ds: el.Dataset, raws: list[RawEpisode]) -> None:
    """Every episode of ``ds`` equals ``raws`` (same order), checked in bulk: one read per field."""
    snap = ds.snapshot()
    pos = np.arange(len(raws))
    np.testing.assert_array_equal(snap.lengths, [r.length for r in raws])
    if not raws:
        return
    for key, name in (("observation/state", "state"), ("observation/camera", "camera")):
        f = ds.schema[key]
        got = snap.read_ranges(f, pos, np.zeros_like(pos), snap.lengths + 1)
        np.testing.assert_array_equal(np.concatenate(got), np.concatenate([r.obs[name] for r in raws]))
    for key, want in (("action", [r.action["action"] for r in raws]), ("reward", [r.reward for r in raws])):
        got = snap.read_ranges(ds.schema[key], pos, np.zeros_like(pos), snap.lengths)
        np.testing.assert_array_equal(np.concatenate(got), np.concatenate(want))
    np.testing.assert_array_equal(snap.index["terminated"], [r.terminated for r in raws])
    np.testing.assert_array_equal(snap.index["truncated"], [r.truncated for r in raws])
    assert [snap.meta(p) for p in pos] == [r.meta for r in raws]


def origins(ds: el.Dataset) -> list[tuple[int, int]]:
    """(seed, index) of every visible episode, in dataset order."""
    return [(int(e.meta["seed"]), int(e.meta["index"])) for e in ds.episodes()]
