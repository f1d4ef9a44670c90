"""``el.Capacity``'s options and ``delete``'s ids, judged against the documented rules written out here.

Each option: ``steps``/``episodes`` positive ints or None (at least one set), ``retention_hours`` a number >= 0
or None (below 1 h only with ``break_old_versions=True``), ``break_old_versions`` a bool, ``vacuum_every`` and
``keep_versions`` positive ints. Anything else is an ArgumentError naming the option; a valid set is kept as
given.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import episodelake as el
from episodelake.storage.retention import check_ids

VALID = dict(steps=5, episodes=None, retention_hours=None, break_old_versions=False, vacuum_every=64, keep_versions=16)

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 40),
    st.floats(-2, 3),
    st.just(float("nan")),
    st.sampled_from(["yes", "4", 1.0]),
)


def positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def expected_error(o: dict[str, object]) -> str | None:
    """The option a valid-rules reader would name first, else None."""
    for name in ("steps", "episodes"):
        if o[name] is not None and not positive_int(o[name]):
            return name
    if o["steps"] is None and o["episodes"] is None:
        return "steps and/or episodes"
    hours = o["retention_hours"]
    if hours is not None and (isinstance(hours, bool) or not isinstance(hours, int | float) or not hours >= 0):
        return "retention_hours"
    if not isinstance(o["break_old_versions"], bool):
        return "break_old_versions"
    if hours is not None and hours < 1 and not o["break_old_versions"]:
        return "break_old_versions=True"
    for name in ("vacuum_every", "keep_versions"):
        if not positive_int(o[name]):
            return name
    return None


@given(
    st.fixed_dictionaries(
        {
            "steps": values,
            "episodes": values,
            "retention_hours": values,
            "break_old_versions": st.one_of(st.booleans(), st.sampled_from([None, "yes", 1])),
            "vacuum_every": values,
            "keep_versions": values,
        }
    )
)
@example(
    dict(steps=5, episodes=None, retention_hours=None, break_old_versions=False, vacuum_every=64, keep_versions=16) | {}
)
@example(
    dict(steps=5, episodes=None, retention_hours=None, break_old_versions=False, vacuum_every=64, keep_versions=16)
    | {"break_old_versions": "yes"}
)
@example(
    dict(steps=5, episodes=None, retention_hours=None, break_old_versions=False, vacuum_every=64, keep_versions=16)
    | {"break_old_versions": 1}
)
@example(
    dict(steps=5, episodes=None, retention_hours=None, break_old_versions=False, vacuum_every=64, keep_versions=16)
    | {"retention_hours": 0.5}
)
@example(
    dict(steps=5, episodes=None, retention_hours=None, break_old_versions=False, vacuum_every=64, keep_versions=16)
    | {"retention_hours": 0.5, "break_old_versions": True}
)
@example(
    dict(steps=5, episodes=None, retention_hours=None, break_old_versions=False, vacuum_every=64, keep_versions=16)
    | {"keep_versions": 0}
)
@example(
    dict(steps=5, episodes=None, retention_hours=None, break_old_versions=False, vacuum_every=64, keep_versions=16)
    | {"vacuum_every": True}
)
@example(
    dict(steps=5, episodes=None, retention_hours=None, break_old_versions=False, vacuum_every=64, keep_versions=16)
    | {"steps": None}
)
@example(
    dict(steps=5, episodes=None, retention_hours=None, break_old_versions=False, vacuum_every=64, keep_versions=16)
    | {"episodes": 3, "steps": None}
)
@example(
    dict(steps=5, episodes=None, retention_hours=None, break_old_versions=False, vacuum_every=64, keep_versions=16)
    | {"retention_hours": float("nan")}
)
def test_capacity_options_are_judged_as_documented(options):
    name = expected_error(options)
    if name is None:
        capacity = el.Capacity(**options)
        assert {k: getattr(capacity, k) for k in options} == options
    else:
        with pytest.raises(el.ArgumentError, match=name.replace("(", r"\(")):
            el.Capacity(**options)


@pytest.mark.parametrize(
    "ids", [[3, 1, 3], (7,), np.array([5, -2], np.int64), range(3), [np.int32(4)], iter([9, 8]), []]
)
def test_any_sequence_of_ints_is_taken_sorted_and_unique(ids):
    given_ = list(ids) if not isinstance(ids, type(iter([]))) else [9, 8]
    assert check_ids(ids).tolist() == sorted({int(i) for i in given_})


@pytest.mark.parametrize(
    ("ids", "pattern"),
    [
        ("12", r"episode_ids must be a sequence of ints, got str"),
        (b"12", r"got bytes"),
        (12, r"got int"),
        ([1, True], r"episode_ids\[1\] must be an int, got True"),
        ([1.0], r"episode_ids\[0\] must be an int, got 1.0"),
        ([1, "2"], r"episode_ids\[1\]"),
    ],
)
def test_bad_ids_name_what_is_wrong(ids, pattern):
    with pytest.raises(el.ArgumentError, match=pattern):
        check_ids(ids)
