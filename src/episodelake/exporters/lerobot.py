"""A dataset (or a view) -> a LeRobot v3 dataset folder that LeRobot's own ``LeRobotDataset`` loads.

Written with pyarrow and PyAV (no lerobot, no torch), in the layout that
:mod:`episodelake.importers.lerobot` reads: ``meta/info.json``,
``meta/tasks.parquet``, ``meta/episodes/chunk-000/file-000.parquet``,
``meta/stats.json``, ``data/chunk-*/file-*.parquet`` and one mp4 per camera
and file (``videos/<key>/chunk-*/file-*.mp4``), episodes one after the other
(a new file past ``data_files_size_in_mb``/``video_files_size_in_mb``, as
LeRobot does).

Episodes become action-out frames, the mirror image of the importer: a
terminated episode of ``T`` transitions is ``T`` frames (frame ``t``:
observation ``t``, action ``t``, ``next.reward`` ``r_t``, ``next.done`` on the
last frame; the final observation follows a terminal step and is not
written). Any other episode is ``T + 1`` frames: the last one carries the
final observation, repeats the last action and extras, and has
``next.reward`` 0, so no observation is lost (the importer drops that
frame's action again). Episodes without transitions are not written.

Feature keys: the LeRobot keys recorded by the importer
(``info["source"]["features"]``), else ``observation.<name>`` (``.`` for
``/``; a field named ``observation`` becomes ``observation.state``),
``action``/``action.<name>``, ``next.reward``, ``next.<name>`` for extras.
Cameras (``uint8`` fields of 3 dims with 3 channels in ``HWC`` or ``CHW``
layout) become videos encoded with PyAV: ``vcodec`` ``"libsvtav1"`` (AV1,
LeRobot's default) or ``"h264"``, ``yuv420p``, ``crf`` and keyframe interval
``gop`` as LeRobot's defaults (30, 2). Other fields must be scalars or 1-D.
``timestamp`` is ``frame_index / fps``. Tasks: the per-step ``task_index``
and task list recorded by the importer, else the meta field ``task``, else
the ``task`` argument. ``stats.json`` holds min, max, mean, std and count
per feature (images per channel in ``[0, 1]``, as LeRobot computes them);
quantiles and per-episode statistics are not written.

What LeRobot's format cannot say is recorded for the importer, so a round
trip gives back the schema it started from: ``info.json`` gets an
``"episodelake"`` entry, ``{"fields": {feature key: FieldSpec JSON},
"meta": {name: FieldSpec JSON}}`` (every exported step field's shape,
dtype, layout and codec or compression: a ``(1,)`` action stays ``(1,)``, a
jpeg camera stays jpeg), and every meta field is a column
``episodelake/<name>`` of ``meta/episodes`` (LeRobot keeps extra columns
there and ignores them).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.errors import ArgumentError, DatasetExistsError, SchemaError
from ..core.progress import track
from ..core.schema import DatasetSchema, FieldSpec
from ..importers.lerobot import (
    CODEBASE_VERSION,
    DATA_PATH,
    DONE,
    EPISODES_PATH,
    INFO_PATH,
    META_COLUMN,
    RECORD,
    REWARD,
    STATS_PATH,
    TASKS_PATH,
    TIMESTAMP,
    VIDEO_PATH,
)

if TYPE_CHECKING:
    from ..read.collection import EpisodeCollection

VCODECS = ("libsvtav1", "h264")
CHUNKS_SIZE = 1000  # files per chunk folder, as LeRobot


def is_camera(f: FieldSpec) -> bool:
    """A field exported as a video: uint8, 3 dims, 3 channels in ``HWC`` or ``CHW`` layout."""
    if f.np_dtype != np.uint8 or len(f.shape) != 3 or f.layout not in ("HWC", "CHW"):
        return False
    return f.shape[f.layout.index("C")] == 3


def default_key(f: FieldSpec) -> str:
    """The LeRobot feature key of a field with no key recorded by the importer."""
    dotted = f.name.replace("/", ".")
    if f.role == "observation":
        return "observation.state" if f.name == "observation" else f"observation.{dotted}"
    if f.role == "action":
        return "action" if f.name == "action" else f"action.{dotted}"
    if f.role == "reward":
        return REWARD
    return f"next.{dotted}"


class _Stats:
    """Running count, sum, sum of squares, min and max of one feature (per element, or per channel)."""

    def __init__(self) -> None:
        self.count = 0  # values summed per element or channel
        self.rows = 0  # frames
        self.sum: Any = 0.0
        self.sumsq: Any = 0.0
        self.min: Any = None
        self.max: Any = None

    def add(self, values: np.ndarray, axes: tuple[int, ...]) -> None:
        v = values.astype(np.float64)
        self.count += int(np.prod([values.shape[a] for a in axes]))
        self.rows += len(values)
        self.sum = self.sum + v.sum(axis=axes)
        self.sumsq = self.sumsq + (v * v).sum(axis=axes)
        lo, hi = v.min(axis=axes), v.max(axis=axes)
        self.min = lo if self.min is None else np.minimum(self.min, lo)
        self.max = hi if self.max is None else np.maximum(self.max, hi)

    def to_json(self, scale: float = 1.0, shape: tuple[int, ...] | None = None) -> dict[str, Any]:
        mean = self.sum / self.count
        std = np.sqrt(np.maximum(self.sumsq / self.count - mean * mean, 0.0))

        def out(a: Any) -> Any:
            a = np.asarray(a) / scale
            return (a.reshape(shape) if shape else a).tolist()

        return {"min": out(self.min), "max": out(self.max), "mean": out(mean), "std": out(std), "count": [self.rows]}


@dataclass(frozen=True)
class _Options:
    """What :func:`to_lerobot` was asked for, checked."""

    fps: int
    task: str
    vcodec: str
    crf: int
    gop: int
    robot_type: str | None
    data_mb: float
    video_mb: float
    progress: bool | None


class _Video:
    """One camera's mp4 files: episodes appended one after the other, a new file past the size limit."""

    def __init__(self, root: Path, key: str, options: _Options, size: tuple[int, int]) -> None:
        self.root, self.key, self.options = root, key, options
        self.fps, self.vcodec = options.fps, options.vcodec
        self.height, self.width = size
        self.file = -1
        self.container: Any = None
        self._next_file()

    def _next_file(self) -> None:
        import av

        self.close()
        self.file += 1
        self.path = self.root / VIDEO_PATH.format(
            video_key=self.key, chunk_index=self.file // CHUNKS_SIZE, file_index=self.file % CHUNKS_SIZE
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.container = av.open(str(self.path), "w")
        codec_options = {"g": str(self.options.gop), "crf": str(self.options.crf)}
        if self.vcodec == "libsvtav1":
            codec_options["preset"] = "12"
        self.stream = self.container.add_stream(self.vcodec, rate=self.fps, options=codec_options)
        self.stream.pix_fmt = "yuv420p"
        self.stream.width, self.stream.height = self.width, self.height
        self.stream.time_base = Fraction(1, self.fps)
        self.frames = 0  # frames in this file
        self.bytes = 0

    def append(self, frames: np.ndarray) -> dict[str, Any]:
        """Encode an episode's HWC frames; its ``videos/<key>/...`` episode metadata."""
        import av

        if self.frames and self.bytes >= self.options.video_mb * 2**20:
            self._next_file()
        start = self.frames
        for image in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = self.frames
            frame.time_base = Fraction(1, self.fps)
            self._mux(self.stream.encode(frame))
            self.frames += 1
        prefix = f"videos/{self.key}/"
        return {
            prefix + "chunk_index": self.file // CHUNKS_SIZE,
            prefix + "file_index": self.file % CHUNKS_SIZE,
            prefix + "from_timestamp": start / self.fps,
            prefix + "to_timestamp": self.frames / self.fps,
        }

    def _mux(self, packets: Any) -> None:
        for packet in packets:
            self.bytes += packet.size
            self.container.mux(packet)

    def close(self) -> None:
        if self.container is not None:
            self._mux(self.stream.encode())
            self.container.close()
            self.container = None

    def info(self) -> dict[str, Any]:
        return {
            "video.height": self.height,
            "video.width": self.width,
            "video.codec": "av1" if self.vcodec == "libsvtav1" else self.vcodec,
            "video.pix_fmt": "yuv420p",
            "video.is_depth_map": False,
            "video.fps": self.fps,
            "video.channels": 3,
            "has_audio": False,
        }


def _tasks_table(tasks: list[str]) -> pa.Table:
    """``meta/tasks.parquet`` as pandas writes it: the task strings are the DataFrame's index."""
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "__index_level_0__": pa.array(tasks)})
    return table.replace_schema_metadata({"pandas": json.dumps(pandas_meta)})


def _plain(value: Any) -> Any:
    """A meta value as Arrow takes it: None, or Python scalars and lists."""
    return None if value is None else np.asarray(value).tolist()


def _episodes_table(rows: list[dict[str, Any]], schema: DatasetSchema) -> pa.Table:
    """``meta/episodes``: one row per episode; meta columns typed by their fields, so an all-null one keeps its type."""
    meta = {META_COLUMN.format(name=f.name): f.arrow_type() for f in schema.meta_fields}
    table = pa.Table.from_pylist([{k: v for k, v in row.items() if k not in meta} for row in rows])
    for name, typ in meta.items():
        table = table.append_column(pa.field(name, typ), pa.array([row[name] for row in rows], typ))
    return table


def _column(values: np.ndarray, shape: tuple[int, ...]) -> pa.Array:
    """A feature's frames as a Parquet column: scalars plain, 1-D values as fixed-size lists."""
    if shape in ((), (1,)):
        return pa.array(values.reshape(len(values)))
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), shape[0])


def to_lerobot(
    collection: EpisodeCollection,
    path: str | os.PathLike,
    *,
    fps: int | None = None,
    task: str = "",
    vcodec: str = "libsvtav1",
    crf: int = 30,
    gop: int = 2,
    robot_type: str | None = None,
    data_files_size_in_mb: float = 100,
    video_files_size_in_mb: float = 200,
    progress: bool | None = None,
) -> Path:
    """Write every episode of ``collection`` to a new LeRobot v3 dataset folder ``path``; returns it.

    ``fps`` defaults to the one recorded by the LeRobot importer and is
    required otherwise. A new data (video) file starts once the current one
    holds ``data_files_size_in_mb`` (``video_files_size_in_mb``), LeRobot's
    defaults. Mapping and encoding: see the module doc.
    """
    root = Path(os.fspath(path)).absolute()
    if root.exists():
        raise DatasetExistsError(f"{root} already exists")
    if vcodec not in VCODECS:
        raise ArgumentError(f"vcodec must be one of {VCODECS}, got {vcodec!r}")
    for name, value in (("crf", crf), ("gop", gop)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "crf" else 1):
            raise ArgumentError(
                f"{name} must be a {'non-negative' if name == 'crf' else 'positive'} int, got {value!r}"
            )
    for name, size in (
        ("data_files_size_in_mb", data_files_size_in_mb),
        ("video_files_size_in_mb", video_files_size_in_mb),
    ):
        if isinstance(size, bool) or not isinstance(size, int | float) or not size > 0:
            raise ArgumentError(f"{name} must be a positive number, got {size!r}")
    source = dict(collection.info).get("source") or {}
    lerobot_source = source.get("format") == "lerobot"
    fps = fps if fps is not None else (source.get("fps") if lerobot_source else None)
    if isinstance(fps, bool) or not isinstance(fps, int) or fps <= 0:
        raise ArgumentError(f"to_lerobot needs fps= (a positive int), got {fps!r}")
    schema = collection.schema
    recorded: Mapping[str, str] = source.get("features", {}) if lerobot_source else {}
    fields = [f for f in schema.step_fields if recorded.get(f.key) not in (TIMESTAMP, "task_index")]
    keys = {f.key: recorded.get(f.key) or default_key(f) for f in fields}
    features: dict[str, dict[str, Any]] = {}
    for f in fields:
        if is_camera(f):
            names = ["height", "width", "channels"] if f.layout == "HWC" else ["channels", "height", "width"]
            features[keys[f.key]] = {"dtype": "video", "shape": list(f.shape), "names": names}
        elif len(f.shape) > 1 or f.np_dtype.kind not in "biuf":
            raise SchemaError(
                f"field {f.key!r}: shape {f.shape} {f.dtype} has no LeRobot feature (scalars, 1-D, cameras)"
            )
        else:
            features[keys[f.key]] = {"dtype": f.np_dtype.name, "shape": list(f.shape or (1,)), "names": None}
    if len(set(keys.values())) != len(keys):
        raise SchemaError(f"two fields map to the same LeRobot feature key: {keys}")
    features[DONE] = {"dtype": "bool", "shape": [1], "names": None}
    for name, dtype in (
        ("timestamp", "float32"),
        ("frame_index", "int64"),
        ("episode_index", "int64"),
        ("index", "int64"),
        ("task_index", "int64"),
    ):
        features[name] = {"dtype": dtype, "shape": [1], "names": None}
    # in schema order; bookkeeping columns stand for the timestamp and per-step task_index of an imported dataset
    record = {
        "fields": {keys.get(f.key) or recorded[f.key]: f.to_json() for f in schema.step_fields},
        "meta": {f.name: f.to_json() for f in schema.meta_fields},
    }

    root.mkdir(parents=True)
    try:
        options = _Options(
            fps, task, vcodec, crf, gop, robot_type, data_files_size_in_mb, video_files_size_in_mb, progress
        )
        _write(collection, root, fields, keys, features, options, source, record)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)  # all or nothing: no half-written dataset stays behind
        raise
    return root


def _write(
    collection: EpisodeCollection,
    root: Path,
    fields: list[FieldSpec],
    keys: Mapping[str, str],
    features: dict[str, dict[str, Any]],
    options: _Options,
    source: Mapping[str, Any],
    record: dict[str, Any],
) -> None:
    """Write the data, videos and metadata files of :func:`to_lerobot` into the new folder ``root``."""
    schema = collection.schema
    recorded: Mapping[str, str] = source.get("features", {}) if source.get("format") == "lerobot" else {}
    per_step_task = recorded.get("observation/task_index") == "task_index"
    known_tasks: list[str] = list(source.get("tasks", [])) if per_step_task else []
    has_task_meta = any(f.name == "task" for f in schema.meta_fields)
    cameras = [f for f in fields if is_camera(f)]
    videos: dict[str, _Video] = {}
    for f in cameras:
        h, w = (f.shape[0], f.shape[1]) if f.layout == "HWC" else (f.shape[1], f.shape[2])
        videos[f.key] = _Video(root, keys[f.key], options, (h, w))
    stats = {k: _Stats() for k in features}
    tasks: dict[str, int] = {t: i for i, t in enumerate(known_tasks)}
    rows: list[dict[str, Any]] = []
    data_file, data_bytes, writer = 0, 0, None
    total = 0
    try:
        for ep in track(list(collection.episodes()), desc="export lerobot", progress=options.progress, unit="episode"):
            if ep.length == 0:
                continue
            seg = ep.read()
            terminated = bool(ep.terminated)
            n = ep.length if terminated else ep.length + 1
            episode_index = len(rows)
            frames: dict[str, np.ndarray] = {}
            for f in fields:
                values = np.asarray(seg.data[f.key])
                if f.role == "observation":
                    values = values[:n]
                elif not terminated:  # the extra frame repeats the last action/extra, earns nothing
                    last = np.zeros_like(values[-1:]) if f.role == "reward" else values[-1:]
                    values = np.concatenate([values, last])
                frames[keys[f.key]] = values
            done = np.zeros(n, bool)
            done[-1] = terminated
            if per_step_task:
                task_index = np.asarray(seg.data["observation/task_index"])[:n].astype(np.int64)
            else:
                name = ep.meta.get("task") if has_task_meta else None
                name = options.task if name is None else str(name)
                task_index = np.full(n, tasks.setdefault(name, len(tasks)), np.int64)
            episode_tasks = [known_tasks[t] if per_step_task else name for t in dict.fromkeys(task_index.tolist())]
            columns = {
                k: _column(v, tuple(features[k]["shape"])) for k, v in frames.items() if features[k]["dtype"] != "video"
            }
            bookkeeping = {
                DONE: done,
                "timestamp": (np.arange(n) / options.fps).astype(np.float32),
                "frame_index": np.arange(n, dtype=np.int64),
                "episode_index": np.full(n, episode_index, np.int64),
                "index": np.arange(total, total + n, dtype=np.int64),
                "task_index": task_index,
            }
            columns.update({k: pa.array(v) for k, v in bookkeeping.items()})
            table = pa.table(columns)
            if writer is not None and data_bytes >= options.data_mb * 2**20:
                writer.close()
                writer, data_file, data_bytes = None, data_file + 1, 0
            if writer is None:
                data_path = root / DATA_PATH.format(
                    chunk_index=data_file // CHUNKS_SIZE, file_index=data_file % CHUNKS_SIZE
                )
                data_path.parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(data_path, table.schema, compression="snappy")
            writer.write_table(table)
            data_bytes += table.nbytes
            row: dict[str, Any] = {
                "episode_index": episode_index,
                "tasks": episode_tasks,
                "length": n,
                "data/chunk_index": data_file // CHUNKS_SIZE,
                "data/file_index": data_file % CHUNKS_SIZE,
                "dataset_from_index": total,
                "dataset_to_index": total + n,
            }
            for f in cameras:
                hwc = frames[keys[f.key]]
                if f.layout == "CHW":
                    hwc = hwc.transpose(0, 2, 3, 1)
                row.update(videos[f.key].append(hwc))
                stats[keys[f.key]].add(hwc, (0, 1, 2))
            row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
            row.update({META_COLUMN.format(name=f.name): _plain(ep.meta.get(f.name)) for f in schema.meta_fields})
            rows.append(row)
            for k, v in {**frames, **bookkeeping}.items():
                if features[k]["dtype"] != "video":
                    stats[k].add(v.reshape(n, -1) if v.ndim > 1 else v.reshape(n, 1), (0,))
            total += n
    finally:
        if writer is not None:
            writer.close()
        for video in videos.values():
            video.close()

    task_list = [t for t, _ in sorted(tasks.items(), key=lambda item: item[1])]
    (root / TASKS_PATH).parent.mkdir(exist_ok=True)
    pq.write_table(_tasks_table(task_list), root / TASKS_PATH)
    episodes_path = root / EPISODES_PATH.format(chunk_index=0, file_index=0)
    episodes_path.parent.mkdir(parents=True)
    pq.write_table(_episodes_table(rows, schema), episodes_path)
    for f in cameras:
        features[keys[f.key]]["info"] = videos[f.key].info()
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": options.robot_type if options.robot_type is not None else source.get("robot_type"),
        "total_episodes": len(rows),
        "total_frames": total,
        "total_tasks": len(task_list),
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": options.data_mb,
        "video_files_size_in_mb": options.video_mb,
        "fps": options.fps,
        "splits": {"train": f"0:{len(rows)}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if cameras else None,
        "features": features,
        RECORD: record,
    }
    (root / INFO_PATH).write_text(json.dumps(info, indent=4))
    out_stats = {}
    for k, s in stats.items():
        if s.count == 0:
            continue
        if features[k]["dtype"] == "video":
            out_stats[k] = s.to_json(255.0, (3, 1, 1))
        else:
            out_stats[k] = s.to_json(shape=tuple(features[k]["shape"]))
    (root / STATS_PATH).write_text(json.dumps(out_stats, indent=4))
