"""ROS bag import rate: episodes/s and messages/s of ``import rosbag``, beside rosbags' own read of the same bags.

Bags: ``--bags`` ROS 2 bags (``--storage mcap|sqlite3``) written by rosbags'
writer, each ``--seconds`` long: ``/joint_states`` (7 joints, 100 Hz,
jittered stamps, 5 % dropped, arrival reordered in blocks of 4),
``/camera/compressed`` (JPEG ``--size`` x ``--size``, 15 Hz, 5 % dropped),
``/cmd_vel`` (Twist, 50 Hz) and ``/odom_x`` (Float64, 50 Hz). Rows:

* rosbags: ``AnyReader.messages`` + ``deserialize`` over every message (the
  floor any rosbags-based importer pays);
* episodelake: ``import_report("rosbag", bags, dst, rate=--rate)`` (one
  episode per bag, every topic aligned to the clock, JPEG frames decoded
  and stored raw; written to a local folder), and its ``--dry-run``.

    python benchmarks/bench_rosbag.py --bags 20 --seconds 20 --rate 10
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import imagecodecs
import numpy as np
from rosbags.highlevel import AnyReader
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from episodelake.importers import import_report

STORE = get_typestore(Stores.ROS2_HUMBLE)
T = STORE.types


def header(ns: int):
    return T["std_msgs/msg/Header"](
        stamp=T["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9), frame_id=""
    )


def times(rng, rate: float, seconds: float, drop: float, shuffle: bool) -> np.ndarray:
    n = int(rate * seconds)
    t = np.arange(n) / rate + rng.uniform(-0.2, 0.2, n) / rate + 0.5 / rate
    t = t[rng.random(n) >= drop]
    ns = np.round(t * 1e9).astype(np.int64) + 1_700_000_000 * 10**9
    if shuffle:
        for s in range(0, len(ns), 4):
            ns[s : s + 4] = rng.permutation(ns[s : s + 4])
    return ns


def write_bag(path: Path, rng, seconds: float, size: int, storage: str) -> int:
    frames = [
        imagecodecs.jpeg8_encode(rng.integers(0, 255, (size, size, 3), dtype=np.uint8), level=90) for _ in range(8)
    ]
    events = []
    for ns in times(rng, 100, seconds, 0.05, True):
        msg = T["sensor_msgs/msg/JointState"](
            header=header(int(ns)),
            name=[f"j{i}" for i in range(7)],
            position=rng.normal(size=7),
            velocity=rng.normal(size=7),
            effort=rng.normal(size=7),
        )
        events.append((int(ns), "/joint_states", "sensor_msgs/msg/JointState", msg))
    for ns in times(rng, 15, seconds, 0.05, False):
        data = np.frombuffer(frames[int(rng.integers(0, 8))], np.uint8)
        msg = T["sensor_msgs/msg/CompressedImage"](header=header(int(ns)), format="jpeg", data=data)
        events.append((int(ns), "/camera/compressed", "sensor_msgs/msg/CompressedImage", msg))
    v = T["geometry_msgs/msg/Vector3"]
    for ns in times(rng, 50, seconds, 0.0, False):
        msg = T["geometry_msgs/msg/Twist"](
            linear=v(x=1.0, y=0.0, z=0.0), angular=v(x=0.0, y=0.0, z=float(rng.normal()))
        )
        events.append((int(ns), "/cmd_vel", "geometry_msgs/msg/Twist", msg))
        events.append((int(ns), "/odom_x", "std_msgs/msg/Float64", T["std_msgs/msg/Float64"](data=float(rng.normal()))))
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    conns = {}
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        for ns, topic, msgtype, msg in events:
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=STORE)
            writer.write(
                conns[topic], ns if topic in ("/cmd_vel", "/odom_x") else ns + 10**6, STORE.serialize_cdr(msg, msgtype)
            )
    return len(events)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bags", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--storage", choices=["mcap", "sqlite3"], default="mcap")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_rosbag_"))
    try:
        rng = np.random.default_rng(0)
        bags = [root / f"bag{i}" for i in range(args.bags)]
        messages = sum(write_bag(b, rng, args.seconds, args.size, args.storage) for b in bags)
        t0 = time.perf_counter()
        for b in bags:
            with AnyReader([b]) as reader:
                for conn, _, raw in reader.messages():
                    reader.deserialize(raw, conn.msgtype)
        read_s = time.perf_counter() - t0
        topics = {
            "/joint_states": "observation/joints",
            "/camera/compressed": "observation/camera",
            "/odom_x:data": "observation/odom_x",
            "/cmd_vel": "action",
        }
        t0 = time.perf_counter()
        dry = import_report("rosbag", bags, None, topics=topics, rate=args.rate, dry_run=True, progress=False)
        dry_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = import_report("rosbag", bags, str(root / "ds"), topics=topics, rate=args.rate, progress=False)
        import_s = time.perf_counter() - t0
        print(
            f"{args.bags} {args.storage} bags x {args.seconds:g} s, {messages} messages, "
            f"{report.bytes_in / 2**20:.1f} MiB"
        )
        print(f"{'row':<34}{'seconds':>9}{'episodes/s':>12}{'messages/s':>12}")
        for name, s in (
            ("rosbags read + deserialize", read_s),
            ("episodelake import --dry-run", dry_s),
            (f"episodelake import ({report.steps} steps)", import_s),
        ):
            print(f"{name:<34}{s:>9.2f}{args.bags / s:>12.1f}{messages / s:>12.0f}")
        print(report)
        assert dry.episodes == report.episodes == args.bags
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
