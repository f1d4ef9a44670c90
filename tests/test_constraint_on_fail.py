"""FieldSpec constraints with ``on_fail=`` (issue 39, item 8): reject, quarantine or warn, as ``el.Check`` does.

Each episode is built so that it fails exactly the constraints the test
names; the expected outcome (stored, quarantined, recorded names) is
written from docs/writing.md#quality-gates, not from the gate's code.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import episodelake as el


def schema(**obs_options) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("observation", (2,), "float32", **obs_options),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("n", (), "int64", role="meta"),
        ]
    )


def episode(n: int, frozen: bool = False, low: bool = False, length: int = 8) -> dict:
    """Episode ``n``: ``frozen`` repeats row 1 over rows 1..5 (a run of 5 identical rows, max_repeat=3 fails at
    step 4); ``low`` puts -5 in row 2 (min=-1 fails at step 2); otherwise every row differs and stays >= 0."""
    obs = np.arange(2 * (length + 1), dtype=np.float32).reshape(length + 1, 2)
    if frozen:
        obs[1:6] = obs[1]
    if low:
        obs[2, 0] = -5
    return {
        "observations": obs,
        "actions": np.zeros(length, np.int64),
        "rewards": np.ones(length, np.float32),
        "meta": {"n": n},
    }


def failed_by_n(collection) -> dict[int, list[str] | None]:
    """n -> checks_failed of the collection's episodes (NULL before the column exists)."""
    has = "checks_failed" in collection.sql("SELECT * FROM episodes LIMIT 0").columns
    rows = collection.sql(f"SELECT n, {'checks_failed' if has else 'NULL'} FROM episodes ORDER BY n").fetchall()
    return {n: failed for n, failed in rows}


def test_quarantine_commits_the_episode_and_holds_it_back(tmp_path):
    ds = el.Dataset.create(schema(max_repeat=3, on_fail="quarantine"), str(tmp_path / "ds"))
    ds.append_episodes([episode(0), episode(1, frozen=True), episode(2), episode(3, frozen=True)])
    ds.flush()
    for view in (ds, el.Dataset.open(str(tmp_path / "ds"))):  # the flag is stored, not held in memory
        assert sorted(int(e.meta["n"]) for e in view.episodes()) == [0, 2]
        held = view.quality.quarantine()
        assert failed_by_n(held) == {1: ["observation: max_repeat"], 3: ["observation: max_repeat"]}
        assert len(view.sql("SELECT * FROM episodes").fetchall()) == 2  # out of the SQL views too
    ids = [e.episode_id for e in ds.quality.quarantine().episodes()]
    ds.quality.release(ids)
    assert sorted(int(e.meta["n"]) for e in ds.episodes()) == [0, 1, 2, 3]


def test_warn_commits_the_episode_normally_and_records_the_failure():
    ds = el.Dataset.create(schema(max_repeat=3, on_fail="warn"))
    ds.append_episodes([episode(0), episode(1, frozen=True)])
    assert len(ds) == 2 and len(ds.quality.quarantine()) == 0
    assert failed_by_n(ds) == {0: [], 1: ["observation: max_repeat"]}


def test_reject_is_the_default_and_names_field_and_step():
    ds = el.Dataset.create(schema(max_repeat=3))
    with pytest.raises(el.QualityError, match=r"episode 1: field 'observation' fails max_repeat=3 at step 4") as info:
        ds.append_episodes([episode(0), episode(1, frozen=True)])
    assert (info.value.check, info.value.episode, info.value.step) == ("observation: max_repeat", 1, 4)
    assert len(ds) == 0


def test_per_constraint_on_fail_rejects_what_it_does_not_name():
    ds = el.Dataset.create(schema(min=-1, max_repeat=3, on_fail={"max_repeat": "quarantine"}))
    ds.append_episodes([episode(0, frozen=True)])
    assert len(ds) == 0 and len(ds.quality.quarantine()) == 1
    with pytest.raises(el.QualityError, match=r"episode 0: field 'observation' fails min=-1.0 at step 2") as info:
        ds.append_episodes([episode(1, low=True), episode(2)])
    assert info.value.check == "observation: min"
    assert len(ds.quality.quarantine()) == 1 and len(ds) == 0  # the refused call stored nothing


def test_a_rejecting_constraint_wins_over_a_quarantining_one_in_the_same_call():
    """A quarantine failure in an earlier episode does not let a later rejection through: the call is refused."""
    ds = el.Dataset.create(schema(min=-1, max_repeat=3, on_fail={"max_repeat": "quarantine", "min": "reject"}))
    with pytest.raises(el.QualityError, match="episode 1: field 'observation' fails min"):
        ds.append_episodes([episode(0, frozen=True), episode(1, low=True)])
    assert len(ds) == 0 and len(ds.quality.quarantine()) == 0


def test_constraint_and_check_failures_are_recorded_together():
    checks = [el.Check("short", "length < 8", on_fail="warn"), el.Check("few", "n < 2", on_fail="quarantine")]
    ds = el.Dataset.create(schema(max_repeat=3, on_fail="warn"), checks=checks)
    ds.append_episodes([episode(0, frozen=True), episode(1), episode(2, frozen=True)])
    # a check passes only where its predicate is TRUE: every episode fails "short", n = 2 fails "few"
    assert failed_by_n(ds) == {0: ["observation: max_repeat", "short"], 1: ["short"]}
    assert failed_by_n(ds.quality.quarantine()) == {2: ["observation: max_repeat", "short", "few"]}


def test_the_online_writer_quarantines_on_the_last_step():
    ds = el.Dataset.create(schema(max_repeat=3, on_fail="quarantine"))
    for n, frozen in enumerate([True, False]):
        raw = episode(n, frozen=frozen)
        w = ds.new_episode(raw["observations"][0], n=n)
        for t in range(8):
            step = {"observations": raw["observations"][t + 1], "actions": 0, "rewards": 1.0}
            w.add_step({**step, "truncated": t == 7})  # no QualityError: the frozen episode is held back
    assert [int(e.meta["n"]) for e in ds.episodes()] == [1]
    assert failed_by_n(ds.quality.quarantine()) == {0: ["observation: max_repeat"]}


def test_meta_bounds_quarantine_and_set_meta_follows_on_fail():
    fields = [*schema().fields[:3], el.FieldSpec("score", (), "float32", role="meta", max=1, on_fail="quarantine")]
    fields.append(el.FieldSpec("grade", (), "float32", role="meta", min=0, on_fail="warn"))
    ds = el.Dataset.create(el.DatasetSchema(fields))
    base = {k: v for k, v in episode(0).items() if k != "meta"}
    ds.append_episodes([{**base, "meta": {"score": 0.5, "grade": -1.0}}, {**base, "meta": {"score": 3.0}}])
    assert len(ds) == 1 and len(ds.quality.quarantine()) == 1
    assert ds.sql("SELECT checks_failed FROM episodes").fetchall() == [(["grade: min"],)]
    eid = int(ds.episode_ids[0])
    before = ds.version
    with pytest.raises(el.QualityError, match=r"meta field 'score' fails max=1.0 \(value 2.0\).*does not quarantine"):
        ds.edit.set_meta({"score": 2.0}, [eid])  # an edit cannot quarantine: refused
    assert ds.version == before
    ds.edit.set_meta({"grade": -2.0}, [eid])  # warn: let through
    assert ds.episode(0).meta["grade"] == -2.0


def test_on_fail_round_trips_and_old_descriptors_reject(tmp_path):
    path = str(tmp_path / "ds")
    s = schema(min=0, max_repeat=np.uint64(3), on_fail={"max_repeat": "warn"})
    el.Dataset.create(s, path)  # a NumPy max_repeat is stored as a plain int
    back = el.Dataset.open(path).schema["observation"]
    assert (back.max_repeat, back.on_fail) == (3, {"max_repeat": "warn"})
    assert (back.on_fail_of("max_repeat"), back.on_fail_of("min")) == ("warn", "reject")
    descriptor = json.loads((tmp_path / "ds" / "episodelake.json").read_text())
    assert [f.get("on_fail") for f in descriptor["schema"]] == [{"max_repeat": "warn"}, None, None, None]
    # a descriptor written before on_fail existed (no key) reads as reject
    plain = el.FieldSpec.from_json({k: v for k, v in back.to_json().items() if k != "on_fail"})
    assert plain.on_fail == "reject" and "on_fail" not in plain.to_json()
    assert (
        el.FieldSpec.from_json(schema(max_repeat=2, on_fail="quarantine").fields[0].to_json()).on_fail == "quarantine"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_repeat": 3, "on_fail": "drop"}, r"field 'observation': on_fail must be one of"),
        ({"on_fail": "quarantine"}, r"field 'observation': on_fail='quarantine' applies to the field's constraints"),
        ({"max_repeat": 3, "on_fail": {"min": "warn"}}, r"on_fail names 'min', which is not a constraint"),
        ({"max_repeat": 3, "on_fail": {"max_repeat": "skip"}}, r"on_fail\['max_repeat'\] must be one of"),
        ({"max_repeat": 3, "on_fail": 3}, r"on_fail must be one of .* or a mapping"),
    ],
)
def test_bad_on_fail_is_a_schema_error_naming_the_field(options, message):
    with pytest.raises(el.SchemaError, match=message):
        el.FieldSpec("observation", (2,), "float32", **options)


def test_a_meta_field_with_one_bound_is_judged():
    """A meta field with only ``max`` (no ``min``): the missing bound is not compared (it was a TypeError)."""
    fields = [*schema().fields[:3], el.FieldSpec("score", (), "uint64", role="meta", max=5)]
    ds = el.Dataset.create(el.DatasetSchema(fields))
    base = {k: v for k, v in episode(0).items() if k != "meta"}
    ds.append_episodes([{**base, "meta": {"score": np.uint64(5)}}])
    with pytest.raises(el.QualityError, match=r"episode 0: field 'score' fails max=5.0;"):
        ds.append_episodes([{**base, "meta": {"score": np.uint64(7)}}])
    assert len(ds) == 1


def test_a_dry_run_fails_only_on_a_rejecting_constraint():
    ds = el.Dataset.create(schema(min=-1, max_repeat=3, on_fail={"max_repeat": "quarantine"}))
    assert ds.append_episodes([episode(0, frozen=True), episode(1)], dry_run=True) == 2
    with pytest.raises(el.QualityError, match="episode 1: field 'observation' fails min"):
        ds.append_episodes([episode(0, frozen=True), episode(1, low=True)], dry_run=True)
    assert len(ds) == 0 and len(ds.quality.quarantine()) == 0
