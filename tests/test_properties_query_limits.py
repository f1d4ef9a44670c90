"""How a sandboxed query's time limit is read: ``query_limits(x)`` and ``EPISODELAKE_QUERY_TIMEOUT_S``.

The reference is written out here by hand from the documented rule (docs/query.md): a number of
seconds > 0 is the limit; 0, infinity, None and the words ``none``/``off`` (and an empty value)
mean no limit; anything else -- negative, NaN, a boolean, text that is not a number -- is an
ArgumentError naming the setting.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from episodelake import ArgumentError
from episodelake.storage.sql import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, default_timeout, query_limits

NO_LIMIT_WORDS = ("", "none", "off", "0", "inf")


def reference(value: object) -> float | type[ArgumentError] | None:
    """The documented reading of one setting: seconds, None (no limit) or the error class."""
    if value is None:
        return None
    if isinstance(value, bool):
        return ArgumentError
    if isinstance(value, str) and value.strip().lower() in NO_LIMIT_WORDS:
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ArgumentError
    if math.isnan(seconds) or seconds < 0:
        return ArgumentError
    return None if seconds == 0 or math.isinf(seconds) else seconds


settings = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-5, 10**6),
    st.sampled_from((*NO_LIMIT_WORDS, " None ", "OFF", "-1", "nan", "1e-3", "2.5", "abc", "5 s", "Inf")),
    st.text(max_size=6),
)


@given(settings)
@example(True)
@example(False)
@example(-0.5)
@example(float("nan"))
@example("nan")
@example(0)
@example(0.25)
def test_query_limits_read_a_setting_as_documented(value: object) -> None:
    expected = reference(value)
    if expected is ArgumentError:
        with pytest.raises(ArgumentError, match="query time limit"), query_limits(value):
            pass
        return
    with query_limits(value) as limits:
        assert limits.seconds == expected


@given(st.one_of(st.sampled_from((*NO_LIMIT_WORDS, " off ", "-1", "nan", "x", "0.5", "7")), st.text(max_size=5)))
def test_the_environment_variable_is_read_as_documented(text: str) -> None:
    if "\x00" in text:
        return  # not a value an environment can hold
    expected = reference(text)
    saved = os.environ.get(TIMEOUT_ENV)
    os.environ[TIMEOUT_ENV] = text
    try:
        if expected is ArgumentError:
            with pytest.raises(ArgumentError, match=TIMEOUT_ENV):
                default_timeout()
        else:
            assert default_timeout() == expected
    finally:
        if saved is None:
            del os.environ[TIMEOUT_ENV]
        else:
            os.environ[TIMEOUT_ENV] = saved


def test_without_the_variable_the_default_holds_in_a_fresh_process() -> None:
    env = {k: v for k, v in os.environ.items() if k != TIMEOUT_ENV}
    code = "from episodelake.storage.sql import default_timeout; print(default_timeout())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert float(out.stdout) == DEFAULT_TIMEOUT_S
