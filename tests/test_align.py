"""el.align against a naive reference: per clock tick, a Python loop choosing the sample by the documented rules.

Streams carry jitter, dropped samples (random subsets), duplicate timestamps
and out-of-order arrival (shuffled blocks); the reference never sorts with
NumPy and never calls searchsorted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el


def reference(t, values, clock, method, tolerance):
    """(values, error, index) per tick; error inf where no sample or beyond ``tolerance``; index -1 there."""
    samples = list(zip([float(x) for x in t], range(len(t)), strict=True))  # (time, arrival)
    rows, errors, picks = [], [], []
    zero = np.zeros(np.asarray(values).shape[1:], np.asarray(values).dtype)
    for c in clock:
        c = float(c)
        before = [s for s in samples if s[0] <= c]
        after = [s for s in samples if s[0] > c]
        # the last at or before (latest time, then latest arrival); the first after (earliest time, latest arrival)
        b = max(before, key=lambda s: (s[0], s[1])) if before else None
        a = min(after, key=lambda s: (s[0], -s[1])) if after else None
        value, err, pick = zero, math.inf, -1
        if method == "latest" and b is not None:
            value, err, pick = values[b[1]], c - b[0], b[1]
        elif method == "nearest" and (b is not None or a is not None):
            if a is None or (b is not None and c - b[0] <= a[0] - c):
                value, err, pick = values[b[1]], c - b[0], b[1]
            else:
                value, err, pick = values[a[1]], a[0] - c, a[1]
        elif method == "linear" and b is not None:
            if c - b[0] == 0:
                value, err, pick = values[b[1]], 0.0, b[1]
            elif a is not None:
                w = (c - b[0]) / (a[0] - b[0])
                lo, hi = np.asarray(values[b[1]], np.float64), np.asarray(values[a[1]], np.float64)
                value = (lo + w * (hi - lo)).astype(np.asarray(values).dtype)
                err, pick = max(c - b[0], a[0] - c), b[1]
        if tolerance is not None and err > tolerance:
            err = math.inf
        if math.isinf(err):
            value, pick = (np.full_like(zero, np.nan) if zero.dtype.kind == "f" else zero), -1
        rows.append(np.asarray(value))
        errors.append(err)
        picks.append(pick)
    return np.stack(rows), np.array(errors), np.array(picks)


@st.composite
def streams(draw):
    """A sensor stream at its own rate with jitter, drops, duplicates and out-of-order arrival, plus a clock."""
    rate = draw(st.sampled_from([3.0, 10.0, 33.0, 100.0]))
    n = draw(st.integers(0, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate + rng.uniform(-0.3, 0.3, n) / rate * draw(st.sampled_from([0.0, 1.0]))
    keep = rng.random(n) > draw(st.sampled_from([0.0, 0.2, 0.6]))  # dropped messages
    t = t[keep]
    if len(t) > 2 and draw(st.booleans()):
        t[rng.integers(1, len(t))] = t[rng.integers(0, len(t))]  # a duplicate timestamp
    order = np.arange(len(t))
    if draw(st.booleans()):  # out of order: shuffle small blocks, as arrival order does
        for s in range(0, len(t), 3):
            order[s : s + 3] = rng.permutation(order[s : s + 3])
    t = np.round(t[order], 6)
    values = rng.normal(size=(len(t), 2))
    clock_rate = draw(st.sampled_from([5.0, 10.0, 30.0]))
    clock = np.arange(draw(st.integers(1, 30))) / clock_rate + draw(st.sampled_from([0.0, -0.05, 0.013]))
    return t, values, clock


@settings(max_examples=150, deadline=None)
@given(
    streams(),
    st.sampled_from(["latest", "nearest", "linear"]),
    st.sampled_from([None, 0.02, 0.1, 0.5]),
)
def test_align_matches_the_naive_reference(data, method, tolerance):
    t, values, clock = data
    got = el.align({"s": (t, values)}, clock, method=method, tolerance=tolerance, on_gap="mask")
    want_v, want_e, want_i = reference(t, values, clock, method, tolerance)
    np.testing.assert_array_equal(got.index["s"], want_i)
    np.testing.assert_allclose(got.error["s"], want_e, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.values["s"], want_v, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got.valid["s"], np.isfinite(want_e))
    if np.isfinite(want_e).all():  # no gap: raising changes nothing
        again = el.align({"s": el.TimedValues(t, values)}, clock, method=method, tolerance=tolerance)
        np.testing.assert_array_equal(again.values["s"], got.values["s"])
    else:
        step = int(np.flatnonzero(~np.isfinite(want_e))[0])
        with pytest.raises(el.ValidationError, match=rf"stream 's' has a gap at step {step} \(clock time"):
            el.align({"s": (t, values)}, clock, method=method, tolerance=tolerance)


def test_integer_streams_and_per_stream_methods_and_tolerances():
    clock = np.array([0.0, 0.1, 0.2, 0.3])
    got = el.align(
        {
            "joints": ([0.0, 0.1, 0.2, 0.3], (np.arange(4)[:, None] * [1, 2]).astype(np.float32)),
            "camera": ([0.04, 0.21], np.array([[[7]], [[9]]], np.uint8)),
            "cmd": ([0.05], np.array([3], np.int64)),
        },
        clock,
        method={"joints": "linear", "camera": "nearest"},
        tolerance={"camera": 0.05},
        on_gap="mask",
    )
    assert got.values["joints"].dtype == np.float32
    np.testing.assert_array_equal(got.values["camera"][:, 0, 0], [7, 0, 9, 0])  # masked integers read 0
    np.testing.assert_array_equal(got.valid["camera"], [True, False, True, False])
    np.testing.assert_array_equal(got.values["cmd"], [0, 3, 3, 3])  # latest: nothing before 0.05
    assert got.error["cmd"][0] == np.inf and got.error["cmd"][1] == pytest.approx(0.05)
    assert set(got.columns()) == {"joints", "camera", "cmd", "sync/joints", "sync/camera", "sync/cmd"}


def test_refusals_name_the_stream_and_sample():
    with pytest.raises(el.ValidationError, match=r"stream 'j': sample 2 at 0.1 s comes after sample 1 at 0.2 s"):
        el.align({"j": ([0.0, 0.2, 0.1], [1.0, 2.0, 3.0])}, [0.0], unordered="raise")
    with pytest.raises(el.ArgumentError, match="'linear' needs float values"):
        el.align({"j": ([0.0], np.array([1], np.int32))}, [0.0], method="linear")
    with pytest.raises(el.ValidationError, match="clock not strictly increasing at tick 2"):
        el.align({}, [0.0, 1.0, 1.0])
    with pytest.raises(el.ValidationError, match=r"stream 'j': 2 timestamps but values of shape \(3,\)"):
        el.align({"j": ([0.0, 1.0], [1.0, 2.0, 3.0])}, [0.0])
    with pytest.raises(el.ValidationError, match=r"stream 'cam' has a gap at step 0 .*the stream has no samples"):
        el.align({"cam": (np.zeros(0), np.zeros((0, 2)))}, [0.0])


def test_the_error_column_gates_sync_in_the_quality_gate_and_sql(tmp_path):
    """A dropped camera: its sync column beyond FieldSpec(max=...) quarantines the episode; SQL sees the error."""
    clock = np.arange(6) / 10
    schema = el.DatasetSchema(
        [
            el.FieldSpec("camera", (2,), "float32"),
            el.FieldSpec("sync/camera", (), "float64", max=0.05, on_fail="quarantine"),
            el.FieldSpec("action", (), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    ds = el.Dataset.create(schema, str(tmp_path / "ds"))
    for cam_t in (clock - 0.01, np.delete(clock, [3, 4]) - 0.01):  # the second camera drops two frames
        a = el.align({"camera": (cam_t, np.ones((len(cam_t), 2), np.float32))}, clock, tolerance=0.25, on_gap="mask")
        cols = a.columns()
        ds.append_episodes(
            [
                {
                    "observations": {"camera": cols["camera"], "sync/camera": cols["sync/camera"]},
                    "actions": np.zeros(len(clock) - 1, np.float32),
                    "rewards": np.zeros(len(clock) - 1, np.float32),
                }
            ]
        )
    ds.flush()
    assert len(ds) == 1 and len(ds.quality.quarantine()) == 1
    worst = ds.quality.quarantine().sql('SELECT max("observation/sync/camera") FROM steps').fetchall()[0][0]
    assert worst == pytest.approx(0.21)  # the frame at 0.19 s stands in for ticks 0.3 s and 0.4 s
