"""Declared defaults: ``FieldSpec(default=...)`` is checked at creation and stored when a step omits the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el

STATE_DEFAULT = np.array([1.5, -2.0, 0.25], np.float32)
CAMERA_DEFAULT = np.full((2, 4, 4), 7, np.uint8)


def defaults_schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (3,), "float32"),
            el.FieldSpec("goal", (3,), "float32", default=STATE_DEFAULT),
            el.FieldSpec("camera", (2, 4, 4), "uint8", storage="tensor", default=CAMERA_DEFAULT),
            el.FieldSpec("action", (2,), "int16", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward", default=0.5),
            el.FieldSpec("value", (), "float64", role="extra", default=-1),
            el.FieldSpec("task", (), "str", role="meta"),
        ]
    )


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (
            dict(shape=(3,), dtype="float32", default=[1.0, 2.0]),
            r"field 'x': default has shape \(2,\), expected \(3,\)",
        ),
        (dict(shape=(), dtype="int8", default=1.5), r"field 'x': default has dtype float64, expected int8"),
        (dict(shape=(), dtype="int8", default=300), r"field 'x': default values do not fit int8"),
        (dict(shape=(), dtype="uint8", default=-1), r"field 'x': default values do not fit uint8"),
        (dict(shape=(), dtype="bool", default=2), r"field 'x': default has dtype int64, expected bool"),
        (dict(shape=(), dtype="float32", default="zero"), r"field 'x': default has dtype <U4, expected float32"),
        (
            dict(shape=(2,), dtype="float32", default=[0, np.nan], finite=True),
            r"field 'x': default has NaN or infinity",
        ),
        (dict(shape=(), dtype="int64", role="meta", default=3), r"meta field 'x': default is for step fields"),
    ],
)
def test_bad_default_is_rejected_at_creation_naming_the_field(kwargs, pattern):
    with pytest.raises(el.SchemaError, match=pattern):
        el.FieldSpec("x", **kwargs)


def test_descriptor_without_defaults_is_unchanged():
    """A field without a default serializes exactly as before (no 'default' key), so old readers open it."""
    spec = el.FieldSpec("state", (3,), "float32")
    assert "default" not in spec.to_json()
    assert set(spec.to_json()) == {
        "name", "shape", "dtype", "role", "layout", "storage", "finite", "chunk_rows", "compression", "description"
    }  # fmt: skip
    with_default = el.FieldSpec("state", (3,), "float32", default=[0, 0, 1])
    assert with_default.to_json()["default"] == [0.0, 0.0, 1.0]
    assert with_default != spec and hash(with_default) == hash(spec)  # hashable, unequal


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(["float16", "float32", "float64", "int8", "uint16", "int64", "uint64", "bool", "complex64"]),
    shape=st.lists(st.integers(1, 3), max_size=2).map(tuple),
    seed=st.integers(0, 2**32 - 1),
)
def test_default_round_trips_through_the_descriptor_json(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        value = rng.integers(0, 2, shape).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        value = rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    elif dt.kind == "c":
        value = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    else:
        value = rng.standard_normal(shape).astype(dt)
    spec = el.FieldSpec("x", shape, dtype, role="extra", default=value)
    again = el.FieldSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again == spec
    assert again.default_value.dtype == dt and again.default_value.shape == shape
    np.testing.assert_array_equal(again.default_value, value)


def test_omitted_fields_store_their_defaults_step_by_step(tmp_path):
    """Omitted fields (a sub-field, a whole role, the unwrapped reward) read back as their defaults, reopened."""
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(defaults_schema(), path)
    rng = np.random.default_rng(0)
    states = rng.standard_normal((5, 3)).astype(np.float32)
    goal2 = np.array([9, 8, 7], np.float32)
    w = ds.new_episode({"state": states[0]}, task="a")  # goal and camera omitted from the reset observation
    w.add_step({"observations": {"state": states[1]}, "actions": [1, 2], "rewards": 1.0})
    w.add_step({"observations": {"state": states[2], "goal": goal2}, "actions": [3, 4]})  # reward omitted
    w.add_step({"observations": {"state": states[3]}, "actions": [5, 6], "rewards": 2.0, "extras": 4.0})
    w.add_step({"observations": {"state": states[4]}, "actions": [7, 8], "terminated": True})
    ds.flush()

    reopened = el.Dataset.open(path)
    assert reopened.schema == defaults_schema()
    np.testing.assert_array_equal(reopened.schema["observation/goal"].default_value, STATE_DEFAULT)
    got = reopened.to_numpy()
    np.testing.assert_array_equal(got["observation/state"], states)
    np.testing.assert_array_equal(
        got["observation/goal"], [STATE_DEFAULT, STATE_DEFAULT, goal2, STATE_DEFAULT, STATE_DEFAULT]
    )
    np.testing.assert_array_equal(got["observation/camera"], np.broadcast_to(CAMERA_DEFAULT, (5, 2, 4, 4)))
    np.testing.assert_array_equal(got["reward"], np.array([1.0, 0.5, 2.0, 0.5], np.float32))
    np.testing.assert_array_equal(got["extra/value"], [-1.0, -1.0, 4.0, -1.0])
    np.testing.assert_array_equal(got["action"], [[1, 2], [3, 4], [5, 6], [7, 8]])
    assert reopened.maintenance.validate().ok


def test_vector_writer_applies_defaults():
    ds = el.Dataset.create(defaults_schema())
    vw = ds.vector_writer({"state": np.zeros((2, 3), np.float32)}, 2, meta={"task": "v"})
    vw.add_steps(
        {"state": np.ones((2, 3), np.float32)}, np.ones((2, 2), np.int16), np.zeros(2), [True, True], [False, False]
    )
    ds.flush()
    got = ds.to_numpy()
    assert got["length"].tolist() == [1, 1]
    np.testing.assert_array_equal(got["observation/goal"], np.broadcast_to(STATE_DEFAULT, (4, 3)))
    np.testing.assert_array_equal(got["extra/value"], [-1.0, -1.0])


def test_fields_without_defaults_are_still_required():
    ds = el.Dataset.create(defaults_schema())
    w = ds.new_episode({"state": np.zeros(3, np.float32)})
    with pytest.raises(el.ValidationError, match=r"step 0: missing observation field\(s\) \['state'\]"):
        w.add_step({"observations": {"goal": STATE_DEFAULT}, "actions": [1, 2]})
    with pytest.raises(el.ValidationError, match=r"step 0: missing action"):
        w.add_step({"observations": {"state": np.zeros(3, np.float32)}})
    with pytest.raises(el.ValidationError, match=r"missing observation field\(s\) \['state'\]"):
        ds.new_episode({"goal": STATE_DEFAULT})
    w.add_step({"observations": {"state": np.zeros(3, np.float32)}, "actions": [1, 2], "terminated": True})
    ds.flush()
    assert len(ds) == 1


def test_a_role_with_some_fields_lacking_defaults_is_not_filled():
    """Omitting the whole observation role is an error when one of its fields has no default."""
    ds = el.Dataset.create(defaults_schema())
    w = ds.new_episode({"state": np.zeros(3, np.float32)})
    with pytest.raises(el.ValidationError, match=r"step 0: missing observation"):
        w.add_step({"actions": [1, 2]})
    assert w.length == 0
