"""A real torch DataLoader with worker processes yields exactly the single-process segments."""

from __future__ import annotations

import zlib
from collections import Counter

import numpy as np
import pytest

import episodelake as el

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from .test_sampling import check_batch, make_dataset, raw_by_id  # noqa: E402


@pytest.fixture(scope="module")
def raw_lake(tmp_path_factory):
    return make_dataset(str(tmp_path_factory.mktemp("loader") / "ds"))


@pytest.fixture(scope="module")
def zstd_lake(tmp_path_factory):
    return make_dataset(str(tmp_path_factory.mktemp("loader") / "zstd"), compression="zstd")


def fingerprints(batch):
    """(episode_id, start, CRC of every buffer of the item) per batch item."""
    out = []
    for b in range(len(batch.episode_id)):
        crc = 0
        for _key, arr in sorted(batch.data.items()):
            crc = zlib.crc32(np.ascontiguousarray(arr[b]).tobytes(), crc)
        crc = zlib.crc32(np.ascontiguousarray(batch.mask[b]).tobytes(), crc)
        out.append((int(batch.episode_id[b]), int(batch.start[b]), crc))
    return out


def loader_multiset(segs, context, shuffle=False):
    loader = DataLoader(
        segs,
        batch_size=7,
        shuffle=shuffle,
        num_workers=2,
        collate_fn=segs.collate,
        multiprocessing_context=context,
        generator=torch.Generator().manual_seed(0),
    )
    batches = list(loader)
    return batches, Counter(fp for b in batches for fp in fingerprints(b))


def single_process_multiset(segs):
    return Counter(fingerprints(segs.__getitems__(list(range(len(segs))))))


@pytest.mark.parametrize("pad", ["suffix", "prefix"])
def test_forked_workers_match_single_process(raw_lake, pad):
    ds, raw = raw_lake
    segs = ds.segments(el.Window(6, pad=pad))
    batches, got = loader_multiset(segs, "fork", shuffle=True)
    assert got == single_process_multiset(segs)
    for b in batches:
        check_batch(b, raw_by_id(ds, raw), 6)


@pytest.mark.slow
def test_spawned_workers_read_compressed_tensors(zstd_lake):
    ds, raw = zstd_lake
    segs = ds.segments(el.Window(5, pad="suffix", stride=2))
    batches, got = loader_multiset(segs, "spawn")
    assert got == single_process_multiset(segs)
    check_batch(batches[0], raw_by_id(ds, raw), 5)
