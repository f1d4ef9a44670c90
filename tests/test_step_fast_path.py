"""``add_step`` accepts and rejects exactly by the rules of ``check_values``, whichever form a value comes in.

The writer stores values that need no conversion (arrays of the field's exact
dtype and shape, floats for float scalars) without the general path; these
tests mix every form step by step and compare what is stored with a naive
NumPy reference, and each rejection with the error the rules name.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el

SCHEMA = el.DatasetSchema(
    [
        el.FieldSpec("observation", (3,), "float32", finite=True),
        el.FieldSpec("action", (2,), "int16", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
        el.FieldSpec("cost", (), "float32", role="extra", finite=True),
    ]
)

_V = np.array([0.5, -1.25, 3.0])
# (value, None when accepted, else the error text that must name the field)
OBS = {
    "exact": (_V.astype(np.float32), None),
    "strided": (np.arange(6, dtype=np.float32)[::2], None),
    "float64": (_V, None),
    "list": (_V.tolist(), None),
    "int32": (np.array([1, 2, 3], np.int32), None),
    "nan": (np.array([0, np.nan, 1], np.float32), "field 'observation' has NaN or infinity"),
    "inf64": (np.array([0, np.inf, 1]), "field 'observation' has NaN or infinity"),
    "shape": (np.zeros(4, np.float32), r"field 'observation' has shape \(4,\), expected \(3,\)"),
    "complex": (np.zeros(3, np.complex64), "field 'observation' has dtype complex64, expected float32"),
}
ACT = {
    "exact": (np.array([7, -8], np.int16), None),
    "int64": (np.array([300, -2]), None),
    "bool": (np.array([True, False]), None),
    "overflow": (np.array([40000, 0]), r"field 'action' values \[0, 40000\] do not fit int16"),
    "float32": (np.array([1, 2], np.float32), "field 'action' has dtype float32, expected int16"),
    "scalar": (np.int16(3), r"field 'action' has shape \(\), expected \(2,\)"),
}
REW = {
    "float": (1.5, None),
    "inf": (float("inf"), None),  # not a finite=True field
    "int": (2, None),
    "bool": (True, None),
    "f32": (np.float32(-0.5), None),
    "0d": (np.array(4.0, np.float32), None),
    "f64 array": (np.array([4.0]), r"field 'reward' has shape \(1,\), expected \(\)"),
    "str": ("x", "field 'reward' has dtype <U1, expected float32"),
}
COST = {
    "float": (0.25, None),
    "0d": (np.array(1.0, np.float32), None),
    "nan": (float("nan"), "field 'extra/cost' has NaN or infinity"),
    "nan 0d": (np.array(np.nan, np.float32), "field 'extra/cost' has NaN or infinity"),
}

PLAIN = {
    "obs": _V.astype(np.float32),
    "actions": np.zeros(2, np.int16),
    "rewards": 1.0,
    "extras": np.zeros((), np.float32),
}
step_forms = st.tuples(st.sampled_from(sorted(OBS)), st.sampled_from(sorted(ACT)), st.sampled_from(sorted(REW)))


def expected(table: dict, name: str, dtype: str) -> np.ndarray:
    return np.asarray(table[name][0]).astype(dtype)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(step_forms, st.sampled_from(sorted(COST))), min_size=1, max_size=12))
def test_each_value_form_is_stored_as_the_reference_or_rejected_naming_field_and_step(steps):
    ds = el.Dataset.create(SCHEMA)
    first = np.array([9, 8, 7], np.float32)
    w = ds.new_episode(first)
    ref = {"observation": [first], "action": [], "reward": [], "extra/cost": []}
    for (o, a, r), c in steps:
        step = {"obs": OBS[o][0], "actions": ACT[a][0], "rewards": REW[r][0], "extras": COST[c][0]}
        errors = [e for e in (OBS[o][1], ACT[a][1], REW[r][1], COST[c][1]) if e]
        if errors:
            # the general path reports the first bad field in role order: observation, action, reward, extra
            with pytest.raises(el.ValidationError, match=f"^step {w.length}: {errors[0]}"):
                w.add_step(step)
            continue
        w.add_step(step)
        ref["observation"].append(expected(OBS, o, "float32"))
        ref["action"].append(expected(ACT, a, "int16"))
        ref["reward"].append(expected(REW, r, "float32"))
        ref["extra/cost"].append(expected(COST, c, "float32"))
    assert w.length == len(ref["action"])
    if not w.length:
        return
    w.finish()
    ds.flush()
    got = ds.to_numpy()
    for key, rows in ref.items():
        np.testing.assert_array_equal(got[key], np.stack(rows))
        assert got[key].dtype == SCHEMA[key].np_dtype


@pytest.mark.parametrize(
    ("step", "pattern"),
    [
        ({**PLAIN, "observations": _V.astype(np.float32)}, "observation given twice"),
        ({"obs": _V.astype(np.float32), "rewards": 1.0, "extras": 1.0}, "missing action"),
        ({"obs": _V.astype(np.float32), "actions": np.zeros(2, np.int16), "rewards": 1.0}, "missing extra"),
        ({"state": _V.astype(np.float32)}, "unknown key 'state'"),
        # every value in the storable form but one, which breaks a rule
        ({**PLAIN, "obs": OBS["nan"][0]}, OBS["nan"][1]),
        ({**PLAIN, "obs": np.zeros(4, np.float32)}, OBS["shape"][1]),
        ({**PLAIN, "actions": np.zeros(3, np.int16)}, "field 'action' has shape"),
        ({**PLAIN, "extras": COST["nan 0d"][0]}, COST["nan 0d"][1]),
        ({**PLAIN, "extras": COST["nan"][0]}, COST["nan"][1]),
        ({"obs": {"observation": _V.astype(np.float32)}}, None),  # a one-field role given as a mapping
    ],
)
def test_steps_outside_the_plain_form_get_the_general_rules(step, pattern):
    ds = el.Dataset.create(SCHEMA)
    w = ds.new_episode(np.zeros(3, np.float32))
    full = {"actions": np.zeros(2, np.int16), "rewards": 1.0, "extras": 0.0}
    if pattern is None:
        w.add_step({**full, **step}, meta=None)
        assert w.length == 1
        return
    with pytest.raises(el.ValidationError, match=f"step 0: .*{pattern}"):
        w.add_step(step)
    assert w.length == 0


@pytest.mark.parametrize(
    ("flags", "pattern"),
    [
        ({"terminated": True, "truncated": True}, "terminated and truncated are both set"),
        ({"terminated": 2}, "terminated must be a bool"),
        ({"truncated": np.array([True])}, "truncated must be a scalar bool"),
    ],
)
def test_bad_flags_on_a_plain_step_are_rejected_and_change_nothing(flags, pattern):
    ds = el.Dataset.create(SCHEMA)
    w = ds.new_episode(np.zeros(3, np.float32))
    with pytest.raises(el.ValidationError, match=f"^step 0: {pattern}"):
        w.add_step({**PLAIN, **flags})
    assert w.length == 0 and not w.done
    w.add_step({**PLAIN, "terminated": np.bool_(True)})
    assert w.done
