"""FieldSpec quality constraints (issue 22): min, max, monotonic, max_repeat, judged when episodes are finished.

The reference is a naive loop over episodes, fields, constraints and steps
(:func:`first_violation`), written from the rules in docs/writing.md, not
from ``core/constraints.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el

CONSTRAINTS = ("min", "max", "monotonic", "max_repeat")


def first_violation(fields: list[el.FieldSpec], episodes: list[dict[str, np.ndarray]]) -> tuple | None:
    """(episode, field key, constraint, step) of the first failure: episode order, then schema and constraint order."""
    for i, ep in enumerate(episodes):
        for f in fields:
            if f.key not in ep:
                continue
            rows = ep[f.key].reshape(len(ep[f.key]), -1)
            for c in CONSTRAINTS:
                limit = getattr(f, c)
                if limit is None:
                    continue
                for t in range(len(rows)):
                    if _fails(c, limit, rows, t):
                        return i, f.key, c, t
    return None


def _fails(c: str, limit, rows: np.ndarray, t: int) -> bool:
    with np.errstate(invalid="ignore"):
        if c == "min":
            return not all(v >= limit for v in rows[t])
        if c == "max":
            return not all(v <= limit for v in rows[t])
        if c == "monotonic":
            if t == 0:
                return False
            ok = rows[t] > rows[t - 1] if limit == "increasing" else rows[t] >= rows[t - 1]
            return not ok.all()
    # max_repeat: row t closes a run of limit + 1 rows identical bit for bit
    return t >= limit and all(rows[t - j].tobytes() == rows[t].tobytes() for j in range(1, limit + 1))


def schema_of(x: dict, cam: dict, act: dict) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("x", (2,), "float32", role="observation", storage="table", **x),
            el.FieldSpec("cam", (2, 2), "uint8", role="observation", storage="tensor", **cam),
            el.FieldSpec("action", (), "float32", role="action", **act),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def episode_dict(x: np.ndarray, cam: np.ndarray, act: np.ndarray) -> dict:
    return {
        "observations": {"x": x, "cam": cam},
        "actions": act,
        "rewards": np.zeros(len(act), np.float32),
        "terminated": True,
    }


@st.composite
def cases(draw):
    x = {
        "min": draw(st.sampled_from([None, 0, 1])),
        "max": draw(st.sampled_from([None, 1.5, 2])),
        "monotonic": draw(st.sampled_from([None, "increasing", "nondecreasing"])),
    }
    cam = {"max_repeat": draw(st.sampled_from([None, 1, 2, 3]))}
    act = {"min": draw(st.sampled_from([None, -1])), "max": draw(st.sampled_from([None, 1]))}
    n = draw(st.integers(1, 4))
    episodes = []
    for _ in range(n):
        t = draw(st.integers(1, 6))
        xs = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, np.nan]), min_size=2 * (t + 1), max_size=2 * (t + 1)))
        cams = draw(st.lists(st.integers(0, 1), min_size=t + 1, max_size=t + 1))  # few values: repeats happen
        acts = draw(st.lists(st.sampled_from([-2.0, -1.0, 0.0, 1.0]), min_size=t, max_size=t))
        episodes.append(
            (
                np.array(xs, np.float32).reshape(t + 1, 2),
                np.repeat(np.array(cams, np.uint8), 4).reshape(t + 1, 2, 2),
                np.array(acts, np.float32),
            )
        )
    return x, cam, act, episodes


@settings(max_examples=40, deadline=None)
@given(cases())
def test_a_bulk_call_is_refused_at_the_first_violation_or_stored_whole(case):
    x, cam, act, episodes = case
    schema = schema_of(x, cam, act)
    keyed = [{"observation/x": e[0], "observation/cam": e[1], "action": e[2]} for e in episodes]
    expected = first_violation(list(schema.fields), keyed)
    ds = el.Dataset.create(schema)
    version = ds.version
    if expected is not None:
        with pytest.raises(el.QualityError) as info:
            ds.append_episodes([episode_dict(*e) for e in episodes])
        i, key, c, t = expected
        assert (info.value.episode, info.value.check, info.value.step) == (i, f"{key}: {c}", t)
        assert f"episode {i}: field {key!r} fails {c}=" in str(info.value) and f"at step {t}" in str(info.value)
        ds.flush()
        assert len(ds) == 0 and ds.version == version  # nothing of the call was stored
        with pytest.raises(el.QualityError):  # the dry run judges the constraints too
            ds.append_episodes([episode_dict(*e) for e in episodes], dry_run=True)
    else:
        ds.append_episodes([episode_dict(*e) for e in episodes])
        assert len(ds) == len(episodes)
        for ref, e in zip(ds.episodes(), episodes, strict=True):
            seg = ref.read()
            np.testing.assert_array_equal(seg.all_obs["x"], e[0])
            np.testing.assert_array_equal(seg.all_obs["cam"], e[1])


def test_constraints_round_trip_through_the_descriptor(tmp_path):
    schema = schema_of({"min": -1, "max": 2.5, "monotonic": "nondecreasing"}, {"max_repeat": 3}, {})
    spec = schema["observation/x"]
    assert (spec.min, spec.max, spec.monotonic) == (-1.0, 2.5, "nondecreasing")
    assert el.FieldSpec.from_json(spec.to_json()) == spec
    assert "max_repeat" not in schema["action"].to_json()  # unset constraints are not written: old readers open it
    el.Dataset.create(schema, str(tmp_path / "ds"))
    reopened = el.Dataset.open(str(tmp_path / "ds"))
    assert reopened.schema["observation/cam"].max_repeat == 3
    assert reopened.schema["observation/x"] == spec


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min": 2, "max": 1}, "min 2.0 is above max 1.0"),
        ({"min": "0"}, "min must be a number"),
        ({"max": float("nan")}, "max must be a number"),
        ({"min": True}, "min must be a number"),
        ({"monotonic": "up"}, "monotonic must be one of"),
        ({"max_repeat": 0}, "max_repeat must be an int >= 1"),
        ({"max_repeat": 1.5}, "max_repeat must be an int >= 1"),
    ],
)
def test_bad_constraints_are_schema_errors_naming_the_field(options, message):
    with pytest.raises(el.SchemaError, match=message) as info:
        el.FieldSpec("x", (2,), "float32", **options)
    assert "'x'" in str(info.value)


def test_constraints_need_numbers_and_step_fields():
    with pytest.raises(el.SchemaError, match="real numeric or bool dtype"):
        el.FieldSpec("task", (), "str", role="meta", min=0)
    with pytest.raises(el.SchemaError, match="real numeric or bool dtype"):
        el.FieldSpec("z", (), "complex64", max=1)
    with pytest.raises(el.SchemaError, match="monotonic and max_repeat are for step fields"):
        el.FieldSpec("seed", (), "int64", role="meta", max_repeat=2)


def test_meta_bounds_judge_set_values_and_pass_null():
    schema = el.DatasetSchema(
        [
            el.FieldSpec("obs", (), "float32"),
            el.FieldSpec("action", (), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("score", (), "float32", role="meta", min=0, max=1),
        ]
    )
    ds = el.Dataset.create(schema)

    def ep(score):
        steps = {"actions": np.zeros(2, np.float32), "rewards": np.zeros(2, np.float32)}
        return {"observations": np.zeros(3, np.float32), **steps, "meta": {"score": score}}

    ds.append_episodes([ep(0.5), ep(None)])
    with pytest.raises(el.QualityError, match=r"episode 1: field 'score' fails max=1.0;") as info:
        ds.append_episodes([ep(1.0), ep(1.5)])
    assert info.value.step is None
    assert len(ds) == 2


def frozen_camera_schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("camera", (8, 8, 3), "uint8", layout="HWC", storage="tensor", max_repeat=2),
            el.FieldSpec("t", (), "float64", monotonic="increasing"),
            el.FieldSpec("action", (), "float32", role="action", min=-1, max=1),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def record(ds: el.Dataset, frames: np.ndarray, end: str = "terminated") -> None:
    """One episode through the online writer; ``end``: the last step's flag, or ``"finish"``."""
    w = ds.new_episode({"camera": frames[0], "t": 0.0})
    for t in range(1, len(frames)):
        last = t == len(frames) - 1
        step = {"observation": {"camera": frames[t], "t": float(t)}, "action": 0.0, "reward": 0.0}
        w.add_step({**step, "terminated": last and end == "terminated"})
    if end == "finish":
        w.finish()


@pytest.mark.parametrize("end", ["terminated", "finish"])
def test_the_call_that_ends_an_episode_rejects_it_and_the_writer_goes_on(tmp_path, end):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(frozen_camera_schema(), path, commit_episodes=1)
    rng = np.random.default_rng(0)
    good = rng.integers(0, 255, (6, 8, 8, 3), dtype=np.uint8)
    record(ds, good)
    version = ds.version
    frozen = good.copy()
    frozen[2:5] = frozen[2]  # rows 2, 3, 4 identical: the third one (step 4) breaks max_repeat=2
    with pytest.raises(el.QualityError, match=r"field 'observation/camera' fails max_repeat=2 at step 4") as info:
        record(ds, frozen, end)
    assert info.value.step == 4
    assert ds.version == version and len(ds) == 1  # nothing of it committed or pending
    record(ds, good[::-1].copy())  # the dataset takes the next episode
    reopened = el.Dataset.open(path)
    assert len(reopened) == 2
    np.testing.assert_array_equal(reopened.episode(1).read().all_obs["camera"], good[::-1])
    report = reopened.maintenance.validate()
    assert report.ok, report.problems


def test_constraints_on_s3(s3_server, s3_url):
    ds = el.Dataset.create(frozen_camera_schema(), s3_url, storage_options=s3_server.storage_options)
    frames = np.random.default_rng(1).integers(0, 255, (4, 8, 8, 3), dtype=np.uint8)

    def ep(t, action):
        return {"observations": {"camera": frames, "t": t}, "actions": action, "rewards": np.zeros(3, np.float32)}

    ds.append_episodes([ep(np.arange(4.0), np.zeros(3, np.float32))])
    ds.flush()
    version = ds.version
    bad = [ep(np.arange(4.0), np.zeros(3, np.float32)), ep(np.array([0, 1, 1, 2.0]), np.zeros(3, np.float32))]
    message = r"episode 1: field 'observation/t' fails monotonic='increasing' at step 2"
    with pytest.raises(el.QualityError, match=message):
        ds.append_episodes(bad)
    ds.flush()
    assert ds.version == version
    reopened = el.Dataset.open(s3_url, storage_options=s3_server.storage_options)
    assert len(reopened) == 1
    assert reopened.maintenance.vacuum(dry_run=True).unreferenced_rows == 0  # no tensor rows written for it


def test_max_repeat_across_the_comparison_windows():
    """Runs that span the cache-sized windows of the comparison (85 rows of 3 KiB frames each) are counted whole."""
    schema = el.DatasetSchema(
        [
            el.FieldSpec("camera", (32, 32, 3), "uint8", layout="HWC", max_repeat=4),
            el.FieldSpec("action", (), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    rng = np.random.default_rng(3)
    for run_end in (85, 171):  # the 5th identical row at a window edge, and past the next one
        frames = rng.integers(0, 255, (3, 101, 32, 32, 3), dtype=np.uint8)
        flat = frames.reshape(-1, 32, 32, 3)
        flat[run_end - 4 : run_end + 1] = flat[run_end - 4]  # rows of the whole batch: episode 0 holds 0..100
        keyed = [{"observation/camera": f} for f in frames]
        expected = first_violation(list(schema.fields), keyed)
        assert expected is not None
        ds = el.Dataset.create(schema)
        episodes = [
            {"observations": f, "actions": np.zeros(100, np.float32), "rewards": np.zeros(100, np.float32)}
            for f in frames
        ]
        with pytest.raises(el.QualityError) as info:
            ds.append_episodes(episodes)
        assert (info.value.episode, info.value.step) == (expected[0], expected[3])
