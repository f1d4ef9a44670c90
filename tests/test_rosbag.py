"""The rosbag importer on bags written by rosbags' own writers (ROS 2 MCAP and sqlite3, ROS 1).

Each bag carries sensors at their own rates with jitter, dropped and
out-of-order messages (header stamps written out of order, as arrival
order is); the imported values are compared with a NumPy alignment written
here, over the messages the test wrote (not el.align).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import episodelake as el

rosbags = pytest.importorskip("rosbags")
imagecodecs = pytest.importorskip("imagecodecs")
from rosbags.rosbag1 import Writer as Writer1  # noqa: E402
from rosbags.rosbag2 import StoragePlugin, Writer  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402

ROS2 = get_typestore(Stores.ROS2_HUMBLE)
ROS1 = get_typestore(Stores.ROS1_NOETIC)
JOINTS = ["shoulder", "elbow", "wrist"]
T0 = 1_700_000_000 * 10**9  # epoch ns


def stamp_of(store, ns):
    time = store.types["builtin_interfaces/msg/Time"]
    return time(sec=ns // 10**9, nanosec=ns % 10**9)


def header(store, ns):
    extra = {"seq": 0} if store is ROS1 else {}  # ROS 1 headers carry a sequence number
    return store.types["std_msgs/msg/Header"](stamp=stamp_of(store, int(ns)), frame_id="base", **extra)


def sensor_times(rng, rate, seconds, drop, shuffle):
    """Jittered sample times (ns after T0) with drops; arrival order with small reorderings."""
    t = np.arange(int(seconds * rate)) / rate + rng.uniform(-0.2, 0.2, int(seconds * rate)) / rate
    t = np.sort(t[rng.random(len(t)) >= drop]) + 0.3 / rate  # every sensor starts a little after 0
    ns = np.round(t * 1e9).astype(np.int64)
    order = np.arange(len(ns))
    if shuffle:
        for s in range(0, len(ns), 4):
            order[s : s + 4] = rng.permutation(order[s : s + 4])
    return ns[order]


def make_messages(rng, seconds=2.0):
    """topic -> list of (stamp ns, kind, payload): joints 100 Hz, camera 15 Hz (PNG + raw), cmd 20 Hz, odom 50 Hz."""
    joints = sensor_times(rng, 100, seconds, 0.1, True)
    camera = sensor_times(rng, 15, seconds, 0.15, True)
    cmd = sensor_times(rng, 20, seconds, 0.1, False)
    odom = sensor_times(rng, 50, seconds, 0.0, False)
    msgs = {
        "/joint_states": [(t, rng.normal(size=(3, 3))) for t in joints],  # position, velocity, effort rows
        "/camera/compressed": [(t, rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)) for t in camera],
        "/camera/raw": [(t, rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)) for t in camera],
        "/cmd_vel": [(t, rng.normal(size=6)) for t in cmd],
        "/odom_x": [(t, rng.normal()) for t in odom],
    }
    return msgs


def build(store, topic, ns, payload, joint_names=JOINTS):
    T = store.types
    if topic == "/joint_states":
        names = list(joint_names)
        order = [JOINTS.index(n) for n in names]
        return "sensor_msgs/msg/JointState", T["sensor_msgs/msg/JointState"](
            header=header(store, ns),
            name=names,
            position=payload[0][order],
            velocity=payload[1][order],
            effort=payload[2][order],
        )
    if topic == "/camera/compressed":
        return "sensor_msgs/msg/CompressedImage", T["sensor_msgs/msg/CompressedImage"](
            header=header(store, ns), format="png", data=np.frombuffer(imagecodecs.png_encode(payload), np.uint8)
        )
    if topic == "/camera/raw":  # written as bgr8: the importer turns it to RGB
        return "sensor_msgs/msg/Image", T["sensor_msgs/msg/Image"](
            header=header(store, ns),
            height=6,
            width=8,
            encoding="bgr8",
            is_bigendian=0,
            step=8 * 3 + 4,  # padded rows
            data=np.concatenate([np.pad(payload[..., ::-1].reshape(6, 24), ((0, 0), (0, 4))).ravel()]).astype(np.uint8),
        )
    if topic == "/cmd_vel":
        V = T["geometry_msgs/msg/Vector3"]
        return "geometry_msgs/msg/Twist", T["geometry_msgs/msg/Twist"](
            linear=V(x=payload[0], y=payload[1], z=payload[2]), angular=V(x=payload[3], y=payload[4], z=payload[5])
        )
    if topic == "/odom_x":
        return "std_msgs/msg/Float64", T["std_msgs/msg/Float64"](data=float(payload))
    if topic == "/episode":
        return "std_msgs/msg/Int32", T["std_msgs/msg/Int32"](data=int(payload))
    raise AssertionError(topic)


HEADERLESS = ("/cmd_vel", "/odom_x", "/episode")  # their time is the bag's receive (log) time


def write_bag(path: Path, kind: str, msgs, markers=()):
    """Write ``msgs`` with rosbags' writer in arrival order.

    A stamped message arrives 1 ms after the latest stamp listed up to it in its topic (so a topic's
    reorderings arrive as listed: header stamps out of order); a headerless one at its listed time,
    which is then its receive time.
    """
    store = ROS1 if kind == "ros1" else ROS2
    events = []
    for topic, items in [*msgs.items(), ("/episode", list(markers))]:
        latest = -(10**18)
        for ns, payload in items:
            latest = max(latest, ns)
            arrival = ns if topic in HEADERLESS else latest + 10**6
            events.append((arrival, topic, ns, payload))
    events.sort(key=lambda e: e[0])
    if kind == "ros1":
        writer = Writer1(path)
    else:
        plugin = StoragePlugin.MCAP if kind == "mcap" else StoragePlugin.SQLITE3
        writer = Writer(path, version=9, storage_plugin=plugin)
    conns = {}
    with writer:
        for arrival, topic, ns, payload in events:
            msgtype, msg = build(store, topic, int(T0 + ns), payload)
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=store)
            data = store.serialize_ros1(msg, msgtype) if kind == "ros1" else store.serialize_cdr(msg, msgtype)
            writer.write(conns[topic], int(T0 + arrival), data)
    return path


def ref_align(times_ns, values, ticks_ns, method):
    """Per tick, a Python loop choosing the sample (latest: last at or before; nearest: closest, ties before)."""
    out, err = [], []
    pairs = list(zip([int(t) for t in times_ns], range(len(times_ns)), strict=True))
    for c in ticks_ns:
        before = [p for p in pairs if p[0] <= c]
        after = [p for p in pairs if p[0] > c]
        b = max(before) if before else None
        a = min(after, key=lambda p: (p[0], -p[1])) if after else None
        if method == "latest" or a is None or (b is not None and c - b[0] <= a[0] - c):
            out.append(values[b[1]])
            err.append((c - b[0]) / 1e9)
        else:
            out.append(values[a[1]])
            err.append((a[0] - c) / 1e9)
    return np.stack([np.asarray(v) for v in out]), np.array(err)


TOPICS = {
    "/joint_states": "observation/joints",
    "/camera/compressed": "observation/camera",
    "/camera/raw": "observation/raw",
    "/odom_x:data": "observation/odom_x",
    "/cmd_vel": "action",
}


def expected(msgs, rate, lo=None, hi=None):
    """The episode the importer must produce, computed from the written messages alone."""
    sel = {
        k: [(t, v) for t, v in items if (lo is None or t >= lo) and (hi is None or t < hi)] for k, items in msgs.items()
    }
    t0 = max(min(t for t, _ in items) for items in sel.values())
    t1 = min(max(t for t, _ in items) for items in sel.values())
    ticks = t0 + np.round(np.arange(0, t1 - t0 + 1, 1e9 / rate)).astype(np.int64)
    out = {}
    for topic, method in (
        ("/joint_states", "nearest"),
        ("/camera/compressed", "latest"),
        ("/camera/raw", "latest"),
        ("/odom_x", "nearest"),
        ("/cmd_vel", "nearest"),
    ):
        times = [t for t, _ in sel[topic]]
        out[topic] = ref_align(times, [v for _, v in sel[topic]], ticks, method)
    return ticks, out


@pytest.mark.parametrize("kind", ["mcap", "sqlite3", "ros1"])
def test_import_matches_the_numpy_alignment_of_the_written_messages(tmp_path, kind):
    rng = np.random.default_rng(7)
    msgs = make_messages(rng)
    bag = write_bag(tmp_path / ("bag.bag" if kind == "ros1" else "bag"), kind, msgs)
    ds = el.importers.import_dataset("rosbag", bag, str(tmp_path / "ds"), topics=TOPICS, rate=10.0, progress=False)
    ticks, want = expected(msgs, 10.0)
    (ep,) = list(ds.episodes())
    data = ep.read()
    n = len(ticks)
    assert ep.length == n - 1 and not ep.terminated and not ep.truncated
    for part, row in (("position", 0), ("velocity", 1), ("effort", 2)):
        np.testing.assert_array_equal(data["observation/joints/" + part], want["/joint_states"][0][: n - 1, row])
    np.testing.assert_array_equal(data["observation/camera"], want["/camera/compressed"][0][: n - 1])
    np.testing.assert_array_equal(data.all_obs["camera"], want["/camera/compressed"][0])  # all n ticks
    np.testing.assert_allclose(data.all_obs["sync/camera"], want["/camera/compressed"][1], atol=1e-12)
    np.testing.assert_array_equal(data["observation/raw"], want["/camera/raw"][0][: n - 1])
    np.testing.assert_array_equal(data["observation/odom_x"], want["/odom_x"][0][: n - 1])
    np.testing.assert_array_equal(data["action"], want["/cmd_vel"][0][: n - 1])
    np.testing.assert_allclose(data["observation/sync/joints"], want["/joint_states"][1][: n - 1], atol=1e-12)
    np.testing.assert_allclose(data["observation/sync/camera"], want["/camera/compressed"][1][: n - 1], atol=1e-12)
    np.testing.assert_allclose(data["extra/sync/action"], want["/cmd_vel"][1][: n - 1], atol=1e-12)
    assert ep.meta["start_time"] == pytest.approx((T0 + ticks[0]) / 1e9)
    assert ep.meta["source_bag"] == str(bag)
    # the sync columns answer SQL: the camera is never staler than one frame period plus jitter and drops
    worst = ds.sql('SELECT max("observation/sync/camera") FROM steps').fetchall()[0][0]
    assert worst == pytest.approx(want["/camera/compressed"][1].max())


def test_split_by_a_message_condition_and_gaps(tmp_path):
    rng = np.random.default_rng(3)
    msgs = make_messages(rng, seconds=3.0)
    markers = [(int(0.2e9), 1), (int(1.0e9), 0), (int(1.6e9), 1)]  # data == 1 starts an episode
    bag = write_bag(tmp_path / "bag", "mcap", msgs, markers)
    report = el.importers.import_report(
        "rosbag", bag, None, topics=TOPICS, rate=10.0, split="/episode:data==1", progress=False
    )
    ds = report.dataset
    bounds = [(int(0.2e9), int(1.6e9)), (int(1.6e9), None)]
    eps = sorted(ds.episodes(), key=lambda e: e.meta["source_episode"])
    assert [e.meta["source_episode"] for e in eps] == [0, 1]
    for ep, (lo, hi) in zip(eps, bounds, strict=True):
        ticks, want = expected(msgs, 10.0, lo, hi)
        assert ep.length == len(ticks) - 1
        np.testing.assert_array_equal(ep.read()["observation/camera"], want["/camera/compressed"][0][: len(ticks) - 1])
    before = sum(1 for items in msgs.values() for t, _ in items if t < bounds[0][0])
    assert report.skipped == {"messages before the first episode start": before}
    assert (report.episodes, report.steps) == (2, sum(e.length for e in eps))
    # a tolerance tighter than the camera's period: raised naming the topic and time, or masked as inf
    with pytest.raises(el.ValidationError, match=r"stream '/camera/compressed' has a gap at step \d+ \(clock time"):
        el.importers.import_dataset(
            "rosbag", bag, None, topics=TOPICS, rate=10.0, tolerance={"observation/camera": 0.02}, progress=False
        )
    ds = el.importers.import_dataset(
        "rosbag",
        bag,
        None,
        topics=TOPICS,
        rate=10.0,
        tolerance={"observation/camera": 0.02},
        on_gap="mask",
        progress=False,
    )
    sync = ds.sql('SELECT "observation/sync/camera" AS s FROM steps').fetchnumpy()["s"]
    assert np.isinf(sync).any() and (sync[np.isfinite(sync)] <= 0.02).all()


def test_clock_topic_ticks_at_each_command(tmp_path):
    """clock='/cmd_vel': one tick per command, so the action's alignment error is 0 and the rest follow it."""
    rng = np.random.default_rng(11)
    msgs = make_messages(rng, seconds=1.5)
    bag = write_bag(tmp_path / "bag", "sqlite3", msgs)
    ds = el.importers.import_dataset("rosbag", bag, None, topics=TOPICS, clock="/cmd_vel", progress=False)
    t0 = max(min(t for t, _ in items) for items in msgs.values())  # every topic has spoken ...
    t1 = min(max(t for t, _ in items) for items in msgs.values())  # ... until the first one stops
    ticks = np.array(sorted(t for t, _ in msgs["/cmd_vel"] if t0 <= t <= t1))
    data = next(iter(ds.episodes())).read()
    want, err = ref_align(
        [t for t, _ in msgs["/joint_states"]], [v for _, v in msgs["/joint_states"]], ticks, "nearest"
    )
    np.testing.assert_array_equal(data.all_obs["joints/velocity"], want[:, 1])
    np.testing.assert_allclose(data.all_obs["sync/joints"], err, atol=1e-12)
    assert (data["extra/sync/action"] == 0).all()


def test_max_sync_quarantines_the_bag_whose_camera_dropped_frames(tmp_path):
    rng = np.random.default_rng(13)
    msgs = make_messages(rng, seconds=2.0)
    dropped = {**msgs, "/camera/compressed": [(t, v) for t, v in msgs["/camera/compressed"] if not 0.8e9 <= t < 1.4e9]}
    bags = [write_bag(tmp_path / "good", "mcap", msgs), write_bag(tmp_path / "dropped", "mcap", dropped)]
    report = el.importers.import_report(
        "rosbag", bags, str(tmp_path / "ds"), topics=TOPICS, rate=10.0, on_gap="mask",
        tolerance={"observation/camera": 0.25}, max_sync={"observation/camera": 0.15}, progress=False,
    )  # fmt: skip
    ds = report.dataset
    assert [e.meta["source_bag"] for e in ds.episodes()] == [str(bags[0])]
    (held,) = ds.quality.quarantine().episodes()
    assert held.meta["source_bag"] == str(bags[1]) and report.quarantined == 1
    failed = ds.quality.quarantine().sql("SELECT checks_failed FROM episodes").fetchall()
    assert failed == [(["observation/sync/camera: max"],)]


def test_bad_input_names_topic_and_field(tmp_path):
    rng = np.random.default_rng(1)
    bag = write_bag(tmp_path / "bag", "sqlite3", make_messages(rng, seconds=1.0))
    with pytest.raises(el.ValidationError, match=r"topic '/nope' is not in the bag"):
        el.importers.import_dataset("rosbag", bag, None, topics=["/nope=action"], rate=10.0)
    with pytest.raises(el.ArgumentError, match="map one topic to the action role"):
        el.importers.import_dataset("rosbag", bag, None, topics=["/joint_states"], rate=10.0)
    with pytest.raises(el.ArgumentError, match="rate=HZ"):
        el.importers.import_dataset("rosbag", bag, None, topics=["/cmd_vel=action"])
    with pytest.raises(el.ArgumentError, match="has no field 'nodata'"):
        el.importers.import_dataset("rosbag", bag, None, topics=["/cmd_vel=action", "/odom_x:nodata"], rate=10.0)


def test_cli_import_rosbag(tmp_path):
    """`episodelake import rosbag` in a real subprocess: exit status, then the dataset on disk."""
    rng = np.random.default_rng(5)
    msgs = make_messages(rng, seconds=1.0)
    bag = write_bag(tmp_path / "bag", "mcap", msgs)
    dst = tmp_path / "ds"
    topics = [f"--topic={spec}={key}" for spec, key in TOPICS.items()]
    cmd = ["import", "rosbag", str(bag), str(dst), *topics, "--rate", "10", "--quiet", "--max-sync", "0.001"]
    run = subprocess.run([sys.executable, "-m", "episodelake.cli", *cmd], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "imported 1 episodes" in run.stdout and "quarantined: 1" in run.stdout  # no sync within 1 ms
    ds = el.Dataset.open(str(dst)).quality.quarantine()
    ticks, want = expected(msgs, 10.0)
    (ep,) = list(ds.episodes())
    np.testing.assert_array_equal(
        ep.read()["observation/joints/position"], want["/joint_states"][0][: len(ticks) - 1, 0]
    )
