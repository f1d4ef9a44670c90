"""Row edits (issue 23): ``ds.edit.trim``, ``ds.edit.split`` and ``ds.edit.set_meta``.

Every expectation comes from the raw NumPy episodes the test generated
(``tests/reference.py``) cut with plain slicing: what the edited episode must
be, its statistics, return and flags. Reads, SQL (``episodes``, ``steps``),
``stats()``, a segment stream, ``changes()``, ``history()``, time travel and
``validate()`` are checked against that reference, in memory, on disk
(partitioned, capacity) and on S3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

from .conftest import robot_schema
from .reference import RawEpisode, random_episode

ROOT = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MANY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def cut(ep: RawEpisode, start: int, stop: int) -> RawEpisode:
    """The reference trim: transitions [start, stop), observations [start, stop]; a cut end is truncated."""
    end = stop == ep.length
    return RawEpisode(
        obs={k: v[start : stop + 1] for k, v in ep.obs.items()},
        action={k: v[start:stop] for k, v in ep.action.items()},
        reward=ep.reward[start:stop],
        terminated=ep.terminated and end,
        truncated=ep.truncated or not end,
        meta=dict(ep.meta),
    )


def build(raws: list[RawEpisode], path: str | None = None, **options) -> el.Dataset:
    ds = el.Dataset.create(robot_schema(), path, **options)
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    return ds


def assert_episode(ref: el.EpisodeRef, want: RawEpisode) -> None:
    seg = ref.read()
    assert ref.length == want.length
    assert (ref.terminated, ref.truncated) == (bool(want.terminated), bool(want.truncated))
    assert ref.meta["task"] == want.meta["task"] and ref.meta["success"] == want.meta["success"]
    for key, values in want.obs.items():
        np.testing.assert_array_equal(seg.data[f"observation/{key}"], values)
    np.testing.assert_array_equal(seg.data["action"], want.action["action"])
    np.testing.assert_array_equal(seg.data["reward"], want.reward)


def assert_dataset(ds: el.Dataset, want: list[RawEpisode]) -> None:
    """Reads, SQL, stats and a segment stream of ``ds`` (episode order) against the reference episodes."""
    assert len(ds) == len(want)
    for ref, raw in zip(ds.episodes(), want, strict=True):
        assert_episode(ref, raw)
    lengths = np.array([w.length for w in want])
    rows = ds.sql("SELECT length, return, terminated, truncated FROM episodes ORDER BY episode_id").fetchnumpy()
    order = np.argsort(ds.episode_ids, kind="stable")
    np.testing.assert_array_equal(rows["length"], lengths[order])
    returns = np.array([w.reward.astype(np.float64).sum() for w in want])
    np.testing.assert_allclose(rows["return"], returns[order], rtol=1e-12, atol=1e-9)
    assert ds.sql("SELECT count(*) AS n FROM steps").fetchnumpy()["n"][0] == lengths.sum()
    stats = ds.stats()
    states = np.concatenate([w.obs["state"] for w in want]).astype(np.float64)
    np.testing.assert_allclose(stats["observation/state"]["mean"], states.mean(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(stats["observation/state"]["max"], states.max(axis=0))
    cams = np.concatenate([w.obs["camera"] for w in want]).astype(np.float64)
    np.testing.assert_allclose(stats["observation/camera"]["mean"], cams.mean(axis=(0, 2, 3)), rtol=1e-12)
    assert stats["length"]["mean"] == pytest.approx(lengths.mean())
    stream = ds.segment_stream(1, batch_size=int(lengths.sum()), sampler=el.Sequential(), prefetch=0)
    batch = next(iter(stream))
    stream.close()
    got = np.sort(np.asarray(batch.data["reward"]).reshape(-1))
    np.testing.assert_array_equal(got, np.sort(np.concatenate([w.reward for w in want])))
    report = ds.maintenance.validate()
    assert report.ok, report.problems


def raw_set(seed: int, n: int, max_length: int = 12, min_length: int = 1) -> list[RawEpisode]:
    rng = np.random.default_rng(seed)
    return [random_episode(rng, int(rng.integers(min_length, max_length))) for _ in range(n)]


def trim_property(seed, n, data):
    """Random episodes and cut points: every read of the trimmed dataset equals the sliced NumPy reference."""
    raws = raw_set(seed, n)
    ds = build(raws)
    ids = ds.episode_ids.tolist()
    before = ds.version
    chosen = data.draw(st.lists(st.integers(0, n - 1), unique=True, min_size=1, max_size=n))
    cuts, want = {}, list(raws)
    for i in chosen:
        t = raws[i].length
        start = data.draw(st.integers(0, t - 1))
        stop = data.draw(st.integers(start + 1, t))
        cuts[ids[i]] = (start, stop)
        want[i] = cut(raws[i], start, stop)
    by_id_length = {e: r.length for e, r in zip(ids, raws, strict=True)}
    report = ds.edit.trim(cuts)
    assert report.version == before + 1 == ds.version
    assert report.steps_removed == sum(raws[i].length - want[i].length for i in chosen)
    assert ds.episode_ids.tolist() == ids  # ids and positions stay
    assert_dataset(ds, want)
    assert ds.history()[0]["operation"] == "TRIM"
    changed = [i for i, (a, b) in cuts.items() if (a, b) != (0, by_id_length[i])]  # a whole-episode cut: no change
    assert ds.changes(before).updated.tolist() == sorted(changed)
    assert not len(ds.changes(before).added) and not len(ds.changes(before).removed)
    old = el.Dataset.open(ds.location.url, version=before)  # time travel: the episodes as they were
    for ref, raw in zip(old.episodes(), raws, strict=True):
        assert_episode(ref, raw)


def split_property(seed, n, data):
    """A random episode split at a random step: two episodes equal to the NumPy halves, new ids."""
    raws = raw_set(seed, n, max_length=14)
    raws[0] = random_episode(np.random.default_rng(seed), int(data.draw(st.integers(2, 14))))
    ds = build(raws)
    ids = ds.episode_ids.tolist()
    before = ds.version
    at = data.draw(st.integers(1, raws[0].length - 1))
    report = ds.edit.split(ids[0], at)
    first, second = report.new_ids
    assert first < second and not set(report.new_ids) & set(ids)
    assert all(i < 0 for i in report.new_ids) and all(i >= 0 for i in ids)  # edit ids never meet a writer's
    head, tail = cut(raws[0], 0, at), cut(raws[0], at, raws[0].length)
    assert (head.terminated, head.truncated) == (False, True)
    assert (tail.terminated, tail.truncated) == (raws[0].terminated, raws[0].truncated)
    by_id = dict(zip(ids, raws, strict=True)) | {first: head, second: tail}
    assert sorted(ds.episode_ids.tolist()) == sorted([first, second, *ids[1:]])
    assert_dataset(ds, [by_id[i] for i in ds.episode_ids.tolist()])
    positions = {int(e): p for p, e in enumerate(ds.episode_ids)}
    assert positions[second] == positions[first] + 1  # the halves stay together, in order
    changes = ds.changes(before)
    assert changes.added.tolist() == sorted([first, second]) and changes.removed.tolist() == [ids[0]]
    assert ds.history()[0]["operation"] == "SPLIT"
    old = el.Dataset.open(ds.location.url, version=before)
    assert old.episode_ids.tolist() == ids


TRIMS = given(seed=st.integers(0, 2**16), n=st.integers(1, 6), data=st.data())
SPLITS = given(seed=st.integers(0, 2**16), n=st.integers(1, 5), data=st.data())
test_trim_matches_the_numpy_reference_and_old_versions_stay = FAST(TRIMS(trim_property))
test_trim_matches_the_numpy_reference_many = pytest.mark.slow(MANY(TRIMS(trim_property)))
test_split_matches_the_numpy_reference = FAST(SPLITS(split_property))
test_split_matches_the_numpy_reference_many = pytest.mark.slow(MANY(SPLITS(split_property)))


def test_set_meta_relabels_in_one_commit_validated_like_a_write(tmp_path):
    raws = raw_set(3, 6)
    for i, r in enumerate(raws):
        r.meta = {"task": "pick" if i % 2 else "place", "success": bool(i % 3)}
    path = str(tmp_path / "ds")
    ds = build(raws, path, partition_by=["task"])
    ids = ds.episode_ids.tolist()
    before = ds.version
    report = ds.edit.set_meta({"task": "stack"}, where="task = ?", params=["pick"])
    picked = [ids[i] for i in range(6) if i % 2]
    assert sorted(report.episode_ids) == sorted(picked) and ds.version == before + 1
    got = ds.sql("SELECT episode_id, task FROM episodes").fetchnumpy()
    labels = dict(zip(got["episode_id"].tolist(), got["task"].tolist(), strict=True))
    assert labels == {e: "stack" if i % 2 else "place" for i, e in enumerate(ids)}
    assert ds.episode_ids.tolist() == ids  # positions stay
    assert ds.changes(before).updated.tolist() == sorted(picked)
    assert ds.history()[0]["operation"] == "SET META"
    assert os.path.isdir(os.path.join(path, "episodes", "task=stack"))  # the partition column moved
    # one value per episode, in the order of episode_ids
    ds.edit.set_meta({"success": [True, False]}, [ids[5], ids[0]])
    assert ds.episode(5).meta["success"] is True and ds.episode(0).meta["success"] is False
    want = [
        replace(r, meta={"task": "stack" if i % 2 else "place", "success": r.meta["success"]})
        for i, r in enumerate(raws)
    ]
    want[5].meta["success"], want[0].meta["success"] = True, False
    assert_dataset(el.Dataset.open(path), want)
    old = el.Dataset.open(path, version=before)
    assert sorted(old.sql("SELECT DISTINCT task FROM episodes").fetchnumpy()["task"].tolist()) == ["pick", "place"]


@pytest.mark.parametrize(
    ("values", "error", "words"),
    [
        ({"task": 3}, el.ValidationError, "'task' must be str"),
        ({"nope": 1}, el.ArgumentError, "'nope' is unknown"),
        ({"reward": 1.0}, el.ArgumentError, "'reward' is a step field"),
        ({}, el.ArgumentError, "non-empty mapping"),
    ],
)
def test_set_meta_refuses_bad_values_and_changes_nothing(values, error, words):
    ds = build(raw_set(4, 3))
    before = ds.version
    with pytest.raises(error, match=words):
        ds.edit.set_meta(values)
    assert ds.version == before and len(ds.history()) == before + 1


def test_bad_edits_name_the_episode_and_change_nothing():
    raws = raw_set(5, 3)
    ds = build(raws)
    ids = ds.episode_ids.tolist()
    before = ds.version
    t = raws[1].length
    with pytest.raises(el.ArgumentError, match=f"episode {ids[1]} has {t} transitions"):
        ds.edit.trim({ids[1]: (0, t + 1)})
    with pytest.raises(el.ArgumentError, match=f"episode {ids[1]} has {t} transitions"):
        ds.edit.trim({ids[0]: (0, 1), ids[1]: (t, t)})
    with pytest.raises(el.ArgumentError, match="two ints"):
        ds.edit.trim({ids[0]: (0,)})
    with pytest.raises(el.ArgumentError, match="not in snapshot"):
        ds.edit.trim({12345: (0, 1)})
    with pytest.raises(el.ArgumentError, match="must keep at least one"):
        ds.edit.trim(head=max(r.length for r in raws))
    with pytest.raises(el.ArgumentError, match=f"episode {ids[2]} has"):
        ds.edit.split(ids[2], raws[2].length)
    with pytest.raises(el.ArgumentError, match="head= and/or tail="):
        ds.edit.trim()
    assert ds.version == before
    assert_dataset(ds, raws)


def test_trim_head_tail_where_and_dry_run():
    raws = raw_set(6, 8, max_length=20)
    for i, r in enumerate(raws):
        r.meta["task"] = "idle" if i < 4 else "busy"
    ds = build(raws)
    long = [i for i, r in enumerate(raws) if i < 4 and r.length > 3]
    where = "task = 'idle' AND length > 3"
    dry = ds.edit.trim(head=2, tail=1, where=where, dry_run=True)
    assert (
        dry.dry_run and ds.version == dry.version and sorted(dry.episode_ids) == sorted(ds.episode_ids[long].tolist())
    )
    ds.edit.trim(head=2, tail=1, where=where)
    want = [cut(r, 2, r.length - 1) if i in long else r for i, r in enumerate(raws)]
    assert_dataset(ds, want)


def test_derived_columns_follow_trim_and_split_or_refuse():
    raws = raw_set(7, 3, min_length=3)
    ds = build(raws)
    ids = ds.episode_ids.tolist()
    ds.columns.add(el.FieldSpec("label", (), "str", role="meta"))
    ds.columns.update({"label": ["a", "b", "c"]})
    ds.edit.trim({ids[1]: (0, 1)})  # per-episode derived values are keyed by id: they stay
    assert [e.meta["label"] for e in ds.episodes()] == ["a", "b", "c"]
    ds.columns.add(el.FieldSpec("advantage", (), "float32", role="reward"))
    adv = [np.arange(r.length, dtype=np.float32) + 10 * i for i, r in enumerate(raws)]
    adv[1] = adv[1][:1]
    ds.columns.update({"reward/advantage": adv[:2]}, ids[:2])  # episode 2 has no per-step value
    before = ds.version
    with pytest.raises(el.ArgumentError, match=r"per-step derived columns \['reward/advantage'\]"):
        ds.edit.trim({ids[0]: (0, 1)})
    assert ds.version == before
    halves = ds.edit.split(ids[0], 2).new_ids  # values follow: label copied, advantage cut at step 2
    other = ds.edit.split(ids[2], 1).new_ids  # no per-step value to cut: the halves have none either
    got = {int(e.episode_id): e for e in ds.episodes()}
    assert got[halves[0]].meta["label"] == got[halves[1]].meta["label"] == "a"
    np.testing.assert_array_equal(got[halves[0]].read().data["reward/advantage"], adv[0][:2])
    np.testing.assert_array_equal(got[halves[1]].read().data["reward/advantage"], adv[0][2:])
    assert got[other[0]].meta["label"] == got[other[1]].meta["label"] == "c"
    assert np.isnan(got[other[1]].read().data["reward/advantage"]).all()  # unset per-step values read NaN
    rows = ds.sql(
        "SELECT e.label, count(*) FROM steps s JOIN episodes e USING (episode_id) "
        'WHERE s."reward/advantage" IS NOT NULL GROUP BY e.label'
    )
    assert sorted(rows.fetchall()) == [("a", raws[0].length), ("b", 1)]
    with pytest.raises(el.ArgumentError, match=r"ds\.columns\.update"):
        ds.edit.set_meta({"label": "x"})
    old = el.Dataset.open(ds.location.url, version=before)
    assert old.episode_ids.tolist() == ids


def test_an_edit_of_episodes_changed_meanwhile_commits_nothing(tmp_path):
    path = str(tmp_path / "ds")
    raws = raw_set(8, 3)
    first = build(raws, path)
    ids = first.episode_ids.tolist()
    second = el.Dataset.open(path)
    second.snapshot()
    first.edit.set_meta({"task": "other"}, [ids[0]])
    version = first.version
    with pytest.raises(el.CommitConflictError, match="changed concurrently"):
        second.edit.trim({ids[0]: (0, 1)})
    first.delete([ids[1]])
    with pytest.raises(el.CommitConflictError, match="no longer in the latest version"):
        second.edit.set_meta({"success": True}, [ids[1]])
    assert el.Dataset.open(path).version == version + 1
    assert el.Dataset.open(path).maintenance.validate().ok


def test_partitioned_disk_edits_survive_vacuum(tmp_path):
    path = str(tmp_path / "ds")
    raws = raw_set(9, 6, max_length=16, min_length=3)
    ds = build(raws[:3], path, partition_by=["task"])
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws[3:])  # a second commit: two arrays of rows
    ds.flush()
    ids = ds.episode_ids.tolist()
    ds.edit.trim({ids[0]: (1, raws[0].length), ids[4]: (0, 2)})
    new = ds.edit.split(ids[2], 1).new_ids
    ds.edit.set_meta({"task": "moved"}, [ids[3]])
    raws[3].meta["task"] = "moved"
    want = {ids[0]: cut(raws[0], 1, raws[0].length), ids[4]: cut(raws[4], 0, 2), ids[1]: raws[1]}
    want |= {new[0]: cut(raws[2], 0, 1), new[1]: cut(raws[2], 1, raws[2].length), ids[3]: raws[3], ids[5]: raws[5]}
    report = ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    assert not report.tensor_arrays  # every array still holds rows an edited episode references
    assert report.unreferenced_rows > 0  # the trimmed-off rows: counted, kept with their array
    reopened = el.Dataset.open(path)
    assert_dataset(reopened, [want[i] for i in reopened.episode_ids.tolist()])
    copy = reopened.copy_to(str(tmp_path / "copy"), progress=False)  # a copy holds only the referenced rows
    assert copy.maintenance.vacuum(dry_run=True).unreferenced_rows == 0
    assert_dataset(copy, [want[i] for i in copy.episode_ids.tolist()])


def test_capacity_dataset_trims_and_refuses_a_split_over_capacity(tmp_path):
    path = str(tmp_path / "ds")
    raws = raw_set(10, 4, max_length=10, min_length=2)
    ds = build(raws, path, capacity={"episodes": 4})
    ids = ds.episode_ids.tolist()
    ds.edit.trim({ids[0]: (0, 1)})
    with pytest.raises(el.ArgumentError, match="at most 4 episodes"):
        ds.edit.split(ids[1], 1)
    assert_dataset(el.Dataset.open(path), [cut(raws[0], 0, 1), *raws[1:]])


@pytest.mark.slow
def test_pinned_reader_in_another_process_keeps_reading_the_old_version(tmp_path):
    from .workers.replay import episode, schema

    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path)
    ds.append_episodes(episode(n, 6) for n in range(4))
    ds.flush()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    reader = subprocess.Popen(
        [sys.executable, "-m", "tests.workers.replay", "read", path],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert reader.stdout.readline().split() == ["ready", "0", "1", "2", "3"]
    ids = ds.episode_ids.tolist()
    ds.edit.trim({ids[1]: (2, 5)})
    ds.edit.split(ids[2], 3)
    ds.edit.set_meta({"kind": "changed"})
    out, _ = reader.communicate("go\n", timeout=120)
    assert reader.returncode == 0 and out.strip() == "ok"  # its (old) snapshot reads the untrimmed episodes


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "episodelake.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_cli_edit_set_meta_commits_once(tmp_path):
    path = str(tmp_path / "ds")
    raws = raw_set(14, 3)
    build(raws, path).close()
    ids = el.Dataset.open(path).episode_ids.tolist()
    done = run_cli("edit", "set-meta", path, "task=relabeled", "--ids", f"{ids[0]},{ids[2]}", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["episode_ids"] == [ids[0], ids[2]]
    ds = el.Dataset.open(path)
    assert ds.version == 2 and ds.history()[0]["operation"] == "SET META"
    assert [e.meta["task"] for e in ds.episodes()] == ["relabeled", raws[1].meta["task"], "relabeled"]


@pytest.mark.slow
def test_cli_edit_trim_split_set_meta_with_dry_run(tmp_path):
    path = str(tmp_path / "ds")
    raws = raw_set(12, 3, max_length=12, min_length=5)
    build(raws, path).close()
    ids = el.Dataset.open(path).episode_ids.tolist()
    dry = run_cli("edit", "trim", path, "--head", "1", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["dry_run"] is True and el.Dataset.open(path).version == 1
    done = run_cli("edit", "trim", path, "--episode", f"{ids[0]}:1:3", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) | {"version": 2} == json.loads(done.stdout)
    done = run_cli("edit", "set-meta", path, "task=relabeled", "success=true", "--ids", str(ids[-1]))
    assert done.returncode == 0 and "SET META: edited 1 episodes" in done.stdout, done.stderr
    done = run_cli("edit", "split", path, str(ids[-1]), "2", "--json")
    assert done.returncode == 0, done.stderr
    halves = json.loads(done.stdout)["new_ids"]
    bad = run_cli("edit", "split", path, str(ids[0]), "0")
    assert bad.returncode == 1 and "at=0" in bad.stderr
    ds = el.Dataset.open(path)
    assert [h["operation"] for h in ds.history()[:3]] == ["SPLIT", "SET META", "TRIM"]
    last = replace(raws[-1], meta={"task": "relabeled", "success": True})
    want = {ids[0]: cut(raws[0], 1, 3), halves[0]: cut(last, 0, 2), halves[1]: cut(last, 2, last.length)}
    want |= {i: r for i, r in zip(ids[1:-1], raws[1:-1], strict=True)}
    assert_dataset(ds, [want[i] for i in ds.episode_ids.tolist()])


def test_edits_on_s3(s3_server, s3_url):
    options = s3_server.storage_options
    raws = [random_episode(np.random.default_rng(s), 6) for s in range(3)]
    ds = build(raws, s3_url, storage_options=options)
    ids = ds.episode_ids.tolist()
    ds.edit.trim({ids[0]: (2, 6)})
    new = ds.edit.split(ids[1], 4).new_ids
    ds.edit.set_meta({"task": "s3"}, [ids[2]])
    raws[2].meta["task"] = "s3"
    want = {ids[0]: cut(raws[0], 2, 6), new[0]: cut(raws[1], 0, 4), new[1]: cut(raws[1], 4, 6), ids[2]: raws[2]}
    reopened = el.Dataset.open(s3_url, storage_options=options)
    assert_dataset(reopened, [want[i] for i in reopened.episode_ids.tolist()])


def test_many_episodes_are_replaced_over_their_id_range_and_the_others_stay(tmp_path):
    path = str(tmp_path / "ds")
    raws = raw_set(15, 100, max_length=6, min_length=2)
    for i, r in enumerate(raws):
        r.meta = {"task": "pick" if i % 3 else "place", "success": False}
    ds = build(raws[:40], path, partition_by=["task"])
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws[40:])
    ds.flush()
    picked = [i for i in range(100) if i % 3]  # 66 (> 64) of 100, in two files, unedited neighbours between
    report = ds.edit.set_meta({"success": True}, where="task = 'pick'")
    assert len(report.episode_ids) == len(picked)
    got = ds.sql("SELECT count(*) AS n FROM episodes WHERE success").fetchnumpy()["n"][0]
    assert got == len(picked) and len(ds) == 100
    ds.edit.trim(head=1, where="length >= 2")  # all 100: replaced over their id range
    want = [cut(replace(r, meta={**r.meta, "success": bool(i % 3)}), 1, r.length) for i, r in enumerate(raws)]
    assert_dataset(el.Dataset.open(path), want)


def test_dry_run_reads_only_and_required_meta_cannot_be_unset(tmp_path):
    path = str(tmp_path / "ds")
    fields = [*robot_schema().fields]
    fields[-1] = el.FieldSpec("success", (), "bool", role="meta", required=True)
    ds = el.Dataset.create(el.DatasetSchema(fields), path)
    raws = raw_set(16, 3, min_length=3)
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    reader = el.Dataset.open(path, read_only=True)
    dry = reader.edit.trim(head=1, dry_run=True)
    assert dry.dry_run and dry.steps_removed == 3 and reader.version == ds.version == 1
    with pytest.raises(el.ReadOnlyError):
        reader.edit.trim(head=1)
    with pytest.raises(el.ValidationError, match="'success' is required"):
        ds.edit.set_meta({"success": None})
    assert el.Dataset.open(path).version == 1
    assert_dataset(el.Dataset.open(path), raws)


def test_edits_after_a_schema_edit_use_the_new_fields():
    raws = raw_set(17, 4, min_length=3)
    ds = build(raws)
    ds.columns.drop("success")
    ds.columns.rename("task", "label")
    ids = ds.episode_ids.tolist()
    ds.edit.trim({ids[0]: (1, 3)})
    ds.edit.set_meta({"label": "x"}, [ids[1]])
    with pytest.raises(el.ArgumentError, match="'task' is unknown"):
        ds.edit.set_meta({"task": "y"})
    want = cut(raws[0], 1, 3)
    ref = ds.episode(0)
    assert ref.length == 2 and ref.truncated == (raws[0].length != 3) and "success" not in ref.meta
    np.testing.assert_array_equal(ref.read().data["observation/camera"], want.obs["camera"])
    labels = [e.meta["label"] for e in ds.episodes()]
    assert labels == [raws[0].meta["task"], "x", *(r.meta["task"] for r in raws[2:])]
    assert ds.maintenance.validate().ok


def test_a_stream_state_taken_before_an_edit_resumes_on_the_version_it_recorded(tmp_path):
    path = str(tmp_path / "ds")
    raws = raw_set(18, 5, min_length=4)
    ds = build(raws, path)
    ids = ds.episode_ids.tolist()
    stream = ds.segment_stream(2, batch_size=4, sampler=el.Uniform(replacement=False), seed=3, prefetch=0)
    it = iter(stream)
    next(it)
    state = stream.state_dict()
    following = [np.asarray(next(it).data["reward"]) for _ in range(2)]
    stream.close()
    ds.edit.trim({i: (0, 1) for i in ids})  # every episode down to one transition
    resumed = el.stream_from_state(state)
    again = iter(resumed)
    for want in following:  # the recorded version, not the edited one
        np.testing.assert_array_equal(np.asarray(next(again).data["reward"]), want)
    resumed.close()
    fresh = ds.segment_stream(1, batch_size=5, sampler=el.Sequential(), prefetch=0)
    got = np.sort(np.asarray(next(iter(fresh)).data["reward"]).reshape(-1))
    fresh.close()
    np.testing.assert_array_equal(got, np.sort([r.reward[0] for r in raws]))


def test_set_meta_checks_the_fields_constraints_like_a_write():
    fields = [*robot_schema().fields, el.FieldSpec("score", (), "float32", role="meta", min=0.0, max=1.0)]
    ds = el.Dataset.create(el.DatasetSchema(fields))
    raws = raw_set(19, 3)
    for r in raws:
        r.meta["score"] = 0.5
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ids = ds.episode_ids.tolist()
    before = ds.version
    for bad in (3.0, float("nan"), -0.5):
        with pytest.raises(el.QualityError, match=f"episode {ids[1]}: meta field 'score' fails"):
            ds.edit.set_meta({"score": [0.25, bad, None]})
    assert ds.version == before
    ds.edit.set_meta({"score": [0.25, 1.0, None]})  # the bounds themselves pass, and so does NULL
    assert [e.meta["score"] for e in ds.episodes()] == [0.25, 1.0, None]


def test_a_trim_built_block_by_block_equals_one_built_at_once(monkeypatch):
    from episodelake.ops import edit

    raws = raw_set(20, 5, min_length=3)
    ds = build(raws)
    monkeypatch.setattr(edit, "BLOCK_BYTES", 1)  # one episode per block: the blocks are joined in order
    ds.edit.trim(head=1, tail=1)
    assert_dataset(ds, [cut(r, 1, r.length - 1) for r in raws])


def test_edits_write_no_tensor_bytes(tmp_path):
    path = str(tmp_path / "ds")
    raws = raw_set(22, 4, min_length=3)
    ds = build(raws, path)
    ids = ds.episode_ids.tolist()

    def tensor_files() -> dict[str, tuple[int, int]]:
        root = Path(path, "tensors")
        return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}

    before = tensor_files()
    assert before  # the camera field's arrays
    ds.edit.trim({ids[0]: (1, 3)})
    ds.edit.split(ids[1], 2)
    ds.edit.set_meta({"task": "x"})
    assert tensor_files() == before  # same files, same sizes, never rewritten
    reopened = el.Dataset.open(path)
    assert reopened.maintenance.validate().ok
    np.testing.assert_array_equal(
        reopened.episode(id=ids[0]).read().data["observation/camera"], raws[0].obs["camera"][1:4]
    )


def test_dry_runs_of_set_meta_and_split_commit_nothing():
    raws = raw_set(23, 3, min_length=2)
    ds = build(raws)
    ids = ds.episode_ids.tolist()
    report = ds.edit.set_meta({"task": "x"}, dry_run=True)
    assert report.dry_run and report.episode_ids == ids and report.version == ds.version == 1
    report = ds.edit.split(ids[0], 1, dry_run=True)
    assert report.dry_run and report.episode_ids == [ids[0]] and ds.version == 1
    assert len(ds.history()) == 2
    assert_dataset(ds, raws)
    nothing = ds.edit.set_meta({"task": "x"}, where="length > 1000")  # no episode matches: no commit
    assert not nothing.dry_run and not nothing.episode_ids and ds.version == 1


def test_an_id_range_edit_keeps_what_landed_meanwhile_and_refuses_changed_episodes(tmp_path):
    path = str(tmp_path / "ds")
    raws = raw_set(17, 100, max_length=4)
    first = build(raws, path)
    ids = first.episode_ids.tolist()
    picked = [ids[i] for i in range(100) if i % 3]  # 66 (> 64): replaced over their id range
    second = el.Dataset.open(path)
    second.snapshot()
    first.edit.set_meta({"task": "moved"}, [ids[3]])  # an unedited episode inside the range changes meanwhile
    second.edit.set_meta({"success": True}, picked)  # its rows read before that commit: read again, not reverted
    want = {eid: (r.meta["task"], r.meta["success"]) for eid, r in zip(ids, raws, strict=True)}
    want[ids[3]] = ("moved", want[ids[3]][1])
    want |= {eid: (want[eid][0], True) for eid in picked}
    reopened = el.Dataset.open(path)
    assert {int(e.episode_id): (e.meta["task"], e.meta["success"]) for e in reopened.episodes()} == want
    third = el.Dataset.open(path)
    third.snapshot()
    latest = el.Dataset.open(path)
    latest.edit.set_meta({"task": "again"}, [picked[-1]])  # an edited episode changes meanwhile: nothing is edited
    version = latest.version
    with pytest.raises(el.CommitConflictError, match="changed concurrently"):
        third.edit.trim(head=0, tail=1, where="length >= 2")
    assert el.Dataset.open(path).version == version
    assert el.Dataset.open(path).maintenance.validate().ok


@pytest.mark.parametrize("sizes", [(1, 64), (65, 80)], ids=["id-list", "id-range"])
@FAST
@given(seed=st.integers(0, 2**16), data=st.data())
def test_set_meta_per_episode_values_land_on_their_episodes(sizes, seed, data):
    """One value per episode, in the (shuffled) ``episode_ids`` order, few (an id list) or many (an id range)."""
    raws = raw_set(seed, 80, max_length=3)
    ds = build(raws)
    ids = ds.episode_ids.tolist()
    chosen = data.draw(st.permutations(ids))[: data.draw(st.integers(*sizes))]
    labels = [f"t{seed}-{i}" for i in range(len(chosen))]
    flags = data.draw(st.lists(st.booleans(), min_size=len(chosen), max_size=len(chosen)))
    ds.edit.set_meta({"task": labels, "success": flags}, chosen)
    want = {eid: (r.meta["task"], r.meta["success"]) for eid, r in zip(ids, raws, strict=True)}
    want |= {eid: (label, flag) for eid, label, flag in zip(chosen, labels, flags, strict=True)}
    assert {int(e.episode_id): (e.meta["task"], e.meta["success"]) for e in ds.episodes()} == want
    rows = ds.sql("SELECT episode_id, task FROM episodes").fetchall()
    assert {int(e): t for e, t in rows} == {eid: t for eid, (t, _) in want.items()}
