"""Object-store tensor arrays hold exactly the rows episodes reference: no gaps, no invented zeros.

0.1.0 started every commit on a fresh shard of the writer's single array: with
two writers committing 10 short episodes at a time, arrays were mostly gaps,
``vacuum`` counted the gaps as unreferenced rows and zarr-python readers of a
whole array saw zeros nobody wrote. Now each commit writes its own array sized
to its rows. Checked on the real S3 server against ground truth recomputed
from ``(seed, index)``, with zarr-python as the independent reader.
"""

from __future__ import annotations

import dataclasses
import io
import json
import signal
import subprocess
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import s3fs

import episodelake as el
from episodelake.ops import maintenance
from episodelake.storage import table
from episodelake.storage.arrays import split_ref

from .workers.common import assert_all_match, crash_schema, episode

zarr = pytest.importorskip("zarr")

REPO = Path(__file__).resolve().parents[1]
OLD_RELEASE = "cbeaee775c86628879c6e64ca72f8358a2c463d1"  # the last commit of episodelake 0.1.0's layout
FIELDS = ("observation/camera", "observation/state")

# A writer process killed when its second commit has written its tensors but not its table rows.
ABORTING_WRITER = """
import json, os, signal, sys
import episodelake as el
from episodelake.storage import table
from tests.workers.common import episode

url, options, seed = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
commit = table.EpisodeTable.append
calls = []

def append(self, rows, *args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return commit(self, rows, *args, **kwargs)

table.EpisodeTable.append = append
ds = el.Dataset.open(url, storage_options=options, commit_episodes=10)
for k in range(2):  # two commits of commit_episodes each: the second is killed
    ds.append_episodes([episode(seed, i).as_dict(unwrap_action=True) for i in range(10 * k, 10 * k + 10)])
"""

# 0.1.0 itself (from git) writing two writers' commits of 10 episodes each.
OLD_WRITER = """
import json, sys
import episodelake as el
from tests.workers.common import crash_schema, episode

assert el.__file__.startswith(sys.argv[3]), el.__file__
url, options = sys.argv[1], json.loads(sys.argv[2])
ds = el.Dataset.create(crash_schema(), url, storage_options=options)
other = el.Dataset.open(url, storage_options=options)
for round in range(2):
    for seed, handle in ((0, ds), (1, other)):
        handle.append_episodes(episode(seed, round * 10 + i).as_dict(unwrap_action=True) for i in range(10))
        handle.flush()
"""


def schema() -> el.DatasetSchema:
    """crash_schema with both observation fields as tensors: zstd camera, raw state."""
    fields = []
    for f in crash_schema().fields:
        if f.key == "observation/camera":
            f = dataclasses.replace(f, compression="zstd")
        elif f.key == "observation/state":
            f = dataclasses.replace(f, storage="tensor", chunk_rows=8)
        fields.append(f)
    return el.DatasetSchema(fields)


def ground_truth(ds: el.Dataset) -> list:
    """The raw episode of every position, from its (seed, index) meta."""
    snap = ds.snapshot()
    return [episode(int(s), int(i)) for s, i in zip(snap.index["seed"], snap.index["index"], strict=True)]


def check_arrays(ds: el.Dataset, fs: s3fs.S3FileSystem) -> dict[str, int]:
    """Every stored array holds exactly its episodes' rows, in order; returns stored rows per field.

    zarr-python reads each whole array; it must equal the concatenation of the
    ground-truth rows of the episodes that reference it (so no zero-filled
    gaps), and no array exists that no episode references.
    """
    snap = ds.snapshot()
    raws = ground_truth(ds)
    zarr_fs = s3fs.S3FileSystem(asynchronous=True, **ds.location.storage_options)
    stored = {}
    for key in FIELDS:
        name = key.split("/")[1]
        members = defaultdict(list)
        for p, (writer, ref) in enumerate(zip(snap.index["writer"], snap.index[f"ref/{key}"], strict=True)):
            commit, row = split_ref(ref)
            members[(str(writer), commit)].append((row, p))
        stored[key] = 0
        for (writer, commit), items in members.items():
            assert commit >= 1
            path = f"{ds.location.path}/tensors/{writer}/{commit}/{key}"
            whole = zarr.open_array(zarr.storage.FsspecStore(zarr_fs, path=path, read_only=True), mode="r")[:]
            want = np.concatenate([raws[p].obs[name] for _, p in sorted(items)])
            np.testing.assert_array_equal(whole, want)
            stored[key] += len(whole)
        on_store = {p.rsplit("/", 1)[0] for p in fs.glob(f"{ds.location.path}/tensors/*/*/{key}/zarr.json")}
        assert on_store == {f"{ds.location.path}/tensors/{w}/{c}/{key}" for w, c in members}
        assert stored[key] == sum(len(r.obs[name]) for r in raws)
    return stored


@pytest.fixture
def two_writers(s3_server, s3_url):
    """Two Dataset objects taking turns committing 10 episodes each, three rounds."""
    opts = s3_server.storage_options
    first = el.Dataset.create(schema(), s3_url, storage_options=opts, commit_episodes=10)
    second = el.Dataset.open(s3_url, storage_options=opts, commit_episodes=10)
    for round in range(3):
        for seed, handle in ((0, first), (1, second)):
            handle.append_episodes(episode(seed, round * 10 + i).as_dict(unwrap_action=True) for i in range(10))
    return el.Dataset.open(s3_url, storage_options=opts), s3fs.S3FileSystem(use_listings_cache=False, **opts)


@pytest.mark.slow
def test_two_writers_leave_arrays_without_gaps(two_writers):
    ds, fs = two_writers
    assert len(ds) == 60
    stored = check_arrays(ds, fs)
    assert stored["observation/camera"] == int((ds.snapshot().lengths + 1).sum())  # stored == referenced
    report = ds.maintenance.vacuum(dry_run=True, retention_hours=0)
    assert (report.unreferenced_rows, report.unreclaimed_rows, report.tensor_arrays, report.truncated) == (
        0,
        0,
        [],
        [],
    )
    assert_all_match(ds, ground_truth(ds))
    assert ds.maintenance.validate().ok


@pytest.mark.slow
def test_vacuum_finds_and_removes_an_aborted_commit(two_writers, s3_server, monkeypatch):
    ds, fs = two_writers
    opts = s3_server.storage_options
    proc = subprocess.run(
        [sys.executable, "-c", ABORTING_WRITER, ds.location.url, json.dumps(opts), "2"],
        cwd=REPO,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    ds = el.Dataset.open(ds.location.url, storage_options=opts)
    assert len(ds) == 70  # the first commit of the killed writer landed, the second did not
    lost = [episode(2, i) for i in range(10, 20)]
    lost_rows = sum(len(r.obs["camera"]) + len(r.obs["state"]) for r in lost)
    young = ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    assert young.unreferenced_rows == lost_rows and young.tensor_arrays == []  # under the floor: could be in flight
    for module in (table, maintenance):  # as if the floor (1 h) had passed: S3 objects cannot be aged
        monkeypatch.setattr(module, "UNREFERENCED_FLOOR_HOURS", 0.0)
    dry = ds.maintenance.vacuum(dry_run=True, retention_hours=0)
    assert dry.unreferenced_rows == lost_rows
    assert dry.unreclaimed_rows == 0  # a whole commit array goes
    assert sorted(p.rsplit("/", 3)[1] for p in dry.tensor_arrays) == ["2", "2"]  # commit 2, both fields
    done = ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    assert done.tensor_arrays == dry.tensor_arrays
    assert [f for p in done.tensor_arrays for f in fs.find(p) if f != p] == []  # a bare directory marker may stay
    again = ds.maintenance.vacuum(dry_run=True, retention_hours=0)
    assert (again.unreferenced_rows, again.tensor_arrays) == (0, [])
    ds = el.Dataset.open(ds.location.url, storage_options=opts)
    check_arrays(ds, fs)
    assert_all_match(ds, ground_truth(ds))


@pytest.fixture
def old_release(tmp_path):
    """episodelake 0.1.0's source tree, extracted from git."""
    try:
        tar = subprocess.run(
            ["git", "-C", str(REPO), "archive", OLD_RELEASE, "src/episodelake"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the 0.1.0 sources are not in this checkout's git history")
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(tmp_path / "old", filter="data")
    return str(tmp_path / "old" / "src")


@pytest.mark.slow
def test_datasets_written_by_0_1_0_still_read_and_accept_new_commits(old_release, s3_server, s3_url):
    opts = s3_server.storage_options
    env = {"PYTHONPATH": f"{old_release}:{REPO}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", OLD_WRITER, s3_url, json.dumps(opts), old_release],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    ds = el.Dataset.open(s3_url, storage_options=opts)
    refs = ds.snapshot().index["ref/observation/camera"]
    assert len(ds) == 40 and {split_ref(r)[0] for r in refs} == {0}  # 0.1.0's single arrays
    assert_all_match(ds, ground_truth(ds))
    # 0.1.0 skipped to a fresh shard per commit: those never-written rows are not leftovers
    assert ds.maintenance.vacuum(dry_run=True, retention_hours=0).unreferenced_rows == 0
    new = el.Dataset.open(s3_url, storage_options=opts)
    new.append_episodes(episode(3, i).as_dict(unwrap_action=True) for i in range(10))
    new.flush()
    ds = el.Dataset.open(s3_url, storage_options=opts)
    assert len(ds) == 50
    assert {split_ref(r)[0] for r in ds.snapshot().index["ref/observation/camera"]} == {0, 1}
    assert_all_match(ds, ground_truth(ds))
    batch = ds.segment_stream(3, batch_size=64, seed=0, prefetch=0).sample()
    assert batch.mask.any()
    assert ds.maintenance.validate().ok
    assert ds.maintenance.vacuum(dry_run=True, retention_hours=0).unreferenced_rows == 0
