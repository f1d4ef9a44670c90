"""copy_to between memory and local disk (S3 is covered in test_s3.py): equality, rechunking, views, verification."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.cli.main import main
from episodelake.ops.copy import verify_copy

from .conftest import robot_schema
from .reference import random_episode
from .test_s3 import assert_episode


def camera_metadata(ds: el.Dataset) -> list[dict]:
    root = Path(ds.location.path) / "tensors"
    return [json.loads(p.read_text()) for p in sorted(root.glob("*/observation/camera/zarr.json"))]


def test_copy_with_new_chunking_and_compression(robot_dataset, raw_episodes, tmp_path):
    dest = None if robot_dataset.location.ephemeral else str(tmp_path / "copy")  # memory <-> disk
    copy = robot_dataset.copy_to(dest, chunk_rows=5, compression="zstd", progress=False)
    assert copy.location.url != robot_dataset.location.url
    np.testing.assert_array_equal(copy.episode_ids, robot_dataset.episode_ids)
    for i, raw in enumerate(raw_episodes):
        assert_episode(copy.episode(i), raw)
    field = copy.schema["observation/camera"]
    assert (field.chunk_rows, field.compression) == (5, "zstd")
    for meta in camera_metadata(copy):
        assert meta["chunk_grid"]["configuration"]["chunk_shape"][0] == 5
        assert [c["name"] for c in meta["codecs"]] == ["bytes", "zstd"]
    assert copy.maintenance.descriptor["partition_by"] == ["task"]


def test_copy_of_a_view_keeps_ids_and_only_those_episodes(robot_dataset, raw_episodes, tmp_path):
    view = robot_dataset.where("task = 'place'")
    expected = [raw for raw in raw_episodes if raw.meta["task"] == "place"]
    copy = view.copy_to(str(tmp_path / "places"), progress=False)
    np.testing.assert_array_equal(copy.episode_ids, view.episode_ids)
    assert len(copy) == len(expected) > 0
    for i, raw in enumerate(expected):
        assert_episode(copy.episode(i), raw)


def test_a_copy_accepts_new_writers_without_id_clashes(robot_dataset, raw_episodes, tmp_path):
    copy = robot_dataset.copy_to(str(tmp_path / "copy"), progress=False)
    extra = random_episode(np.random.default_rng(99), 9)
    copy.append_episodes([extra.as_dict(unwrap_action=True)])
    copy.flush()
    assert len(copy) == len(raw_episodes) + 1 and len(set(copy.episode_ids.tolist())) == len(copy)
    for i, raw in enumerate([*raw_episodes, extra]):
        assert_episode(copy.episode(i), raw)


def test_verification_detects_differences(robot_dataset, tmp_path):
    copy = robot_dataset.copy_to(str(tmp_path / "copy"), progress=False)
    rows = copy.snapshot().arrow_dataset().to_table()
    rows = rows.take(pc.sort_indices(rows, sort_keys=[("created_at", "ascending"), ("episode_id", "ascending")]))
    verify_copy(rows.select(rows.column_names), copy.snapshot())  # the copy matches itself
    other = rows.set_column(rows.column_names.index("return"), "return", pc.add(rows["return"], 1.0))
    with pytest.raises(el.CorruptionError, match="'return' differs"):
        verify_copy(other, copy.snapshot())
    with pytest.raises(el.CorruptionError, match="ids"):
        verify_copy(rows.slice(1), copy.snapshot())
    chunk = next((Path(copy.location.path) / "tensors").glob("*/observation/camera/c/0/0/0/0"))
    data = bytearray(chunk.read_bytes())
    data[7] ^= 0xFF  # one flipped byte in the first episode's first frame
    chunk.write_bytes(bytes(data))
    with pytest.raises(el.CorruptionError, match="fails its CRC-32"):
        verify_copy(rows, el.Dataset.open(copy.location.url).snapshot())


def test_copy_refuses_its_own_location_and_existing_datasets(robot_dataset, tmp_path):
    with pytest.raises(el.LocationError, match="onto itself"):
        robot_dataset.copy_to(robot_dataset.location.url)
    target = str(tmp_path / "taken")
    first = robot_dataset.copy_to(target, progress=False)
    with pytest.raises(FileExistsError):
        robot_dataset.copy_to(target, progress=False)
    assert len(el.Dataset.open(target)) == len(first)
    assert len(robot_dataset.where("task = 'pick'").copy_to(target, overwrite=True, progress=False)) < len(first)


def test_cli_copy(robot_dataset, raw_episodes, tmp_path, capsys):
    if robot_dataset.location.ephemeral:
        pytest.skip("the CLI copies between named locations")
    dest = str(tmp_path / "cli-copy")
    assert main(["copy", robot_dataset.location.url, dest, "--chunk-rows", "4", "--quiet"]) == 0
    assert f"copied {len(raw_episodes)} episodes" in capsys.readouterr().out
    copy = el.Dataset.open(dest)
    assert copy.schema["observation/camera"].chunk_rows == 4
    for i, raw in enumerate(raw_episodes):
        assert_episode(copy.episode(i), raw)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**31),
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    chunk_rows=st.one_of(st.none(), st.integers(1, 40)),
    compression=st.sampled_from([None, "zstd"]),
    batch_bytes=st.sampled_from([1, 5000, 1 << 30]),
)
def test_copy_round_trip_property(seed, lengths, chunk_rows, compression, batch_bytes):
    rng = np.random.default_rng(seed)
    eps = [random_episode(rng, n) for n in lengths]
    src = el.Dataset.from_episodes((e.as_dict(unwrap_action=True) for e in eps), schema=robot_schema())
    copy = src.copy_to(None, chunk_rows=chunk_rows, compression=compression, batch_bytes=batch_bytes, progress=False)
    assert copy.version == len(list(_batch_sizes(lengths, batch_bytes)))  # one commit per batch
    for i, raw in enumerate(eps):
        assert_episode(copy.episode(i), raw)


def _batch_sizes(lengths, batch_bytes):
    """Independent model of the batching rule: fill to batch_bytes, at least one episode each."""
    row = 3 * 8 * 8
    acc = 0
    for n in lengths:
        size = (n + 1) * row
        if acc and acc + size > batch_bytes:
            yield acc
            acc = 0
        acc += size
    yield acc
