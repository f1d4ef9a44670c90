"""Frame transforms on decode (``transform=``): crop, resize, normalize and layout, checked against torch and
NumPy references, through the stream, the map-style dataset and DataLoader workers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core.transforms import FrameTransform

from .test_codecs import camera_schema, episode, smooth_frames, write

torch = pytest.importorskip("torch")
torch.set_num_threads(1)


def torch_resize(frames_hwc: np.ndarray, h: int, w: int) -> np.ndarray:
    """Independent reference: torch's antialiased bilinear resize, float32 ``[N, h, w, C]``."""
    x = torch.from_numpy(np.ascontiguousarray(frames_hwc)).permute(0, 3, 1, 2).float()
    y = torch.nn.functional.interpolate(x, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
    return y.permute(0, 2, 3, 1).numpy()


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(8, 64),
    w=st.integers(8, 64),
    oh=st.integers(4, 80),
    ow=st.integers(4, 80),
    layout=st.sampled_from(["HWC", "CHW"]),
    seed=st.integers(0, 2**31),
)
def test_resize_matches_torch_antialiased_bilinear(h, w, oh, ow, layout, seed):
    frames = smooth_frames(np.random.default_rng(seed), 2, h, w)
    f = el.FieldSpec("camera", (h, w, 3) if layout == "HWC" else (3, h, w), "uint8", layout=layout)
    stored = frames if layout == "HWC" else frames.transpose(0, 3, 1, 2)
    got = FrameTransform(resize=(oh, ow), layout="HWC")(stored, f)
    assert got.dtype == np.uint8 and got.shape == (2, oh, ow, 3)  # uint8 kept: no normalization asked
    want = torch_resize(frames, oh, ow)
    assert np.abs(got.astype(np.float32) - want).max() <= 0.5 + 1e-3  # rounding only
    normalized = FrameTransform(resize=(oh, ow), mean=0.0, std=1.0, layout="HWC")(stored, f)
    np.testing.assert_allclose(normalized * 255, want, atol=1e-2)  # float path: no rounding at all


def test_crop_normalize_and_layout_match_numpy():
    frames = smooth_frames(np.random.default_rng(1), 3, 40, 50)  # [N, H, W, C]
    f = el.FieldSpec("camera", (40, 50, 3), "uint8", layout="HWC")
    crop = FrameTransform(crop=(5, 7, 20, 30))
    np.testing.assert_array_equal(crop(frames, f), frames[:, 5:25, 7:37])
    chw = FrameTransform(crop=(5, 7, 20, 30), layout="CHW")(frames, f)
    np.testing.assert_array_equal(chw, frames[:, 5:25, 7:37].transpose(0, 3, 1, 2))
    assert chw.flags.c_contiguous
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    norm = FrameTransform(mean=mean, std=std, layout="CHW")(frames, f)
    want = ((frames.astype(np.float64) / 255 - mean) / std).transpose(0, 3, 1, 2)
    assert norm.dtype == np.float32
    np.testing.assert_allclose(norm, want, rtol=1e-5, atol=1e-5)
    # a CHW field keeps CHW unless asked otherwise
    fc = el.FieldSpec("camera", (3, 40, 50), "uint8", layout="CHW")
    np.testing.assert_array_equal(crop(frames.transpose(0, 3, 1, 2), fc), frames[:, 5:25, 7:37].transpose(0, 3, 1, 2))


@pytest.fixture(scope="module")
def camera_lake(tmp_path_factory):
    rng = np.random.default_rng(2)
    raw = [smooth_frames(rng, n + 1, 32, 40) for n in (12, 9, 15)]
    ds = write(
        str(tmp_path_factory.mktemp("tf") / "ds"), camera_schema((32, 40, 3), codec="jpeg"), [episode(r) for r in raw]
    )
    return ds


def test_stream_applies_transforms_to_the_same_frames(camera_lake):
    ds = camera_lake
    t = FrameTransform(crop=(2, 4, 28, 32), resize=(16, 16), mean=0.5, std=0.25, layout="CHW")
    plain = next(iter(ds.segment_stream(4, batch_size=6, seed=11, prefetch=0)))
    shaped = next(iter(ds.segment_stream(4, batch_size=6, seed=11, prefetch=0, transform={"observation/camera": t})))
    np.testing.assert_array_equal(shaped.episode_id, plain.episode_id)
    np.testing.assert_array_equal(shaped.start, plain.start)
    assert shaped.all_obs.shape == (6, 5, 3, 16, 16) and shaped.all_obs.dtype == np.float32
    frames = plain.all_obs.reshape(-1, 32, 40, 3)[:, 2:30, 4:36]
    want = (torch_resize(frames, 16, 16) / 255 - 0.5) / 0.25
    np.testing.assert_allclose(shaped.all_obs, want.reshape(6, 5, 16, 16, 3).transpose(0, 1, 4, 2, 3), atol=1e-4)
    np.testing.assert_array_equal(shaped.action, plain.action)  # other fields untouched


def test_segments_transform_in_dataloader_workers(camera_lake):
    from torch.utils.data import DataLoader

    ds = camera_lake
    t = {"observation/camera": FrameTransform(resize=(8, 10), layout="CHW")}
    segs = ds.segments(el.Window(4, stride=2), transform=t)
    plain = ds.segments(el.Window(4, stride=2))
    loader = DataLoader(segs, batch_size=5, num_workers=2, collate_fn=segs.collate, multiprocessing_context="fork")
    seen = 0
    for batch in loader:
        assert batch.all_obs.shape[2:] == (3, 8, 10) and batch.all_obs.dtype == np.uint8
        for b, (eid, start) in enumerate(zip(batch.episode_id.tolist(), batch.start.tolist(), strict=True)):
            k = next(i for i in range(len(plain)) if (int(plain[i].episode_id), int(plain[i].start)) == (eid, start))
            want = t["observation/camera"](plain[k].all_obs, ds.schema["observation/camera"])
            np.testing.assert_array_equal(batch.all_obs[b], want)
            seen += 1
    assert seen == len(segs)


def test_callable_transform(camera_lake):
    seg = camera_lake.segments(3, transform={"observation/camera": lambda x: x[..., :1]})[0]
    assert seg.all_obs.shape == (4, 32, 40, 1)


@pytest.mark.parametrize(
    ("transform", "pattern"),
    [
        ({"nope": FrameTransform()}, r"transform: 'nope' is not a step field"),
        ({"action": FrameTransform(resize=(2, 2))}, r"transform of field 'action': frames need a 3-D field"),
        (
            {"observation/camera": FrameTransform(crop=(0, 0, 33, 4))},
            r"field 'observation/camera': crop \(0, 0, 33, 4\) does not fit frames of 32x40",
        ),
        (
            {"observation/camera": FrameTransform(resize=(0, 4))},
            r"field 'observation/camera': resize \(0, 4\) must be positive",
        ),
        ({"observation/camera": FrameTransform(mean=0.5)}, r"field 'observation/camera': give both mean and std"),
        ({"observation/camera": FrameTransform(mean=(0.5, 0.5), std=1.0)}, r"mean needs 1 or 3 values, got 2"),
        ({"observation/camera": FrameTransform(mean=0.5, std=0.0)}, r"std must be positive"),
        ({"observation/camera": FrameTransform(layout="WHC")}, r"layout must be one of \('HWC', 'CHW'\)"),
        ({"observation/camera": 3}, r"transform of field 'observation/camera': give a FrameTransform or a callable"),
        ("resize", r"transform must map field keys"),
    ],
)
def test_bad_transforms_are_rejected(camera_lake, transform, pattern):
    with pytest.raises(el.ArgumentError, match=pattern):
        camera_lake.segment_stream(2, transform=transform)
    with pytest.raises(el.ArgumentError, match=pattern):
        camera_lake.segments(2, transform=transform)


def test_sample_transitions_transform(camera_lake):
    t = FrameTransform(resize=(16, 20), layout="CHW")
    plain = camera_lake.sample_transitions(6, seed=4, history=2)
    shaped = camera_lake.sample_transitions(6, seed=4, history=2, transform={"observation/camera": t})
    assert shaped.obs.shape == (6, 2, 3, 16, 20) and shaped.next_obs.shape == (6, 2, 3, 16, 20)
    f = camera_lake.schema["observation/camera"]
    np.testing.assert_array_equal(shaped.obs, t(plain.obs, f))
    np.testing.assert_array_equal(shaped.next_obs, t(plain.next_obs, f))
    with pytest.raises(el.ArgumentError, match=r"transform: 'nope' is not a step field"):
        camera_lake.sample_transitions(2, transform={"nope": t})
