"""ROS bags -> episodes on a control clock, read with ``rosbags`` (pure Python; no ROS install).

Reads ROS 2 bags (a folder with ``metadata.yaml``, MCAP or sqlite3 storage)
and ROS 1 ``.bag`` files through ``rosbags.highlevel.AnyReader``. ``src`` is
one bag or a list of bags.

**Topics -> fields.** ``topics`` maps a topic spec to a field key
(``{"/joint_states": "observation/joints", "/cmd_vel": "action"}``), or is a
list of specs ``"TOPIC[:PATH][=KEY]"`` (the CLI's ``--topic``; without
``=KEY`` the key is ``observation/<topic without its leading slash>``). A
message becomes values by its type:

* ``sensor_msgs/Image``: ``uint8`` (``rgb8``, ``bgr8`` turned to RGB,
  ``rgba8``, ``bgra8`` to RGBA, ``mono8``), ``uint16`` (``mono16``,
  ``16UC1``) or ``float32`` (``32FC1``), shape ``(H, W, C)``, layout ``HWC``.
* ``sensor_msgs/CompressedImage``: JPEG or PNG decoded with ``imagecodecs``
  (the ``camera`` extra) to ``uint8`` ``HWC``; only the frames the clock
  chooses are decoded. The encoded bytes are not stored as they are: a
  camera field's frames are encoded by the write path from pixels (their
  statistics and checksums are of the pixels), so a ``codec=`` given in
  ``camera_options`` re-encodes; without it frames are stored raw.
* ``sensor_msgs/JointState``: the key gets ``/position``, ``/velocity``
  and ``/effort`` (``float64``, one entry per joint; empty arrays are left
  out), joints in the order of the topic's first message, later messages
  reordered by ``name`` (a joint missing is a ValidationError naming topic
  and time).
* ``geometry_msgs/Twist`` and ``TwistStamped``: ``float64[6]``, linear
  x, y, z then angular x, y, z.
* ``:PATH`` (``"/odom:pose.pose.position"``): the message attribute at that
  dotted path; otherwise any other message: every numeric field, depth
  first in declaration order, ``header`` left out, flattened into one
  ``float64`` vector.

A message's time is its ``header.stamp`` when it has one (the sensor time;
these arrive out of order, which alignment sorts), else the bag's receive
time (``time="log"`` uses receive time for every topic).

**Episodes.** ``split="bag"`` (default): one episode per bag.
``split="/topic"``: every message on that topic starts an episode (messages
before the first are not imported; ``import_report`` counts them).
``split="/topic:PATH==VALUE"`` (or ``(topic, predicate)`` in Python): a
message on that topic whose ``PATH`` equals ``VALUE`` (compared as a number
when it parses as one) starts an episode.

**Clock.** ``rate=HZ``: ticks every ``1/HZ`` s from the moment every mapped
topic has a sample in the episode to the moment the first of them stops
(the last first sample to the first last sample), or ``clock="/topic"``:
one tick per message on that topic inside that same window. Every field is aligned to the ticks by
:func:`episodelake.align` with ``method`` (default ``"latest"`` for images
and ``"nearest"`` otherwise; a string or a mapping key -> method),
``tolerance`` (seconds; a number or a mapping key -> seconds) and
``on_gap``. Each topic's alignment error is stored as its own step column,
``<role>/sync/<name>`` (observations: ``observation/sync/<name>``; actions:
``extra/sync/<name>``), float64 seconds, ``inf`` on a masked gap: gate it
with ``FieldSpec(max=...)`` or an ``el.Check`` over ``steps``. ``max_sync=SECONDS``
(or a mapping field key -> seconds) declares that gate on the sync columns:
an episode with a step beyond it is quarantined (``sync_on_fail``:
``"quarantine"``, ``"reject"`` or ``"warn"``), e.g. one whose camera dropped
frames, with ``on_gap="mask"`` for gaps (their error is ``inf``).

**Rows.** ``n`` ticks are ``n`` observations and ``n`` commands, action-out
(:func:`episodelake.importers.common.action_out_episode`): the last
command led nowhere recorded, so an episode keeps ``n - 1`` transitions
and is neither terminated nor truncated; reward is all zeros (bags have
none). At least one topic must map to the action role. Meta:
``source_bag`` (its path), ``source_episode`` (index within the bag),
``start_time`` (the first tick, seconds since the epoch).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.align import align
from ..core.errors import ArgumentError, MissingDependencyError, ValidationError
from ..core.schema import DatasetSchema, FieldSpec
from ..dataset import Dataset
from .common import SOURCE_EPISODE, action_out_episode, write_import
from .report import ACTIVE

IMAGE, COMPRESSED, JOINTS, TWIST, TWIST_STAMPED = (
    "sensor_msgs/msg/Image",
    "sensor_msgs/msg/CompressedImage",
    "sensor_msgs/msg/JointState",
    "geometry_msgs/msg/Twist",
    "geometry_msgs/msg/TwistStamped",
)
JOINT_PARTS = ("position", "velocity", "effort")
ENCODINGS: dict[str, tuple[str, int]] = {  # Image encoding -> (dtype, channels)
    "rgb8": ("uint8", 3),
    "bgr8": ("uint8", 3),
    "rgba8": ("uint8", 4),
    "bgra8": ("uint8", 4),
    "mono8": ("uint8", 1),
    "8UC1": ("uint8", 1),
    "mono16": ("uint16", 1),
    "16UC1": ("uint16", 1),
    "32FC1": ("float32", 1),
}
SOURCE_BAG = FieldSpec("source_bag", (), "str", role="meta", description="the bag an episode was read from")
START_TIME = FieldSpec(
    "start_time", (), "float64", role="meta", description="first clock tick, seconds since the epoch"
)
NS = 1_000_000_000


@dataclasses.dataclass
class TopicMap:
    """One topic spec: its topic, optional attribute path, role and field name."""

    topic: str
    path: str | None
    role: str
    name: str

    @classmethod
    def parse(cls, spec: str, key: str | None = None) -> TopicMap:
        """``"TOPIC[:PATH][=KEY]"`` (``key`` given apart wins); KEY is ``role`` or ``role/name``."""
        if key is None and "=" in spec:
            spec, key = spec.split("=", 1)
        topic, _, path = spec.partition(":")
        if not topic.startswith("/"):
            raise ArgumentError(f"rosbag: topic spec {spec!r}: a topic starts with '/'")
        if key is None:
            key = "observation/" + topic.strip("/")
        role, _, name = key.partition("/")
        if role not in ("observation", "action"):
            raise ArgumentError(f"rosbag: topic {topic!r} maps to {key!r}; use observation[/NAME] or action[/NAME]")
        return cls(topic, path or None, role, name or role)

    @property
    def label(self) -> str:
        """The spec as written back: ``TOPIC[:PATH]``."""
        return self.topic + (f":{self.path}" if self.path else "")


@dataclasses.dataclass
class Series:
    """A topic's samples in one bag: times (ns), values per part ('' for one value, joint parts), raw images."""

    times: list[int] = dataclasses.field(default_factory=list)
    parts: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)
    images: list[Any] = dataclasses.field(default_factory=list)  # (msgtype, msg) decoded when chosen
    joint_names: list[str] | None = None


def load(
    src: str | os.PathLike | Sequence[str | os.PathLike],
    dst: str | None = None,
    *,
    topics: Mapping[str, str] | Sequence[str],
    rate: float | None = None,
    clock: str | None = None,
    split: str | tuple[str, Callable[[Any], bool]] = "bag",
    method: str | Mapping[str, str] | None = None,
    tolerance: float | Mapping[str, float] | None = None,
    on_gap: str = "raise",
    time: str = "header",
    camera_options: Mapping[str, Any] | None = None,
    max_sync: float | Mapping[str, float] | None = None,
    sync_on_fail: str = "quarantine",
    progress: bool | None = None,
    **create_options: Any,
) -> Dataset:
    """Import ROS bags into a new dataset at ``dst``; the rules are the module's.

    Raises:
        MissingDependencyError: ``rosbags`` (the ``rosbag`` extra) is not installed.
        ArgumentError: bad topic specs, no action topic, neither or both of ``rate`` and ``clock``.
        ValidationError: a topic missing from a bag, an undecodable message, a joint missing, a gap
            beyond ``tolerance`` with ``on_gap="raise"`` (each names the topic and time), or no tick.
    """
    maps = (
        [TopicMap.parse(s, k) for s, k in topics.items()]
        if isinstance(topics, Mapping)
        else [TopicMap.parse(s) for s in topics]
    )
    if not maps:
        raise ArgumentError("rosbag: map at least one topic (topics= / --topic)")
    if not any(m.role == "action" for m in maps):
        raise ArgumentError("rosbag: map one topic to the action role (e.g. '/cmd_vel=action'): episodes need actions")
    keys = [f"{m.role}/{m.name}" for m in maps]
    if len(set(keys)) != len(keys):
        raise ArgumentError(f"rosbag: two topic specs map to the same field: {keys}")
    if (rate is None) == (clock is None):
        raise ArgumentError(
            "rosbag: give the control clock as rate=HZ (--rate) or clock=TOPIC (--clock-topic), one of them"
        )
    if rate is not None and not rate > 0:
        raise ArgumentError(f"rosbag: rate={rate!r} must be > 0 (Hz)")
    if time not in ("header", "log"):
        raise ArgumentError(f"rosbag: time={time!r}; use 'header' or 'log'")
    bags = [Path(os.fspath(src))] if isinstance(src, (str, os.PathLike)) else [Path(os.fspath(s)) for s in src]
    splitter = _splitter(split)
    stats: dict[str, Any] = {"messages": 0}
    episodes = _episodes(bags, maps, rate, clock, splitter, method, tolerance, on_gap, time, stats)
    first = next(episodes, None)
    if first is None:
        raise ValidationError(f"rosbag: {[str(b) for b in bags]}: no episode to import")
    schema = _schema(first, maps, camera_options or {}, max_sync, sync_on_fail)
    info = {
        "source": {
            "format": "rosbag",
            "bags": [str(b) for b in bags],
            "topics": {m.label: k for m, k in zip(maps, keys, strict=True)},
        }
    }

    def chained() -> Iterator[dict[str, Any]]:
        yield first
        yield from episodes

    return write_import(
        schema, chained(), dst, info=info, total=None, desc="rosbag", progress=progress, **create_options
    )


def _rosbags() -> Any:
    try:
        from rosbags.highlevel import AnyReader
    except ImportError as exc:  # pragma: no cover - the extra is installed in tests
        raise MissingDependencyError("the rosbag importer needs rosbags: pip install 'episodelake[rosbag]'") from exc
    return AnyReader


def _splitter(split: str | tuple[str, Callable[[Any], bool]]) -> tuple[str, Callable[[Any], bool]] | None:
    """None for one episode per bag, else (topic, does this message start an episode)."""
    if isinstance(split, tuple):
        return split
    if split == "bag":
        return None
    if not split.startswith("/"):
        raise ArgumentError(f"rosbag: split={split!r}; use 'bag', a topic or 'TOPIC:PATH==VALUE'")
    topic, _, cond = split.partition(":")
    if not cond:
        return topic, lambda msg: True
    if "==" not in cond:
        raise ArgumentError(f"rosbag: split condition {cond!r}; write PATH==VALUE")
    path, want = (s.strip() for s in cond.split("==", 1))
    try:
        number: float | None = float(want)
    except ValueError:
        number = None

    def starts(msg: Any) -> bool:
        got = _attr(msg, path, topic)
        return bool(float(got) == number) if number is not None else str(got) == want

    return topic, starts


def _attr(msg: Any, path: str, topic: str) -> Any:
    value = msg
    for part in path.split("."):
        if not hasattr(value, part):
            raise ArgumentError(f"rosbag: topic {topic!r}: message {msg.__msgtype__} has no field {path!r}")
        value = getattr(value, part)
    return value


def _stamp(msg: Any, log_ns: int, time: str) -> int:
    header = getattr(msg, "header", None) if time == "header" else None
    stamp = getattr(header, "stamp", None)
    if stamp is None:
        return log_ns
    sec = getattr(stamp, "sec", getattr(stamp, "secs", 0))
    nsec = getattr(stamp, "nanosec", getattr(stamp, "nsecs", 0))
    return int(sec) * NS + int(nsec)


def _numeric(msg: Any) -> list[float]:
    """Every numeric field of ``msg``, depth first in declaration order, header left out."""
    out: list[float] = []
    for f in dataclasses.fields(msg):
        if f.name == "header":
            continue
        v = getattr(msg, f.name)
        if isinstance(v, bool | int | float | np.number):
            out.append(float(v))
        elif isinstance(v, np.ndarray) and v.dtype.kind in "biuf":
            out.extend(v.astype(np.float64).ravel().tolist())
        elif dataclasses.is_dataclass(v):
            out.extend(_numeric(v))
    return out


def _value(m: TopicMap, msgtype: str, msg: Any, series: Series, t_ns: int) -> None:
    """Append one message's values to ``series`` (images kept encoded until the clock chooses them)."""
    if m.path is not None:
        v = np.asarray(_attr(msg, m.path, m.topic))
        if dataclasses.is_dataclass(_attr(msg, m.path, m.topic)):
            v = np.asarray(_numeric(_attr(msg, m.path, m.topic)), np.float64)
        series.parts.setdefault("", []).append(v)
    elif msgtype in (IMAGE, COMPRESSED):
        series.images.append((msgtype, msg))
    elif msgtype == JOINTS:
        names = list(msg.name)
        if series.joint_names is None:
            series.joint_names = names
        if names != series.joint_names:
            missing = [n for n in series.joint_names if n not in names]
            if missing:
                raise ValidationError(f"rosbag: topic {m.topic!r} at {t_ns / NS:.9f} s: joint(s) {missing} missing")
            order = [names.index(n) for n in series.joint_names]
        else:
            order = None
        for part in JOINT_PARTS:
            arr = np.asarray(getattr(msg, part), np.float64)
            if len(arr):
                series.parts.setdefault(part, []).append(arr[order] if order is not None else arr)
    elif msgtype in (TWIST, TWIST_STAMPED):
        tw = msg.twist if msgtype == TWIST_STAMPED else msg
        series.parts.setdefault("", []).append(
            np.array([tw.linear.x, tw.linear.y, tw.linear.z, tw.angular.x, tw.angular.y, tw.angular.z], np.float64)
        )
    else:
        series.parts.setdefault("", []).append(np.asarray(_numeric(msg), np.float64))
    series.times.append(t_ns)


def decode_image(msgtype: str, msg: Any, where: str) -> np.ndarray:
    """A ``sensor_msgs/Image`` or ``CompressedImage`` as an ``HWC`` array (see the module's rules)."""
    if msgtype == COMPRESSED:
        try:
            import imagecodecs
        except ImportError as exc:  # pragma: no cover
            raise MissingDependencyError(
                "CompressedImage topics need imagecodecs: pip install 'episodelake[camera]'"
            ) from exc
        data = bytes(msg.data)
        fmt = str(msg.format).lower()
        try:
            if "png" in fmt or data[:4] == b"\x89PNG":
                img = imagecodecs.png_decode(data)
            else:
                img = imagecodecs.jpeg8_decode(data)
        except Exception as exc:
            raise ValidationError(f"rosbag: {where}: CompressedImage ({msg.format!r}) does not decode: {exc}") from exc
        return img[..., None] if img.ndim == 2 else img
    enc = str(msg.encoding)
    if enc not in ENCODINGS:
        raise ValidationError(f"rosbag: {where}: Image encoding {enc!r} is not read; known: {sorted(ENCODINGS)}")
    dtype, channels = ENCODINGS[enc]
    dt = np.dtype(dtype).newbyteorder(">" if msg.is_bigendian else "<")
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    raw = np.frombuffer(bytes(msg.data), np.uint8)
    if len(raw) < h * step:
        raise ValidationError(f"rosbag: {where}: Image data has {len(raw)} bytes, height*step is {h * step}")
    rows = raw[: h * step].reshape(h, step)[:, : w * channels * dt.itemsize]
    img = np.ascontiguousarray(rows).view(dt).reshape(h, w, channels).astype(dtype)
    if enc in ("bgr8", "bgra8"):
        img = img[..., [2, 1, 0, 3][:channels]]
    return img


def _episodes(
    bags: list[Path],
    maps: list[TopicMap],
    rate: float | None,
    clock: str | None,
    splitter: tuple[str, Callable[[Any], bool]] | None,
    method: str | Mapping[str, str] | None,
    tolerance: float | Mapping[str, float] | None,
    on_gap: str,
    time: str,
    stats: dict[str, Any],
) -> Iterator[dict[str, Any]]:
    AnyReader = _rosbags()
    for bag in bags:
        if not bag.exists():
            raise ValidationError(f"rosbag: {bag}: no such bag")
        series = {m.label: Series() for m in maps}
        clock_times: list[int] = []
        starts: list[int] = []
        with AnyReader([bag]) as reader:
            wanted = {m.topic for m in maps} | ({clock} if clock else set()) | ({splitter[0]} if splitter else set())
            have = {c.topic for c in reader.connections}
            for topic in sorted(wanted - have):
                raise ValidationError(f"rosbag: {bag}: topic {topic!r} is not in the bag (it has {sorted(have)})")
            conns = [c for c in reader.connections if c.topic in wanted]
            by_topic: dict[str, list[TopicMap]] = {}
            for m in maps:
                by_topic.setdefault(m.topic, []).append(m)
            for conn, log_ns, raw in reader.messages(connections=conns):
                msg = reader.deserialize(raw, conn.msgtype)
                t_ns = _stamp(msg, log_ns, time)
                stats["messages"] += 1
                for m in by_topic.get(conn.topic, ()):
                    _value(m, conn.msgtype, msg, series[m.label], t_ns)
                if conn.topic == clock:
                    clock_times.append(t_ns)
                if splitter is not None and conn.topic == splitter[0] and splitter[1](msg):
                    starts.append(t_ns)
        bounds = _bounds(series, starts, splitter is not None, stats)
        for number, (lo, hi) in enumerate(bounds):
            yield _episode(bag, number, lo, hi, maps, series, rate, clock_times, method, tolerance, on_gap)


def _bounds(series: dict[str, Series], starts: list[int], split: bool, stats: dict[str, Any]) -> list[tuple[int, int]]:
    """Each episode's [start, end) in ns: the whole bag, or from each start message to the next."""
    end = max((max(s.times) for s in series.values() if s.times), default=0) + 1
    if not split:
        return [(-(2**62), 2**62)]
    starts = sorted(set(starts))
    report = ACTIVE.get()
    if report is not None:
        before = sum(sum(1 for t in s.times if not starts or t < starts[0]) for s in series.values())
        report.skip("messages before the first episode start", before)
    return [(a, b) for a, b in zip(starts, [*starts[1:], max(end, starts[-1] + 1)], strict=True)] if starts else []


def _episode(
    bag: Path,
    number: int,
    lo: int,
    hi: int,
    maps: list[TopicMap],
    series: dict[str, Series],
    rate: float | None,
    clock_times: list[int],
    method: str | Mapping[str, str] | None,
    tolerance: float | Mapping[str, float] | None,
    on_gap: str,
) -> dict[str, Any]:
    where = f"{bag} episode {number}"
    picked: dict[str, np.ndarray] = {}
    for m in maps:
        t = np.asarray(series[m.label].times, np.int64)
        inside = (t >= lo) & (t < hi)
        if not inside.any():
            raise ValidationError(f"rosbag: {where}: topic {m.label!r} has no message in the episode")
        picked[m.label] = inside
    t0 = max(int(np.asarray(series[m.label].times)[picked[m.label]].min()) for m in maps)
    t1 = min(int(np.asarray(series[m.label].times)[picked[m.label]].max()) for m in maps)
    if rate is not None:
        ticks_ns = t0 + np.round(np.arange(0, max(t1 - t0, -1) + 1, NS / rate)).astype(np.int64)
    else:
        ct = np.unique(np.asarray(clock_times, np.int64))
        ticks_ns = ct[(ct >= max(lo, t0)) & (ct < hi) & (ct <= t1)]
    if len(ticks_ns) < 2:
        raise ValidationError(f"rosbag: {where}: the control clock has {len(ticks_ns)} tick(s) in the episode; need 2")
    base = int(ticks_ns[0])
    ticks = (ticks_ns - base) / NS
    values: dict[str, dict[str, np.ndarray]] = {"observation": {}, "action": {}}
    sync: dict[str, dict[str, np.ndarray]] = {"observation": {}, "action": {}}
    for m in maps:
        s = series[m.label]
        key = f"{m.role}/{m.name}"
        inside = picked[m.label]
        secs = (np.asarray(s.times, np.int64)[inside] - base) / NS
        meth = method.get(key) if isinstance(method, Mapping) else method
        tol = tolerance.get(key) if isinstance(tolerance, Mapping) else tolerance
        try:
            if s.images:
                meth = meth or "latest"
                if meth == "linear":
                    raise ArgumentError(f"rosbag: {key}: images align by 'latest' or 'nearest', not 'linear'")
                pos = np.flatnonzero(inside)
                a = align({m.label: (secs, pos)}, ticks, method=meth, tolerance=tol, on_gap=on_gap)  # type: ignore[arg-type]
                chosen = a.values[m.label]
                frames = {}
                for i in np.unique(chosen[a.valid[m.label]]):
                    msgtype, msg = s.images[int(i)]
                    frames[int(i)] = decode_image(msgtype, msg, f"{where}, topic {m.label!r}")
                shape = next(iter(frames.values())).shape if frames else None
                if shape is None:
                    raise ValidationError(f"rosbag: {where}: topic {m.label!r}: no frame chosen")
                dtype = next(iter(frames.values())).dtype
                out = np.zeros((len(ticks), *shape), dtype)
                for row, (i, ok) in enumerate(zip(chosen, a.valid[m.label], strict=True)):
                    if ok:
                        f = frames[int(i)]
                        if f.shape != shape:
                            raise ValidationError(
                                f"rosbag: {where}: topic {m.label!r} at {s.times[int(i)] / NS:.9f} s: "
                                f"frame shape {f.shape} differs from {shape}"
                            )
                        out[row] = f
                values[m.role][m.name] = out
                sync[m.role][m.name] = a.error[m.label]
                continue
            for part, rows in s.parts.items():
                if len(rows) != len(s.times):
                    raise ValidationError(
                        f"rosbag: {where}: topic {m.label!r}: {part or 'value'} is empty in some messages"
                    )
                arrs = [r for r, ok in zip(rows, inside, strict=True) if ok]
                shapes = {a.shape for a in arrs}
                if len(shapes) > 1:
                    raise ValidationError(
                        f"rosbag: {where}: topic {m.label!r} {part or 'value'}: values of shapes {sorted(shapes)}"
                    )
                v = np.stack(arrs)
                if v.dtype.kind in "iub" and (meth or "nearest") == "linear":
                    v = v.astype(np.float64)
                a = align({m.label: (secs, v)}, ticks, method=meth or "nearest", tolerance=tol, on_gap=on_gap)  # type: ignore[arg-type]
                values[m.role][f"{m.name}/{part}" if part else m.name] = a.values[m.label]
                sync[m.role][m.name] = a.error[m.label]
        except ValidationError as exc:
            raise ValidationError(f"rosbag: {where}: {exc} (times are seconds after {base / NS:.9f} s)") from exc
    n = len(ticks)
    episode = action_out_episode(
        {**values["observation"], **{f"sync/{k}": v for k, v in sync["observation"].items()}},
        values["action"],
        {"reward": np.zeros(n, np.float32)},
        extras={f"sync/{k}": v for k, v in sync["action"].items()},
        meta={"source_bag": str(bag), "source_episode": number, "start_time": base / NS},
        where=where,
    )
    assert episode is not None  # n >= 2
    return episode


def _owner(role: str) -> str:
    """The role of the field a sync column measures: actions' sync columns are extras."""
    return "action" if role == "extra" else role


def _schema(
    first: Mapping[str, Any],
    maps: list[TopicMap],
    camera_options: Mapping[str, Any],
    max_sync: float | Mapping[str, float] | None,
    sync_on_fail: str,
) -> DatasetSchema:
    """The schema the first episode spells; images become HWC camera fields with ``camera_options``."""
    fields: list[FieldSpec] = []
    for plural, role in (("observations", "observation"), ("actions", "action"), ("extras", "extra")):
        for name, arr in first.get(plural, {}).items():
            image = arr.ndim == 4 and not name.startswith("sync/")
            opts: dict[str, Any] = {"layout": "HWC", **camera_options} if image else {}
            if name.startswith("sync/") and max_sync is not None:
                owner, measured = _owner(role), name[len("sync/") :]
                key = owner if measured == owner else f"{owner}/{measured}"  # the measured field's key
                limit = max_sync.get(key) if isinstance(max_sync, Mapping) else max_sync
                if limit is not None:
                    opts = {"max": float(limit), "on_fail": sync_on_fail}
            fields.append(FieldSpec(name, tuple(arr.shape[1:]), arr.dtype, role=role, **opts))
    fields.append(FieldSpec("reward", (), "float32", role="reward"))
    fields += [SOURCE_BAG, SOURCE_EPISODE, START_TIME]
    return DatasetSchema(fields)
