"""copy_to between memory and local disk (S3 is covered in test_s3.py): equality, rechunking, views, verification."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
from .workers.replay import Fifo, check_episode, length_of, live_numbers
from .workers.replay import episode as replay_episode
from .workers.replay import schema as replay_schema

ROOT = Path(__file__).resolve().parents[1]


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


# ---- dataset-level settings travel with a copy (issue 39, item 4)

GATES = (
    el.Check("not_13", "n <> 13", on_fail="quarantine"),
    el.Check("not_14", "n <> 14"),  # reject
    el.Check("not_15", "n <> 15", on_fail="warn"),
    el.Check("short", "length <= 11", on_fail="warn"),
)


def gated_buffer(path: str | None, options: dict | None = None) -> el.Dataset:
    """A replay buffer of 40 steps with :data:`GATES`, holding episodes 0..9 (episode order = their numbers)."""
    ds = el.Dataset.create(
        replay_schema(),
        path,
        storage_options=options,
        capacity=el.Capacity(steps=40),
        checks=GATES,
        commit_episodes=10**6,
    )
    feed(ds, range(10))
    return ds


def feed(ds: el.Dataset, numbers) -> list[int]:
    """Append episodes ``numbers`` one commit each; the numbers rejected."""
    rejected = []
    for n in numbers:
        try:
            ds.append_episodes([replay_episode(n)])
            ds.flush()
        except el.QualityError:
            ds.flush(discard=True)
            rejected.append(n)
    return rejected


def gate_record(ds: el.Dataset) -> dict[int, tuple[bool, list[str]]]:
    """Episode number -> (quarantined, checks failed) of every episode stored in the latest version."""
    ds.refresh()
    tbl = ds._store.table.read(["n", "quarantined", "checks_failed"])
    rows = zip(tbl["n"].to_pylist(), tbl["quarantined"].to_pylist(), tbl["checks_failed"].to_pylist(), strict=True)
    return {n: (bool(q), sorted(c or [])) for n, q, c in rows}


@pytest.mark.parametrize("where", ["disk", "s3"])
def test_a_copy_gates_and_evicts_exactly_as_its_source(where, tmp_path, request):
    """Checks (each on_fail) and the capacity travel: the same appends give the same buffer as a FIFO model."""
    src = gated_buffer(str(tmp_path / "src"))
    options = request.getfixturevalue("s3_server").storage_options if where == "s3" else None
    dest = request.getfixturevalue("s3_url") if where == "s3" else str(tmp_path / "copy")
    copy = src.copy_to(dest, options, progress=False)
    assert copy.quality.list() == src.quality.list() == GATES
    assert copy.maintenance.descriptor["capacity"] == src.maintenance.descriptor["capacity"]
    model = Fifo(steps=40)
    model.commit([(n, length_of(n)) for n in range(10)])
    for numbers in (range(10, 17), range(17, 40)):  # the gated episodes, then enough to evict them
        assert feed(src, numbers) == feed(copy, numbers) == [n for n in numbers if n == 14]
        for n in numbers:
            if n != 14:
                model.commit([(n, length_of(n))])
        visible = [n for n in model.numbers if n != 13]
        assert live_numbers(src) == live_numbers(copy) == visible
        assert live_numbers(copy.quality.quarantine()) == [n for n in model.numbers if n == 13]
        assert copy.num_steps <= 40
        record = gate_record(copy)
        assert record == gate_record(src)
        assert sorted(record) == model.numbers
        for n, (quarantined, failed) in record.items():
            want = (["not_13"] if n == 13 else []) + (["not_15"] if n == 15 else [])
            want += ["short"] if length_of(n) > 11 else []
            assert (quarantined, failed) == (n == 13, sorted(want))
    for ref in copy.episodes():
        check_episode(ref)


def test_a_copy_overrides_or_drops_capacity_checks_and_partitioning(tmp_path):
    src = gated_buffer(str(tmp_path / "src"))
    plain = src.copy_to(str(tmp_path / "plain"), capacity=None, checks=(), progress=False)
    assert plain.quality.list() == () and "capacity" not in plain.maintenance.descriptor
    assert feed(plain, range(10, 40)) == []  # nothing rejected, nothing quarantined, nothing evicted
    assert live_numbers(plain)[-30:] == list(range(10, 40)) and plain.num_steps > 40
    other = (el.Check("not_20", "n <> 20"),)
    small = src.copy_to(str(tmp_path / "small"), capacity=15, checks=other, partition_by=["kind"], progress=False)
    model = Fifo(steps=15)
    model.commit([(n, length_of(n)) for n in live_numbers(src)])
    assert live_numbers(small) == model.numbers  # the newest episodes that fit, as the buffer's eviction keeps
    assert small.quality.list() == other and small.maintenance.descriptor["partition_by"] == ["kind"]
    assert small.maintenance.descriptor["capacity"]["steps"] == 15
    assert feed(small, [20, 21]) == [20]
    model.commit([(21, length_of(21))])
    assert live_numbers(small) == model.numbers
    with pytest.raises(el.QueryError):
        src.copy_to(str(tmp_path / "bad"), checks=[el.Check("bad", "no_such_column > 0")], progress=False)
    assert not (tmp_path / "bad").exists()


def test_cli_copy_carries_checks_and_capacity_in_a_subprocess(tmp_path):
    src = gated_buffer(str(tmp_path / "src"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}

    def cli(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "episodelake.cli", "copy", *args, "--quiet"]
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    done = cli(str(tmp_path / "src"), str(tmp_path / "copy"))
    assert done.returncode == 0 and "copied" in done.stdout, done.stderr
    copy = el.Dataset.open(str(tmp_path / "copy"))
    assert copy.quality.list() == GATES and copy.maintenance.descriptor["capacity"]["steps"] == 40
    assert live_numbers(copy) == live_numbers(src)
    assert feed(copy, [13, 14]) == [14] and live_numbers(copy.quality.quarantine()) == [13]
    done = cli(str(tmp_path / "src"), str(tmp_path / "bare"), "--no-checks", "--no-capacity")
    assert done.returncode == 0, done.stderr
    bare = el.Dataset.open(str(tmp_path / "bare"))
    assert bare.quality.list() == () and "capacity" not in bare.maintenance.descriptor
    assert feed(bare, [13, 14]) == [] and live_numbers(bare)[-2:] == [13, 14]
