"""A bounded meta field (``min=``/``max=`` on a meta ``FieldSpec``) judges values, never a missing one (issue 39).

docs/writing.md: "Without ``required`` a field is nullable: missing is NULL";
the constraints table: ``min``/``max`` fail "an element below/above, or NaN
(meta fields too; NULL passes)"; ``set_meta``: "None unsets (a ``required``
field refuses it)"; dict-form episodes "must carry every required field".
The reference below states that by hand: a value is accepted iff it is
missing/None on a nullable field, or a number within ``[min, max]``. The
bounds are drawn so that they often exclude 0 (the fill value of a NULL's
slot), where a bound check that forgets which values are NULL refuses them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el

ABSENT = "absent"  # the meta key is not given at all


def schema(lo: float, hi: float, required: bool) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (2,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("score", (), "float32", role="meta", min=lo, max=hi, required=required),
            el.FieldSpec("level", (2,), "int64", role="meta", min=int(lo), max=int(hi)),
        ]
    )


def expected(value, lo: float, hi: float, required: bool) -> str:
    """The reference outcome: ``"stored"``, ``"missing"`` (a required field without value) or ``"bounds"``."""
    if value is ABSENT or value is None:
        return "missing" if required else "stored"
    return "stored" if not math.isnan(value) and lo <= value <= hi else "bounds"


def episode(meta: dict) -> dict:
    T = 2
    return {
        "observations": np.zeros((T + 1, 2), np.float32),
        "actions": np.arange(T),
        "rewards": np.zeros(T, np.float32),
        "meta": meta,
    }


def meta_of(value, key: str = "score") -> dict:
    return {} if value is ABSENT else {key: value}


VALUES = st.one_of(
    st.just(ABSENT), st.none(), st.integers(-8, 8).map(float), st.just(float("nan")), st.just(0.5), st.just(-0.5)
)
BOUNDS = st.tuples(st.integers(-4, 4), st.integers(0, 3)).map(lambda t: (float(t[0]), float(t[0] + t[1])))


@settings(max_examples=60, deadline=None)
@given(bounds=BOUNDS, required=st.booleans(), value=VALUES)
def test_a_write_accepts_a_missing_value_iff_the_field_is_nullable(bounds, required, value):
    """Kills "a bounded meta field refuses a missing value" at write (append_episodes)."""
    lo, hi = bounds
    ds = el.Dataset.create(schema(lo, hi, required))
    ds.append_episodes([episode({"score": lo})])  # one stored episode, in bounds
    want = expected(value, lo, hi, required)
    if want == "stored":
        ds.append_episodes([episode(meta_of(value))])
        stored = [e.meta["score"] for e in ds.episodes()]
        assert stored == [lo, None if value in (ABSENT, None) else value]
        assert [e.meta["level"] for e in ds.episodes()] == [None, None]  # absent: NULL, whatever the bounds
    else:
        error = el.QualityError if want == "bounds" else el.ValidationError
        with pytest.raises(error, match="score"):
            ds.append_episodes([episode(meta_of(value))])
        assert len(ds) == 1


@settings(max_examples=40, deadline=None)
@given(bounds=BOUNDS, value=VALUES)
def test_the_online_writer_accepts_a_missing_value_of_a_nullable_field(bounds, value):
    """The same at ``new_episode``/``add_step``: nullable field, every way of leaving it unset or setting it."""
    lo, hi = bounds
    ds = el.Dataset.create(schema(lo, hi, False))
    want = expected(value, lo, hi, False)

    def record() -> None:
        w = ds.new_episode({"state": np.zeros(2, np.float32)}, **meta_of(value))
        w.add_step({"observation": {"state": np.zeros(2, np.float32)}, "action": 0, "reward": 0.0})
        w.add_step({"observation": {"state": np.zeros(2, np.float32)}, "action": 1, "reward": 0.0, "terminated": True})

    if want == "stored":
        record()
        ds.flush()
        assert [e.meta["score"] for e in ds.episodes()] == [None if value in (ABSENT, None) else value]
    else:
        with pytest.raises(el.QualityError, match="score"):
            record()
        ds.flush()
        assert len(ds) == 0


@settings(max_examples=60, deadline=None)
@given(bounds=BOUNDS, required=st.booleans(), value=VALUES.filter(lambda v: v is not ABSENT), per_episode=st.booleans())
def test_set_meta_unsets_a_nullable_bounded_field_and_judges_values(bounds, required, value, per_episode):
    """Kills "a bounded meta field refuses a missing value" in ``ds.edit.set_meta`` (one value, or per episode)."""
    lo, hi = bounds
    ds = el.Dataset.create(schema(lo, hi, required))
    ds.append_episodes([episode({"score": lo, "level": [int(lo), int(hi)]}), episode({"score": hi})])
    ds.flush()
    before = ds.version
    want = expected(value, lo, hi, required)
    values = {"score": [value, hi] if per_episode else value}
    if want == "stored":
        ds.edit.set_meta(values)
        assert [e.meta["score"] for e in ds.episodes()] == [value, hi if per_episode else value]
        ds.edit.set_meta({"level": None})  # a nullable vector field with bounds unsets too
        assert [e.meta["level"] for e in ds.episodes()] == [None, None]
    else:
        error = el.QualityError if want == "bounds" else el.ValidationError
        with pytest.raises(error, match="score"):
            ds.edit.set_meta(values)
        assert ds.version == before
        assert [e.meta["score"] for e in ds.episodes()] == [lo, hi]
