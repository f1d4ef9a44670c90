"""Video codecs (``codec="video:h264" | "video:av1"``): one closed GOP per inner chunk, segments appended to a
partly filled GOP, odd frame sizes, random segments against whole-episode reads, S3, copies and vacuum.
Every-reader checks (fork/spawn DataLoader workers, zarr-python) are in test_codecs.py's ``EVERY_CODEC``."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core import codecs
from episodelake.storage.arrays import tensors_size
from episodelake.storage.location import resolve
from episodelake.storage.store import Store

from .test_codecs import camera_schema, episode, frames_of, smooth_frames, write


def decode(codec: str, quality: int, layout: str, frames: int, shape: tuple[int, ...], blob: bytes) -> np.ndarray:
    chain = [codecs.lossy_codec(codec, quality, layout)]
    return codecs.chunk_decoder(chain, (frames, *shape), np.dtype("uint8"))(blob)


@settings(max_examples=25, deadline=None)
@given(
    codec=st.sampled_from(codecs.VIDEO),
    quality=st.integers(1, 100),
    h=st.integers(8, 48),
    w=st.integers(8, 48),
    layout=st.sampled_from(["HWC", "CHW"]),
    n=st.integers(1, 10),
    first=st.integers(0, 5),
    seed=st.integers(0, 2**31),
)
def test_video_segments_keep_their_floor_and_appending_keeps_earlier_frames(
    codec, quality, h, w, layout, n, first, seed
):
    """Any size (odd ones padded for yuv420p and cropped back) decodes to exactly its shape, within the declared
    floor from 32 x 32 pixels on; a second segment appended to the chunk replaces only the frames from its offset."""
    rng = np.random.default_rng(seed)
    hwc = smooth_frames(rng, first + n, h, w)
    frames = hwc.transpose(0, 3, 1, 2).copy() if layout == "CHW" else hwc
    shape, G = frames.shape[1:], first + n
    one = codecs.encode_segment(codec, quality, layout, 0, frames)
    alone = decode(codec, quality, layout, G, shape, one)
    assert alone.shape == (G, *shape) and alone.dtype == np.uint8
    floor = codecs.psnr_floor(codec, quality) if min(h, w) >= 32 else 10.0
    assert min(codecs.psnr(a, b) for a, b in zip(frames, alone, strict=True)) >= floor
    later = frames[first:][:, ::-1].copy()  # other frames for the same rows
    both = decode(codec, quality, layout, G, shape, one + codecs.encode_segment(codec, quality, layout, first, later))
    np.testing.assert_array_equal(both[:first], alone[:first])
    assert min(codecs.psnr(a, b) for a, b in zip(later, both[first:], strict=True)) >= floor


def test_undecodable_video_chunk_is_a_value_error():
    frames = smooth_frames(np.random.default_rng(0), 4, 16, 16)
    blob = codecs.encode_segment("video:h264", 60, "HWC", 0, frames)
    with pytest.raises(ValueError, match="not a video segment"):
        decode("video:h264", 60, "HWC", 4, (16, 16, 3), b"XXXX" + blob[4:])
    with pytest.raises(ValueError, match="undecodable video chunk"):
        decode("video:h264", 60, "HWC", 4, (16, 16, 3), blob[:20])
    with pytest.raises(ValueError, match=r"frames 3\.\.7 of a 4-frame chunk"):
        decode("video:h264", 60, "HWC", 4, (16, 16, 3), codecs.encode_segment("video:h264", 60, "HWC", 3, frames))


@pytest.mark.parametrize("codec", codecs.VIDEO)
def test_random_segments_equal_whole_episode_reads(tmp_path, codec):
    """Episodes appended over five commits (GOPs of 5 split across commits): sampled segments, decoded cold
    and warm, hold exactly the frames of whole-episode reads; the write-time CRC-32s still match."""
    rng = np.random.default_rng(3)
    raw = [smooth_frames(rng, n + 1, 32, 33) for n in (6, 12, 3, 17, 9, 4, 11, 8, 13, 2)]
    schema = camera_schema((32, 33, 3), codec=codec, chunk_rows=5)
    ds = write(str(tmp_path / "ds"), schema, [episode(r) for r in raw], commits=5)
    # CRCs computed at write of earlier commits still match after appends
    assert ds.maintenance.validate().problems == []
    whole = dict(zip(ds.episode_ids.tolist(), frames_of(ds), strict=True))
    for r, g in zip(raw, whole.values(), strict=True):
        assert min(codecs.psnr(a, b) for a, b in zip(r, g, strict=True)) >= codecs.psnr_floor(
            codec, codecs.DEFAULT_QUALITY[codec]
        )
    for warm in (False, True):
        if not warm:
            codecs.decoded_cache.clear()
        stream = el.Dataset.open(str(tmp_path / "ds")).segment_stream(6, batch_size=16, seed=7)
        seen = 0
        for batch, _i in zip(stream, range(4), strict=False):
            for b, (eid, start) in enumerate(zip(batch.episode_id.tolist(), batch.start.tolist(), strict=True)):
                want = whole[eid][start : start + 7]  # shorter at an episode's end (the batch pads)
                np.testing.assert_array_equal(batch.all_obs[b][: len(want)], want)
                seen += 1
        assert seen == 64


def test_copy_to_video_and_back(tmp_path):
    """A raw field chunked by 4096 rows becomes a video field with the default 16-frame GOP, and back exactly."""
    rng = np.random.default_rng(4)
    raw = [smooth_frames(rng, n + 1, 32, 32) for n in (20, 35)]
    src = write(str(tmp_path / "src"), camera_schema(chunk_rows=4096), [episode(r) for r in raw])
    video = src.copy_to(str(tmp_path / "h264"), codecs={"observation/camera": "video:h264"})
    f = video.schema["observation/camera"]
    assert (f.codec, f.quality, f.rows_per_chunk) == ("video:h264", 60, 16)
    got = frames_of(video)
    for r, g in zip(raw, got, strict=True):
        assert min(codecs.psnr(a, b) for a, b in zip(r, g, strict=True)) >= codecs.psnr_floor("video:h264", 60)
    stats = video.stats(["observation/camera"])["observation/camera"]
    np.testing.assert_array_equal(stats["min"], np.concatenate(got).min(axis=(0, 1, 2)))
    assert [zlib.crc32(g.data) for g in got] == [int(c) for c in video.snapshot().index["crc/observation/camera"]]
    assert video.maintenance.validate().problems == []
    assert tensors_size(video.location) * 10 < tensors_size(src.location)
    writer = str(video.snapshot().index["writer"][0])
    meta = json.loads((tmp_path / "h264" / "tensors" / writer / "observation" / "camera" / "zarr.json").read_text())
    conf = meta["codecs"][0]["configuration"]
    assert conf["chunk_shape"] == [16, 32, 32, 3]  # one GOP per inner chunk
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [64, 32, 32, 3]  # 64 frames per shard
    assert conf["codecs"][0]["name"] == "episodelake_video"
    assert conf["codecs"][0]["configuration"] == {
        "codec": "h264",
        "encoder": "libx264",
        "decoder": "h264",
        "quality": 60,
        "crf": 21,  # round((100 - 60) * 51 / 99)
        "pix_fmt": "yuv420p",
        "layout": "HWC",
        "format": "segments-v1",
    }
    back = video.copy_to(str(tmp_path / "back"), codecs={"observation/camera": None})
    for a, b in zip(got, frames_of(back), strict=True):
        np.testing.assert_array_equal(a, b)


def test_vacuum_counts_lost_frames_inside_a_gop_and_never_cuts_them(tmp_path):
    """A lost commit's frames inside a partly filled GOP are counted by vacuum, never cut; the committed frames
    read the same and the dataset validates."""
    path = str(tmp_path / "ds")
    rng = np.random.default_rng(0)
    raw = [smooth_frames(rng, n + 1, 32, 32) for n in (5, 9)]  # 16 frames: GOP 2 of 6 is partly filled
    ds = write(path, camera_schema(codec="video:h264", chunk_rows=6), [episode(r) for r in raw])
    before = frames_of(ds)
    store = Store.open(resolve(path, {}))
    f, writer = store.schema["observation/camera"], str(ds.snapshot().index["writer"][0])
    orphan = store.open_array(writer, f, read_only=False)
    orphan.append_block(smooth_frames(rng, 7, 32, 32))[1].result()  # a lost commit, into the partly filled GOP
    report = el.Dataset.open(path).maintenance.vacuum(retention_hours=1)
    assert report.unreferenced_rows == report.unreclaimed_rows == 7  # counted; vacuum never cuts a writer's array
    assert store.open_array(writer, f).rows == 23
    fresh = el.Dataset.open(path)
    for a, b in zip(before, frames_of(fresh), strict=True):
        np.testing.assert_array_equal(a, b)
    assert fresh.maintenance.validate().problems == []


def test_zarr_python_without_registration_names_the_video_codec(tmp_path):
    """A fresh interpreter that never called ``register_zarr_codecs`` cannot open a video array, and says why."""
    schema = camera_schema(codec="video:h264")
    ds = write(str(tmp_path / "ds"), schema, [episode(smooth_frames(np.random.default_rng(0), 5, 32, 32))])
    where = tmp_path / "ds" / "tensors" / str(ds.snapshot().index["writer"][0]) / "observation" / "camera"
    script = f"import zarr\ntry:\n    zarr.open_array({str(where)!r}, mode='r')\nexcept Exception as e:\n    print(e)\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "Unknown codec: 'episodelake_video'" in done.stdout
