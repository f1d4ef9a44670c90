"""Schema edits (issue 23): ``ds.columns.drop(*keys)`` and ``ds.columns.rename(old, new)``.

Expectations come from the raw NumPy episodes the test generated
(``tests/reference.py``) and a plain mapping of each original key to its key
after the edits (None: dropped): reads, SQL, ``stats()``, a segment stream,
time travel (every intermediate version reads its own fields), ``history()``
and ``validate()``, in memory, on disk and on S3; writers opened before an
edit (this process and another) get a clear error; a SIGKILL during an edit
leaves the old fields or the new ones, never a mix.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

from .conftest import robot_schema
from .reference import RawEpisode, random_episode

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
FAST = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MANY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
STEP_KEYS = ("observation/state", "observation/camera", "action", "reward")
META_KEYS = ("task", "success")
ORIGINAL = {k: k for k in (*STEP_KEYS, *META_KEYS)}
# the candidate edits: (kind, key, new key); a drop that would leave no observation is refused (tested apart)
EDITS = [
    ("rename", "observation/state", "observation/pose"),
    ("rename", "observation/camera", "observation/cam"),
    ("rename", "task", "label"),
    ("rename", "action", "action/move"),
    ("rename", "reward", "reward/r"),
    ("drop", "success", None),
    ("drop", "observation/state", None),
    ("drop", "observation/camera", None),
]


def raw_set(seed: int, n: int) -> list[RawEpisode]:
    rng = np.random.default_rng(seed)
    return [random_episode(rng, int(rng.integers(1, 10))) for _ in range(n)]


def build(raws: list[RawEpisode], path: str | None = None, **options) -> el.Dataset:
    ds = el.Dataset.create(robot_schema(), path, **options)
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    return ds


def raw_values(raw: RawEpisode, key: str):
    """The reference value of original field ``key`` of ``raw``."""
    if key.startswith("observation/"):
        return raw.obs[key.split("/", 1)[1]]
    return {"action": raw.action["action"], "reward": raw.reward}.get(key, raw.meta.get(key))


def assert_fields(ds: el.Dataset | el.DatasetView, raws: list[RawEpisode], keys: dict[str, str | None]) -> None:
    """``ds`` holds ``raws`` (in order) with original field ``k`` under key ``keys[k]`` (None: gone)."""
    present = {k: v for k, v in keys.items() if v is not None}
    assert sorted(f.key for f in ds.schema.fields) == sorted(present.values())
    assert len(ds) == len(raws)
    for ref, raw in zip(ds.episodes(), raws, strict=True):
        seg = ref.read()
        assert sorted(seg.data) == sorted(present[k] for k in STEP_KEYS if k in present)
        for k in STEP_KEYS:
            if k in present:
                np.testing.assert_array_equal(seg.data[present[k]], raw_values(raw, k))
        assert ref.meta == {present[k]: raw.meta[k] for k in META_KEYS if k in present}
    order = np.argsort(ds.episode_ids, kind="stable")
    for k in META_KEYS:
        if k in present:
            got = ds.sql(f'SELECT "{present[k]}" AS v FROM episodes ORDER BY episode_id').fetchnumpy()["v"]
            assert list(got) == [raws[i].meta[k] for i in order]
        else:
            with pytest.raises(el.QueryError):
                ds.sql(f"SELECT {k} FROM episodes").fetchall()
    rewards = ds.sql(f'SELECT sum(len("{present["reward"]}")) AS n FROM episodes').fetchnumpy()["n"][0]
    assert rewards == sum(r.length for r in raws)
    stats = ds.stats()
    if "observation/state" in present:
        states = np.concatenate([r.obs["state"] for r in raws]).astype(np.float64)
        np.testing.assert_allclose(stats[present["observation/state"]]["mean"], states.mean(axis=0), rtol=1e-9)
    assert "observation/state" in present or "observation/state" not in stats
    total = sum(r.length for r in raws)
    stream = ds.segment_stream(1, batch_size=total, sampler=el.Sequential(), prefetch=0)
    batch = next(iter(stream))
    stream.close()
    got = np.sort(np.asarray(batch.data[present["reward"]]).reshape(-1))
    np.testing.assert_array_equal(got, np.sort(np.concatenate([r.reward for r in raws])))
    if isinstance(ds, el.Dataset):
        report = ds.maintenance.validate()
        assert report.ok, report.problems


def edits_property(seed, n, data):
    """A random sequence of drops and renames: every version reads the reference under its own fields."""
    raws = raw_set(seed, n)
    ds = build(raws)
    picked = data.draw(st.lists(st.sampled_from(EDITS), unique=True, min_size=1, max_size=4))
    keys, versions = dict(ORIGINAL), [(ds.version, dict(ORIGINAL))]
    for kind, key, new in picked:
        obs_left = [k for k in ("observation/state", "observation/camera") if keys[k] is not None]
        if keys[key] is None or (kind == "drop" and obs_left == [key]):
            continue
        report = ds.columns.drop(keys[key]) if kind == "drop" else ds.columns.rename(keys[key], new)
        assert report.version == versions[-1][0] + 1 == ds.version and report.episodes == n
        assert ds.history()[0]["operation"] == ("DROP FIELDS" if kind == "drop" else "RENAME FIELD")
        keys[key] = new
        versions.append((ds.version, dict(keys)))
    assert_fields(ds, raws, keys)
    for version, then in versions[:-1]:  # time travel: each version reads the fields it had
        assert_fields(el.Dataset.open(ds.location.url, version=version), raws, then)
    reopened = el.Dataset.open(ds.location.url)
    assert_fields(reopened, raws, keys)


EDIT_CASES = given(seed=st.integers(0, 2**16), n=st.integers(1, 4), data=st.data())
test_edits_match_the_reference_at_every_version = FAST(EDIT_CASES(edits_property))
test_edits_match_the_reference_at_every_version_many = pytest.mark.slow(MANY(EDIT_CASES(edits_property)))


def test_new_episodes_use_the_new_names_and_tensors_are_never_written(tmp_path):
    raws = raw_set(1, 4)
    ds = build(raws, str(tmp_path / "ds"))
    tensors = sorted(p.relative_to(tmp_path) for p in (tmp_path / "ds" / "tensors").rglob("*") if p.is_file())
    stamps = {p: (tmp_path / p).stat().st_mtime_ns for p in tensors}
    ds.columns.rename("observation/camera", "observation/cam")
    ds.columns.rename("task", "label")
    ds.columns.drop("success")
    after = sorted(p.relative_to(tmp_path) for p in (tmp_path / "ds" / "tensors").rglob("*") if p.is_file())
    assert after == tensors and all((tmp_path / p).stat().st_mtime_ns == stamps[p] for p in tensors)
    extra = raw_set(2, 2)
    for raw in extra:
        ep = raw.as_dict(unwrap_action=True)
        ep["initial_observation"]["cam"] = ep["initial_observation"].pop("camera")
        ep["observations"]["cam"] = ep["observations"].pop("camera")
        ep["meta"] = {"label": raw.meta["task"]}
        ds.append_episodes([ep])
    ds.flush()
    for raw in extra:
        del raw.meta["success"]
    for raw in raws:
        del raw.meta["success"]
    keys = {**ORIGINAL, "observation/camera": "observation/cam", "task": "label", "success": None}
    assert_fields(ds, raws + extra, keys)
    assert_fields(el.Dataset.open(str(tmp_path / "ds")), raws + extra, keys)
    assert_fields(ds.copy_to(str(tmp_path / "copy")), raws + extra, keys)  # the renamed arrays copied, verified
    assert ds.sql("SELECT count(*) AS n FROM episodes WHERE label = 'pick'").fetchnumpy()["n"][0] == sum(
        r.meta["task"] == "pick" for r in raws + extra
    )
    assert len(ds.where("label = $t", {"t": "place"})) == sum(r.meta["task"] == "place" for r in raws + extra)


def test_a_writer_opened_before_the_edit_gets_a_clear_error(tmp_path):
    path = str(tmp_path / "ds")
    raws = raw_set(3, 3)
    ds = build(raws, path)
    writer = el.Dataset.open(path)
    raw = raws[0]
    ep = writer.new_episode({k: v[0] for k, v in raw.obs.items()}, **raw.meta)
    for t in range(raw.length):
        obs = {k: v[t + 1] for k, v in raw.obs.items()}
        ep.add_step({"observations": obs, "actions": raw.action["action"][t], "rewards": raw.reward[t]})
    ep.finish()  # pending in the writer, recorded under the old fields
    before = ds.version
    ds.columns.drop("success")
    with pytest.raises(el.SchemaError, match="edited"):
        writer.flush()
    assert el.Dataset.open(path).version == before + 1 and len(el.Dataset.open(path)) == 3
    with pytest.raises(el.SchemaError, match="discard"):
        writer.flush()  # still held: never half-committed
    writer.flush(discard=True)
    ep = raws[1].as_dict(unwrap_action=True)
    ep["meta"] = {"task": "again"}
    writer.append_episodes([ep])  # episodes recorded after the edit use the new fields
    writer.flush()
    assert sorted(el.Dataset.open(path).sql("SELECT task FROM episodes").fetchnumpy()["task"]) == sorted(
        [r.meta["task"] for r in raws] + ["again"]
    )


WRITER = """
import sys, numpy as np, episodelake as el
from tests.reference import random_episode
ds = el.Dataset.open(sys.argv[1])
ep = random_episode(np.random.default_rng(0), 5).as_dict(unwrap_action=True)
print("ready", flush=True)
sys.stdin.readline()
try:
    ds.append_episodes([ep])
    ds.flush()
except el.SchemaError as exc:
    print("SchemaError", exc, flush=True)
    sys.exit(3)
"""


def test_a_writer_in_another_process_opened_before_the_edit_gets_a_clear_error(tmp_path):
    path = str(tmp_path / "ds")
    raws = raw_set(4, 3)
    ds = build(raws, path)
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, path],
        cwd=ROOT,
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "ready"
    ds.columns.rename("task", "label")
    out, _ = child.communicate("go\n", timeout=120)
    assert child.returncode == 3 and "SchemaError" in out and "edited" in out
    after = el.Dataset.open(path)
    assert len(after) == 3 and [f.key for f in after.schema.meta_fields] == ["label", "success"]
    assert after.maintenance.validate().ok


@pytest.mark.parametrize(
    "edit, error, words",
    [
        (lambda ds: ds.columns.drop("observation/state", "observation/camera"), el.SchemaError, "observation"),
        (lambda ds: ds.columns.drop("reward"), el.SchemaError, "reward"),
        (lambda ds: ds.columns.drop("nope"), el.ArgumentError, "not a field"),
        (lambda ds: ds.columns.drop(), el.ArgumentError, "at least one"),
        (lambda ds: ds.columns.drop("task", "task"), el.ArgumentError, "repeat"),
        (lambda ds: ds.columns.drop("task"), el.ArgumentError, "partition"),
        (lambda ds: ds.columns.rename("task", "label"), el.ArgumentError, "partition"),
        (lambda ds: ds.columns.drop("score"), el.ArgumentError, "derived"),
        (lambda ds: ds.columns.rename("score", "grade"), el.ArgumentError, "derived"),
        (lambda ds: ds.columns.rename("observation/state", "action/state"), el.ArgumentError, "keeps its role"),
        (lambda ds: ds.columns.rename("observation/state", "observation/camera"), el.SchemaError, "duplicate"),
        (lambda ds: ds.columns.rename("success", "length"), el.SchemaError, "reserved"),
        (lambda ds: ds.columns.rename("success", "score"), el.SchemaError, "duplicate"),
        (lambda ds: ds.columns.rename("success", "success"), el.ArgumentError, "already"),
        (lambda ds: ds.columns.rename("success", 3), el.ArgumentError, "non-empty str"),
    ],
)
def test_bad_schema_edits_raise_and_change_nothing(edit, error, words):
    raws = raw_set(5, 2)
    ds = build(raws, partition_by=["task"])
    ds.columns.add(el.FieldSpec("score", (), "float32", role="meta"))
    before, schema = ds.version, ds.schema
    with pytest.raises(error, match=words):
        edit(ds)
    assert ds.version == before and ds.schema == schema and ds.maintenance.validate().ok


def test_dry_run_reports_and_read_only_refuses(tmp_path):
    path = str(tmp_path / "ds")
    build(raw_set(6, 2), path)
    ro = el.Dataset.open(path, read_only=True)
    report = ro.columns.drop("observation/camera", dry_run=True)
    assert report.dry_run and report.fields == {"observation/camera": None}
    assert set(report.columns) == {
        "ref/observation/camera",
        "crc/observation/camera",
        *(f"stats/observation/camera/{p}" for p in ("count", "sum", "sumsq", "min", "max")),
    }
    assert el.Dataset.open(path).version == report.version == 1
    as_json = json.loads(json.dumps(report.to_json()))  # what `episodelake edit ... --json` prints
    assert as_json["operation"] == report.operation and as_json["dry_run"] is True
    assert as_json["fields"] == {"observation/camera": None} and set(as_json["columns"]) == set(report.columns)
    with pytest.raises(el.ReadOnlyError):
        ro.columns.rename("task", "label")
    with pytest.raises(el.ReadOnlyError):
        el.Dataset.open(path, version=0).columns.drop("task")


def test_derived_columns_and_changes_survive_a_schema_edit(tmp_path):
    raws = raw_set(7, 3)
    ds = build(raws, str(tmp_path / "ds"))
    ds.columns.add(el.FieldSpec("score", (), "float32", role="meta"))
    ds.columns.update({"score": [1.0, 2.0, 3.0]})
    before = ds.version
    ds.columns.rename("task", "label")
    assert ds.sql("SELECT score FROM episodes ORDER BY score").fetchnumpy()["score"].tolist() == [1.0, 2.0, 3.0]
    changes = ds.changes(before)  # every row changed its columns: the same episodes, all updated
    assert not len(changes.added) and not len(changes.removed)
    assert changes.updated.tolist() == sorted(ds.episode_ids.tolist())
    ds.columns.drop("success")
    assert ds.changes(before + 1).updated.tolist() == sorted(ds.episode_ids.tolist())


def test_schema_edits_on_s3(s3_server, s3_url):
    options = s3_server.storage_options
    raws = raw_set(8, 3)
    ds = build(raws, s3_url, storage_options=options)
    ds.columns.rename("observation/camera", "observation/cam")
    ds.columns.drop("success")
    for raw in raws:
        del raw.meta["success"]
    keys = {**ORIGINAL, "observation/camera": "observation/cam", "success": None}
    assert_fields(el.Dataset.open(s3_url, storage_options=options), raws, keys)
    assert_fields(el.Dataset.open(s3_url, version=1, storage_options=options), raw_set(8, 3), ORIGINAL)


KILLED = """
import sys, threading, os, signal, time
import episodelake as el
import episodelake.storage.table as table
ds = el.Dataset.open(sys.argv[1])
kill = lambda: os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[2] in ("before", "after"):  # at the overwrite: before it starts, or once it committed
    real = table.write_deltalake
    def write(*args, **kwargs):
        if sys.argv[2] == "before":
            kill()
        real(*args, **kwargs)
        kill()
    table.write_deltalake = write
else:  # at a random moment
    threading.Timer(float(sys.argv[2]), kill).start()
ds.columns.rename("observation/camera", "observation/cam") if sys.argv[3] == "rename" else ds.columns.drop("task")
time.sleep(60)  # the edit is done: wait for the kill
"""


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["rename", "drop"])
def test_sigkill_during_a_schema_edit_leaves_old_or_new(tmp_path, edit):
    raws = raw_set(9, 4)
    outcomes = set()
    delays = ["before", "after", *map(str, np.random.default_rng(10).uniform(0.0, 0.6, 8).tolist())]
    for trial, delay in enumerate(delays):
        path = str(tmp_path / f"ds{trial}")
        build(raws, path)
        child = subprocess.run([sys.executable, "-c", KILLED, path, delay, edit], cwd=ROOT, env=ENV, timeout=120)
        assert child.returncode == -signal.SIGKILL
        ds = el.Dataset.open(path)
        if ds.version == 1:
            outcomes.add("old")
            keys = dict(ORIGINAL)
        else:
            assert ds.version == 2
            outcomes.add("new")
            keys = (
                {**ORIGINAL, "observation/camera": "observation/cam"}
                if edit == "rename"
                else {**ORIGINAL, "task": None}
            )
        want = [RawEpisode(r.obs, r.action, r.reward, r.terminated, r.truncated, dict(r.meta)) for r in raws]
        if keys["task"] is None:
            for w in want:
                del w.meta["task"]
        assert_fields(ds, want, keys)
        assert json.loads((Path(path) / "episodelake.json").read_text())["schema"] == robot_schema().to_json()
    assert outcomes == {"old", "new"}  # the kill points give both; the random kills may give either


def test_vacuum_keeps_the_arrays_of_dropped_tensor_fields_for_older_versions(tmp_path):
    from .test_vacuum_safety import age_files

    path = str(tmp_path / "ds")
    raws = raw_set(11, 3)
    ds = build(raws, path)
    ds.columns.drop("observation/camera")  # the only tensor field
    age_files(str(tmp_path / "ds" / "tensors"), 2.0)  # past the 1 h floor for data no version references
    report = ds.maintenance.vacuum()
    assert not report.tensor_arrays
    old = el.Dataset.open(path, version=1)  # still in the retention window: reads its camera rows
    for ref, raw in zip(old.episodes(), raws, strict=True):
        np.testing.assert_array_equal(ref.read().data["observation/camera"], raw.obs["camera"])
    assert old.maintenance.validate().ok


def test_a_view_taken_before_the_edit_keeps_reading_its_fields():
    raws = raw_set(12, 3)
    ds = build(raws)
    view = ds.where("task IS NOT NULL")  # pinned to the version before the edits
    ds.columns.rename("observation/camera", "observation/cam")
    ds.columns.rename("task", "label")
    assert_fields(view, raws, ORIGINAL)
    assert_fields(ds, raws, {**ORIGINAL, "observation/camera": "observation/cam", "task": "label"})
