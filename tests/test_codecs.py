"""Tensor codecs: lossless Blosc/zstd round trips, lossy image codecs within their declared PSNR floor,
statistics and checksums of decoded frames, re-encoding copies, and every codec read by forked and spawned
DataLoader workers, by zarr-python and from S3."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core import codecs
from episodelake.storage.arrays import array_parts, tensors_size, zarr_metadata
from episodelake.storage.location import resolve
from episodelake.storage.planned import PlainArray


def smooth_frames(rng: np.random.Generator, n: int, h: int, w: int, c: int = 3) -> np.ndarray:
    """``n`` rendered-like uint8 frames ``[n, h, w, c]``: smooth shading plus flat discs that move a little."""
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    base = np.zeros((h, w, c))
    for ch in range(c):
        a, b, p = rng.uniform(-1, 1, 3)
        base[..., ch] = 128 + 80 * np.sin(3 * (a * x + b * y) + p)
    discs = [(rng.uniform(0, 1, 3), rng.uniform(0, 255, c), rng.uniform(-0.01, 0.01, 2)) for _ in range(3)]
    out = np.empty((n, h, w, c), np.uint8)
    for t in range(n):
        img = base.copy()
        for (cy, cx, r), colour, (vy, vx) in discs:
            img[((y - cy - vy * t) ** 2 + (x - cx - vx * t) ** 2) < (0.3 * r) ** 2] = colour
        out[t] = np.clip(img, 0, 255)
    return out


def camera_schema(shape=(32, 32, 3), layout="HWC", **options) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("camera", shape, "uint8", layout=layout, storage="tensor", **options),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def episode(frames: np.ndarray) -> dict:
    T = len(frames) - 1
    return {
        "observations": frames,
        "actions": np.zeros((T, 2), np.float32),
        "rewards": np.arange(T, dtype=np.float32),
        "terminated": True,
    }


def write(path, schema, episodes, commits=1):
    """A dataset at ``path`` holding ``episodes``, committed in ``commits`` groups (several appends per array)."""
    ds = el.Dataset.create(schema, path)
    for part in np.array_split(np.arange(len(episodes)), commits):
        ds.append_episodes([episodes[i] for i in part])
        ds.flush()
    ds.close()
    return el.Dataset.open(path)


def frames_of(ds, key="observation/camera"):
    return [ds.episode(i).read().data[key] for i in range(len(ds))]


# ---------------------------------------------------------------- schema


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"compression": "lz4"}, r"field 'camera': compression must be None or one of"),
        ({"compression": "blosc-snappy"}, r"field 'camera': compression must be"),
        ({"codec": "gif"}, r"field 'camera': codec must be one of \('jpeg', 'webp', 'avif', 'video:h264', 'video:av1'"),
        ({"codec": "jpeg", "quality": 0}, r"field 'camera': quality must be an int in \[1, 100\], got 0"),
        ({"codec": "jpeg", "quality": 101}, r"field 'camera': quality must be an int in \[1, 100\]"),
        ({"codec": "jpeg", "quality": 9.5}, r"field 'camera': quality must be an int"),
        ({"quality": 90}, r"field 'camera': quality is for a lossy codec"),
        ({"codec": "jpeg", "compression": "zstd"}, r"field 'camera': codec 'jpeg' and compression cannot both"),
        ({"codec": "jpeg", "storage": "table"}, r"field 'camera': codec 'jpeg' is for step fields stored as tensors"),
    ],
)
def test_fieldspec_rejects_bad_codec_options(options, pattern):
    with pytest.raises(el.SchemaError, match=pattern):
        el.FieldSpec("camera", (32, 32, 3), "uint8", layout="HWC", **{"storage": "tensor", **options})


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        (
            dict(shape=(32, 32, 3), dtype="float32", layout="HWC"),
            r"codec .jpeg. stores uint8 images, the field is float32",
        ),
        (
            dict(shape=(32, 32), dtype="uint8", layout=None),
            r"codec .jpeg. needs a 3-D image field with layout 'HWC' or 'CHW'",
        ),
        (
            dict(shape=(32, 32, 2), dtype="uint8", layout="HWC"),
            r"codec 'jpeg' stores \(1, 3\) channels, the field has 2",
        ),
        (
            dict(shape=(4, 32, 32), dtype="uint8", layout="CHW"),
            r"codec 'jpeg' stores \(1, 3\) channels, the field has 4",
        ),
    ],
)
def test_fieldspec_rejects_codec_on_non_images(spec, pattern):
    with pytest.raises(el.SchemaError, match=rf"field 'camera': {pattern}"):
        el.FieldSpec("camera", codec="jpeg", **spec)


@pytest.mark.parametrize(
    ("shape", "layout", "pattern"),
    [
        ((32, 32, 1), "HWC", r"codec 'video:h264' stores \(3,\) channels, the field has 1"),
        ((4, 32, 32), "CHW", r"codec 'video:h264' stores \(3,\) channels, the field has 4"),
        ((7, 32, 3), "HWC", r"codec 'video:h264' needs frames of at least 8 x 8 pixels"),
        ((3, 32, 5), "CHW", r"codec 'video:h264' needs frames of at least 8 x 8 pixels"),
    ],
)
def test_video_fields_need_rgb_frames_of_8_pixels(shape, layout, pattern):
    with pytest.raises(el.SchemaError, match=rf"field 'camera': {pattern}"):
        el.FieldSpec("camera", shape, "uint8", layout=layout, storage="tensor", codec="video:h264")


def test_descriptor_round_trips_codecs_and_older_descriptors_open(tmp_path):
    f = el.FieldSpec("camera", (3, 16, 16), "uint8", layout="CHW", codec="avif")
    assert f.quality == codecs.DEFAULT_QUALITY["avif"] and f.in_tensor  # defaults recorded, tensor implied
    assert el.FieldSpec.from_json(json.loads(json.dumps(f.to_json()))) == f
    blosc = el.FieldSpec("depth", (16, 16), "uint16", storage="tensor", compression="blosc-zstd-bitshuffle")
    assert el.FieldSpec.from_json(blosc.to_json()) == blosc
    assert "codec" not in blosc.to_json()  # fields without a codec keep 0.1.0's descriptor form
    older = {k: v for k, v in blosc.to_json().items() if k not in ("codec", "quality")}
    older["compression"] = "zstd"
    assert el.FieldSpec.from_json(older).codec is None
    ds = write(
        str(tmp_path / "ds"), camera_schema(codec="webp", quality=70), [episode(np.zeros((3, 32, 32, 3), np.uint8))]
    )
    assert (ds.schema["observation/camera"].codec, ds.schema["observation/camera"].quality) == ("webp", 70)


# ---------------------------------------------------------------- lossless


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    compression=st.sampled_from(codecs.LOSSLESS),
    dtype=st.sampled_from(["uint8", "int16", "float32", "float64"]),
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
    rows=st.integers(1, 40),
    chunk_rows=st.sampled_from([None, 1, 5]),
    sharded=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_lossless_codecs_round_trip_exactly(
    tmp_path_factory, compression, dtype, shape, rows, chunk_rows, sharded, seed
):
    """Every lossless chain zarr_metadata declares: TensorStore writes it, TensorStore and the forked-process
    reader (PlainArray) read back exactly what was written."""
    rng = np.random.default_rng(seed)
    values = (np.cumsum(rng.normal(size=(rows, *shape)), axis=0) * 10).astype(dtype)  # compressible, not noise
    f = el.FieldSpec("x", shape, dtype, storage="tensor", compression=compression, chunk_rows=chunk_rows)
    loc = resolve(str(tmp_path_factory.mktemp("lossless")), {})
    store = ts.open(
        {
            "driver": "zarr3",
            "kvstore": loc.kvstore(*array_parts("w", f, 1)),
            "metadata": zarr_metadata(f, sharded=sharded, rows=rows),
            "create": True,
            "store_data_equal_to_fill_value": True,  # as episodelake writes: every chunk stored
        }
    ).result()
    store.write(values).result()
    np.testing.assert_array_equal(store.read().result(), values)
    plain = PlainArray(loc, "w", f, 1)
    np.testing.assert_array_equal(plain.read(0, rows).result(), values)
    lo = int(rng.integers(0, rows))
    np.testing.assert_array_equal(plain.read(lo, rows).result(), values[lo:])
    with open(os.path.join(plain.dir, "zarr.json")) as fh:
        stored = json.load(fh)["codecs"]
    inner = stored[0]["configuration"]["codecs"] if sharded else stored
    names = [(c["name"], (c.get("configuration") or {}).get("cname")) for c in inner[1:]]
    declared = codecs.lossless_codecs(compression, np.dtype(dtype).itemsize)
    assert names == [(c["name"], c["configuration"].get("cname")) for c in declared]


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    compression=st.sampled_from(codecs.LOSSLESS),
    dtype=st.sampled_from(["uint8", "int16", "float32"]),
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=4),
    seed=st.integers(0, 2**31),
)
def test_lossless_datasets_round_trip_exactly(tmp_path_factory, compression, dtype, lengths, seed):
    rng = np.random.default_rng(seed)
    values = (np.cumsum(rng.normal(size=(sum(lengths) + len(lengths), 6, 5)), axis=0) * 10).astype(dtype)
    schema = el.DatasetSchema(
        [
            el.FieldSpec("x", (6, 5), dtype, storage="tensor", compression=compression, chunk_rows=4),
            el.FieldSpec("action", (), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    starts = np.cumsum([0] + [n + 1 for n in lengths])
    eps = [
        {
            "observations": values[a:b],
            "actions": np.zeros(b - a - 1, np.float32),
            "rewards": np.zeros(b - a - 1, np.float32),
        }
        for a, b in itertools.pairwise(starts)
    ]
    ds = write(str(tmp_path_factory.mktemp("lossless") / "ds"), schema, eps, commits=min(2, len(eps)))
    for i, e in enumerate(eps):
        np.testing.assert_array_equal(ds.episode(i).read().all_obs, e["observations"])
    assert ds.maintenance.validate().problems == []


def test_compressed_fields_get_small_chunks():
    """A random segment decodes few rows it does not need: compressed image fields default to 8-row chunks."""
    raw = el.FieldSpec("camera", (96, 96, 3), "uint8", layout="HWC")
    assert raw.rows_per_chunk == (1 << 20) // (96 * 96 * 3)
    assert el.FieldSpec("camera", (96, 96, 3), "uint8", layout="HWC", compression="blosc-lz4").rows_per_chunk == 8
    assert el.FieldSpec("camera", (224, 224, 3), "uint8", layout="HWC", compression="zstd").rows_per_chunk == 6


# ---------------------------------------------------------------- lossy


@settings(max_examples=60, deadline=None)
@given(
    codec=st.sampled_from(codecs.IMAGE),
    quality=st.integers(1, 100),
    h=st.integers(32, 96),
    w=st.integers(32, 96),
    layout=st.sampled_from(["HWC", "CHW"]),
    seed=st.integers(0, 2**31),
)
def test_lossy_codecs_keep_their_declared_psnr(codec, quality, h, w, layout, seed):
    """On rendered-like frames every codec/quality keeps at least its declared PSNR floor."""
    frame = smooth_frames(np.random.default_rng(seed), 1, h, w)[0]
    stored = frame.transpose(2, 0, 1) if layout == "CHW" else frame
    blob = codecs.encode_frame(codec, quality, layout, stored)
    decoded = codecs.chunk_decoder([codecs.lossy_codec(codec, quality, layout)], (1, *stored.shape), np.dtype("uint8"))(
        blob
    )[0]
    assert decoded.shape == stored.shape and decoded.dtype == np.uint8
    assert codecs.psnr(stored, decoded) >= codecs.psnr_floor(codec, quality)
    assert len(blob) < frame.nbytes  # it does compress


@pytest.mark.parametrize("codec", codecs.LOSSY)
def test_lossy_dataset_reads_stats_and_checksums_describe_decoded_frames(tmp_path, codec):
    rng = np.random.default_rng(1)
    raw = [smooth_frames(rng, n + 1, 32, 40) for n in (9, 14, 6, 11)]
    # chunk_rows=4 frames per shard: later commits append into a partly filled shard of the single local array
    schema = camera_schema((32, 40, 3), codec=codec, chunk_rows=4)
    ds = write(str(tmp_path / "ds"), schema, [episode(r) for r in raw], commits=4)
    got = frames_of(ds)
    floor = codecs.psnr_floor(codec, codecs.DEFAULT_QUALITY[codec])
    for r, g in zip(raw, got, strict=True):
        assert g.shape == r.shape and g.dtype == np.uint8
        assert min(codecs.psnr(a, b) for a, b in zip(r, g, strict=True)) >= floor
    # stats and CRC-32s were computed on the decoded frames: exactly what reads return
    decoded = np.concatenate(got)
    stats = ds.stats(["observation/camera"])["observation/camera"]
    np.testing.assert_array_equal(stats["min"], decoded.min(axis=(0, 1, 2)))
    np.testing.assert_array_equal(stats["max"], decoded.max(axis=(0, 1, 2)))
    np.testing.assert_allclose(stats["mean"], decoded.reshape(-1, 3).mean(axis=0), rtol=1e-12)
    assert not np.array_equal(stats["mean"], np.concatenate(raw).reshape(-1, 3).mean(axis=0))
    crcs = ds.snapshot().index["crc/observation/camera"]
    assert [zlib.crc32(np.ascontiguousarray(g).data) for g in got] == [int(c) for c in crcs]
    assert ds.maintenance.validate().problems == []
    # sampled batches hold the same decoded frames
    batch = next(iter(ds.segment_stream(4, batch_size=8, seed=3)))
    by_id = dict(zip(ds.episode_ids.tolist(), got, strict=True))
    for b, (eid, start) in enumerate(zip(batch.episode_id.tolist(), batch.start.tolist(), strict=True)):
        np.testing.assert_array_equal(batch.all_obs[b], by_id[eid][start : start + 5])
    writer = str(ds.snapshot().index["writer"][0])
    with open(tmp_path / "ds" / "tensors" / writer / "observation" / "camera" / "zarr.json") as fh:
        meta = json.load(fh)
    shard = meta["codecs"][0]
    inner = 4 if codec in codecs.VIDEO else 1  # video: one GOP of chunk_rows frames per inner chunk
    assert shard["name"] == "sharding_indexed" and shard["configuration"]["chunk_shape"] == [inner, 32, 40, 3]
    name = "episodelake_video" if codec in codecs.VIDEO else f"imagecodecs_{codec}"
    assert shard["configuration"]["codecs"][0]["name"] == name


def test_lossy_chw_field_round_trips_within_floor(tmp_path):
    raw = smooth_frames(np.random.default_rng(2), 8, 48, 32).transpose(0, 3, 1, 2).copy()
    ds = write(str(tmp_path / "ds"), camera_schema((3, 48, 32), layout="CHW", codec="jpeg", quality=92), [episode(raw)])
    got = frames_of(ds)[0]
    assert got.shape == raw.shape
    assert min(codecs.psnr(a, b) for a, b in zip(raw, got, strict=True)) >= codecs.psnr_floor("jpeg", 92)


def test_corrupt_lossy_frame_is_reported(tmp_path):
    ds = write(
        str(tmp_path / "ds"), camera_schema(codec="jpeg"), [episode(smooth_frames(np.random.default_rng(0), 5, 32, 32))]
    )
    writer = str(ds.snapshot().index["writer"][0])
    shard = tmp_path / "ds" / "tensors" / writer / "observation" / "camera" / "c" / "0" / "0" / "0" / "0"
    blob = bytearray(shard.read_bytes())
    blob[2:40] = b"\0" * 38  # inside the first frame's JPEG header
    shard.write_bytes(bytes(blob))
    fresh = el.Dataset.open(str(tmp_path / "ds"))
    with pytest.raises(el.CorruptionError, match=r"field 'observation/camera'.*chunk 0 .*undecodable frame"):
        fresh.episode(0).read()


# ---------------------------------------------------------------- copies


def test_copy_to_reencodes_and_back(tmp_path):
    rng = np.random.default_rng(4)
    raw = [smooth_frames(rng, n + 1, 32, 32) for n in (7, 12)]
    src = write(str(tmp_path / "src"), camera_schema(), [episode(r) for r in raw])
    jpeg = src.copy_to(str(tmp_path / "jpeg"), codecs={"observation/camera": ("jpeg", 80)})
    f = jpeg.schema["observation/camera"]
    assert (f.codec, f.quality, f.compression) == ("jpeg", 80, None)
    got = frames_of(jpeg)
    for r, g in zip(raw, got, strict=True):
        assert min(codecs.psnr(a, b) for a, b in zip(r, g, strict=True)) >= codecs.psnr_floor("jpeg", 80)
    stats = jpeg.stats(["observation/camera"])["observation/camera"]
    np.testing.assert_array_equal(stats["max"], np.concatenate(got).max(axis=(0, 1, 2)))
    assert jpeg.maintenance.validate().problems == []
    assert tensors_size(jpeg.location) * 2 < tensors_size(src.location)
    back = jpeg.copy_to(str(tmp_path / "back"), codecs={"observation/camera": None}, compression="zstd")
    assert back.schema["observation/camera"].codec is None
    for a, b in zip(got, frames_of(back), strict=True):
        np.testing.assert_array_equal(a, b)  # lossless copy of the decoded frames
    assert back.maintenance.validate().problems == []


@pytest.mark.parametrize(
    ("codecs_arg", "error", "pattern"),
    [
        ({"nope": "jpeg"}, el.ArgumentError, r"codecs: \['nope'\] are not tensor fields"),
        ("jpeg", el.ArgumentError, r"codecs must map field keys"),
        ({"observation/camera": ("jpeg",)}, el.ArgumentError, r"codecs\['observation/camera'\]: give a codec name"),
        ({"observation/camera": "gif"}, el.SchemaError, r"field 'camera': codec must be one of"),
    ],
)
def test_copy_to_rejects_bad_codecs(tmp_path, codecs_arg, error, pattern):
    src = write(str(tmp_path / "src"), camera_schema(), [episode(np.zeros((3, 32, 32, 3), np.uint8))])
    with pytest.raises(error, match=pattern):
        src.copy_to(str(tmp_path / "dst"), codecs=codecs_arg)
    assert not (tmp_path / "dst").exists()


# ---------------------------------------------------------------- every codec, every reader

EVERY_CODEC = [
    ("raw", {}),
    ("zstd", {"compression": "zstd"}),
    ("lz4", {"compression": "blosc-lz4"}),
    ("zstdbit", {"compression": "blosc-zstd-bitshuffle"}),
    ("lz4hcnoshuf", {"compression": "blosc-lz4hc-noshuffle"}),
    ("jpeg", {"codec": "jpeg"}),
    ("webp", {"codec": "webp"}),
    ("avif", {"codec": "avif"}),
    ("h264", {"codec": "video:h264"}),
    ("av1", {"codec": "video:av1"}),
]


@pytest.fixture(scope="module")
def every_codec(tmp_path_factory):
    """One dataset with a camera field per codec, the same frames in each, in three commits."""
    rng = np.random.default_rng(5)
    raw = [smooth_frames(rng, n + 1, 32, 32) for n in (10, 13, 7, 9, 12, 8)]
    fields = [
        el.FieldSpec(name, (32, 32, 3), "uint8", layout="HWC", storage="tensor", chunk_rows=6, **opts)
        for name, opts in EVERY_CODEC
    ]
    schema = el.DatasetSchema(
        [
            *fields,
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    eps = [{**episode(r), "observations": {name: r for name, _ in EVERY_CODEC}} for r in raw]
    return write(str(tmp_path_factory.mktemp("every") / "ds"), schema, eps, commits=3), raw


def multiset(batches):
    out = Counter()
    for batch in batches:
        for b in range(len(batch.episode_id)):
            crc = 0
            for key in sorted(batch.data):
                crc = zlib.crc32(np.ascontiguousarray(batch.data[key][b]).tobytes(), crc)
            out[(int(batch.episode_id[b]), int(batch.start[b]), crc)] += 1
    return out


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.slow
def test_dataloader_workers_read_every_codec(every_codec, context):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    ds, raw = every_codec
    segs = ds.segments(el.Window(5, stride=3))
    want = multiset([segs.__getitems__(list(range(len(segs))))])  # the parent reads (TensorStore) before forking
    loader = DataLoader(segs, batch_size=7, num_workers=2, collate_fn=segs.collate, multiprocessing_context=context)
    batches = list(loader)
    assert multiset(batches) == want
    by_id = dict(zip(ds.episode_ids.tolist(), raw, strict=True))
    for batch in batches:
        for b, (eid, start) in enumerate(zip(batch.episode_id.tolist(), batch.start.tolist(), strict=True)):
            rows = by_id[eid][start : start + 6]
            for name, opts in EVERY_CODEC:
                got = batch.data[f"observation/{name}"][b][: len(rows)]
                if "codec" in opts:
                    assert codecs.psnr(rows, got) >= codecs.psnr_floor(
                        opts["codec"], codecs.DEFAULT_QUALITY[opts["codec"]]
                    )
                else:
                    np.testing.assert_array_equal(got, rows)


def test_zarr_python_reads_every_codec(every_codec):
    zarr = pytest.importorskip("zarr")
    codecs.register_zarr_codecs()
    ds, _raw = every_codec
    index = ds.snapshot().index
    writer = str(index["writer"][0])
    for name, _ in EVERY_CODEC:
        arr = zarr.open_array(os.path.join(ds.location.url, "tensors", writer, "observation", name), mode="r")
        want = np.concatenate(frames_of(ds, f"observation/{name}"))
        np.testing.assert_array_equal(arr[:], want)


@pytest.mark.parametrize(("codec", "quality"), [("webp", 90), ("video:av1", 55)])
def test_lossy_dataset_on_s3(s3_server, s3_url, codec, quality):
    """Images: a second commit array of two 64-frame shards; video: 71 frames in two shards of 16-frame GOPs."""
    raw = [smooth_frames(np.random.default_rng(6), n + 1, 32, 32) for n in (5, 9, 70)]
    ds = el.Dataset.create(camera_schema(codec=codec), s3_url, storage_options=s3_server.storage_options)
    ds.append_episodes([episode(r) for r in raw[:2]])
    ds.flush()
    ds.append_episodes([episode(raw[2])])
    ds.close()
    again = el.Dataset.open(s3_url, storage_options=s3_server.storage_options)
    for r, g in zip(raw, frames_of(again), strict=True):
        assert min(codecs.psnr(a, b) for a, b in zip(r, g, strict=True)) >= codecs.psnr_floor(codec, quality)
    assert again.maintenance.validate().problems == []


# ---------------------------------------------------------------- decoded-chunk cache


def test_decoded_cache_serves_hits_and_never_a_replaced_chunk(tmp_path):
    """Warm reads come from the decoded-chunk cache; a chunk file replaced by a later commit is read afresh."""
    rng = np.random.default_rng(8)
    raw = [smooth_frames(rng, n + 1, 16, 16) for n in (4, 6)]
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(camera_schema((16, 16, 3), compression="zstd", chunk_rows=8), path)
    ds.append_episodes([episode(raw[0])])  # rows 0-4: chunk 0 is partly written
    ds.flush()
    np.testing.assert_array_equal(el.Dataset.open(path).episode(0).read().all_obs, raw[0])  # cached now
    ds.append_episodes([episode(raw[1])])  # rows 5-11: chunk 0 rewritten with rows 5-7
    ds.flush()
    fresh = el.Dataset.open(path)
    np.testing.assert_array_equal(fresh.episode(1).read().all_obs, raw[1])
    # a hit is served without touching the file: same size and time, other bytes, still the right rows
    writer = str(fresh.snapshot().index["writer"][0])
    chunk = tmp_path / "ds" / "tensors" / writer / "observation" / "camera" / "c" / "1" / "0" / "0" / "0"
    st = chunk.stat()
    np.testing.assert_array_equal(el.Dataset.open(path).episode(1).read().all_obs, raw[1])
    chunk.write_bytes(b"\0" * st.st_size)
    os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns))
    np.testing.assert_array_equal(el.Dataset.open(path).episode(1).read().all_obs, raw[1])
    codecs.decoded_cache.clear()
    with pytest.raises(el.CorruptionError, match=r"field 'observation/camera'.*undecodable chunk"):
        el.Dataset.open(path).episode(1).read()


def test_docs_table_lists_the_declared_floors():
    text = (Path(__file__).resolve().parents[1] / "docs" / "camera.md").read_text()
    for codec in codecs.LOSSY:
        row = next(line for line in text.splitlines() if line.startswith(f"| {codec} |"))
        cells = [float(c.split()[0]) for c in row.strip("|").split("|")[1:]]
        assert cells == [codecs.psnr_floor(codec, q) for q in (90, 75, 50, 30, 10, 1)]


def test_vacuum_counts_a_lost_commits_frames_and_never_cuts_the_array(tmp_path):
    """Frames written by a commit that never reached the table are counted, not cut (a live writer may be
    growing the array); the committed frames read the same."""
    from episodelake.storage.location import resolve
    from episodelake.storage.store import Store

    path = str(tmp_path / "ds")
    raw = [smooth_frames(np.random.default_rng(0), n + 1, 32, 32) for n in (5, 9)]
    ds = write(path, camera_schema(codec="jpeg", chunk_rows=4), [episode(r) for r in raw])
    before = frames_of(ds)
    store = Store.open(resolve(path, {}))
    f, writer = store.schema["observation/camera"], str(ds.snapshot().index["writer"][0])
    orphan = store.open_array(writer, f, read_only=False)
    orphan.append_block(smooth_frames(np.random.default_rng(1), 7, 32, 32))[1].result()  # into a partly filled shard
    assert store.open_array(writer, f).rows == 23
    report = el.Dataset.open(path).maintenance.vacuum(retention_hours=1)
    assert report.unreferenced_rows == report.unreclaimed_rows == 7  # counted; vacuum never cuts a writer's array
    assert store.open_array(writer, f).rows == 23  # nothing was cut
    fresh = el.Dataset.open(path)
    for a, b in zip(before, frames_of(fresh), strict=True):
        np.testing.assert_array_equal(a, b)
    assert fresh.maintenance.validate().problems == []


# ---------------------------------------------------------------- real rendered frames


@pytest.fixture(scope="module")
def mujoco_frames(tmp_path_factory):
    """41 frames of HalfCheetah-v5 rendered at 96x96 by MuJoCo (headless EGL), in a subprocess."""
    out = tmp_path_factory.mktemp("render") / "frames.npy"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_camera.py"
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    done = subprocess.run(
        [sys.executable, str(script), "--render", "96", "1", "40", str(out)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"MuJoCo cannot render headless here: {done.stderr.strip().splitlines()[-1:]}")
    return np.load(out)[0]


def test_rendered_mujoco_frames(tmp_path, mujoco_frames):
    """On real rendered frames: lossless copies are exact and >= 3x smaller than raw, lossy ones keep their floor."""
    frames = mujoco_frames
    assert frames.shape == (41, 96, 96, 3) and frames.std() > 10  # a real scene, not a blank image
    raw = write(str(tmp_path / "raw"), camera_schema((96, 96, 3)), [episode(frames)])
    raw_bytes = tensors_size(raw.location)
    for name in ("zstd", "blosc-zstd", "blosc-lz4"):
        ds = write(str(tmp_path / name), camera_schema((96, 96, 3), compression=name), [episode(frames)])
        np.testing.assert_array_equal(frames_of(ds)[0], frames)
        assert tensors_size(ds.location) * 3 <= raw_bytes, name
    for codec in codecs.LOSSY:
        ds = write(str(tmp_path / codec), camera_schema((96, 96, 3), codec=codec), [episode(frames)])
        got = frames_of(ds)[0]
        floor = codecs.psnr_floor(codec, codecs.DEFAULT_QUALITY[codec])
        assert min(codecs.psnr(a, b) for a, b in zip(frames, got, strict=True)) >= floor
        assert tensors_size(ds.location) * 3 <= raw_bytes, codec


def test_chunk_cache_is_bounded_least_recently_used():
    cache = codecs.ChunkCache(limit=3 * 800)
    chunks = {k: np.full(100, i, np.float64) for i, k in enumerate("abcd")}  # 800 bytes each
    for k in "abc":
        cache.put(k, chunks[k])
    assert cache.get("a") is chunks["a"]  # a is now the most recently used
    cache.put("d", chunks["d"])  # evicts b, the least recently used
    assert cache.get("b") is None and cache.get("c") is not None and cache.nbytes == 2400
    assert not chunks["a"].flags.writeable  # cached chunks are shared read-only
    off = codecs.ChunkCache(limit=0)  # EPISODELAKE_DECODED_CACHE_MB=0
    off.put("a", np.zeros(1))
    assert off.get("a") is None and off.nbytes == 0
    env = {**os.environ, "EPISODELAKE_DECODED_CACHE_MB": "0"}
    code = "from episodelake.core import codecs; print(codecs.decoded_cache.limit)"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip() == "0"


@pytest.mark.slow
def test_missing_imagecodecs_names_the_extra(tmp_path):
    """Without imagecodecs a lossy write fails with MissingDependencyError naming the camera extra."""
    code = f"""
import sys
sys.modules["imagecodecs"] = None  # as if not installed
import numpy as np
import episodelake as el
from tests.test_codecs import camera_schema, episode
ds = el.Dataset.create(camera_schema(codec="jpeg"), {str(tmp_path / "ds")!r})
try:
    ds.append_episodes([episode(np.zeros((3, 32, 32, 3), np.uint8))])
    ds.flush()
except el.MissingDependencyError as exc:
    print("missing:", exc)
"""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=root)
    assert "missing: camera codecs need imagecodecs: pip install 'episodelake[camera]'" in done.stdout, done.stderr
