"""Exact image codecs (``codec="webp-lossless"``, ``"jpegxl-lossless"``): bit-exact round trips of noisy,
clean and edge-valued frames of any size, grey and colour, CHW and HWC; exact statistics and checksums;
sampling, copies, forked DataLoader workers, zarr-python and S3 read the written frames; bad options are refused.

References are independent of the code under test: the frames as written, NumPy statistics, zlib CRC-32s.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core import codecs

EXACT = codecs.EXACT_IMAGE


def rendered(rng: np.random.Generator, n: int, h: int, w: int, c: int, sigma: float = 0.0) -> np.ndarray:
    """``n`` rendered-like frames ``[n, h, w, c]``: smooth shading, flat discs that move, saturated corners
    (0 and 255), plus rounded Gaussian sensor noise of ``sigma`` grey levels."""
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    base = np.stack([128 + 90 * np.sin(3 * (a * x + b * y) + p) for a, b, p in rng.uniform(-1, 1, (c, 3))], -1)
    out = np.empty((n, h, w, c), np.float64)
    for t in range(n):
        img = base.copy()
        for cy, cx, r in rng.uniform(0, 1, (3, 3)):
            img[((y - cy - 0.01 * t) ** 2 + (x - cx) ** 2) < (0.3 * r) ** 2] = rng.uniform(0, 255, c)
        img[: h // 4, : w // 4], img[-(h // 4) :, -(w // 4) :] = 0, 255
        out[t] = img + rng.normal(0, sigma, img.shape) if sigma else img
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def schema(shape, layout="HWC", **options) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("camera", shape, "uint8", layout=layout, **options),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def episode(frames: np.ndarray) -> dict:
    T = len(frames) - 1
    return {"observations": frames, "actions": np.zeros((T, 2), np.float32), "rewards": np.ones(T, np.float32)}


def write(path, spec, raw, commits=1):
    ds = el.Dataset.create(spec, path)
    for part in np.array_split(np.arange(len(raw)), commits):
        ds.append_episodes([episode(raw[i]) for i in part])
        ds.flush()
    ds.close()
    return el.Dataset.open(path)


def frames_of(ds):
    return [ds.episode(i).read().data["observation/camera"] for i in range(len(ds))]


def to_layout(frames: np.ndarray, layout: str) -> np.ndarray:
    return np.ascontiguousarray(frames.transpose(0, 3, 1, 2)) if layout == "CHW" else frames


def round_trip(codec: str, layout: str, frame: np.ndarray) -> np.ndarray:
    blob = codecs.encode_frame(codec, None, layout, frame)
    chain = [codecs.lossy_codec(codec, None, layout)]
    return codecs.chunk_decoder(chain, (1, *frame.shape), np.dtype("uint8"))(blob)[0]


# ---------------------------------------------------------------- the codecs alone


@settings(max_examples=50, deadline=None)
@given(
    codec=st.sampled_from(EXACT),
    kind=st.sampled_from(["noisy", "clean", "edges", "random"]),
    h=st.integers(1, 41),
    w=st.integers(1, 41),
    channels=st.sampled_from([1, 3, 4]),
    layout=st.sampled_from(["HWC", "CHW"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_every_frame_round_trips_bit_exactly(codec, kind, h, w, channels, layout, seed):
    rng = np.random.default_rng(seed)
    if kind == "edges":  # only the extreme values
        hwc = rng.choice(np.array([0, 255], np.uint8), (1, h, w, channels))
    elif kind == "random":
        hwc = rng.integers(0, 256, (1, h, w, channels), dtype=np.uint8)
    else:
        hwc = rendered(rng, 1, h, w, channels, sigma=1.0 if kind == "noisy" else 0.0)
    frame = to_layout(hwc, layout)[0]
    got = round_trip(codec, layout, frame)
    assert got.dtype == np.uint8 and got.shape == frame.shape
    np.testing.assert_array_equal(got, frame)


@pytest.mark.parametrize("codec", ["webp", "webp-lossless"])
def test_an_opaque_rgba_frame_keeps_its_alpha_channel(codec):
    """libwebp stores no alpha when every pixel is opaque; the frame still decodes to 4 channels."""
    frame = rendered(np.random.default_rng(8), 1, 16, 12, 4)[0]
    frame[:, :, 3] = 255
    quality = None if codec == "webp-lossless" else 90
    blob = codecs.encode_frame(codec, quality, "HWC", frame)
    chain = [codecs.lossy_codec(codec, quality, "HWC")]
    got = codecs.chunk_decoder(chain, (1, *frame.shape), np.dtype("uint8"))(blob)[0]
    assert got.shape == frame.shape
    np.testing.assert_array_equal(got[:, :, 3], frame[:, :, 3])
    if quality is None:
        np.testing.assert_array_equal(got, frame)


def exact_over(codec: str, n: int, size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for sigma in (0.0, 0.7, 1.0):  # clean, then σ=0.7 and σ=1 sensor noise
        for c in (1, 3):
            for i, frame in enumerate(rendered(rng, n, size, size, c, sigma)):
                got = round_trip(codec, "HWC", frame)
                assert np.array_equal(got, frame), f"{codec}: frame {i} (sigma {sigma}, {c} channels) differs"


@pytest.mark.parametrize("codec", EXACT)
def test_exact_over_many_frames(codec):
    exact_over(codec, 40, 48, seed=11)


@pytest.mark.slow
@pytest.mark.parametrize("codec", EXACT)
def test_exact_over_thousands_of_rendered_frames(codec):
    exact_over(codec, 400, 96, seed=12)


# ---------------------------------------------------------------- datasets


@pytest.mark.parametrize("codec", EXACT)
@pytest.mark.parametrize(("shape", "layout"), [((31, 45, 3), "HWC"), ((1, 27, 20), "CHW"), ((4, 16, 9), "CHW")])
def test_dataset_reads_stats_and_checksums_are_of_the_written_frames(tmp_path, codec, shape, layout):
    rng = np.random.default_rng(3)
    c = shape[layout.index("C")]
    hw = [s for s, a in zip(shape, layout, strict=True) if a != "C"]
    raw = [to_layout(rendered(rng, n + 1, *hw, c, sigma=1.0), layout) for n in (9, 14, 6, 11)]
    # 4 frames per shard: later commits append into a partly filled shard of the single local array
    ds = write(str(tmp_path / "ds"), schema(shape, layout, codec=codec, chunk_rows=4), raw, commits=4)
    f = ds.schema["observation/camera"]
    assert (f.codec, f.quality, f.lossy, f.in_tensor) == (codec, None, False, True)
    for r, g in zip(raw, frames_of(ds), strict=True):
        np.testing.assert_array_equal(g, r)
    everything = np.moveaxis(np.concatenate(raw), 1 + layout.index("C"), -1).reshape(-1, c).astype(np.float64)
    stats = ds.stats(["observation/camera"])["observation/camera"]
    np.testing.assert_array_equal(stats["min"], everything.min(axis=0))
    np.testing.assert_array_equal(stats["max"], everything.max(axis=0))
    np.testing.assert_allclose(stats["mean"], everything.mean(axis=0), rtol=1e-12)
    crcs = ds.snapshot().index["crc/observation/camera"]
    assert [zlib.crc32(r.data) for r in raw] == [int(x) for x in crcs]
    assert ds.maintenance.validate().problems == []
    batch = next(iter(ds.segment_stream(4, batch_size=8, seed=3)))
    by_id = dict(zip(ds.episode_ids.tolist(), raw, strict=True))
    for b, (eid, start) in enumerate(zip(batch.episode_id.tolist(), batch.start.tolist(), strict=True)):
        np.testing.assert_array_equal(batch.all_obs[b], by_id[eid][start : start + 5])
    writer = str(ds.snapshot().index["writer"][0])
    with open(tmp_path / "ds" / "tensors" / writer / "observation" / "camera" / "zarr.json") as fh:
        shard = json.load(fh)["codecs"][0]
    assert shard["name"] == "sharding_indexed" and shard["configuration"]["chunk_shape"] == [1, *shape]
    assert shard["configuration"]["codecs"][0]["name"] == "imagecodecs_" + codec.replace("-", "_")


@pytest.mark.parametrize("codec", EXACT)
def test_partly_decoded_and_rewritten_shards_read_the_right_frames(tmp_path, codec):
    """The decoded-chunk cache keeps a shard's frames as they are decoded: reads mixing decoded and missing
    frames, and reads after the next commit rewrote the last shard, return the written frames."""
    rng = np.random.default_rng(9)
    raw = [rendered(rng, n + 1, 12, 10, 3, sigma=1.0) for n in (4, 6, 9)]
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema((12, 10, 3), codec=codec, chunk_rows=8), path)  # 8 frames per shard
    ds.append_episodes([episode(raw[0])])  # frames 0-4: shard 0 partly written
    ds.flush()
    codecs.decoded_cache.clear()
    np.testing.assert_array_equal(el.Dataset.open(path).episode(0).read().all_obs, raw[0])  # frames 0-4 decoded
    ds.append_episodes([episode(raw[1]), episode(raw[2])])  # shard 0 rewritten with frames 5-7 added
    ds.flush()
    ds.close()
    fresh = el.Dataset.open(path)
    np.testing.assert_array_equal(fresh.episode(1).read().all_obs, raw[1])  # part of shards 0 and 1 decoded
    by_id = dict(zip(fresh.episode_ids.tolist(), raw, strict=True))
    stream = fresh.segment_stream(3, batch_size=16, seed=1)
    for batch in (stream.sample() for _ in range(4)):
        for b, (eid, start) in enumerate(zip(batch.episode_id.tolist(), batch.start.tolist(), strict=True)):
            np.testing.assert_array_equal(batch.all_obs[b], by_id[eid][start : start + 4])


@pytest.mark.parametrize("codec", EXACT)
def test_noisy_frames_take_fewer_bytes_than_zstd(tmp_path, codec):
    """σ=1 noise on rendered-like frames: the image codec stores less than the field's zstd chunks."""
    raw = [rendered(np.random.default_rng(4), 33, 48, 48, 3, sigma=1.0)]
    sizes = {}
    for name, options in (("image", {"codec": codec}), ("zstd", {"compression": "zstd", "storage": "tensor"})):
        ds = write(str(tmp_path / name), schema((48, 48, 3), **options), raw)
        np.testing.assert_array_equal(frames_of(ds)[0], raw[0])
        root = tmp_path / name / "tensors"
        sizes[name] = sum(os.path.getsize(os.path.join(d, x)) for d, _, files in os.walk(root) for x in files)
    assert sizes["image"] < sizes["zstd"]


def test_copy_to_an_exact_codec_and_back_keeps_every_byte(tmp_path):
    raw = [rendered(np.random.default_rng(5), n + 1, 24, 24, 3, sigma=1.0) for n in (7, 12)]
    src = write(str(tmp_path / "src"), schema((24, 24, 3), storage="tensor"), raw)
    webp = src.copy_to(str(tmp_path / "webp"), codecs={"observation/camera": "webp-lossless"})
    jxl = webp.copy_to(str(tmp_path / "jxl"), codecs={"observation/camera": "jpegxl-lossless"})
    back = jxl.copy_to(str(tmp_path / "back"), codecs={"observation/camera": None})
    for ds, codec in ((webp, "webp-lossless"), (jxl, "jpegxl-lossless"), (back, None)):
        assert ds.schema["observation/camera"].codec == codec
        for r, g in zip(raw, frames_of(ds), strict=True):
            np.testing.assert_array_equal(g, r)
        assert ds.maintenance.validate().problems == []
    crcs = [int(x) for x in src.snapshot().index["crc/observation/camera"]]
    assert [int(x) for x in jxl.snapshot().index["crc/observation/camera"]] == crcs


def test_copy_to_a_lossy_codec_at_a_quality_given_as_a_pair(tmp_path):
    """``codecs={key: (codec, quality)}``: each copy's field carries both, and the higher quality's frames are
    nearer the written ones (measured against the raw frames the test wrote)."""
    raw = [rendered(np.random.default_rng(6), 5, 24, 24, 3, sigma=1.0)]
    src = write(str(tmp_path / "src"), schema((24, 24, 3), storage="tensor"), raw)
    error = {}
    for quality in (30, 95):
        jpeg = src.copy_to(str(tmp_path / f"jpeg{quality}"), codecs={"observation/camera": ("jpeg", quality)})
        spec = jpeg.schema["observation/camera"]
        assert (spec.codec, spec.quality) == ("jpeg", quality)
        error[quality] = float(np.abs(frames_of(jpeg)[0].astype(np.float64) - raw[0]).mean())
    assert 0 < error[95] < error[30] / 2


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"codec": "webp-lossless", "quality": 90}, r"field 'camera': codec 'webp-lossless' is lossless and takes no"),
        ({"codec": "jpegxl-lossless", "quality": 1}, r"field 'camera': codec 'jpegxl-lossless' is lossless"),
        ({"codec": "png"}, r"field 'camera': codec must be one of .*'webp-lossless', 'jpegxl-lossless'\)"),
        ({"codec": "webp-lossless", "compression": "zstd"}, r"codec 'webp-lossless' and compression cannot both"),
    ],
)
def test_bad_options_are_refused_naming_the_field(tmp_path, options, pattern):
    with pytest.raises(el.SchemaError, match=pattern):
        schema((16, 16, 3), **options)


@pytest.mark.parametrize(
    ("shape", "layout", "dtype", "pattern"),
    [
        ((16, 16, 2), "HWC", "uint8", r"field 'camera': codec 'webp-lossless' stores \(1, 3, 4\) channels, .* 2"),
        ((16, 16, 3), "HWC", "uint16", r"field 'camera': codec 'webp-lossless' stores uint8 images"),
        ((16, 16), None, "uint8", r"field 'camera': codec 'webp-lossless' needs a 3-D image field"),
    ],
)
def test_fields_that_are_not_8_bit_images_are_refused(shape, layout, dtype, pattern):
    with pytest.raises(el.SchemaError, match=pattern):
        el.FieldSpec("camera", shape, dtype, layout=layout, codec="webp-lossless")


# ---------------------------------------------------------------- other readers and places


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """One dataset with a field per exact codec, the same noisy frames in each, in three commits."""
    rng = np.random.default_rng(6)
    raw = [rendered(rng, n + 1, 20, 28, 3, sigma=1.0) for n in (10, 13, 7, 9, 12, 8)]
    spec = el.DatasetSchema(
        [
            *(el.FieldSpec(c, (20, 28, 3), "uint8", layout="HWC", codec=c, chunk_rows=6) for c in EXACT),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    path = str(tmp_path_factory.mktemp("both") / "ds")
    ds = el.Dataset.create(spec, path)
    for part in np.array_split(np.arange(len(raw)), 3):
        ds.append_episodes([{**episode(raw[i]), "observations": {c: raw[i] for c in EXACT}} for i in part])
        ds.flush()
    ds.close()
    return el.Dataset.open(path), raw


def test_forked_dataloader_workers_read_the_written_frames(both):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    ds, raw = both
    segs = ds.segments(el.Window(5, stride=3))
    segs.__getitems__([0])  # the parent reads first, so the workers inherit its state by fork
    loader = DataLoader(segs, batch_size=7, num_workers=2, collate_fn=segs.collate, multiprocessing_context="fork")
    by_id = dict(zip(ds.episode_ids.tolist(), raw, strict=True))
    seen = 0
    for batch in loader:
        for b, (eid, start) in enumerate(zip(batch.episode_id.tolist(), batch.start.tolist(), strict=True)):
            rows = by_id[eid][start : start + 6]
            for c in EXACT:
                np.testing.assert_array_equal(batch.data[f"observation/{c}"][b][: len(rows)], rows)
            seen += 1
    assert seen == len(segs)


def test_zarr_python_reads_them_through_the_registered_codecs(both):
    zarr = pytest.importorskip("zarr")
    codecs.register_zarr_codecs()
    ds, raw = both
    writer = str(ds.snapshot().index["writer"][0])
    for c in EXACT:
        arr = zarr.open_array(os.path.join(ds.location.url, "tensors", writer, "observation", c), mode="r")
        np.testing.assert_array_equal(arr[:], np.concatenate(raw))


@pytest.mark.parametrize("codec", EXACT)
def test_exact_frames_on_s3(s3_server, s3_url, codec):
    """A second commit array of two 64-frame shards; reopened, every frame reads back exactly."""
    raw = [rendered(np.random.default_rng(7), n + 1, 24, 24, 3, sigma=1.0) for n in (5, 9, 70)]
    ds = el.Dataset.create(schema((24, 24, 3), codec=codec), s3_url, storage_options=s3_server.storage_options)
    ds.append_episodes([episode(r) for r in raw[:2]])
    ds.flush()
    ds.append_episodes([episode(raw[2])])
    ds.close()
    again = el.Dataset.open(s3_url, storage_options=s3_server.storage_options)
    for r, g in zip(raw, frames_of(again), strict=True):
        np.testing.assert_array_equal(g, r)
    assert again.maintenance.validate().problems == []
