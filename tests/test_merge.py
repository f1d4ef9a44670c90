"""``el.merge`` (issue 23): several datasets in one new dataset, new ids, a ``source`` column, verified.

Expectations come from the raw NumPy episodes each source was built from
(``tests/reference.py``): every merged episode, found by its lineage columns
(``source``, ``source_episode_id``), reads exactly as its raw episode; ids are
unique; SQL, ``stats()`` and ``validate()`` see the union; schema differences
are named; memory, disk and S3 in any combination; the CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

from .conftest import robot_schema
from .reference import RawEpisode
from .test_schema_edit import build, raw_set
from .workers.replay import Fifo, length_of, live_numbers
from .workers.replay import episode as replay_episode
from .workers.replay import schema as replay_schema

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
FAST = settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MANY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def assert_merged(merged: el.Dataset, sources: list[tuple[el.Dataset, list[RawEpisode]]]) -> None:
    """Every episode of every source is in ``merged`` once, under a new unique id, reading as its raw episode."""
    want = {}
    for ds, raws in sources:
        for eid, raw in zip(ds.episode_ids.tolist(), raws, strict=True):
            want[(ds.location.url, eid)] = raw
    assert len(merged) == len(want)
    ids = merged.episode_ids.tolist()
    assert len(set(ids)) == len(ids)
    assert not set(ids) & {eid for _, eid in want}  # new ids, not the sources'
    seen = set()
    for ref in merged.episodes():
        origin = (ref.meta["source"], ref.meta["source_episode_id"])
        raw = want[origin]
        seen.add(origin)
        seg = ref.read()
        assert ref.length == raw.length and (ref.terminated, ref.truncated) == (raw.terminated, raw.truncated)
        assert ref.meta["task"] == raw.meta["task"] and ref.meta["success"] == raw.meta["success"]
        for key, values in raw.obs.items():
            np.testing.assert_array_equal(seg.data[f"observation/{key}"], values)
        np.testing.assert_array_equal(seg.data["action"], raw.action["action"])
        np.testing.assert_array_equal(seg.data["reward"], raw.reward)
    assert seen == set(want)
    rows = merged.sql("SELECT source, count(*) AS n, sum(length) AS steps FROM episodes GROUP BY source").fetchall()
    expect = {}
    for (url, _), raw in want.items():
        n, steps = expect.get(url, (0, 0))
        expect[url] = (n + 1, steps + raw.length)
    assert {url: (n, steps) for url, n, steps in rows} == expect
    if want:
        states = np.concatenate([r.obs["state"] for r in want.values()]).astype(np.float64)
        np.testing.assert_allclose(merged.stats()["observation/state"]["mean"], states.mean(axis=0), rtol=1e-9)
    report = merged.maintenance.validate()
    assert report.ok, report.problems


def merge_property(seed, sizes):
    sources = [(build(raws), raws) for raws in (raw_set(seed + i, n) for i, n in enumerate(sizes))]
    merged = el.merge([ds for ds, _ in sources], None)
    assert_merged(merged, sources)
    assert [f.key for f in merged.schema.fields] == [f.key for f in robot_schema().fields] + [
        "source",
        "source_episode_id",
    ]


MERGES = given(seed=st.integers(0, 2**16), sizes=st.lists(st.integers(0, 4), min_size=1, max_size=3))
test_merge_holds_every_episode_of_every_source = FAST(MERGES(merge_property))
test_merge_holds_every_episode_of_every_source_many = pytest.mark.slow(MANY(MERGES(merge_property)))


def test_merge_where_views_paths_and_a_source_that_was_split_and_renamed(tmp_path):
    a_raws, b_raws = raw_set(1, 5), raw_set(2, 3)
    a = build(a_raws, str(tmp_path / "a"), partition_by=["task"])
    b = build(b_raws, str(tmp_path / "b"))
    merged = el.merge([str(tmp_path / "a"), b], str(tmp_path / "m"), where="task = 'pick'")
    picks = [(a, [r for r in a_raws if r.meta["task"] == "pick"]), (b, [r for r in b_raws if r.meta["task"] == "pick"])]
    picked = [(ds.where("task = 'pick'"), raws) for ds, raws in picks]
    assert len(merged) == sum(len(r) for _, r in picks)
    assert merged.maintenance.descriptor["partition_by"] == ["task"]  # the first source's
    assert len(picked[0][0]) == len(picks[0][1])
    # the same writer in two sources (a merged with itself) still gives unique ids
    twice = el.merge([a, a], None)
    assert len(twice) == 10 and len(set(twice.episode_ids.tolist())) == 10
    # sources with edit ids (a split) and a renamed tensor field (its arrays under the old key)
    long = next(int(e) for e, r in zip(b.episode_ids, b_raws, strict=True) if r.length > 1)
    b.edit.split(long, 1)
    for ds in (a, b):
        ds.columns.rename("observation/camera", "observation/cam")
    renamed = el.merge([a, b], str(tmp_path / "r"))
    cams = {
        (r.meta["source"], r.meta["source_episode_id"]): r.read().data["observation/cam"] for r in renamed.episodes()
    }
    for ds in (a, b):
        for ref in ds.episodes():
            np.testing.assert_array_equal(
                cams[(ds.location.url, int(ref.episode_id))], ref.read().data["observation/cam"]
            )
    assert renamed.maintenance.validate().ok


def test_merge_names_the_schema_difference_and_writes_nothing(tmp_path):
    a = build(raw_set(3, 2))
    other = el.DatasetSchema(
        [*(f for f in robot_schema().fields if f.key != "reward"), el.FieldSpec("reward", (), "float64", role="reward")]
    )
    b = el.Dataset.create(other, None)
    with pytest.raises(el.SchemaError, match=r"'reward': dtype 'float32' vs 'float64'"):
        el.merge([a, b], str(tmp_path / "m"))
    c = build(raw_set(4, 1))
    c.columns.drop("success")
    with pytest.raises(el.SchemaError, match=r"only in the first: \['success'\]"):
        el.merge([a, c], str(tmp_path / "m"))
    lineage = el.DatasetSchema([*robot_schema().fields, el.FieldSpec("source", (), "str", role="meta")])
    with pytest.raises(el.SchemaError, match="rename them first"):
        el.merge([el.Dataset.create(lineage, None)], str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()
    with pytest.raises(el.ArgumentError, match="at least one"):
        el.merge([], None)
    with pytest.raises(el.LocationError, match="into itself"):
        el.merge([a], a.location.url, overwrite=True)
    with pytest.raises(el.DatasetExistsError):
        el.merge([a], c.location.url)


def test_merge_carries_derived_columns(tmp_path):
    a, b = build(raw_set(5, 3)), build(raw_set(6, 2))
    for ds, scores in ((a, [1.0, None, 3.0]), (b, [4.0, 5.0])):
        ds.columns.add(el.FieldSpec("score", (), "float32", role="meta"))
        ds.columns.update({"score": scores})
    merged = el.merge([a, b], str(tmp_path / "m"))
    got = merged.sql("SELECT source_episode_id AS e, score FROM episodes").fetchall()
    want = dict(zip(a.episode_ids.tolist(), [1.0, None, 3.0], strict=True)) | dict(
        zip(b.episode_ids.tolist(), [4.0, 5.0], strict=True)
    )
    assert dict(got) == want


def test_merge_across_disk_and_s3(tmp_path, s3_server, s3_url):
    options = s3_server.storage_options
    disk_raws, s3_raws = raw_set(7, 3), raw_set(8, 2)
    disk = build(disk_raws, str(tmp_path / "d"))
    remote = build(s3_raws, s3_url, storage_options=options)
    to_s3 = el.merge([disk, remote], f"{s3_url}-merged", options)
    assert_merged(el.Dataset.open(f"{s3_url}-merged", storage_options=options), [(disk, disk_raws), (remote, s3_raws)])
    to_s3.columns.drop("source", "source_episode_id")  # a merged dataset merged again: its lineage first
    back = el.merge([to_s3], str(tmp_path / "back"))
    assert sorted(back.sql("SELECT source FROM episodes").fetchnumpy()["source"]) == [f"{s3_url}-merged"] * 5


def cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "episodelake.cli", *args]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


def test_cli_merge_then_rename_in_subprocesses(tmp_path):
    a_raws, b_raws = raw_set(11, 2), raw_set(12, 1)
    a, b = build(a_raws, str(tmp_path / "a")), build(b_raws, str(tmp_path / "b"))
    done = cli("merge", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "m"), "--quiet")
    assert done.returncode == 0 and "merged 3 episodes" in done.stdout, done.stderr
    assert_merged(el.Dataset.open(str(tmp_path / "m")), [(a, a_raws), (b, b_raws)])
    renamed = cli("edit", "rename-field", str(tmp_path / "m"), "task", "label")
    assert renamed.returncode == 0 and "RENAME FIELD: changed task -> label" in renamed.stdout, renamed.stderr
    assert el.Dataset.open(str(tmp_path / "m")).schema.meta_fields[0].key == "label"


@pytest.mark.slow
def test_cli_merge_and_schema_edits_in_a_subprocess(tmp_path):
    a_raws, b_raws = raw_set(9, 3), raw_set(10, 2)
    a, b = build(a_raws, str(tmp_path / "a")), build(b_raws, str(tmp_path / "b"))
    dry = cli("merge", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "m"), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["episodes"] == 5 and not (tmp_path / "m").exists()
    done = cli("merge", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "m"), "--quiet")
    assert done.returncode == 0 and "merged 5 episodes" in done.stdout, done.stderr
    assert_merged(el.Dataset.open(str(tmp_path / "m")), [(a, a_raws), (b, b_raws)])
    dry = cli("edit", "drop-field", str(tmp_path / "m"), "success", "--dry-run")
    assert dry.returncode == 0 and "would change success dropped" in dry.stdout
    assert el.Dataset.open(str(tmp_path / "m")).version == 2
    assert cli("edit", "rename-field", str(tmp_path / "m"), "task", "label").returncode == 0
    assert cli("edit", "drop-field", str(tmp_path / "m"), "success", "--json").returncode == 0
    ds = el.Dataset.open(str(tmp_path / "m"))
    assert [f.key for f in ds.schema.meta_fields] == ["label", "source", "source_episode_id"]
    assert [h["operation"] for h in ds.history()[:2]] == ["DROP FIELDS", "RENAME FIELD"]
    bad = cli("edit", "drop-field", str(tmp_path / "m"), "reward")
    assert bad.returncode == 1 and "reward" in bad.stderr and el.Dataset.open(str(tmp_path / "m")).version == 4
    bad = cli("merge", str(tmp_path / "m"), str(tmp_path / "a"), str(tmp_path / "n"))
    assert bad.returncode == 1 and "lineage columns" in bad.stderr and not (tmp_path / "n").exists()


# ---- dataset-level settings travel with a merge (issue 39, item 4)


def replay_buffer(path: str, checks: tuple, numbers, steps: int | None = 40) -> el.Dataset:
    capacity = None if steps is None else el.Capacity(steps=steps)
    ds = el.Dataset.create(replay_schema(), path, capacity=capacity, checks=checks, commit_episodes=10**6)
    for n in numbers:
        ds.append_episodes([replay_episode(n)])
        ds.flush()
    return ds


QUARANTINE_13 = el.Check("not_13", "n <> 13", on_fail="quarantine")
REJECT_14 = el.Check("not_14", "n <> 14")
WARN_15 = el.Check("not_15", "n <> 15", on_fail="warn")


def test_a_merge_carries_the_union_of_checks_and_a_shared_capacity(tmp_path):
    a = replay_buffer(str(tmp_path / "a"), (QUARANTINE_13, WARN_15), range(0, 8))
    b = replay_buffer(str(tmp_path / "b"), (REJECT_14, QUARANTINE_13), range(100, 108))
    merged = el.merge([a, b], str(tmp_path / "m"), progress=False)
    assert merged.quality.list() == (QUARANTINE_13, WARN_15, REJECT_14)
    assert merged.maintenance.descriptor["capacity"]["steps"] == 40
    model = Fifo(steps=40)  # b's episodes were recorded after a's: the newest that fit, across both
    model.commit([(n, length_of(n)) for n in [*live_numbers(a), *live_numbers(b)]])
    assert live_numbers(merged) == model.numbers and merged.num_steps <= 40
    for n in (13, 14, 15, 16):
        try:
            merged.append_episodes([replay_episode(n)])
            merged.flush()
            model.commit([(n, length_of(n))])
        except el.QualityError:
            merged.flush(discard=True)
            assert n == 14
    assert live_numbers(merged) == [n for n in model.numbers if n != 13]
    assert live_numbers(merged.quality.quarantine()) == [n for n in model.numbers if n == 13]
    for n in range(17, 40):
        merged.append_episodes([replay_episode(n)])
        merged.flush()
        model.commit([(n, length_of(n))])
    assert live_numbers(merged) == model.numbers and merged.num_steps <= 40


def test_a_merge_refuses_settings_that_differ_unless_given(tmp_path):
    a = replay_buffer(str(tmp_path / "a"), (QUARANTINE_13,), range(0, 5))
    other = el.Check("not_13", "n <> 13", on_fail="warn")  # the same name, another on_fail
    b = replay_buffer(str(tmp_path / "b"), (other,), range(100, 105))
    c = replay_buffer(str(tmp_path / "c"), (), range(200, 205), steps=None)
    with pytest.raises(el.ArgumentError, match="not_13") as caught:
        el.merge([a, b], str(tmp_path / "m"), progress=False)
    assert a.location.url in str(caught.value) and b.location.url in str(caught.value)
    with pytest.raises(el.ArgumentError, match="capacities differ") as caught:
        el.merge([a, c], str(tmp_path / "m"), progress=False)
    assert a.location.url in str(caught.value) and c.location.url in str(caught.value)
    assert not (tmp_path / "m").exists()
    merged = el.merge([a, b, c], str(tmp_path / "m"), capacity=None, checks=[REJECT_14], progress=False)
    assert merged.quality.list() == (REJECT_14,) and "capacity" not in merged.maintenance.descriptor
    assert len(merged) == len(a) + len(b) + len(c)
    bigger = el.merge([a, c], str(tmp_path / "m2"), capacity={"steps": 30}, checks=(), progress=False)
    model = Fifo(steps=30)
    model.commit([(n, length_of(n)) for n in [*live_numbers(a), *live_numbers(c)]])
    assert live_numbers(bigger) == model.numbers and bigger.quality.list() == ()
    done = cli("merge", str(tmp_path / "a"), str(tmp_path / "c"), str(tmp_path / "m3"), "--no-capacity", "--quiet")
    assert done.returncode == 0, done.stderr
    assert el.Dataset.open(str(tmp_path / "m3")).quality.list() == (QUARANTINE_13,)


def test_the_leftover_of_a_killed_merge_is_named_and_overwrite_starts_over(tmp_path):
    """Issue 40: a merge killed after writing the destination's table but before its ``episodelake.json`` (the
    state is made here by removing the descriptor) left a folder no call could reuse (deltalake's "A Delta Lake
    table already exists"). Without overwrite the error names the leftover and how to clear it; with
    ``overwrite=True`` the merge starts over."""
    a_raws, b_raws = raw_set(3, 3), raw_set(4, 2)
    a = build(a_raws, str(tmp_path / "a"))
    b = build(b_raws, str(tmp_path / "b"))
    target = tmp_path / "m"
    el.merge([a, b], str(target))
    (target / "episodelake.json").unlink()
    with pytest.raises(el.DatasetNotFoundError):
        el.Dataset.open(str(target))
    for again in (lambda: el.merge([a, b], str(target)), lambda: el.Dataset.create(robot_schema(), str(target))):
        with pytest.raises(el.DatasetExistsError, match=r"incomplete dataset \(episodes, tensors but no") as info:
            again()
        assert "overwrite=True to start over" in str(info.value) and str(target) in str(info.value)
    merged = el.merge([a, b], str(target), overwrite=True)
    assert len(merged) == 5 and merged.maintenance.validate().ok
    assert len(el.Dataset.open(str(target))) == 5
