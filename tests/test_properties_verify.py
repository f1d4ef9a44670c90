"""Every read of corrupt data fails, the second and later ones too, whatever reads it.

``Dataset.open(..., verify=True)`` checks each episode's tensor rows against the
CRC-32 recorded at commit when they are first read from a snapshot, and caches
only a *passed* check. The reference: the bytes of every tensor chunk are
inverted on disk (sizes unchanged, the raw codec still decodes them), so every
episode's rows differ from what was written; each read entry point, asked
twice, must raise ``CorruptionError`` both times and never return the damaged
values.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

import episodelake as el

from .conftest import build_robot_dataset


@pytest.fixture
def inverted(tmp_path):
    path = str(tmp_path / "ds")
    build_robot_dataset(path, seed=3, episodes=4, per_commit=2, max_length=12)
    chunks = [f for f in glob.glob(f"{path}/tensors/**/camera/**", recursive=True) if os.path.isfile(f)]
    chunks = [f for f in chunks if not f.endswith("zarr.json")]
    assert chunks
    for chunk in chunks:
        with open(chunk, "r+b") as fh:
            data = fh.read()
            fh.seek(0)
            fh.write(bytes(b ^ 0xFF for b in data))
    return path


READS = {
    "episode.read": lambda ds: ds.episode(0).read(),
    "episodes": lambda ds: [ep.read() for ep in ds.episodes()],
    "segments": lambda ds: ds.segments(2)[0],
    "segment_stream": lambda ds: ds.segment_stream(2, batch_size=8, seed=0, prefetch=0).sample(),
    "sample_transitions": lambda ds: ds.sample_transitions(8, seed=0),
    "to_numpy": lambda ds: ds.to_numpy(),
}


@pytest.mark.parametrize("read", list(READS))
def test_every_read_of_corrupt_rows_fails_every_time(inverted, read):
    ds = el.Dataset.open(inverted, verify=True)
    for _ in range(3):  # the same snapshot each time: a failed check is never cached as passed
        with pytest.raises(el.CorruptionError):
            READS[read](ds)


def test_each_episode_fails_on_its_own_reads(inverted):
    ds = el.Dataset.open(inverted, verify=True)
    for i in range(len(ds)):
        for _ in range(2):
            with pytest.raises(el.CorruptionError, match=r"CRC-32|unreadable"):
                ds.episode(i).read()


def test_a_healthy_dataset_reads_the_same_twice_with_verify(tmp_path):
    path = str(tmp_path / "ds")
    raws = build_robot_dataset(path, seed=3, episodes=4, per_commit=2, max_length=12)
    ds = el.Dataset.open(path, verify=True)
    written = {(r.length, r.obs["camera"].tobytes()) for r in raws}
    for _ in range(2):
        got = {(ep.length, np.ascontiguousarray(ep.read().all_obs["camera"]).tobytes()) for ep in ds.episodes()}
        assert got == written
