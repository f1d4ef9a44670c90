"""``to_lerobot`` then ``import_dataset("lerobot", ...)`` gives back the dataset it started from.

The reference is the source dataset itself, read back through episodelake (its jpeg frames as they
decode), compared field by field with the re-imported one: the schema (shapes, dtypes, codecs), every
value, every meta value, and nothing added. No ``lerobot`` package is needed: our reader reads our writer;
tests/test_lerobot.py checks both against the real package.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

import episodelake as el
from episodelake.core.errors import ValidationError
from episodelake.exporters.lerobot import to_lerobot
from episodelake.importers import import_dataset
from episodelake.storage.arrays import tensors_size

pytest.importorskip("av")

CLI = [sys.executable, "-m", "episodelake.cli"]
FLAGS = ("truncated", "terminated", "truncated")  # a flag LeRobot's next.done can say back


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def frames(t: int, shift: int) -> np.ndarray:
    """Smooth moving gradients, HWC uint8: what a camera sees, and what both lossy codecs keep well."""
    yy, xx = np.mgrid[:48, :48]
    return np.stack(
        [np.stack([(xx * 4 + 3 * k + shift) % 256, yy * 5, np.full_like(xx, 60 + shift)], -1) for k in range(t)]
    ).astype(np.uint8)


def source(path: str, seeds=(0, 1, 2)) -> tuple[el.Dataset, list[dict]]:
    schema = el.DatasetSchema(
        [
            el.FieldSpec("camera", (48, 48, 3), "uint8", layout="HWC", codec="jpeg", quality=85),
            el.FieldSpec("state", (4,), "float32"),
            el.FieldSpec("action", (1,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("success", (), "bool", role="meta"),
            el.FieldSpec("seed", (), "int64", role="meta"),
            el.FieldSpec("env_id", (), "str", role="meta"),
        ]
    )
    rng = np.random.default_rng(7)
    episodes = []
    for i, (flag, seed) in enumerate(zip(FLAGS, seeds, strict=True)):
        t = 12 + 3 * i
        episodes.append(
            {
                "observations": {
                    "camera": frames(t + 1, 20 * i),
                    "state": rng.standard_normal((t + 1, 4)).astype(np.float32),
                },
                "actions": rng.standard_normal((t, 1)).astype(np.float32),
                "rewards": rng.standard_normal(t).astype(np.float32),
                "terminated": flag == "terminated",
                "truncated": flag == "truncated",
                "meta": {"success": i == 1, "seed": seed, "env_id": f"Reach-v{i}"},
            }
        )
    return el.Dataset.from_episodes(episodes, path, schema=schema), episodes


def assert_same_dataset(back: el.Dataset, ds: el.Dataset) -> None:
    """Schema, flags, meta and values of ``back`` equal ``ds``'s (jpeg frames within PSNR of their decode).

    The observation after a terminal step is not in LeRobot's frames (to_lerobot's documented rule), so a
    terminated episode's last observation row is not compared.
    """
    assert back.schema.to_json() == ds.schema.to_json()  # shapes, dtypes, codec and quality; nothing added
    assert len(back) == len(ds)
    for mine, theirs in zip(back.episodes(), ds.episodes(), strict=True):
        assert (mine.length, mine.terminated, mine.truncated) == (theirs.length, theirs.terminated, theirs.truncated)
        assert mine.meta == theirs.meta
        assert {k: type(v) for k, v in mine.meta.items()} == {k: type(v) for k, v in theirs.meta.items()}
        got, want = mine.read(), theirs.read()
        rows = theirs.length if theirs.terminated else theirs.length + 1
        for f in ds.schema.step_fields:
            a, b = np.asarray(got.data[f.key]), np.asarray(want.data[f.key])
            assert (a.shape, a.dtype) == (b.shape, b.dtype), f.key
            if f.role == "observation":
                a, b = a[:rows], b[:rows]
            if f.lossy:
                assert psnr(a, b) > 30, f.key  # video, then jpeg again: two lossy passes over smooth frames
            else:
                np.testing.assert_array_equal(a, b, err_msg=f.key)


@pytest.mark.parametrize("vcodec", ["h264", "libsvtav1"])
def test_round_trip_keeps_shapes_codecs_and_meta(tmp_path, vcodec):
    ds, episodes = source(str(tmp_path / "src"))
    out = to_lerobot(ds, tmp_path / "lr", fps=10, vcodec=vcodec)
    info = json.loads((out / "meta/info.json").read_text())
    # LeRobot's view: (1,) is its scalar (a plain column), the camera a video
    assert info["features"]["action"]["shape"] == [1] and info["features"]["observation.camera"]["dtype"] == "video"
    assert info["episodelake"]["fields"]["observation.camera"]["codec"] == "jpeg"
    rows = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [r["episodelake/seed"] for r in rows] == [e["meta"]["seed"] for e in episodes]

    back = import_dataset("lerobot", out, str(tmp_path / "back"))
    assert_same_dataset(back, ds)
    assert "observation/timestamp" not in [f.key for f in back.schema]  # the export's bookkeeping stays LeRobot's
    np.testing.assert_array_equal(back.episode(0).read().action, episodes[0]["actions"])  # (T, 1), not (T,)
    # stored as jpeg again: comparable to the source's bytes, not ~14x (raw frames)
    raw = sum(e["observations"]["camera"].nbytes for e in episodes)
    src_bytes, back_bytes = tensors_size(ds.location), tensors_size(back.location)
    assert back_bytes < 2 * src_bytes and back_bytes < raw / 4, (src_bytes, back_bytes, raw)


def test_camera_options_replace_the_recorded_codec(tmp_path):
    ds, _ = source(None)
    out = to_lerobot(ds, tmp_path / "lr", fps=10, vcodec="h264")
    lossless = import_dataset("lerobot", out, None, camera_options={"compression": "zstd"})
    cam = lossless.schema["observation/camera"]
    assert (cam.codec, cam.quality, cam.compression) == (None, None, "zstd")
    assert lossless.schema["action"].shape == (1,)
    finer = import_dataset("lerobot", out, None, camera_options={"quality": 95})
    assert (finer.schema["observation/camera"].codec, finer.schema["observation/camera"].quality) == ("jpeg", 95)
    for a, b in zip(lossless.episodes(), ds.episodes(), strict=True):
        rows = b.length + (0 if b.terminated else 1)
        assert psnr(a.read().all_obs["camera"][:rows], b.read().all_obs["camera"][:rows]) > 30


def test_missing_meta_values_and_no_meta(tmp_path):
    ds, _ = source(None, seeds=(None, 5, None))
    back = import_dataset("lerobot", to_lerobot(ds, tmp_path / "lr", fps=10, vcodec="h264"), None)
    assert [e.meta["seed"] for e in back.episodes()] == [None, 5, None]
    assert_same_dataset(back, ds)

    plain = el.DatasetSchema(
        [
            el.FieldSpec("observation", (2,), "float64"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    bare = el.Dataset.from_episodes(
        [
            {
                "observations": np.ones((4, 2)),
                "actions": np.arange(3),
                "rewards": np.ones(3, np.float32),
                "truncated": True,
            }
        ],
        None,
        schema=plain,
    )
    again = import_dataset("lerobot", to_lerobot(bare, tmp_path / "bare", fps=5, task="t"), None)
    assert again.schema.to_json() == plain.to_json()  # no task, source_episode or timestamp appear
    np.testing.assert_array_equal(again.episode(0).read().action, np.arange(3))


@pytest.mark.slow
def test_cli_round_trip(tmp_path):
    """The user's path: ``episodelake export lerobot`` then ``episodelake import lerobot``, in processes."""
    ds, _ = source(str(tmp_path / "src"))
    for argv in (
        ["export", "lerobot", str(tmp_path / "src"), str(tmp_path / "lr"), "--fps", "10", "--vcodec", "h264"],
        ["import", "lerobot", str(tmp_path / "lr"), str(tmp_path / "back")],
    ):
        proc = subprocess.run([*CLI, *argv, "--quiet"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert_same_dataset(el.Dataset.open(str(tmp_path / "back")), ds)


def test_a_damaged_record_is_named(tmp_path):
    ds, _ = source(None)
    out = to_lerobot(ds, tmp_path / "lr", fps=10, vcodec="h264")
    info_path = out / "meta/info.json"
    good = info_path.read_text()
    info = json.loads(good)
    info["episodelake"]["fields"]["action"]["shape"] = [0]
    info_path.write_text(json.dumps(info))
    with pytest.raises(ValidationError, match=r"meta/info.json: 'episodelake' entry is not a valid field record"):
        import_dataset("lerobot", out, None)
    info_path.write_text(good)
    episodes = out / "meta/episodes/chunk-000/file-000.parquet"
    pq.write_table(pq.read_table(episodes).drop_columns(["episodelake/seed"]), episodes)
    with pytest.raises(ValidationError, match=r"no column for the recorded meta field\(s\) \['seed'\]"):
        import_dataset("lerobot", out, None)
