"""Both tensor readers are one ``ArrayReader``: TensorStore's ``TensorArray`` and the planned ``PlainArray``.

Each reads the same stored rows as the NumPy arrays written, through every
member of the protocol, on a local dataset with a raw and a compressed field.
"""

from __future__ import annotations

import numpy as np
import pytest

import episodelake as el
from episodelake.storage.arrays import ArrayReader, split_ref, tensor_writers
from episodelake.storage.location import resolve
from episodelake.storage.planned import PlainArray, read_many
from episodelake.storage.tensors import TensorArray, make_context

LENGTHS = [7, 12, 3, 9]
SCHEMA = el.DatasetSchema(
    [
        el.FieldSpec("x", (3, 2), "float32", storage="tensor", chunk_rows=4),
        el.FieldSpec("depth", (5, 4), "uint16", storage="tensor", compression="zstd", chunk_rows=4),
        el.FieldSpec("action", (), "float32", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
    ]
)
KEYS = ["observation/x", "observation/depth"]


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """A local dataset written in two commits, the observations written per episode, and each episode's
    ``(commit, first row)`` per field."""
    path = str(tmp_path_factory.mktemp("reader") / "ds")
    rng = np.random.default_rng(4)
    episodes = []
    for T in LENGTHS:
        x = rng.normal(size=(T + 1, 3, 2)).astype(np.float32)
        depth = np.cumsum(rng.integers(0, 50, size=(T + 1, 5, 4)), axis=0).astype(np.uint16)  # compressible
        obs = {"x": x, "depth": depth}
        episodes.append({"observations": obs, "actions": np.zeros(T, np.float32), "rewards": np.ones(T, np.float32)})
    ds = el.Dataset.create(SCHEMA, path)
    for part in (episodes[:2], episodes[2:]):
        ds.append_episodes(part)
        ds.flush()
    ds.close()
    index = el.Dataset.open(path).snapshot().index
    order = np.argsort(index["episode_id"])
    refs = {k: [split_ref(r) for r in index[f"ref/{k}"][order].tolist()] for k in KEYS}
    written = {
        "observation/x": [e["observations"]["x"] for e in episodes],
        "observation/depth": [e["observations"]["depth"] for e in episodes],
    }
    return resolve(path), written, refs


def readers(loc, key: str) -> list[ArrayReader]:
    """The writer's single array of ``key`` opened by both readers."""
    (writer,) = tensor_writers(loc)
    return [TensorArray.open(loc, writer, SCHEMA[key], make_context()), PlainArray(loc, writer, SCHEMA[key])]


def test_both_readers_are_array_readers(lake):
    loc, _, _ = lake
    for key in KEYS:
        tensor, plain = readers(loc, key)
        assert isinstance(tensor, ArrayReader) and isinstance(plain, ArrayReader)
    # the protocol asks for the whole read surface: a bare array is no reader
    assert not isinstance(np.zeros((4, 3, 2), np.float32), ArrayReader)


@pytest.mark.parametrize("key", KEYS)
def test_both_readers_read_the_rows_written(lake, key):
    loc, written, refs = lake
    f = SCHEMA[key]
    for reader in readers(loc, key):
        assert reader.field == f
        assert reader.rows >= max(row + len(w) for (_, row), w in zip(refs[key], written[key], strict=True))
        assert key in reader.where
        for (commit, row), want in zip(refs[key], written[key], strict=True):
            assert commit == 0  # a local dataset: every episode in the writer's single array
            np.testing.assert_array_equal(reader.read(row, row + len(want)).result(), want)
            np.testing.assert_array_equal(reader.read(row + 1, row + len(want) - 1).result(), want[1:-1])
        # runs of every episode, copied to scattered places in one call (chunks crossed: chunk_rows is 4)
        total = sum(len(w) for w in written[key])
        out = np.zeros((total, *f.shape), f.np_dtype)
        runs, at = [], total
        for eid, ((_, row), want) in enumerate(zip(refs[key], written[key], strict=True)):
            at -= len(want)  # the last episode first: destinations in reverse order
            runs.append((at, row, len(want), eid))
        reader.copy_runs(out, runs)
        np.testing.assert_array_equal(out, np.concatenate(written[key][::-1]))


def test_read_many_mixes_both_readers(lake):
    loc, written, refs = lake
    requests, want = [], []
    for key in KEYS:
        for reader in readers(loc, key):
            for (_, row), w in zip(refs[key], written[key], strict=True):
                requests.append((reader, row + 2, row + len(w)))
                want.append(w[2:])
    got = read_many(requests)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
