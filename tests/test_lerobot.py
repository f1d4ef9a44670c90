"""LeRobot v3 in and out: ``import_dataset("lerobot", ...)`` and ``to_lerobot``.

Fast tests check both directions against an independent reference: a v3
dataset written here by :func:`write_v3` (following lerobot 0.4.4's
``lerobot_dataset.py``/``utils.py``: pandas ``tasks.parquet``, episodes
concatenated in one mp4 per camera and file) and read back with pyarrow and
PyAV. Slow tests run the real ``lerobot`` package in its own virtualenv
(tests/lerobot_env.py): LeRobot writes a dataset from rendered MuJoCo frames
that we import, and LeRobot's ``LeRobotDataset`` loads what we export; every
value is compared with what LeRobot's own reader returns (exact for data,
PSNR-bounded for video frames).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; set before MuJoCo loads

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core.errors import ArgumentError, DatasetExistsError, SchemaError, ValidationError
from episodelake.exporters.lerobot import to_lerobot
from episodelake.importers import import_dataset

av = pytest.importorskip("av")

SCRIPTS = Path(__file__).parent / "scripts"
CLI = [sys.executable, "-m", "episodelake.cli"]


# ---------------------------------------------------------------- reference data


def rendered_episodes(lengths: list[int], size: int = 64, seed: int = 0) -> list[dict]:
    """Episodes of a real MuJoCo env (Reacher): rendered frames (frame counter bar on top), state, actions, rewards."""
    import gymnasium as gym

    env = gym.make("Reacher-v5", render_mode="rgb_array", width=size, height=size)
    out = []
    for e, n in enumerate(lengths):
        env.reset(seed=seed + e)
        env.action_space.seed(seed + e)
        frames, states, actions, rewards = [env.render()], [env.unwrapped.data.qpos.astype(np.float32)], [], []
        for _ in range(n):
            a = env.action_space.sample().astype(np.float32)
            _, r, _, _, _ = env.step(a)
            actions.append(a)
            rewards.append(np.float32(r))
            frames.append(env.render())
            states.append(env.unwrapped.data.qpos.astype(np.float32))
        out.append(
            {
                "frames": np.stack(frames),
                "state": np.stack(states),
                "action": np.array(actions, np.float32).reshape(n, *env.action_space.shape),
                "reward": np.array(rewards, np.float32),
            }
        )
    env.close()
    for ep in out:  # a white bar whose length counts frames: a frame shifted in time cannot pass a PSNR bound
        for t, frame in enumerate(ep["frames"]):
            frame[: size // 8, : (t % 8 + 1) * size // 8] = 255
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def encode_mp4(path: Path, frames: np.ndarray, fps: int, codec: str = "h264") -> None:
    """Frames (HWC uint8) as one mp4 at ``pts = k``, as LeRobot's encoder plus its concatenation leave them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=fps, options={"g": "2", "crf": "20"})
        stream.pix_fmt = "yuv420p"
        stream.height, stream.width = frames.shape[1:3]
        for k, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = k, Fraction(1, fps)
            out.mux(stream.encode(frame))
        out.mux(stream.encode())


def decode_mp4(path: Path) -> np.ndarray:
    """Every frame of an mp4, in order (the naive reference decode)."""
    with av.open(str(path)) as f:
        return np.stack([fr.to_ndarray(format="rgb24") for fr in f.decode(video=0)])


def write_v3(
    root: Path, frames: list[dict], fps: int, tasks: list[list[str]], files: list[int], without: tuple[str, ...] = ()
) -> None:
    """A LeRobot v3 dataset by hand: ``frames[e]`` holds episode ``e``'s per-frame arrays (``camera`` HWC,
    ``state``, ``action``, ``reward``, ``done``); ``tasks[e]`` a task per frame; ``files[e]`` which data and
    video file (``file-00k``) the episode goes to (episodes of a file follow each other); ``without``: features
    left out."""
    import pandas as pd

    task_names = list(dict.fromkeys(t for ep in tasks for t in ep))
    pd.DataFrame({"task_index": range(len(task_names))}, index=task_names).to_parquet(root / "meta_tasks.parquet")
    (root / "meta").mkdir(parents=True)
    os.rename(root / "meta_tasks.parquet", root / "meta" / "tasks.parquet")
    h, w = frames[0]["camera"].shape[1:3]
    features = {
        "observation.images.top": {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": [frames[0]["state"].shape[1]], "names": None},
        "action": {"dtype": "float32", "shape": [frames[0]["action"].shape[1]], "names": None},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "language": {"dtype": "string", "shape": [1], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    rows, index = [], 0
    for f in sorted(set(files)):
        members = [e for e in range(len(frames)) if files[e] == f]
        encode_mp4(
            root / f"videos/observation.images.top/chunk-000/file-{f:03d}.mp4",
            np.concatenate([frames[e]["camera"] for e in members]),
            fps,
        )
        tables, offset = [], 0
        for e in members:
            ep = frames[e]
            n = len(ep["state"])
            tables.append(
                pa.table(
                    {
                        "observation.state": pa.FixedSizeListArray.from_arrays(
                            pa.array(ep["state"].reshape(-1)), ep["state"].shape[1]
                        ),
                        "action": pa.FixedSizeListArray.from_arrays(
                            pa.array(ep["action"].reshape(-1)), ep["action"].shape[1]
                        ),
                        "next.reward": pa.array(ep["reward"]),
                        "next.done": pa.array(ep["done"]),
                        "language": pa.array(["say"] * n),
                        "timestamp": pa.array((np.arange(n) / fps).astype(np.float32)),
                        "frame_index": pa.array(np.arange(n)),
                        "episode_index": pa.array(np.full(n, e)),
                        "index": pa.array(np.arange(index, index + n)),
                        "task_index": pa.array([task_names.index(t) for t in tasks[e]], pa.int64()),
                    }
                )
            )
            rows.append(
                {
                    "episode_index": e,
                    "tasks": list(dict.fromkeys(tasks[e])),
                    "length": n,
                    "data/chunk_index": 0,
                    "data/file_index": f,
                    "dataset_from_index": index,
                    "dataset_to_index": index + n,
                    "videos/observation.images.top/chunk_index": 0,
                    "videos/observation.images.top/file_index": f,
                    "videos/observation.images.top/from_timestamp": offset / fps,
                    "videos/observation.images.top/to_timestamp": (offset + n) / fps,
                    "stats/action/mean": ep["action"].mean(axis=0).tolist(),
                    "meta/episodes/chunk_index": 0,
                    "meta/episodes/file_index": 0,
                }
            )
            offset += n
            index += n
        path = root / f"data/chunk-000/file-{f:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(tables).drop_columns(list(without)), path)
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), root / "meta/episodes/chunk-000/file-000.parquet")
    info = {
        "codebase_version": "v3.0",
        "robot_type": "reacher",
        "total_episodes": len(frames),
        "total_frames": index,
        "total_tasks": len(task_names),
        "chunks_size": 1000,
        "fps": fps,
        "splits": {"train": f"0:{len(frames)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": {k: v for k, v in features.items() if k not in without},
    }
    (root / "meta/info.json").write_text(json.dumps(info))


def v3_source(
    tmp_path: Path, lengths=(6, 4, 7), done=(False, True, False), files=(0, 0, 1), without=()
) -> tuple[Path, list[dict]]:
    """A hand-written v3 dataset of rendered frames; episode 2 switches task halfway."""
    episodes = rendered_episodes([n - 1 for n in lengths])
    frames = []
    for ep, n, d in zip(episodes, lengths, done, strict=True):
        doneflags = np.zeros(n, bool)
        doneflags[-1] = d
        action = np.concatenate(
            [ep["action"], np.full((1, ep["action"].shape[1]), 0.5, np.float32)]
        )  # n frames, n actions
        reward = np.concatenate([ep["reward"], [np.float32(0.25)]])
        frames.append(
            {"camera": ep["frames"], "state": ep["state"], "action": action, "reward": reward, "done": doneflags}
        )
    tasks = [["reach"] * n if e != 1 else ["push"] * n for e, n in enumerate(lengths)]
    if len(lengths) > 2:
        tasks[2] = ["reach"] * 3 + ["push"] * (lengths[2] - 3)
    root = tmp_path / "v3"
    root.mkdir()
    write_v3(root, frames, 10, tasks, list(files), without)
    return root, frames


# ---------------------------------------------------------------- import


@pytest.mark.slow
def test_import_v3_layout_every_value(tmp_path):
    root, frames = v3_source(tmp_path)
    ds = import_dataset("lerobot", root, str(tmp_path / "el"))
    reference = [decode_mp4(root / "videos/observation.images.top/chunk-000/file-000.mp4")]
    reference.append(decode_mp4(root / "videos/observation.images.top/chunk-000/file-001.mp4"))
    video_rows = [reference[0][:6], reference[0][6:10], reference[1]]
    assert len(ds) == 3
    src = ds.info["source"]
    assert src["fps"] == 10 and src["tasks"] == ["reach", "push"] and src["skipped_features"] == ["language"]
    assert src["features"]["observation/images/top"] == "observation.images.top"
    for e, (ep, ref, video) in enumerate(zip(ds.episodes(), frames, video_rows, strict=True)):
        seg = ep.read()
        n = len(ref["state"])
        done = bool(ref["done"][-1])
        assert (ep.length, ep.terminated, ep.truncated) == ((n, True, False) if done else (n - 1, False, True))
        kept = n if done else n - 1
        assert ep.meta["source_episode"] == e and ep.meta["task"] == ("push" if e == 1 else "reach")
        np.testing.assert_array_equal(seg.action, ref["action"][:kept])
        np.testing.assert_array_equal(seg.reward, ref["reward"][:kept])
        obs = seg.all_obs
        np.testing.assert_array_equal(obs["state"][:n], ref["state"])
        np.testing.assert_array_equal(obs["timestamp"][:n], (np.arange(n) / 10).astype(np.float32))
        np.testing.assert_array_equal(obs["images/top"][:n], video)  # the same frames PyAV decodes in order
        assert psnr(obs["images/top"][:n], ref["camera"]) > 30
        task_names = np.array(["reach", "push"])[obs["task_index"][:n]]
        expected = ["push"] * n if e == 1 else (["reach"] * 3 + ["push"] * 4 if e == 2 else ["reach"] * n)
        assert task_names.tolist() == expected
        if done:  # the final observation row of a terminal step repeats the last frame
            np.testing.assert_array_equal(obs["state"][n], ref["state"][-1])


def test_import_rejects_and_leaves_nothing(tmp_path):
    root, _ = v3_source(tmp_path, lengths=(4, 5), done=(False, False), files=(0, 0))
    dst = tmp_path / "el"
    info = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.1"}))
    with pytest.raises(ValidationError, match=r"codebase_version 'v2\.1'"):
        import_dataset("lerobot", root, str(dst))
    (root / "meta/info.json").write_text(json.dumps(info))
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    done = np.zeros(table.num_rows, bool)
    done[5] = True  # episode 1, frame 1: before its last frame
    pq.write_table(table.set_column(table.column_names.index("next.done"), "next.done", pa.array(done)), path)
    with pytest.raises(ValidationError, match=r"episode 1, frame 1: 'next.done' is set before"):
        import_dataset("lerobot", root, str(dst))
    assert not dst.exists()
    pq.write_table(table, path)
    episodes = root / "meta/episodes/chunk-000/file-000.parquet"
    meta = pq.read_table(episodes)
    shifted = pa.array(np.array(meta.column("videos/observation.images.top/from_timestamp").to_pylist()) + 0.05)
    pq.write_table(
        meta.set_column(
            meta.column_names.index("videos/observation.images.top/from_timestamp"),
            "videos/observation.images.top/from_timestamp",
            shifted,
        ),
        episodes,
    )
    with pytest.raises(ValidationError, match=r"episode 0, camera 'observation.images.top', frame 0: no video frame"):
        import_dataset("lerobot", root, str(dst))
    assert not dst.exists()
    with pytest.raises(ValidationError, match="not a LeRobot dataset"):
        import_dataset("lerobot", tmp_path, str(dst))
    with pytest.raises(ArgumentError, match="tolerance_s"):
        import_dataset("lerobot", root, str(dst), tolerance_s=0)


def test_import_without_reward_and_done(tmp_path):
    root, frames = v3_source(
        tmp_path, lengths=(5, 1, 3), done=(False,) * 3, files=(0,) * 3, without=("next.reward", "next.done")
    )
    ds = import_dataset("lerobot", root, None)
    assert ds.info["source"]["reward"] is False and ds.info["source"]["skipped_episodes"] == [1]
    assert [e.meta["source_episode"] for e in ds.episodes()] == [0, 2]
    for ep, ref in zip(ds.episodes(), [frames[0], frames[2]], strict=True):
        seg = ep.read()
        assert (ep.length, ep.terminated, ep.truncated) == (len(ref["state"]) - 1, False, False)
        np.testing.assert_array_equal(seg.reward, np.zeros(ep.length, np.float32))
        np.testing.assert_array_equal(seg.action, ref["action"][:-1])
        np.testing.assert_array_equal(seg.all_obs["state"], ref["state"])


def test_import_image_features(tmp_path):
    """``image`` features: PNG bytes embedded in the data files (LeRobot's ``use_videos=False``)."""
    import io

    from PIL import Image

    root, frames = v3_source(tmp_path, lengths=(4, 3), done=(False, True), files=(0, 0))
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    images = []
    for ep in frames:
        for image in ep["camera"][:, ::-1]:
            buffer = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG")
            images.append({"bytes": buffer.getvalue(), "path": None})
    pq.write_table(table.append_column("observation.images.side", pa.array(images)), path)
    info = json.loads((root / "meta/info.json").read_text())
    shape = list(frames[0]["camera"].shape[1:])
    info["features"]["observation.images.side"] = {"dtype": "image", "shape": shape, "names": None}
    (root / "meta/info.json").write_text(json.dumps(info))
    ds = import_dataset("lerobot", root, None)
    for ep, ref in zip(ds.episodes(), frames, strict=True):
        n = len(ref["state"])
        np.testing.assert_array_equal(ep.read().all_obs["images/side"][:n], ref["camera"][:, ::-1])  # lossless


def test_import_camera_options(tmp_path):
    root, frames = v3_source(tmp_path, lengths=(5, 3), done=(True, False), files=(0, 0))
    ds = import_dataset("lerobot", root, str(tmp_path / "el"), camera_options={"compression": "zstd"})
    spec = next(f for f in ds.schema.fields if f.key == "observation/images/top")
    assert spec.compression == "zstd" and spec.layout == "HWC" and spec.shape == frames[0]["camera"].shape[1:]
    with pytest.raises(ArgumentError, match="camera_options"):
        import_dataset("lerobot", root, str(tmp_path / "el2"), camera_options={"no_such_option": 1})


# ---------------------------------------------------------------- export


def camera_dataset(path: str | None, layout: str = "HWC", lengths=(5, 7, 4), flags=("truncated", "terminated", "")):
    """Rendered frames in an episodelake dataset (two cameras: the render and its mirror image)."""
    episodes = rendered_episodes(list(lengths))
    frames_shape = episodes[0]["frames"].shape[1:]
    cam_shape = frames_shape if layout == "HWC" else (3, *frames_shape[:2])
    schema = el.DatasetSchema(
        [
            el.FieldSpec("images/top", cam_shape, "uint8", layout=layout),
            el.FieldSpec("images/mirror", cam_shape, "uint8", layout=layout),
            el.FieldSpec("state", episodes[0]["state"].shape[1:], "float32"),
            el.FieldSpec("action", episodes[0]["action"].shape[1:], "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("task", (), "str", role="meta"),
        ]
    )
    ds = el.Dataset.create(schema, path)
    dicts = []
    for i, (ep, flag) in enumerate(zip(episodes, flags, strict=True)):
        top = ep["frames"] if layout == "HWC" else ep["frames"].transpose(0, 3, 1, 2)
        dicts.append(
            {
                "observations": {
                    "images/top": top,
                    "images/mirror": np.ascontiguousarray(top[..., ::-1]),
                    "state": ep["state"],
                },
                "actions": {"action": ep["action"]},
                "rewards": {"reward": ep["reward"]},
                "terminated": flag == "terminated",
                "truncated": flag == "truncated",
                "meta": {"task": f"reach {i % 2}"},
            }
        )
    ds.append_episodes(dicts)
    ds.flush()
    return ds, dicts


@pytest.mark.parametrize(("layout", "vcodec"), [("HWC", "libsvtav1"), ("CHW", "h264")])
def test_export_layout_and_round_trip(tmp_path, layout, vcodec):
    ds, dicts = camera_dataset(str(tmp_path / "el"), layout)
    out = to_lerobot(ds, tmp_path / "lr", fps=20, vcodec=vcodec)
    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 20 and info["total_episodes"] == 3
    # T + 1 frames unless terminated (T)
    lengths = [len(d["actions"]["action"]) + (0 if d["terminated"] else 1) for d in dicts]
    assert info["total_frames"] == sum(lengths)
    assert info["features"]["observation.images.top"]["dtype"] == "video"
    data = pq.read_table(out / "data/chunk-000/file-000.parquet")
    assert data.column("index").to_pylist() == list(range(sum(lengths)))
    episodes = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    import pandas as pd

    tasks = pd.read_parquet(out / "meta/tasks.parquet")
    assert list(tasks.index) == ["reach 0", "reach 1"] and tasks.loc["reach 1"].task_index == 1
    stats = json.loads((out / "meta/stats.json").read_text())
    states = np.concatenate([d["observations"]["state"][:n] for d, n in zip(dicts, lengths, strict=True)])
    np.testing.assert_allclose(stats["observation.state"]["mean"], states.mean(axis=0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(stats["observation.state"]["min"], states.min(axis=0))
    assert set(stats["observation.state"]) == {"min", "max", "mean", "std", "count"}
    for key in ("observation.images.top", "observation.images.mirror"):
        path = out / f"videos/{key}/chunk-000/file-000.mp4"
        video = decode_mp4(path)
        assert len(video) == sum(lengths)
        with av.open(str(path)) as f:  # a keyframe every 2 frames, as LeRobot encodes (g=2)
            keyframes = [p.is_keyframe for p in f.demux(video=0) if p.size]
        assert keyframes == [k % 2 == 0 for k in range(sum(lengths))]
        for e, (d, row) in enumerate(zip(dicts, episodes, strict=True)):
            start = round(row[f"videos/{key}/from_timestamp"] * 20)
            assert row["dataset_from_index"] == start == sum(lengths[:e])
            src = d["observations"]["images/" + key.rsplit(".", 1)[1]][: lengths[e]]
            hwc = src if layout == "HWC" else src.transpose(0, 2, 3, 1)
            assert psnr(video[start : start + lengths[e]], hwc) > 30
    back = import_dataset("lerobot", out, str(tmp_path / "back"))
    top = next(f for f in back.schema.fields if f.key == "observation/images/top")
    assert top.layout == layout and top.shape == ds.schema.fields[0].shape
    for ep, d in zip(back.episodes(), dicts, strict=True):
        seg = ep.read()
        assert ep.terminated == d["terminated"] and ep.truncated == (not d["terminated"])
        assert ep.meta["task"] == d["meta"]["task"]
        np.testing.assert_array_equal(seg.action, d["actions"]["action"])
        np.testing.assert_array_equal(seg.reward, d["rewards"]["reward"])
        kept = len(d["actions"]["action"]) + (0 if d["terminated"] else 1)
        np.testing.assert_array_equal(seg.all_obs["state"][:kept], d["observations"]["state"][:kept])
        assert psnr(seg.all_obs["images/top"][:kept], d["observations"]["images/top"][:kept]) > 30
    again = to_lerobot(back, tmp_path / "again", vcodec=vcodec)  # fps and keys come from the import
    assert json.loads((again / "meta/info.json").read_text())["features"].keys() == info["features"].keys()


def test_export_starts_new_files_past_the_size_limits(tmp_path):
    ds, dicts = camera_dataset(None, "HWC", lengths=(3, 4, 2))
    out = to_lerobot(
        ds, tmp_path / "lr", fps=10, vcodec="h264", data_files_size_in_mb=1e-6, video_files_size_in_mb=1e-6
    )
    episodes = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["data/file_index"] for e in episodes] == [0, 1, 2]
    assert [e["videos/observation.images.top/file_index"] for e in episodes] == [0, 1, 2]
    assert [e["videos/observation.images.top/from_timestamp"] for e in episodes] == [0, 0, 0]
    for e, d in enumerate(dicts):
        n = len(d["actions"]["action"]) + (0 if d["terminated"] else 1)
        assert pq.read_table(out / f"data/chunk-000/file-{e:03d}.parquet").num_rows == n
        video = decode_mp4(out / f"videos/observation.images.top/chunk-000/file-{e:03d}.mp4")
        assert psnr(video, d["observations"]["images/top"][:n]) > 30
    back = import_dataset("lerobot", out, None)
    for ep, d in zip(back.episodes(), dicts, strict=True):
        np.testing.assert_array_equal(ep.read().action, d["actions"]["action"])
    with pytest.raises(ArgumentError, match="video_files_size_in_mb"):
        to_lerobot(ds, tmp_path / "lr2", fps=10, video_files_size_in_mb=0)


numeric_episode = st.tuples(st.integers(1, 6), st.sampled_from(["terminated", "truncated", ""]))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(episodes=st.lists(numeric_episode, min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_round_trip_values_exact(tmp_path_factory, episodes, seed):
    rng = np.random.default_rng(seed)
    schema = el.DatasetSchema(
        [
            el.FieldSpec("observation", (3,), "float64"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("cost", (2,), "float32", role="extra"),
        ]
    )
    ds = el.Dataset.create(schema, None)
    dicts = []
    for t, flag in episodes:
        dicts.append(
            {
                "observations": {"observation": rng.normal(size=(t + 1, 3))},
                "actions": {"action": rng.integers(-5, 5, t)},
                "rewards": {"reward": rng.normal(size=t).astype(np.float32)},
                "extras": {"cost": rng.normal(size=(t, 2)).astype(np.float32)},
                "terminated": flag == "terminated",
                "truncated": flag == "truncated",
            }
        )
    ds.append_episodes(dicts)
    ds.flush()
    tmp = tmp_path_factory.mktemp("rt")
    out = to_lerobot(ds, tmp / "lr", fps=30, task="balance")
    assert json.loads((out / "meta/info.json").read_text())["video_path"] is None
    back = import_dataset("lerobot", out, None)
    assert back.schema.to_json() == schema.to_json()  # the recorded schema: no timestamp, task or source_episode
    for ep, d in zip(back.episodes(), dicts, strict=True):
        seg = ep.read()
        t = len(d["actions"]["action"])
        kept = t if d["terminated"] else t + 1
        assert (ep.length, ep.terminated, ep.truncated) == (t, d["terminated"], not d["terminated"])
        np.testing.assert_array_equal(seg.data["observation"][:kept], d["observations"]["observation"][:kept])
        np.testing.assert_array_equal(seg.action, d["actions"]["action"])
        np.testing.assert_array_equal(seg.reward, d["rewards"]["reward"])
        np.testing.assert_array_equal(seg.data["extra/cost"], d["extras"]["cost"])


def test_export_rejects_and_leaves_nothing(tmp_path):
    schema = el.DatasetSchema(
        [
            el.FieldSpec("grid", (2, 2), "float32"),
            el.FieldSpec("action", (), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    ds = el.Dataset.create(schema, None)
    ds.append_episodes(
        [
            {
                "observations": {"grid": np.zeros((3, 2, 2), np.float32)},
                "actions": {"action": np.zeros(2, np.float32)},
                "rewards": {"reward": np.zeros(2, np.float32)},
            }
        ]
    )
    ds.flush()
    out = tmp_path / "lr"
    with pytest.raises(SchemaError, match="field 'observation/grid'"):
        to_lerobot(ds, out, fps=10)
    assert not out.exists()
    with pytest.raises(ArgumentError, match="needs fps="):
        to_lerobot(ds, out)
    with pytest.raises(ArgumentError, match="vcodec"):
        to_lerobot(ds, out, fps=10, vcodec="mpeg2")
    with pytest.raises(ArgumentError, match="gop"):
        to_lerobot(ds, out, fps=10, gop=0)
    assert not out.exists()
    out.mkdir()
    with pytest.raises(DatasetExistsError):
        to_lerobot(ds, out, fps=10)


@pytest.mark.slow
def test_cli_import_and_export(tmp_path):
    root, frames = v3_source(tmp_path, lengths=(5, 4), done=(False, True), files=(0, 0))
    proc = subprocess.run(
        [*CLI, "import", "lerobot", str(root), str(tmp_path / "el"), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "imported 2 episodes (8 steps) from lerobot" in proc.stdout
    ds = el.Dataset.open(str(tmp_path / "el"))
    np.testing.assert_array_equal(list(ds.episodes())[1].read().action, frames[1]["action"])
    proc = subprocess.run(
        [*CLI, "export", "lerobot", str(tmp_path / "el"), str(tmp_path / "lr"), "--vcodec", "h264", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "lr/meta/info.json").read_text())["total_frames"] == 9


# ---------------------------------------------------------------- against the real lerobot package


@pytest.fixture(scope="session")
def lerobot_py() -> Path:
    from .lerobot_env import lerobot_python

    return lerobot_python()


def lerobot_read(python: Path, root: Path, out: Path) -> tuple[dict[str, np.ndarray], dict]:
    proc = subprocess.run(
        [str(python), str(SCRIPTS / "lerobot_read.py"), str(root), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    z = np.load(out)
    return {k: z[k] for k in z.files if k != "__meta__"}, json.loads(str(z["__meta__"]))


@pytest.mark.slow
@pytest.mark.parametrize("vcodec", ["libsvtav1", "h264"])
def test_real_lerobot_dataset_imports_as_lerobot_reads_it(tmp_path, lerobot_py, vcodec):
    episodes = rendered_episodes([19, 12, 25], size=96)
    n = [len(ep["state"]) for ep in episodes]
    done = np.concatenate([np.eye(k, dtype=bool)[-1] & (e == 1) for e, k in enumerate(n)])
    action = np.concatenate([np.concatenate([ep["action"], ep["action"][-1:]]) for ep in episodes])
    reward = np.concatenate([np.concatenate([ep["reward"], [np.float32(0)]]) for ep in episodes])
    tasks = ["reach"] * n[0] + ["push"] * n[1] + ["reach"] * 10 + ["push"] * (n[2] - 10)
    source = tmp_path / "frames.npz"
    np.savez(
        source,
        **{
            "camera/top": np.concatenate([ep["frames"] for ep in episodes]),
            "camera/mirror": np.concatenate([ep["frames"][:, ::-1] for ep in episodes]),
        },
        state=np.concatenate([ep["state"] for ep in episodes]),
        action=action,
        reward=reward,
        done=done,
        episode=np.repeat(np.arange(3), n),
        tasks=np.array(tasks),
        fps=np.array(20),
    )
    root = tmp_path / "lerobot"
    proc = subprocess.run(
        [str(lerobot_py), str(SCRIPTS / "lerobot_write.py"), str(root), str(source), vcodec],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs, meta = lerobot_read(lerobot_py, root, tmp_path / "theirs.npz")
    assert meta["tasks"] == tasks and sorted(meta["video_keys"]) == [
        "observation.images.mirror",
        "observation.images.top",
    ]
    ds = import_dataset("lerobot", root, str(tmp_path / "el"))
    assert ds.info["source"]["fps"] == 20
    starts = np.r_[0, np.cumsum(n)]
    for e, ep in enumerate(ds.episodes()):
        seg, rows = ep.read(), slice(starts[e], starts[e + 1])
        kept = n[e] if e == 1 else n[e] - 1
        assert (ep.length, ep.terminated, ep.meta["task"]) == (kept, e == 1, ["reach", "push", "reach"][e])
        obs = seg.all_obs
        np.testing.assert_array_equal(obs["state"][: n[e]], theirs["observation.state"][rows])
        np.testing.assert_array_equal(obs["timestamp"][: n[e]], theirs["timestamp"][rows])
        np.testing.assert_array_equal(seg.action, theirs["action"][rows][:kept])
        np.testing.assert_array_equal(seg.reward, theirs["next.reward"][rows][:kept])
        np.testing.assert_array_equal(obs["task_index"][: n[e]], theirs["task_index"][rows])
        for cam in ("top", "mirror"):
            mine = obs[f"images/{cam}"][: n[e]]
            lerobots = theirs[f"observation.images.{cam}"][rows].transpose(0, 2, 3, 1)
            assert psnr(mine, lerobots) > 40  # the same file, decoded by PyAV here and torchcodec there
            rendered = episodes[e]["frames"] if cam == "top" else episodes[e]["frames"][:, ::-1]
            assert psnr(mine, rendered) > 28


@pytest.mark.slow
def test_real_lerobot_loads_our_export(tmp_path, lerobot_py):
    ds, dicts = camera_dataset(None, "CHW", lengths=(15, 22, 9), flags=("truncated", "terminated", ""))
    out = to_lerobot(ds, tmp_path / "lr", fps=15, video_files_size_in_mb=1e-6)  # one mp4 per episode
    theirs, meta = lerobot_read(lerobot_py, out, tmp_path / "theirs.npz")
    lengths = [len(d["actions"]["action"]) + (0 if d["terminated"] else 1) for d in dicts]
    assert meta["num_episodes"] == 3 and meta["fps"] == 15
    assert meta["tasks"] == [d["meta"]["task"] for d, k in zip(dicts, lengths, strict=True) for _ in range(k)]
    starts = np.r_[0, np.cumsum(lengths)]
    np.testing.assert_array_equal(theirs["episode_index"], np.repeat(np.arange(3), lengths))
    np.testing.assert_allclose(theirs["timestamp"], np.concatenate([np.arange(k) / 15 for k in lengths]), atol=1e-6)
    for e, d in enumerate(dicts):
        rows, k, t = slice(starts[e], starts[e + 1]), lengths[e], len(d["actions"]["action"])
        np.testing.assert_array_equal(theirs["observation.state"][rows], d["observations"]["state"][:k])
        np.testing.assert_array_equal(theirs["action"][rows][:t], d["actions"]["action"])
        np.testing.assert_array_equal(theirs["next.reward"][rows][:t], d["rewards"]["reward"])
        np.testing.assert_array_equal(
            theirs["next.done"][rows], np.arange(k) == k - 1 if d["terminated"] else np.zeros(k)
        )
        for cam in ("top", "mirror"):
            assert psnr(theirs[f"observation.images.{cam}"][rows], d["observations"][f"images/{cam}"][:k]) > 30
