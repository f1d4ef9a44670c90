"""Damaged files give a clear CorruptionError naming the file (and episode), never wrong data.

Each case builds a small on-disk dataset from reference episodes, damages one
file the way disks and crashes do (truncation, a flipped bit, a deleted file,
a reference past the end of an array) and checks: reads raise
CorruptionError naming the damaged file and, where one episode is affected,
its id; ``validate()`` reports the problem; and anything that is still
returned equals the reference data.
"""

from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
import pytest

import episodelake as el

from .conftest import build_robot_dataset


@pytest.fixture
def damaged(tmp_path):
    """A fresh dataset of 6 episodes (3 commits) + its reference episodes."""
    path = str(tmp_path / "ds")
    raws = build_robot_dataset(path, seed=7, episodes=6, per_commit=2, max_length=30)
    assert el.Dataset.open(path).maintenance.validate().ok
    return path, raws


def read_all(path: str, **kw) -> list[el.Segment]:
    ds = el.Dataset.open(path, **kw)
    return [ds.episode(i).read() for i in range(len(ds))]


def assert_same(segs: list[el.Segment], raws) -> None:
    assert len(segs) == len(raws)
    for seg, raw in zip(segs, raws, strict=True):
        np.testing.assert_array_equal(seg.all_obs.camera, raw.obs["camera"])
        np.testing.assert_array_equal(seg.all_obs.state, raw.obs["state"])
        np.testing.assert_array_equal(seg.action, raw.action["action"])
        np.testing.assert_array_equal(seg.reward, raw.reward)


def problems(path: str) -> list[el.maintenance.Problem]:
    return el.Dataset.open(path).maintenance.validate().problems


def flip(path: str, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ (1 << bit)]))


def truncate(path: str, keep: float = 0.5) -> None:
    os.truncate(path, int(os.path.getsize(path) * keep))


def camera_chunks(path: str) -> list[str]:
    return sorted(glob.glob(f"{path}/tensors/*/observation/camera/c/*/0/0/0"))


def data_files(path: str) -> list[str]:
    return sorted(glob.glob(f"{path}/episodes/task=*/*.parquet"))


def log_entries(path: str) -> list[str]:
    return sorted(glob.glob(f"{path}/episodes/_delta_log/*.json"))


def owner_of_chunk(path: str, chunk: str) -> set[int]:
    """Episode ids with camera rows in ``chunk`` (16 rows per chunk), from the table's refs."""
    ds = el.Dataset.open(path)
    snap = ds.snapshot()
    writer = chunk.split("/tensors/")[1].split("/")[0]
    n = int(chunk.split("/c/")[1].split("/")[0])
    out = set()
    for p in range(len(ds)):
        start = int(snap.index["ref/observation/camera"][p])
        stop = start + int(snap.lengths[p]) + 1
        if snap.index["writer"][p] == writer and start < 16 * (n + 1) and stop > 16 * n:
            out.add(int(snap.index["episode_id"][p]))
    return out


def test_healthy_dataset_validates(damaged):
    path, raws = damaged
    report = el.Dataset.open(path).maintenance.validate()
    assert report.ok and report.episodes == 6 and report.steps == sum(r.length for r in raws)
    assert report.tensor_rows == sum(r.length + 1 for r in raws)
    assert report.table_files == len(data_files(path)) and report.log_entries == 4
    assert_same(read_all(path, verify=True), raws)


@pytest.mark.parametrize("damage", [truncate, lambda p: flip(p, os.path.getsize(p) - 12)], ids=["truncated", "footer"])
def test_damaged_parquet_file(damaged, damage):
    path, _ = damaged
    target = data_files(path)[0]
    damage(target)
    with pytest.raises(el.CorruptionError, match=os.path.basename(target)):
        read_all(path)
    assert any(p.file and p.file.endswith(os.path.basename(target)) for p in problems(path))


def read_everything(path: str) -> list[tuple]:
    """Each episode as (id, length, terminated, truncated, meta, segment), in dataset order."""
    ds = el.Dataset.open(path)
    out = []
    for i in range(len(ds)):
        ref = ds.episode(i)
        out.append((ref.episode_id, ref.length, ref.terminated, ref.truncated, ref.meta, ref.read()))
    return out


def test_parquet_bit_flips_never_give_wrong_data(damaged, tmp_path):
    """A flipped bit anywhere in a data file: reads raise CorruptionError naming it, or return the truth.

    The truth is the reference episodes plus the ids the pristine dataset assigned; every part of an
    episode a reader sees is compared: data, flags, meta and id.
    """
    path, raws = damaged
    ids = el.Dataset.open(path).episode_ids.tolist()
    pristine = str(tmp_path / "pristine")
    shutil.copytree(path, pristine)
    rng = np.random.default_rng(0)
    for _ in range(16):
        shutil.rmtree(path)
        shutil.copytree(pristine, path)
        target = data_files(path)[int(rng.integers(0, len(data_files(path))))]
        flip(target, int(rng.integers(0, os.path.getsize(target))), int(rng.integers(0, 8)))
        try:
            got = read_everything(path)
        except el.CorruptionError as exc:
            assert os.path.basename(target) in str(exc)
            continue
        assert [g[0] for g in got] == ids
        for (_, length, terminated, truncated, meta, seg), raw in zip(got, raws, strict=True):
            assert (length, terminated, truncated, meta) == (raw.length, raw.terminated, raw.truncated, raw.meta)
            np.testing.assert_array_equal(seg.terminated[-1:], [raw.terminated])
            np.testing.assert_array_equal(seg.truncated[-1:], [raw.truncated])
            assert not seg.terminated[:-1].any() and not seg.truncated[:-1].any()
        assert_same([g[5] for g in got], raws)


def test_truncated_tensor_chunk(damaged):
    path, _ = damaged
    chunk = camera_chunks(path)[0]
    owners = owner_of_chunk(path, chunk)
    truncate(chunk)
    with pytest.raises(el.CorruptionError, match=r"episode (\d+)") as info:
        read_all(path)
    assert int(info.value.args[0].split()[1].rstrip(":")) in owners
    assert chunk in str(info.value)
    found = [p for p in problems(path) if p.kind == "tensor"]
    assert found and {p.episode_id for p in found} <= owners


def test_deleted_tensor_chunk_is_not_read_as_zeros(damaged):
    path, _ = damaged
    chunk = camera_chunks(path)[0]
    os.remove(chunk)
    with pytest.raises(el.CorruptionError, match=r"episode .*missing"):
        read_all(path)
    assert any(p.kind == "tensor" for p in problems(path))


def test_bit_flip_in_tensor_chunk(damaged):
    path, _ = damaged
    chunk = camera_chunks(path)[0]
    owners = owner_of_chunk(path, chunk)
    flip(chunk, 5)  # raw bytes codec: the read succeeds, only the checksum can tell
    with pytest.raises(el.CorruptionError, match="CRC-32") as info:
        read_all(path, verify=True)
    assert int(str(info.value).split()[1].rstrip(":")) in owners
    found = [p for p in problems(path) if p.kind == "checksum"]
    assert {p.episode_id for p in found} <= owners and len(found) == 1
    assert "observation/camera" in found[0].file


def test_missing_tensor_array(damaged):
    path, _ = damaged
    array = glob.glob(f"{path}/tensors/*")[0]
    shutil.rmtree(array)
    with pytest.raises(el.CorruptionError, match=rf"episode \d+: field 'observation/camera'.*{array}"):
        read_all(path)
    assert any(p.kind == "tensor" and array in p.file for p in problems(path))


def test_reference_past_the_array(damaged):
    path, _ = damaged
    meta_file = glob.glob(f"{path}/tensors/*/observation/camera/zarr.json")[0]
    with open(meta_file) as fh:
        meta = json.load(fh)
    meta["shape"][0] -= 2  # the last episode's rows now reach past the array's end
    with open(meta_file, "w") as fh:
        json.dump(meta, fh)
    with pytest.raises(el.CorruptionError, match=r"episode \d+: field 'observation/camera' references rows"):
        read_all(path)
    assert any("references rows" in p.message and p.episode_id is not None for p in problems(path))


def test_truncated_zarr_metadata(damaged):
    path, _ = damaged
    meta_file = glob.glob(f"{path}/tensors/*/observation/camera/zarr.json")[0]
    truncate(meta_file)
    with pytest.raises(el.CorruptionError, match="cannot be opened"):
        read_all(path)


def test_truncated_log_entry(damaged):
    path, _ = damaged
    entry = log_entries(path)[-1]
    truncate(entry)
    with pytest.raises(el.CorruptionError, match=os.path.basename(entry)):
        el.Dataset.open(path)


def test_log_entry_pointing_at_a_missing_file(damaged):
    path, _ = damaged
    entry = log_entries(path)[-1]
    with open(entry) as fh:
        text = fh.read()
    with open(entry, "w") as fh:
        fh.write(text.replace("part-00000-", "part-00000x", 1))
    with pytest.raises(el.CorruptionError, match="part-00000x"):
        read_all(path)
    assert any(p.kind == "table-file" and "missing" in p.message for p in problems(path))


@pytest.mark.parametrize(
    "edit",
    [
        lambda a: a["partitionValues"].update(task=a["partitionValues"]["task"] + "x"),
        lambda a: a.update(stats=json.dumps({**json.loads(a["stats"]), "numRecords": 99})),
        lambda a: a.update(size=a["size"] + 1),
    ],
    ids=["partition-value", "num-records", "size"],
)
def test_log_bit_rot_found_by_validate(damaged, edit):
    """Delta log entries carry no checksum: validate() cross-checks them against the files."""
    path, _ = damaged
    entry = log_entries(path)[-1]
    with open(entry) as fh:
        actions = [json.loads(line) for line in fh if line.strip()]
    for action in actions:
        if "add" in action:
            edit(action["add"])
            break
    with open(entry, "w") as fh:
        fh.write("\n".join(json.dumps(a) for a in actions) + "\n")
    assert any(p.kind == "table-file" and p.file for p in problems(path))


def test_validate_cli_reports_corruption(damaged, capsys):
    from episodelake.cli.main import main

    path, _ = damaged
    assert main(["validate", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    flip(camera_chunks(path)[0], 5)
    assert main(["validate", path]) == 1
    assert "checksum" in capsys.readouterr().out


def test_sampler_raises_on_deleted_chunk_file(damaged):
    """The memory-mapped sampling path never turns a missing chunk into zeros."""
    path, _ = damaged
    chunk = sorted(glob.glob(os.path.join(path, "tensors", "*", "observation", "camera", "c", "*", "0", "0", "0")))[0]
    os.remove(chunk)
    segments = el.Dataset.open(path).segments(2)
    with pytest.raises(el.CorruptionError, match="missing"):
        segments.__getitems__(list(range(len(segments))))
