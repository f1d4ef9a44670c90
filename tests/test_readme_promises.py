"""README promises that need their own proof: each test names the sentence it checks.

Ground truth is computed from the raw arrays the tests generate (tests/reference.py) or from files on disk,
never from the code under test. Damage to a table is made the way a buggy writer would leave it: the
episode rows are rewritten through deltalake itself, so every table-file check still passes and only the
targeted per-episode check can report it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import episodelake as el
from episodelake.cli.main import build_parser, main
from episodelake.storage import table

from .conftest import build_robot_dataset, robot_schema
from .reference import random_episode
from .test_query import count_opened
from .test_sampling import make_dataset, raw_by_id
from .test_sampling_transitions import check_transitions

ROOT = Path(__file__).resolve().parents[1]


# ---- "validate() audits table vs tensors, lengths, flags, statistics and per-episode checksums"


@pytest.fixture
def healthy(tmp_path):
    """6 reference episodes in 3 commits, partitioned by task; validate() finds nothing."""
    path = str(tmp_path / "ds")
    build_robot_dataset(path, seed=7, episodes=6, per_commit=2, max_length=30)
    assert el.Dataset.open(path).maintenance.validate().ok
    return path


def rewrite_rows(path: str, change) -> int:
    """Rewrite the episode table with ``change(rows)`` applied to row 2; return that row's episode id."""
    table = DeltaTable(f"{path}/episodes").to_pyarrow_table()
    rows = table.to_pylist()
    change(rows, rows[2])
    damaged = pa.Table.from_pylist(rows, schema=table.schema)
    write_deltalake(f"{path}/episodes", damaged, mode="overwrite", partition_by=["task"])
    return rows[2]["episode_id"]


def bump(column: str, by: float, channel: int = 0):
    def change(rows, row):
        row[column][channel] += by

    return change


def setter(**values):
    def change(rows, row):
        row.update(values)

    return change


def first_state_value_changed(rows, row):
    row["observation/state"][0][0] += 0.25  # a per-step table value: its statistics no longer match


DAMAGE = {
    # length disagrees with the per-step lists (table), the tensor rows' CRC-32 and their statistics
    "length+1": (lambda rows, row: row.update(length=row["length"] + 1), {"length", "checksum", "stats"}),
    "length-1": (lambda rows, row: row.update(length=row["length"] - 1), {"length", "checksum", "stats"}),
    "length 0": (setter(length=0), {"length"}),
    "flags": (setter(terminated=True, truncated=True), {"flags"}),
    "reward sum": (bump("stats/reward/sum", 1.0), {"stats"}),
    "reward count": (lambda rows, row: row.update({"stats/reward/count": row["stats/reward/count"] + 1}), {"stats"}),
    "camera max": (bump("stats/observation/camera/max", 0.5, channel=1), {"stats"}),
    "state value": (first_state_value_changed, {"stats"}),
    "return": (lambda rows, row: row.update({"return": row["return"] + 1.0}), {"stats"}),
    "duplicate id": (lambda rows, row: rows.append(dict(row)), {"ids"}),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_validate_reports_each_kind_of_damage_naming_the_episode(healthy, damage, capsys):
    change, kinds = DAMAGE[damage]
    eid = rewrite_rows(healthy, change)
    problems = el.Dataset.open(healthy).maintenance.validate().problems
    assert {p.kind for p in problems} == kinds, [str(p) for p in problems]
    assert {p.episode_id for p in problems} == {eid}
    if damage == "return":
        assert "return" in problems[0].message
    assert main(["validate", healthy]) == 1
    assert str(eid) in capsys.readouterr().out


# ---- "Every read, query and sampler of a Dataset first commits": see tests/test_read_your_writes.py READS


# ---- data-model table: `obs` / `observation`, `next_obs` / `next_observation`, `all_obs` / `all_observations`


def assert_aliases(seg) -> None:
    pairs = [("observation", "obs"), ("next_observation", "next_obs"), ("all_observations", "all_obs")]
    for long, short in pairs:
        a, b = getattr(seg, long), getattr(seg, short)
        keys = list(b.keys()) if hasattr(b, "keys") else [None]
        assert keys == ["state", "camera"] or keys == [None]
        for k in keys:
            x, y = (a, b) if k is None else (a[k], b[k])
            assert x.shape == y.shape and np.shares_memory(x, y)
            np.testing.assert_array_equal(x, y)


def test_long_alias_names_are_the_short_ones():
    ds, raw = make_dataset(None)
    by_id = raw_by_id(ds, raw)
    ref = ds.episode(3)
    seg = ref.read()
    assert_aliases(seg)
    want = by_id[ref.episode_id].obs
    for k in ("state", "camera"):  # and they hold the episode's data, not merely each other
        np.testing.assert_array_equal(seg.all_observations[k], want[k])
        np.testing.assert_array_equal(seg.next_observation[k], want[k][1:])
    assert_aliases(ds.segment_stream(3, batch_size=5, seed=0, prefetch=0).sample())
    assert_aliases(ds.segments(3)[2])
    # a role of one field unwraps to the array under every name
    schema = el.DatasetSchema(
        [
            el.FieldSpec("observation", (5,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    obs = np.random.default_rng(1).standard_normal((7, 5)).astype(np.float32)
    ep = {"observations": obs, "actions": np.arange(6), "rewards": np.ones(6, np.float32)}
    single = el.Dataset.from_episodes([ep], schema=schema).episode(0).read()
    assert isinstance(single.observation, np.ndarray)
    assert_aliases(single)
    np.testing.assert_array_equal(single.next_observation, obs[1:])


# ---- schema comment: "> 1 KiB/step: a Zarr tensor" / "small: a table column"


def test_the_1_kib_rule_puts_1024_bytes_in_the_table_and_1025_in_a_tensor(tmp_path, capsys):
    cases = {"f1024": ((256,), "float32"), "f1028": ((257,), "float32"), "u1024": ((1024,), "uint8")}
    cases["u1025"] = ((1025,), "uint8")
    fields = [el.FieldSpec(n, s, d) for n, (s, d) in cases.items()]
    assert [f.step_bytes for f in fields] == [1024, 1028, 1024, 1025]
    assert [f.in_tensor for f in fields] == [False, True, False, True]
    schema = el.DatasetSchema([*fields, *robot_schema(image=False).fields[1:]])
    rng = np.random.default_rng(5)
    obs = {n: rng.integers(0, 200, (4, *s)).astype(d) for n, (s, d) in cases.items()}
    path = str(tmp_path / "kib")
    ep = {"observations": obs, "actions": np.arange(3), "rewards": np.ones(3, np.float32)}
    ds = el.Dataset.from_episodes([{**ep, "meta": {"task": "a", "success": True}}], path=path, schema=schema)
    columns = set(DeltaTable(f"{path}/episodes").schema().to_arrow().names)
    for name, in_tensor in (("f1024", False), ("f1028", True), ("u1024", False), ("u1025", True)):
        key = f"observation/{name}"
        assert (key in columns, f"ref/{key}" in columns) == (not in_tensor, in_tensor)
        assert bool(glob.glob(f"{path}/tensors/*/{key}/zarr.json")) == in_tensor
        np.testing.assert_array_equal(ds.episode(0).read().all_obs[name], obs[name])
    assert main(["info", path, "--json"]) == 0
    stored = {f["key"]: f["storage"] for f in json.loads(capsys.readouterr().out)["schema"]}
    assert [stored[f"observation/{n}"] for n in cases] == ["table", "tensor", "table", "tensor"]


# ---- "the schema is inferred from the first one unless given"


def inferable(rng, T: int, pos_shape=(3,), action_dtype=np.int64) -> dict:
    return {
        "observations": {
            "pos": rng.standard_normal((T + 1, *pos_shape)),
            "img": rng.integers(0, 256, (T + 1, 32, 32), dtype=np.uint8),
            "big": rng.integers(0, 256, (T + 1, 16, 16, 5), dtype=np.uint8),
        },
        "actions": rng.integers(0, 3, T).astype(action_dtype),
        "rewards": rng.standard_normal(T),  # float64: stored as float32 (documented)
        "terminated": True,
        "meta": {"task": "a", "k": 3, "ok": True},
    }


NO_STORE = """
import sys, numpy as np, episodelake as el
sys.path.insert(0, sys.argv[2])
from tests.test_readme_promises import inferable
rng = np.random.default_rng(0)
bad = dict(pos_shape=(4,)) if sys.argv[3] == "shape" else dict(action_dtype=np.float32)
try:
    el.Dataset.from_episodes([inferable(rng, 5), inferable(rng, 4, **bad)], path=sys.argv[1])
except el.ValidationError as exc:
    print(exc)
else:
    sys.exit("accepted")
"""


def test_schema_is_inferred_from_the_first_episode_and_a_later_disagreement_stores_nothing(tmp_path):
    rng = np.random.default_rng(0)
    first, second = inferable(rng, 5), inferable(rng, 7)
    ds = el.Dataset.from_episodes([first, second])
    inferred = {f.key: (f.role, f.shape, f.dtype, f.in_tensor) for f in ds.schema.fields}
    assert inferred == {
        "observation/pos": ("observation", (3,), "float64", False),
        "observation/img": ("observation", (32, 32), "uint8", False),  # 1024 B: table
        "observation/big": ("observation", (16, 16, 5), "uint8", True),  # 1280 B: tensor
        "action": ("action", (), "int64", False),
        "reward": ("reward", (), "float32", False),
        "task": ("meta", (), "str", False),
        "k": ("meta", (), "int64", False),
        "ok": ("meta", (), "bool", False),
    }
    for i, ep in enumerate((first, second)):
        seg = ds.episode(i).read()
        assert isinstance(seg.action, np.ndarray) and isinstance(seg.reward, np.ndarray)  # one-field roles unwrap
        np.testing.assert_array_equal(seg.action, ep["actions"])
        np.testing.assert_array_equal(seg.reward, ep["rewards"].astype(np.float32))
        for k in ("pos", "img", "big"):
            np.testing.assert_array_equal(seg.all_obs[k], ep["observations"][k])
        assert ds.episode(i).meta == {"task": "a", "k": 3, "ok": True}
    # a later episode that disagrees: rejected naming it and the field; at exit nothing was committed
    for kind, field in (("shape", "pos"), ("dtype", "action")):
        path = str(tmp_path / kind)
        out = subprocess.run(
            [sys.executable, "-c", NO_STORE, path, str(ROOT), kind], capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr
        assert "episode 1" in out.stdout and field in out.stdout, out.stdout
        assert len(el.Dataset.open(path)) == 0


# ---- "filters and partitions push down" (ordinary columns: files whose log statistics exclude them are not opened)


def test_filters_on_ordinary_columns_skip_table_files(tmp_path):
    rng = np.random.default_rng(2)
    ds = el.Dataset.create(robot_schema(), str(tmp_path / "ds"))  # not partitioned
    lengths = []
    for low in (2, 10, 20):  # one commit (one file) per disjoint length range
        raws = [random_episode(rng, int(rng.integers(low, low + 5))) for _ in range(4)]
        lengths += [r.length for r in raws]
        ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
        ds.flush()
    files = sorted(glob.glob(f"{tmp_path}/ds/episodes/*.parquet"))
    assert len(files) == 3 and sorted(set(count_opened(ds, "SELECT count(*) FROM episodes"))) == files
    for predicate, opened in (("length > 18", 1), ("length BETWEEN 10 AND 14", 1), ("length < 15", 2)):
        assert len(set(count_opened(ds, f"SELECT count(*) FROM episodes WHERE {predicate}"))) == opened
    assert ds.sql("SELECT count(*) FROM episodes WHERE length > 18").fetchall()[0][0] == sum(n > 18 for n in lengths)


# ---- "ds.where(...) returns a view that every read and sampling call accepts": view.sample_transitions


def test_view_sample_transitions_are_the_views_episodes_and_their_data():
    ds, raw = make_dataset(None)
    by_id = raw_by_id(ds, raw)
    view = ds.where("task = 'place'")
    place = {i for i, r in by_id.items() if r.meta["task"] == "place"}
    assert set(view.episode_ids.tolist()) == place and 1 < len(place) < len(raw)
    tr = view.sample_transitions(64, n_step=3, gamma=0.9, history=2, horizon=2, seed=0)
    assert set(tr.episode_id.tolist()) <= place and len(set(tr.episode_id.tolist())) > 1
    check_transitions(tr, by_id, 3, 0.9, 2, 2)
    same = ds.sample_transitions(64, n_step=3, gamma=0.9, history=2, horizon=2, seed=0, where="task = 'place'")
    np.testing.assert_array_equal(tr.episode_id, same.episode_id)
    np.testing.assert_array_equal(tr.start, same.start)


# ---- "copy_to(...) or episodelake copy ... migrates between memory, disk and S3, verified"


def damaged_source(tmp_path) -> tuple[str, int]:
    """A dataset whose first camera chunk has a flipped byte in its first episode's first frame; that episode's id."""
    path = str(tmp_path / "src")
    build_robot_dataset(path, seed=3, episodes=5, per_commit=5, max_length=12)
    snap = el.Dataset.open(path).snapshot()
    first = int(snap.index["episode_id"][np.flatnonzero(snap.index["ref/observation/camera"] == 0)[0]])
    (chunk,) = glob.glob(f"{path}/tensors/*/observation/camera/c/0/0/0/0")
    data = bytearray(Path(chunk).read_bytes())
    data[7] ^= 0xFF
    Path(chunk).write_bytes(bytes(data))
    return path, first


def test_copy_to_fails_when_the_written_copy_differs(tmp_path, monkeypatch, capsys):
    # 1. tensor rows: the copied rows no longer match the CRC-32 their writer stored -> the copy's check fails
    path, first = damaged_source(tmp_path)
    src = el.Dataset.open(path)
    with pytest.raises(el.CorruptionError, match=f"episode {first} field 'observation/camera' fails its CRC-32"):
        src.copy_to(str(tmp_path / "a"), progress=False)
    unchecked = src.copy_to(str(tmp_path / "b"), progress=False, verify=False)  # the same copy, unverified
    problems = unchecked.maintenance.validate().problems  # the flipped byte: a CRC-32 and a statistics mismatch
    assert {(p.kind, p.episode_id) for p in problems} == {("checksum", first), ("stats", first)}
    assert main(["copy", path, str(tmp_path / "c"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"episode {first}" in err
    # 2. table columns: a copy whose table rows change on the way fails naming the column
    healthy = el.Dataset.open(str(tmp_path / "b"))
    append = table.EpisodeTable.append

    def altered(self, rows, *args, **kwargs):  # fault injection in the copy's own table writes
        col = rows.schema.get_field_index("return")
        values = rows["return"].to_pylist()
        values[0] += 1.0
        altered_rows = rows.set_column(col, "return", pa.array(values, rows.schema.field(col).type))
        return append(self, altered_rows, *args, **kwargs)

    monkeypatch.setattr(table.EpisodeTable, "append", altered)
    with pytest.raises(el.CorruptionError, match="column 'return' differs"):
        healthy.where("true").copy_to(str(tmp_path / "d"), progress=False)


# ---- "episodelake demo collects CartPole episodes into ./episodelake-demo"; "Every command takes --options"


def test_demo_without_a_path_writes_episodelake_demo_in_the_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--episodes", "3"]) == 0
    assert "collected 3 episodes" in capsys.readouterr().out
    assert os.listdir(tmp_path) == ["episodelake-demo"]
    ds = el.Dataset.open(str(tmp_path / "episodelake-demo"))
    assert len(ds) == 3 and ds.maintenance.validate().ok


def test_every_command_takes_storage_options():
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    subcommands = {}
    for name, sub in commands.choices.items():
        groups = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]  # `edit trim`, ...
        subcommands |= {f"{name} {n}": s for g in groups for n, s in g.choices.items()} if groups else {name: sub}
    for name, sub in subcommands.items():
        if name == "lineage":  # prints a local state file; it opens no dataset, so it has no storage to reach
            continue
        flags = set(sub._option_string_actions)
        assert "--options" in flags or {"--src-options", "--dst-options"} <= flags, name
        if "--options" in flags:
            assert sub._option_string_actions["--options"].type("{}") == {}


@pytest.mark.slow
def test_demo_on_s3_with_options(s3_server, s3_url, capsys):
    opts = s3_server.storage_options
    assert main(["demo", s3_url, "--episodes", "3", "--options", json.dumps(opts)]) == 0
    assert f"into {s3_url}" in capsys.readouterr().out
    ds = el.Dataset.open(s3_url, storage_options=opts)
    assert len(ds) == 3 and ds.maintenance.validate().ok


def test_stats_need_no_pass_over_the_tensors(tmp_path):
    """README: statistics of any subset come from the commit-time statistics, "without a pass over the tensors"."""
    import shutil

    from .test_query import assert_stats_equal

    path = str(tmp_path / "ds")
    raws = build_robot_dataset(path, seed=5, episodes=12, per_commit=4, max_length=30)
    shutil.rmtree(os.path.join(path, "tensors"))  # no tensor byte left to read
    ds = el.Dataset.open(path, read_only=True)
    assert_stats_equal(ds.stats(), raws)
    assert_stats_equal(ds.where("task = 'pick'").stats(), [r for r in raws if r.meta["task"] == "pick"])
    with pytest.raises(el.CorruptionError):  # the tensors really are gone
        ds.episode(0).read()
