"""Re-adding a quality check under a taken name (issue 39): refused unless it is the same check, in every field.

docs (``ds.quality.add``): "a name already taken by a different check is an
``ArgumentError`` (drop it first); adding a check equal to a stored one
changes nothing". Two checks are the same when name, predicate, level and
``on_fail`` all match. The property is checked where it matters: after any
such attempt, the check in force at the next write is the stored one, so an
episode failing it is rejected, quarantined or warned about exactly as the
stored ``on_fail`` says (the reference below is a plain dict of outcomes).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el

# every predicate passes for episode(5) and fails for episode(2, reward=-5)
PREDICATES = {"episode": ["length >= 3", "length >= 4"], "step": ["reward >= 0", "reward > -1"]}


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (2,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def episode(T: int, reward: float = 0.0) -> dict:
    return {
        "observations": np.zeros((T + 1, 2), np.float32),
        "actions": np.arange(T),
        "rewards": np.full(T, reward, np.float32),
    }


CHECKS = st.builds(
    lambda level, i, on_fail: el.Check("gate", PREDICATES[level][i], level, on_fail),
    st.sampled_from(["episode", "step"]),
    st.integers(0, 1),
    st.sampled_from(["reject", "quarantine", "warn"]),
)


def outcome_of_a_failing_write(ds: el.Dataset) -> str:
    """Write an episode every predicate here fails: ``"reject"``, ``"quarantine"`` or ``"warn"`` by what happened."""
    stored, held = len(ds), len(ds.quality.quarantine())
    try:
        ds.append_episodes([episode(2, reward=-5.0)])
        ds.flush()
    except el.QualityError as exc:
        assert exc.check == "gate" and len(ds) == stored
        return "reject"
    if len(ds.quality.quarantine()) == held + 1 and len(ds) == stored:
        return "quarantine"
    assert len(ds) == stored + 1
    failed = ds.sql("SELECT checks_failed FROM episodes ORDER BY created_at DESC LIMIT 1").fetchall()[0][0]
    assert failed == ["gate"]
    return "warn"


@settings(max_examples=40, deadline=None)
@given(stored=CHECKS, again=CHECKS, at_create=st.booleans())
def test_a_taken_name_takes_only_the_same_check_and_the_stored_one_stays_in_force(stored, again, at_create):
    """Kills "re-adding a check under the same name with another on_fail silently ignored"."""
    ds = el.Dataset.create(schema(), checks=[stored] if at_create else [])
    if not at_create:
        ds.quality.add(stored)
    ds.append_episodes([episode(5)])  # passes every check here
    ds.flush()
    before = (ds.version, ds.quality.list())
    same = (stored.predicate, stored.level, stored.on_fail) == (again.predicate, again.level, again.on_fail)
    if same:
        assert ds.quality.add(again) == before[0]  # changes nothing, commits nothing
    else:
        with pytest.raises(el.ArgumentError, match=r"different check named 'gate'.*drop it first"):
            ds.quality.add(again)
        with pytest.raises(el.ArgumentError, match="different check named 'gate'"):  # with another check: none lands
            ds.quality.add(el.Check("other", "length > 0"), again)
    assert (ds.version, ds.quality.list()) == before == (before[0], (stored,))
    assert outcome_of_a_failing_write(ds) == stored.on_fail
    # dropped first, the other check replaces it, and it is the one in force
    ds.quality.drop("gate")
    ds.quality.add(again)
    assert ds.quality.list() == (again,)
    assert outcome_of_a_failing_write(ds) == again.on_fail


@pytest.mark.parametrize("first, second", [("reject", "warn"), ("warn", "quarantine"), ("quarantine", "reject")])
def test_a_check_differing_only_in_on_fail_is_refused_and_reopened_datasets_agree(tmp_path, first, second):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, checks=[el.Check("gate", "length >= 3", on_fail=first)])
    with pytest.raises(el.ArgumentError, match="different check named 'gate'"):
        ds.quality.add(el.Check("gate", "length >= 3", on_fail=second))
    reopened = el.Dataset.open(path)
    assert reopened.quality.list() == (el.Check("gate", "length >= 3", on_fail=first),)
    assert outcome_of_a_failing_write(reopened) == first


def test_failures_sql_of_no_checks_selects_no_rows_with_the_failure_columns():
    """The documented edge of ``failures_sql`` (the write gate calls it only with checks; an audit needs one)."""
    import duckdb

    from episodelake.core.quality import FAILURE_COLUMNS, failures_sql

    rel = duckdb.sql(failures_sql([]))
    assert tuple(rel.columns) == FAILURE_COLUMNS and rel.fetchall() == []
