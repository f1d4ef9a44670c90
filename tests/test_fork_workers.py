"""Forked DataLoader workers read compressed and object-store tensors (TensorStore is never used after fork).

TensorStore aborts a process that uses it after ``fork()`` from one that did;
0.1.0 therefore refused forked workers for anything but raw local arrays. Now a
forked worker reads the same Zarr files without TensorStore
(:class:`episodelake.storage.planned.PlainArray`). Every test here has the parent read
through TensorStore first, so the workers really are forked from a process
that used it, and compares with the parent's own read and with ground truth.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import episodelake as el
from episodelake.storage.arrays import split_ref
from episodelake.storage.planned import PlainArray
from episodelake.storage.tensors import TensorArray, make_context

from .test_dataloader import loader_multiset, single_process_multiset
from .test_sampling import check_batch, make_dataset, raw_by_id


@pytest.fixture(scope="module")
def zstd_local(tmp_path_factory):
    return make_dataset(str(tmp_path_factory.mktemp("fork") / "zstd"), compression="zstd", writers=2)


@pytest.fixture(scope="module")
def s3_lakes(s3_server):
    opts = s3_server.storage_options
    raw_lake = make_dataset(f"s3://episodes/fork-raw-{os.getpid()}", writers=2, storage_options=opts)
    zstd_lake = make_dataset(f"s3://episodes/fork-zstd-{os.getpid()}", "zstd", writers=2, storage_options=opts)
    return {"raw": raw_lake, "zstd": zstd_lake}


def arrays_of(ds) -> list[tuple[str, int]]:
    """The (writer, commit) arrays of the camera field that episodes reference."""
    index = ds.snapshot().index
    refs = index["ref/observation/camera"].tolist()
    return sorted({(str(w), split_ref(r)[0]) for w, r in zip(index["writer"].tolist(), refs, strict=True)})


def check_forked_loader(ds, raw, L=5):
    segs = ds.segments(el.Window(L, pad="suffix", stride=2))
    want = single_process_multiset(segs)  # the parent reads through TensorStore before forking
    batches, got = loader_multiset(segs, "fork", shuffle=True)
    assert got == want
    by_id = raw_by_id(ds, raw)
    for batch in batches:
        check_batch(batch, by_id, L)


def test_forked_workers_read_compressed_local_tensors(zstd_local):
    check_forked_loader(*zstd_local)


@pytest.mark.parametrize("kind", ["raw", "zstd"])
def test_forked_workers_read_s3_tensors(s3_lakes, kind):
    ds, raw = s3_lakes[kind]
    assert len(arrays_of(ds)) > 2  # two writers, several commits each: one array per commit
    check_forked_loader(ds, raw)


def test_plain_reader_matches_tensorstore_on_every_array(s3_lakes, zstd_local):
    """Whole arrays (sharded, partial last shard, zstd) decode to TensorStore's values, row for row."""
    ctx = make_context()
    for ds, _ in (*s3_lakes.values(), zstd_local):
        f = ds.schema["observation/camera"]
        for writer, commit in arrays_of(ds):
            plain = PlainArray(ds.location, writer, f, commit)
            engine = TensorArray.open(ds.location, writer, f, ctx, commit=commit)
            assert plain.rows == engine.rows
            for lo, hi in ((0, engine.rows), (3, max(4, engine.rows - 5))):
                np.testing.assert_array_equal(plain.read(lo, hi).result(), engine.read(lo, hi).result())


def test_plain_reader_reports_a_missing_chunk(tmp_path):
    ds, _ = make_dataset(str(tmp_path / "ds"), compression="zstd")
    snap = ds.snapshot()
    f = ds.schema["observation/camera"]
    writer = str(snap.index["writer"][0])
    chunk = tmp_path / "ds" / "tensors" / writer / "observation" / "camera" / "c" / "1" / "0" / "0" / "0"
    chunk.unlink()
    with pytest.raises(el.CorruptionError, match=str(chunk)):
        PlainArray(ds.location, writer, f).read(0, 40)
