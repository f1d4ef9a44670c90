"""Small commits store their rows, not padded chunks: stored tensor bytes stay near the rows' payload.

Online collection commits small and often. Each object-store commit array
gets chunks fitted to its rows (the fewest chunks of at most
``rows_per_chunk`` rows, all of one length), so the stored bytes under
``tensors/`` are at most 1.1x the rows' payload plus a small constant per
object (``zarr.json``, a shard index) at every commit size. The reference is
the payload computed from the generated arrays, and the sizes are the stored
objects' sizes as the filesystem lists them.
"""

from __future__ import annotations

import numpy as np
import pytest
import s3fs

import episodelake as el
from episodelake.storage.location import resolve

PER_OBJECT = 4096  # bytes allowed per stored object: a zarr.json, a shard index
CAMERA = (3, 32, 32)


def camera_schema(chunk_rows: int | None = None) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("camera", CAMERA, "uint8", layout="CHW", storage="tensor", chunk_rows=chunk_rows),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def episode(rng: np.random.Generator, steps: int) -> dict:
    return {
        "initial_observation": {"camera": rng.integers(0, 256, CAMERA, dtype=np.uint8)},
        "observations": {"camera": rng.integers(0, 256, (steps, *CAMERA), dtype=np.uint8)},
        "actions": rng.integers(0, 4, steps).astype(np.int64),
        "rewards": rng.standard_normal(steps).astype(np.float32),
        "terminated": True,
        "truncated": False,
    }


def stored(fs, root: str) -> tuple[int, int]:
    """(bytes, objects) under ``root``, as the filesystem lists them."""
    sizes = [int(info["size"]) for info in fs.find(root, detail=True).values()]
    return sum(sizes), len(sizes)


def write_commits(ds: el.Dataset, commits: list[list[int]], seed: int) -> tuple[list[dict], int]:
    """Commit episodes of the given step counts, one commit per inner list; return them and their camera payload."""
    rng = np.random.default_rng(seed)
    eps = []
    for steps in commits:
        batch = [episode(rng, s) for s in steps]
        ds.append_episodes(batch)
        ds.flush()
        eps += batch
    payload = sum((len(e["observations"]["camera"]) + 1) * int(np.prod(CAMERA)) for e in eps)
    return eps, payload


def assert_reads_back(ds: el.Dataset, eps: list[dict]) -> None:
    for i, e in enumerate(eps):
        want = np.concatenate([e["initial_observation"]["camera"][None], e["observations"]["camera"]])
        seg = ds.episode(i).read()
        np.testing.assert_array_equal(np.concatenate([seg.obs[:1], seg.next_obs]), want)


# (commits of episode step counts, chunk_rows): 30 one-episode commits of 20 steps (the case), commits
# just over one default chunk, and commits of many small chunks spanning several shards
CASES = {
    "30-small": ([[20]] * 30, None),
    "over-a-chunk": ([[400], [350, 5]], None),
    "many-shards": ([[150, 149], [3]], 2),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.slow
def test_object_store_commits_store_their_payload(s3_server, s3_url, case):
    commits, chunk_rows = CASES[case]
    ds = el.Dataset.create(camera_schema(chunk_rows), s3_url, storage_options=s3_server.storage_options)
    eps, payload = write_commits(ds, commits, seed=1)
    fs = s3fs.S3FileSystem(**s3_server.storage_options)
    nbytes, objects = stored(fs, f"{ds.location.path}/tensors")
    assert nbytes <= 1.1 * payload + PER_OBJECT * objects, (nbytes, payload, objects)
    again = el.Dataset.open(s3_url, storage_options=s3_server.storage_options, read_only=True)
    assert_reads_back(again, eps)


@pytest.mark.parametrize("capacity", [None, 10**6], ids=["append-only", "capacity"])
def test_local_commits_store_their_payload(tmp_path, capacity):
    """On disk, a writer's single array pads only its last chunk (one chunk per array, whatever the number of
    commits); a capacity dataset's commit arrays are fitted like an object store's."""
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(camera_schema(), path, capacity=capacity)
    eps, payload = write_commits(ds, [[20]] * 30, seed=2)
    fs = resolve(path).fs
    nbytes, objects = stored(fs, f"{path}/tensors")
    one_chunk = camera_schema()["observation/camera"].rows_per_chunk * int(np.prod(CAMERA))
    padding = one_chunk if capacity is None else 0
    assert nbytes <= 1.1 * payload + padding + PER_OBJECT * objects, (nbytes, payload, objects)
    assert_reads_back(el.Dataset.open(path, read_only=True), eps)
