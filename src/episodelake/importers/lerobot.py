"""LeRobot v3 datasets on disk -> episodes, read with pyarrow and PyAV (no lerobot, no torch).

The layout (LeRobot's ``codebase_version`` ``v3.0``): ``meta/info.json``
(fps, features, path templates), ``meta/tasks.parquet`` (task strings and
their ``task_index``), ``meta/episodes/chunk-*/file-*.parquet`` (per episode:
``length``, ``data/chunk_index``/``file_index``, and per camera
``videos/<key>/chunk_index``/``file_index``/``from_timestamp``/``to_timestamp``),
``data/chunk-*/file-*.parquet`` (one row per frame, many episodes per file) and
``videos/<key>/chunk-*/file-*.mp4`` (many episodes per file, one after the other).

Frames are action-out: frame ``t`` holds the observation at which action
``t`` was taken, ``next.reward``/``next.done`` what that action produced. An
episode of ``n`` frames imports as by
:func:`episodelake.importers.common.action_out_episode`: ``next.done`` set on its last
frame makes it terminated with all ``n`` transitions (the final observation
row repeats frame ``n - 1``); otherwise it keeps ``n - 1`` transitions, every
frame's observation, and drops the last frame's action (nothing recorded what
it led to), and is truncated when the dataset has ``next.done`` (it ended in
no terminal state), neither flag without it. :func:`episodelake.lerobot_export.to_lerobot` writes the mirror
image, so episodes round-trip exactly.

A folder written by :func:`episodelake.lerobot_export.to_lerobot` carries
the schema it came from (``info.json``'s ``"episodelake"`` entry: the
FieldSpec behind each feature, and the meta fields with their
``episodelake/<name>`` columns in ``meta/episodes``). It then imports as exactly
that schema: every field's name, shape (a ``(1,)`` field stays ``(1,)``),
dtype, layout and codec or compression (a jpeg camera is stored as jpeg
again), and every meta field with its value; nothing is added (no
``timestamp``, which the export wrote only because LeRobot needs it; no
``task`` or ``source_episode`` unless the source had them).
``camera_options`` that set ``codec`` or ``compression`` replace the
recorded codec, compression and quality; others are applied over the
record. Any other folder maps by the rules below.

Features map to fields by key: ``observation.<a>.<b>`` -> observation
``<a>/<b>``; ``action`` (and ``action.<a>``) -> action; ``next.reward`` ->
the reward (all zeros when the source has none: episodelake needs one, and
``info["source"]["reward"]`` is then False); ``timestamp`` -> observation
``timestamp``; ``next.done`` -> the terminated flag; any other numeric feature
-> an extra (``next.`` dropped). Shape ``(1,)``, LeRobot's scalar, imports as
``()``. ``frame_index``/``episode_index``/``index``/``task_index`` are
LeRobot's bookkeeping (checked, not stored). Meta fields:
``task`` (the task of the episode's first frame), ``source_episode`` (its
``episode_index``); an episode whose frames name several tasks also gets the
per-step observation ``task_index``. Camera features (``video``, ``image``)
become ``uint8`` fields in the layout their ``names`` spell (``HWC`` unless
channels come first); video frames are decoded with PyAV and matched to each
frame's ``timestamp`` (plus the episode's ``from_timestamp``) within
``tolerance_s``, as LeRobot's own reader does. ``camera_options`` are extra
:class:`~episodelake.schema.FieldSpec` arguments for camera fields (e.g.
``{"compression": "zstd"}``); frames are stored raw by default. A one-frame
episode in a dataset without ``next.done`` has no transition and is skipped
(listed in ``info["source"]["skipped_episodes"]``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..core.errors import ArgumentError, SchemaError, ValidationError
from ..core.schema import DatasetSchema, FieldSpec
from ..dataset import Dataset
from .common import SOURCE_EPISODE, action_out_episode, write_import

RECORD = "episodelake"  # info.json entry written by to_lerobot: {"fields": {key: spec}, "meta": {name: spec}}
META_COLUMN = RECORD + "/{name}"  # a meta field's column in meta/episodes (apart from LeRobot's meta/...)
STORAGE_CHOICES = ("codec", "compression")  # camera_options that replace the recorded storage of a camera

INFO_PATH = "meta/info.json"
TASKS_PATH = "meta/tasks.parquet"
STATS_PATH = "meta/stats.json"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
EPISODES_PATH = EPISODES_DIR + "/" + CHUNK_FILE + ".parquet"
CODEBASE_VERSION = "v3.0"
BOOKKEEPING = ("frame_index", "episode_index", "index", "task_index")  # LeRobot's own per-frame columns
TIMESTAMP, REWARD, DONE = "timestamp", "next.reward", "next.done"
CAMERA_DTYPES = ("video", "image")
TASK = FieldSpec("task", (), "str", role="meta", description="LeRobot task of the episode's first frame")


def field_of(feature: str) -> tuple[str, str]:
    """The (role, name) a LeRobot feature key imports as (reward and done are handled by the caller)."""
    if feature == TIMESTAMP:
        return "observation", TIMESTAMP
    for role in ("observation", "action"):
        if feature == role:
            return role, role
        if feature.startswith(role + "."):
            return role, feature[len(role) + 1 :].replace(".", "/")
    return "extra", feature.removeprefix("next.").replace(".", "/")


def camera_layout(feature: Mapping[str, Any]) -> str:
    """``CHW`` when a camera feature's ``names`` put channels first, else ``HWC`` (LeRobot's default)."""
    names = feature.get("names") or []
    return "CHW" if names and str(names[0]).startswith("channel") else "HWC"


def feature_shape(feature: Mapping[str, Any], key: str) -> tuple[int, ...]:
    """A feature's per-frame shape; ``(1,)`` is LeRobot's scalar (a plain column) and imports as ``()``."""
    try:
        shape = tuple(int(s) for s in feature["shape"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValidationError(f"meta/info.json: feature {key!r} has no valid shape") from exc
    return () if shape == (1,) else shape


class LeRobotSource:
    """The metadata of a LeRobot v3 dataset folder and its per-episode frames."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(os.fspath(root))
        info_path = self.root / INFO_PATH
        if not info_path.is_file():
            raise ValidationError(f"{self.root} is not a LeRobot dataset (no {INFO_PATH})")
        self.info = json.loads(info_path.read_text())
        version = self.info.get("codebase_version")
        if version != CODEBASE_VERSION:
            raise ValidationError(
                f"{info_path}: codebase_version {version!r}; only LeRobot {CODEBASE_VERSION} is read "
                "(convert older datasets with lerobot's convert_dataset_v21_to_v30 first)"
            )
        self.fps = int(self.info["fps"])
        self.features: dict[str, dict[str, Any]] = self.info["features"]
        self.data_path = self.info.get("data_path") or DATA_PATH
        self.video_path = self.info.get("video_path") or VIDEO_PATH
        self.tasks = read_tasks(self.root / TASKS_PATH)
        files = sorted((self.root / EPISODES_DIR).glob("*/*.parquet"))
        if not files:
            raise ValidationError(f"{self.root}: no episode metadata under {EPISODES_DIR}/")
        tables = [pq.read_table(f) for f in files]
        names = [c for c in tables[0].column_names if not c.startswith("stats/")]
        table = pa.concat_tables([t.select(names) for t in tables], promote_options="permissive")
        self.episodes = sorted(table.to_pylist(), key=lambda e: e["episode_index"])
        self._data: tuple[Path, dict[int, pa.Table]] | None = None
        self.record_fields, self.record_meta = self._record(info_path, names)

    def _record(
        self, info_path: Path, columns: list[str]
    ) -> tuple[dict[str, dict[str, Any]] | None, dict[str, FieldSpec] | None]:
        """What ``to_lerobot`` recorded: the field spec (JSON) behind each feature key, and the meta fields."""
        record = self.info.get(RECORD)
        if record is None:
            return None, None
        try:
            fields = {str(k): _importable(v) for k, v in record["fields"].items()}
            for spec in fields.values():
                FieldSpec.from_json(spec)  # checked here, so a bad record is named as such
            meta = {str(k): FieldSpec.from_json(_importable(v)) for k, v in record["meta"].items()}
        except (KeyError, TypeError, AttributeError, ValueError, SchemaError) as exc:
            raise ValidationError(f"{info_path}: {RECORD!r} entry is not a valid field record: {exc}") from exc
        unknown = sorted(set(fields) - set(self.features))
        if unknown:
            raise ValidationError(f"{info_path}: {RECORD!r} records fields for features {unknown} that are not there")
        missing = sorted(n for n in meta if META_COLUMN.format(name=n) not in columns)
        if missing:
            raise ValidationError(f"{self.root / EPISODES_DIR}: no column for the recorded meta field(s) {missing}")
        return fields, meta

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] == "video"]

    def frames(self, episode: Mapping[str, Any]) -> pa.Table:
        """The episode's data rows in frame order (one data file is cached at a time)."""
        path = self.root / self.data_path.format(
            chunk_index=episode["data/chunk_index"], file_index=episode["data/file_index"]
        )
        if self._data is None or self._data[0] != path:
            table = pq.read_table(path)
            order = pc.sort_indices(table, [("episode_index", "ascending"), ("frame_index", "ascending")])
            table = table.take(order)
            ids = table.column("episode_index").to_numpy()
            starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            ends = np.r_[starts[1:], len(ids)]
            self._data = (path, {int(ids[s]): table.slice(s, e - s) for s, e in zip(starts, ends, strict=True)})
        index = episode["episode_index"]
        rows = self._data[1].get(index)
        if rows is None:
            raise ValidationError(f"episode {index}: no rows in {path}")
        return rows


def read_tasks(path: Path) -> dict[int, str]:
    """``task_index -> task`` from ``meta/tasks.parquet`` (pandas keeps the task strings in its index)."""
    if not path.is_file():
        raise ValidationError(f"{path}: missing (LeRobot v3 keeps the task strings there)")
    table = pq.read_table(path)
    strings = [
        c
        for c in table.column_names
        if pa.types.is_string(t := table.schema.field(c).type) or pa.types.is_large_string(t)
    ]
    text = strings[0] if strings else None
    if text is None or "task_index" not in table.column_names:
        raise ValidationError(f"{path}: expected a task_index column and the task strings")
    return dict(zip(table.column("task_index").to_pylist(), table.column(text).to_pylist(), strict=True))


def _numeric(dtype: str) -> bool:
    try:
        return np.dtype(dtype).kind in "biuf"
    except TypeError:  # "string" and other non-NumPy LeRobot dtypes
        return False


def column_array(column: pa.ChunkedArray, shape: tuple[int, ...], dtype: str, where: str) -> np.ndarray:
    """A data column (scalars or nested fixed/variable lists) as an array of ``[rows, *shape]``."""
    values: pa.Array = column.combine_chunks()
    rows = len(values)
    while (
        pa.types.is_list(values.type) or pa.types.is_fixed_size_list(values.type) or pa.types.is_large_list(values.type)
    ):
        values = values.flatten()
    flat = values.to_numpy(zero_copy_only=False)
    if flat.size != rows * int(np.prod(shape)):
        raise ValidationError(f"{where}: {flat.size} values for {rows} frames of shape {shape}")
    return flat.reshape(rows, *shape).astype(dtype, copy=False)


def decode_images(column: pa.ChunkedArray, where: str) -> np.ndarray:
    """``image`` features: PNG/JPEG bytes in the data file (``{"bytes", "path"}`` structs), as HWC uint8."""
    import io

    from PIL import Image

    out = []
    for i, item in enumerate(column.to_pylist()):
        if not item or not item.get("bytes"):
            raise ValidationError(f"{where}, frame {i}: image has no embedded bytes")
        with Image.open(io.BytesIO(item["bytes"])) as img:
            out.append(np.asarray(img.convert("RGB")))
    return np.stack(out)


class VideoCursor:
    """One mp4 file's frames in presentation order, decoded forward once (reopened to go back)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.container: Any = None
        self._open()

    def _open(self) -> None:
        import av

        if self.container is not None:
            self.container.close()
        self.container = av.open(str(self.path))
        stream = self.container.streams.video[0]
        stream.thread_type = "AUTO"
        self.decoded = self.container.decode(stream)
        self.held: Any = None  # a frame read past the last request, first in line for the next
        self.consumed = -np.inf  # time of the last frame handed out or skipped

    def close(self) -> None:
        self.container.close()

    def take(self, times: np.ndarray, tolerance: float, where: str) -> np.ndarray:
        """RGB frames (HWC uint8) nearest each time in seconds, each within ``tolerance``."""
        lo, hi = float(times.min()) - tolerance, float(times.max()) + tolerance
        if lo <= self.consumed:
            self._open()
        got_t: list[float] = []
        got: list[np.ndarray] = []
        while True:
            frame = self.held if self.held is not None else next(self.decoded, None)
            self.held = None
            if frame is None:
                break
            t = float(frame.time)
            if t > hi:
                self.held = frame
                break
            self.consumed = t
            if t >= lo:
                got_t.append(t)
                got.append(frame.to_ndarray(format="rgb24"))
        if not got:
            raise ValidationError(f"{where}: {self.path} has no frame between {lo:.4f}s and {hi:.4f}s")
        found = np.asarray(got_t)
        nearest = np.abs(times[:, None] - found[None, :]).argmin(axis=1)
        off = np.abs(found[nearest] - times)
        if (off >= tolerance).any():
            bad = int(np.flatnonzero(off >= tolerance)[0])
            raise ValidationError(
                f"{where}, frame {bad}: no video frame within {tolerance}s of {times[bad]:.4f}s in {self.path}"
            )
        return np.stack([got[i] for i in nearest])


def _importable(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded FieldSpec (JSON) as a field to write: a derived column of the source is plain data here."""
    return {k: v for k, v in spec.items() if k != "derived"}


def _camera_spec(
    key: str,
    feature: Mapping[str, Any],
    recorded: Mapping[str, Mapping[str, Any]] | None,
    camera_options: Mapping[str, Any],
) -> FieldSpec:
    """The field of a camera feature: the recorded spec (its codec kept unless ``camera_options`` choose a
    codec or compression), else a ``uint8`` field in the layout its ``names`` spell; ``camera_options`` on top."""
    if recorded is not None and key in recorded:
        base = dict(recorded[key])
        if any(k in camera_options for k in STORAGE_CHOICES):
            base = {k: v for k, v in base.items() if k not in (*STORAGE_CHOICES, "quality")}
    else:
        role, name = field_of(key)
        base = {"name": name, "shape": feature_shape(feature, key), "dtype": "uint8", "role": role}
        base["layout"] = camera_layout(feature)
    try:
        return FieldSpec.from_json({**base, **camera_options})
    except TypeError as exc:
        raise ArgumentError(f"camera_options: {exc}") from exc


def load(
    src: str | os.PathLike,
    dst: str | None = None,
    *,
    camera_options: Mapping[str, Any] | None = None,
    tolerance_s: float = 1e-4,
    progress: bool | None = None,
    **create_options: Any,
) -> Dataset:
    """Import the LeRobot v3 dataset folder ``src`` into a new dataset at ``dst`` (mapping: see module doc)."""
    if not tolerance_s > 0:
        raise ArgumentError(f"tolerance_s must be positive, got {tolerance_s!r}")
    source = LeRobotSource(src)
    camera_options = dict(camera_options or {})
    recorded = source.record_fields
    fields: list[FieldSpec] = []
    keys: dict[str, str] = {}  # field key -> LeRobot feature key
    skipped: list[str] = []
    for key, feature in source.features.items():
        dtype = feature["dtype"]
        if key in BOOKKEEPING or key in (REWARD, DONE):
            continue
        if recorded is not None and key == TIMESTAMP and key not in recorded:
            continue  # to_lerobot wrote it because LeRobot needs one; the source had no such field
        if dtype in CAMERA_DTYPES:
            spec = _camera_spec(key, feature, recorded, camera_options)
        elif not _numeric(dtype):
            skipped.append(key)
            continue
        elif recorded is not None and key in recorded:
            spec = FieldSpec.from_json(recorded[key])
        else:
            role, name = field_of(key)
            spec = FieldSpec(name, feature_shape(feature, key), dtype, role=role)
        fields.append(spec)
        keys[spec.key] = key
    has_reward = REWARD in source.features
    if recorded is not None and REWARD in recorded:
        reward = FieldSpec.from_json(recorded[REWARD])
    else:
        reward = FieldSpec("reward", (), source.features[REWARD]["dtype"] if has_reward else "float32", role="reward")
    fields.append(reward)
    keys[reward.key] = REWARD
    if not any(f.role == "action" for f in fields):
        raise SchemaError(f"{src}: the LeRobot dataset has no action feature; episodelake needs one")
    task_field: FieldSpec | None = None  # the field that gets the per-frame task_index, if any
    if recorded is not None:
        task_field = FieldSpec.from_json(recorded["task_index"]) if "task_index" in recorded else None
    elif any(len(e.get("tasks") or []) > 1 for e in source.episodes):
        task_field = FieldSpec("task_index", (), "int64", role="observation")
    if task_field is not None:
        fields.append(task_field)
        keys[task_field.key] = "task_index"
    if recorded is not None:  # the source's field order
        order = {key: i for i, key in enumerate(recorded)}
        fields.sort(key=lambda f: order.get(keys[f.key], len(order)))
    meta = list(source.record_meta.values()) if source.record_meta is not None else [TASK, SOURCE_EPISODE]
    schema = DatasetSchema([*fields, *meta])
    # a one-frame episode that cannot say it ended has no transition to keep
    skipped_episodes = (
        [] if DONE in source.features else [e["episode_index"] for e in source.episodes if e["length"] == 1]
    )
    skip = set(skipped_episodes)
    step_fields = [f for f in fields if keys[f.key] not in (REWARD, "task_index")]

    def episodes() -> Iterator[dict[str, Any]]:
        cursors: dict[tuple[str, Path], VideoCursor] = {}
        try:
            for episode in source.episodes:
                index = int(episode["episode_index"])
                if index in skip:
                    continue
                yield _episode(source, episode, index, step_fields, keys, reward, task_field, cursors, tolerance_s)
        finally:
            for cursor in cursors.values():
                cursor.close()

    info = {
        "source": {
            "format": "lerobot",
            "path": os.fspath(src),
            "codebase_version": CODEBASE_VERSION,
            "fps": source.fps,
            "robot_type": source.info.get("robot_type"),
            "episodes": len(source.episodes),
            "tasks": [source.tasks[i] for i in sorted(source.tasks)],
            "features": keys,
            "reward": has_reward,
            "skipped_features": skipped,
            "skipped_episodes": skipped_episodes,
        }
    }
    return write_import(
        schema,
        episodes(),
        dst,
        info=info,
        total=len(source.episodes),
        desc="import lerobot",
        progress=progress,
        **create_options,
    )


def _episode(
    source: LeRobotSource,
    episode: Mapping[str, Any],
    index: int,
    step_fields: list[FieldSpec],
    keys: Mapping[str, str],
    reward_field: FieldSpec,
    task_field: FieldSpec | None,
    cursors: dict[tuple[str, Path], VideoCursor],
    tolerance_s: float,
) -> dict[str, Any]:
    """One LeRobot episode as a dict-form episode (action-out conversion, see the module doc).

    ``task_field``: the field that gets the per-frame ``task_index``, if any.
    """
    rows = source.frames(episode)
    n = rows.num_rows
    where = f"episode {index}"
    if n != episode["length"] or n == 0:
        raise ValidationError(f"{where}: meta/episodes says {episode['length']} frames, the data file has {n}")
    frame_index = rows.column("frame_index").to_numpy()
    if not np.array_equal(frame_index, np.arange(n)):
        raise ValidationError(f"{where}: frame_index is not 0..{n - 1}")
    timestamps = rows.column(TIMESTAMP).to_numpy().astype(np.float64)
    values: dict[str, dict[str, np.ndarray]] = {"observation": {}, "action": {}, "extra": {}}
    for f in step_fields:
        key = keys[f.key]
        feature = source.features[key]
        if feature["dtype"] == "video":
            path = source.root / source.video_path.format(
                video_key=key,
                chunk_index=episode[f"videos/{key}/chunk_index"],
                file_index=episode[f"videos/{key}/file_index"],
            )
            cursor = cursors.get((key, path))
            if cursor is None:
                for old in [k for k in cursors if k[0] == key]:
                    cursors.pop(old).close()  # one open file per camera: episodes come in file order
                cursor = cursors[(key, path)] = VideoCursor(path)
            times = float(episode[f"videos/{key}/from_timestamp"]) + timestamps
            array = cursor.take(times, tolerance_s, f"{where}, camera {key!r}")
        elif feature["dtype"] == "image":
            array = decode_images(rows.column(key), f"{where}, camera {key!r}")
        else:
            array = column_array(rows.column(key), f.shape, f.dtype, f"{where}, feature {key!r}")
        if array.shape[1:] != f.shape:
            if f.layout == "CHW" and array.shape[1:] == (f.shape[1], f.shape[2], f.shape[0]):
                array = np.ascontiguousarray(array.transpose(0, 3, 1, 2))
            else:
                raise ValidationError(
                    f"{where}, feature {key!r}: frames of shape {array.shape[1:]}, declared {f.shape}"
                )
        values[f.role][f.name] = array
    if task_field is not None:
        task_index = rows.column("task_index").to_numpy().astype(task_field.np_dtype)
        values[task_field.role][task_field.name] = task_index
    reward = (
        column_array(rows.column(REWARD), reward_field.shape, reward_field.dtype, f"{where}, feature {REWARD!r}")
        if REWARD in source.features
        else np.zeros(n, reward_field.np_dtype)
    )
    terminated = truncated = False
    if DONE in source.features:
        done = column_array(rows.column(DONE), (), "bool", f"{where}, feature {DONE!r}")
        early = np.flatnonzero(done[:-1])
        if early.size:
            raise ValidationError(f"{where}, frame {early[0]}: {DONE!r} is set before the episode's last frame")
        terminated = bool(done[-1])
        truncated = not terminated  # it says it did not end in a terminal state, yet it ended
    if source.record_meta is not None:
        meta = {name: episode[META_COLUMN.format(name=name)] for name in source.record_meta}
    else:
        meta = {"task": source.tasks.get(int(rows.column("task_index")[0].as_py())), "source_episode": index}
    converted = action_out_episode(
        values["observation"],
        values["action"],
        {reward_field.name: reward},
        extras=values["extra"],
        terminated=terminated,
        truncated=truncated,
        meta=meta,
        where=where,
    )
    if converted is None:
        raise ValidationError(f"{where}: one frame and no {DONE!r}: no transition to import")
    return converted
