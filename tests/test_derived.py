"""Derived columns: ``ds.columns.add`` / ``ds.columns.update`` (src/episodelake/derived.py).

References are computed independently in NumPy from the episodes the test
wrote (discounted returns, priorities, labels), never read back from the
library, and compared with what SQL, segments, batches, transitions,
``to_numpy`` and ``stats`` return. Process boundaries (a second process
updating, two concurrent updaters) run in real subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake import DatasetSchema, FieldSpec
from episodelake.core.errors import ArgumentError, ReadOnlyError, SchemaError, ValidationError

ROOT = Path(__file__).resolve().parents[1]
GAMMA = 0.9


def schema(derived: bool = True) -> DatasetSchema:
    fields = [
        FieldSpec("observation", (3,), "float32"),
        FieldSpec("action", (), "int64", role="action"),
        FieldSpec("reward", (), "float32", role="reward"),
        FieldSpec("n", (), "int64", role="meta"),
    ]
    if derived:
        fields += [
            FieldSpec("returns", (), "float32", role="extra", derived=True),
            FieldSpec("advantage", (2,), "float64", role="extra", derived=True, default=[-1.0, -1.0]),
            FieldSpec("priority", (), "float64", role="meta", derived=True),
            FieldSpec("instruction", (), "str", role="meta", derived=True),
        ]
    return DatasetSchema(fields)


def episode(n: int) -> dict:
    rng = np.random.default_rng(n)
    length = 2 + n % 5
    return {
        "observations": rng.random((length + 1, 3), dtype=np.float32),
        "actions": rng.integers(0, 4, length),
        "rewards": rng.random(length, dtype=np.float32),
        "meta": {"n": n},
    }


def discounted(rewards: np.ndarray) -> np.ndarray:
    """Reference discounted returns, a plain backwards loop in float64."""
    out, acc = np.zeros(len(rewards)), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = float(rewards[t]) + GAMMA * acc
        out[t] = acc
    return out.astype(np.float32)


def make(path: str | None, count: int = 8, derived: bool = True, **options) -> el.Dataset:
    ds = el.Dataset.create(schema(derived), path, commit_episodes=10**6, **options)
    ds.append_episodes(episode(n) for n in range(count))
    ds.flush()
    return ds


def numbers(ds: el.Dataset) -> dict[int, int]:
    """episode id -> the episode number the test wrote."""
    got = ds.sql("SELECT episode_id, n FROM episodes").fetchnumpy()
    return dict(zip(got["episode_id"].tolist(), got["n"].tolist(), strict=True))


@pytest.mark.parametrize("where", ["memory", "disk", "s3"])
def test_recomputed_columns_read_back_everywhere(where, tmp_path, request):
    if where == "s3":
        options = {"storage_options": request.getfixturevalue("s3_server").storage_options}
        ds = make(request.getfixturevalue("s3_url"), **options)
    else:
        ds = make({"memory": None, "disk": str(tmp_path / "ds")}[where])
    by_id = numbers(ds)
    ids = ds.episode_ids
    returns = {i: discounted(episode(by_id[i])["rewards"]) for i in ids.tolist()}
    base_version = ds.version
    version = ds.columns.update(
        {
            "extra/returns": [returns[i] for i in ids.tolist()],
            "priority": [float(by_id[i]) / 10 for i in ids.tolist()],
            "instruction": [f"pick {by_id[i]}" for i in ids.tolist()],
        }
    )
    assert version == ds.version > base_version

    # SQL: per-step column in `steps`, per-episode columns in `episodes`
    got = ds.sql('SELECT episode_id, t, "extra/returns" AS r FROM steps ORDER BY episode_id, t').fetchnumpy()
    want = np.concatenate([returns[i] for i in sorted(returns)])
    np.testing.assert_array_equal(got["r"], want)
    meta = ds.sql("SELECT episode_id, priority, instruction FROM episodes ORDER BY episode_id").fetchnumpy()
    assert meta["priority"].tolist() == [by_id[i] / 10 for i in sorted(by_id)]
    assert meta["instruction"].tolist() == [f"pick {by_id[i]}" for i in sorted(by_id)]
    assert len(ds.where("priority >= $p", {"p": 0.5})) == sum(n >= 5 for n in by_id.values())

    # whole episodes and to_numpy
    for e in ds.episodes():
        np.testing.assert_array_equal(e.read().extra["returns"], returns[e.episode_id])
        assert e.meta["instruction"] == f"pick {by_id[e.episode_id]}"
    full = ds.to_numpy()
    np.testing.assert_array_equal(full["extra/returns"], np.concatenate([returns[i] for i in ids.tolist()]))

    # sampled segments and transitions read the column like any small per-step field
    stream = ds.segment_stream(2, batch_size=16, seed=0, prefetch=0)
    batch = next(iter(stream))
    for b in range(16):
        eid, start = int(batch.episode_id[b]), int(batch.start[b])
        np.testing.assert_array_equal(batch.extra["returns"][b], returns[eid][start : start + 2])
        assert batch.meta["priority"][b] == by_id[eid] / 10
    stream.close()
    tr = ds.sample_transitions(64, seed=1)
    for b in range(64):
        assert tr.extra["returns"][b] == returns[int(tr.episode_id[b])][int(tr.start[b])]

    # stats from the values themselves; the unset per-step column reports nothing
    stats = ds.stats()
    assert stats["extra/returns"]["count"] == len(want)
    assert stats["extra/returns"]["mean"] == pytest.approx(want.astype(np.float64).mean())
    assert stats["extra/returns"]["max"] == pytest.approx(want.max())
    assert stats["extra/advantage"]["count"] == 0


def test_time_travel_sees_the_values_of_each_version(tmp_path):
    path = str(tmp_path / "ds")
    ds = make(path)
    before = ds.version
    first = ds.columns.update({"priority": [1.0] * len(ds)})
    second = ds.columns.update({"priority": [2.0] * len(ds)})
    ds.columns.update({"priority": [3.0] * 2}, ds.episode_ids[:2])
    for version, want in [(before, [None] * 8), (first, [1.0] * 8), (second, [2.0] * 8)]:
        old = el.Dataset.open(path, version=version)
        got = old.sql("SELECT priority FROM episodes ORDER BY episode_id").fetchnumpy()["priority"].tolist()
        assert [None if v != v else v for v in got] == want  # NULL reads as NaN in NumPy
    latest = el.Dataset.open(path).sql("SELECT priority FROM episodes ORDER BY episode_id").fetchnumpy()["priority"]
    assert sorted(latest.tolist()) == [2.0] * 6 + [3.0] * 2
    with pytest.raises(ReadOnlyError):
        el.Dataset.open(path, version=first).columns.update({"priority": [0.0] * 8})


def test_update_by_ids_where_and_all(tmp_path):
    ds = make(str(tmp_path / "ds"))
    by_id = numbers(ds)
    ids = ds.episode_ids
    # by ids: values follow the order the ids are given in
    chosen = [int(ids[5]), int(ids[1])]
    ds.columns.update({"priority": [5.5, 1.5]}, chosen)
    # by where with params: values follow episode order
    view = ds.where("n >= $lo", {"lo": 6})
    ds.columns.update({"instruction": ["late"] * len(view)}, where="n >= $lo", params={"lo": 6})
    # per-step by one array of all rows, episode order
    rows = np.concatenate([np.full((len(episode(by_id[i])["rewards"]), 2), by_id[i], np.float64) for i in ids.tolist()])
    ds.columns.update({"extra/advantage": rows})
    got = ds.sql("SELECT episode_id, priority, instruction FROM episodes").fetchnumpy()
    for eid, p, ins in zip(
        got["episode_id"].tolist(), got["priority"].tolist(), got["instruction"].tolist(), strict=True
    ):
        assert (p if p == p else None) == {chosen[0]: 5.5, chosen[1]: 1.5}.get(eid)
        assert ins == ("late" if by_id[eid] >= 6 else None)
    for e in ds.episodes():
        assert (e.read().extra["advantage"] == by_id[e.episode_id]).all()
    # returns never set: the declared default fills nothing (no default) -> NaN; advantage's default is -1
    assert np.isnan(ds.episode(0).read().extra["returns"]).all()


def test_unset_rows_use_the_declared_default(tmp_path):
    ds = make(str(tmp_path / "ds"))
    ds.columns.update({"extra/advantage": [np.ones((len(episode(0)["rewards"]), 2))]}, [int(ds.episode_ids[0])])
    assert (ds.episode(0).read().extra["advantage"] == 1).all()
    assert (ds.episode(1).read().extra["advantage"] == -1).all()
    stats = ds.stats(["extra/advantage"])["extra/advantage"]
    assert stats["count"] == len(episode(0)["rewards"])  # unset episodes are not counted
    np.testing.assert_array_equal(stats["mean"], [1.0, 1.0])


def _digest(ds: el.Dataset) -> tuple:
    got = ds.sql('SELECT episode_id, priority, "extra/returns" AS r FROM episodes ORDER BY episode_id').fetchnumpy()
    return ds.version, got["priority"].tolist(), [np.asarray(r).tolist() for r in got["r"]]


def test_bad_input_names_the_field_and_episode_and_changes_nothing(tmp_path):
    ds = make(str(tmp_path / "ds"))
    ids = ds.episode_ids
    good = [discounted(episode(n)["rewards"]) for n in range(8)]
    ds.columns.update({"extra/returns": good, "priority": [0.0] * 8})
    before = _digest(ds)
    bad_len = [*good[:3], good[3][:-1], *good[4:]]
    with pytest.raises(ValidationError, match=rf"episode {int(ids[3])}.*extra/returns.*shape"):
        ds.columns.update({"extra/returns": bad_len, "priority": [9.0] * 8})
    with pytest.raises(ValidationError, match=r"priority.*dtype"):
        ds.columns.update({"priority": ["high"] * 8})
    with pytest.raises(ValidationError, match=r"instruction.*must be str"):
        ds.columns.update({"instruction": [3] * 8})
    with pytest.raises(ValidationError, match=r"priority.*7 values for 8 episodes"):
        ds.columns.update({"priority": [1.0] * 7})
    with pytest.raises(ArgumentError, match=r"not derived columns"):
        ds.columns.update({"reward": good})
    with pytest.raises(ArgumentError, match=r"not in snapshot"):
        ds.columns.update({"priority": [1.0]}, [12345])
    with pytest.raises(ArgumentError, match=r"repeat"):
        ds.columns.update({"priority": [1.0, 2.0]}, [int(ids[0]), int(ids[0])])
    with pytest.raises(ArgumentError, match=r"not both"):
        ds.columns.update({"priority": [1.0]}, [int(ids[0])], where="n = 0")
    with pytest.raises(el.QueryError):
        ds.columns.update({"priority": [1.0]}, where="no_such_column = 1")
    assert _digest(ds) == before
    assert _digest(el.Dataset.open(str(tmp_path / "ds"))) == before


def test_declarations_persist_and_clash(tmp_path):
    path = str(tmp_path / "ds")
    ds = make(path, derived=False)
    assert not ds.snapshot().derived.fields
    version = ds.columns.add(
        FieldSpec("value", (), "float32", role="extra"), FieldSpec("label", (), "int32", role="meta")
    )
    assert ds.columns.add(FieldSpec("value", (), "float32", role="extra")) == version  # again: no change
    with pytest.raises(SchemaError, match="extra/value"):
        ds.columns.add(FieldSpec("value", (), "float64", role="extra"))
    with pytest.raises(SchemaError, match="reward"):
        ds.columns.add(FieldSpec("reward", (), "float32", role="reward"))
    with pytest.raises(SchemaError, match="n"):
        ds.columns.add(FieldSpec("n", (), "int64", role="meta"))
    with pytest.raises(SchemaError, match="tensor"):
        FieldSpec("big", (4,), "float32", role="extra", derived=True, storage="tensor")
    assert ds.version == version
    ds.columns.update({"label": list(range(8))})
    reopened = el.Dataset.open(path)
    keys = [f.key for f in reopened.snapshot().schema.derived_fields]
    assert keys == ["extra/value", "label"]
    assert sorted(reopened.sql("SELECT label FROM episodes").fetchnumpy()["label"].tolist()) == list(range(8))
    # the writing schema never includes derived columns: new episodes need no values for them
    reopened.append_episodes([episode(100)])
    reopened.flush()
    assert len(reopened) == 9


def test_deleted_episodes_derived_rows_do_not_show(tmp_path):
    ds = make(str(tmp_path / "ds"))
    ds.columns.update({"priority": [1.0] * 8})
    gone = [int(i) for i in ds.episode_ids[:3]]
    ds.delete(gone)
    got = ds.sql("SELECT count(*) AS c, count(priority) AS p FROM episodes").fetchnumpy()
    assert got["c"][0] == got["p"][0] == 5
    assert len(ds.where("priority = 1.0")) == 5
    assert ds.stats()["episodes"]["count"] == 5
    ds.delete(all=True)
    assert ds.sql("SELECT count(*) AS c FROM episodes").fetchnumpy()["c"][0] == 0
    assert [f.key for f in ds.snapshot().derived.fields] == [
        "extra/returns",
        "extra/advantage",
        "priority",
        "instruction",
    ]


UPDATER = """
import sys, numpy as np, episodelake as el
path, column, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
ds = el.Dataset.open(path)
for r in range(rounds):
    ds.refresh()
    ids = ds.episode_ids
    if column == "priority":
        ds.columns.update({"priority": [float(r)] * len(ids)})
    else:
        ds.columns.update({"instruction": [f"round {r}"] * len(ids)})
print("ok")
"""


def test_two_processes_update_concurrently_and_nothing_is_lost(tmp_path):
    path = str(tmp_path / "ds")
    make(path)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", UPDATER, path, column, "6"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for column in ("priority", "instruction")
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == "ok"
    got = el.Dataset.open(path).sql("SELECT priority, instruction FROM episodes").fetchnumpy()
    assert got["priority"].tolist() == [5.0] * 8  # both writers' last rounds are there
    assert got["instruction"].tolist() == ["round 5"] * 8
    side = el.Dataset.open(path)
    rows = side.snapshot().derived_values()
    assert rows.num_rows == 8 and len(set(rows.column("episode_id").to_pylist())) == 8


def test_a_second_process_sees_an_update_after_refresh(tmp_path):
    path = str(tmp_path / "ds")
    reader = make(path)
    assert np.isnan(reader.sql("SELECT priority FROM episodes").fetchnumpy()["priority"]).all()
    script = (
        "import sys, episodelake as el; ds = el.Dataset.open(sys.argv[1]); "
        "ds.columns.update({'priority': [7.0] * len(ds)})"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, "-c", script, path], env=env, check=True, timeout=600)
    assert np.isnan(reader.sql("SELECT priority FROM episodes").fetchnumpy()["priority"]).all()  # pinned until refresh
    reader.refresh()
    assert reader.sql("SELECT priority FROM episodes").fetchnumpy()["priority"].tolist() == [7.0] * 8
    assert json.loads((tmp_path / "ds" / "episodelake.json").read_text())["schema"] == schema().base.to_json()


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_per_step_values_round_trip(data):
    ds = make(None, count=4)
    values = []
    for e in ds.episodes():
        length = e.length
        values.append(
            np.array(data.draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=length, max_size=length)), np.float32)
        )
    ds.columns.update({"extra/returns": values})
    for e, want in zip(ds.episodes(), values, strict=True):
        np.testing.assert_array_equal(e.read().extra["returns"], want)


def test_an_older_update_recorded_last_does_not_hide_a_newer_one(tmp_path):
    """Two updaters whose property commits land in the opposite order of their merges: the newer values stay."""
    from episodelake.storage.store import Store
    from episodelake.write import derived

    path = str(tmp_path / "ds")
    ds = make(path)
    ids = ds.episode_ids
    a, b = (Store.open(ds.location) for _ in range(2))
    f = ds.snapshot().schema["priority"]
    lengths = ds.snapshot().lengths
    old = derived._merge(
        ds.location, pa.table({"episode_id": ids, "priority": derived.encode(f, [1.0] * 8, lengths, ids)})
    )
    derived.write(b, ids, {"priority": derived.encode(f, [2.0] * 8, lengths, ids)})  # merges and records the newer
    derived._record(a, derived.DerivedState(old, ()))  # the older merge's record lands last
    got = el.Dataset.open(path).sql("SELECT priority FROM episodes").fetchnumpy()["priority"]
    assert got.tolist() == [2.0] * 8


def test_copy_carries_derived_columns(tmp_path):
    ds = make(str(tmp_path / "ds"))
    by_id = numbers(ds)
    ds.columns.update({"priority": [float(by_id[i]) for i in ds.episode_ids.tolist()]})
    ds.columns.update(
        {"extra/returns": [discounted(episode(by_id[i])["rewards"]) for i in ds.episode_ids[:3].tolist()]},
        ds.episode_ids[:3],
    )
    view = ds.where("n >= 1")
    copy = view.copy_to(str(tmp_path / "copy"), progress=False)
    got = copy.sql('SELECT n, priority, "extra/returns" AS r FROM episodes ORDER BY n').fetchnumpy()
    assert got["n"].tolist() == list(range(1, 8))
    assert got["priority"].tolist() == [float(n) for n in range(1, 8)]
    with_returns = {by_id[i] for i in ds.episode_ids[:3].tolist()}
    for n, r in zip(got["n"].tolist(), got["r"], strict=True):
        if n in with_returns:
            np.testing.assert_array_equal(r, discounted(episode(n)["rewards"]))
        else:
            assert r is None
    assert [f.key for f in copy.snapshot().derived.fields] == [f.key for f in ds.snapshot().derived.fields]
    assert json.loads((tmp_path / "copy" / "episodelake.json").read_text())["schema"] == schema().base.to_json()


def test_vacuum_removes_replaced_side_files_and_keeps_the_values(tmp_path):
    ds = make(str(tmp_path / "ds"))
    ds.columns.update({"priority": [1.0] * 8})
    ds.columns.update({"priority": [2.0] * 8})  # the merge rewrote the file the first update wrote
    side = tmp_path / "ds" / "derived"
    before = {p for p in side.rglob("*.parquet")}
    report = ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    assert len(report.derived_files) >= 1
    assert all(not os.path.exists(p) for p in report.derived_files)
    assert {p for p in side.rglob("*.parquet")} < before
    assert ds.maintenance.validate().ok
    assert (
        el.Dataset.open(str(tmp_path / "ds")).sql("SELECT priority FROM episodes").fetchnumpy()["priority"].tolist()
        == [2.0] * 8
    )


def test_a_grown_snapshot_keeps_derived_values_and_adds_unset_rows(tmp_path, monkeypatch):
    import episodelake.read.snapshot as snapshot_module

    ds = make(str(tmp_path / "ds"))
    ds.columns.update({"priority": [1.0] * 8, "extra/returns": [discounted(episode(n)["rewards"]) for n in range(8)]})
    assert ds.sql("SELECT count(priority) AS c FROM episodes").fetchnumpy()["c"][0] == 8  # reads the values once
    ds.append_episodes([episode(8), episode(9)])
    ds.flush()
    snap = ds.snapshot()
    assert snap.scan().kept == 8  # grown from the previous snapshot
    with monkeypatch.context() as m:  # a learner's refresh does not re-read the side table
        m.setattr(snapshot_module, "side_values", lambda *a: pytest.fail("side table read again"))
        got = ds.sql("SELECT n, priority FROM episodes ORDER BY n").fetchnumpy()
    assert [p if p == p else None for p in got["priority"].tolist()] == [1.0] * 8 + [None, None]
    fresh = el.Dataset.open(str(tmp_path / "ds")).snapshot()
    assert fresh.derived_values().equals(snap.derived_values())
    assert np.isnan(ds.episode(9).read().extra["returns"]).all()


def test_an_update_that_keeps_losing_races_raises_commit_conflict(tmp_path, monkeypatch):
    """Real Delta conflicts: a merge through a handle that never sees the newer side version loses every time."""
    from deltalake import DeltaTable

    from episodelake.write import derived

    path = str(tmp_path / "ds")
    ds = make(path)
    ds.columns.update({"priority": [1.0] * 8})
    stale = DeltaTable(str(tmp_path / "ds" / "derived"))
    ds.columns.update({"priority": [2.0] * 8})  # the side table moved on
    source = pa.table({"episode_id": pa.array(ds.episode_ids, pa.int64()), "priority": pa.array([3.0] * 8)})

    def attempt() -> int:
        merger = stale.merge(source, "t.episode_id = s.episode_id", source_alias="s", target_alias="t")
        merger.when_matched_update(updates={"priority": "s.priority"}).execute()
        return stale.version()

    monkeypatch.setattr(derived, "RETRIES", 2)
    with pytest.raises(el.CommitConflictError, match=r"update of \['priority'\].*conflicted 2 times"):
        derived._retry(attempt, "update of ['priority']")
    assert el.Dataset.open(path).sql("SELECT priority FROM episodes").fetchnumpy()["priority"].tolist() == [2.0] * 8
