"""Multi-rate alignment: timestamped streams of different rates -> one row per tick of a control clock.

``align(streams, clock, method=..., tolerance=..., on_gap=...)`` takes each
stream as a :class:`TimedValues` (or a ``(timestamps, values)`` pair): ``n``
timestamps in seconds and ``n`` value rows. For every clock tick ``c`` it
chooses samples by ``method`` (one for every stream, or a mapping per
stream name):

* ``"latest"``: the last sample at or before ``c`` (what a controller
  running at ``c`` had seen). Error: ``c - t`` (staleness, >= 0). A tick
  before the first sample has none: a gap.
* ``"nearest"``: the sample closest to ``c`` in time, before or after. Error:
  ``|t - c|``. On a tie between one before and one after, the one before.
* ``"linear"``: the value interpolated between the last sample at or before
  ``c`` and the first after it (float values only; a sample exactly at
  ``c`` is taken as it is, error 0). Error: ``max(c - t_before, t_after - c)``,
  the distance to the farther of the two samples used. No extrapolation: a
  tick before the first or after the last sample is a gap.

Samples with equal timestamps: the one given last wins (a republished
message replaces the earlier one). Out-of-order input (timestamps not
nondecreasing in the order given, as bags record messages by arrival) is
**sorted** by timestamp, stably, by default; ``unordered="raise"`` refuses it
instead with a :class:`ValidationError` naming the stream and the first
sample out of order. The clock must be strictly increasing and finite.

A tick whose chosen sample is further than ``tolerance`` seconds away (the
error above; ``None``: no limit, per stream with a mapping) or that has no
sample at all is a **gap**. ``on_gap="raise"`` (default) raises
:class:`ValidationError` naming the stream, the tick, its clock time and the
error; ``on_gap="mask"`` keeps the step: ``valid`` is False there, the
error is ``inf`` (so ``FieldSpec(max=...)`` on the error column, an
``el.Check`` over ``steps`` or SQL finds it), and the value is NaN for float
streams, 0 otherwise.

The result, :class:`Aligned`, holds per stream the values, the error in
seconds (float64), the validity mask and the index of the chosen sample in
the order the caller gave (for ``"linear"`` the earlier of the two);
:meth:`Aligned.columns` spells them as step columns: ``name`` -> values,
``sync/<name>`` -> error. Pure NumPy: one ``searchsorted`` per stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from .errors import ArgumentError, ValidationError

METHODS = ("latest", "nearest", "linear")
ON_GAP = ("raise", "mask")
UNORDERED = ("sort", "raise")
SYNC_PREFIX = "sync/"

Method = Literal["latest", "nearest", "linear"]


@dataclass(frozen=True)
class TimedValues:
    """One timestamped stream: ``t`` (``n`` timestamps, seconds) and ``values`` (``n`` rows of any shape)."""

    t: Any
    values: Any


@dataclass(frozen=True)
class Aligned:
    """Streams aligned to a clock: per stream name, ``values[name]`` (one row per tick), ``error[name]``
    (seconds, float64, ``inf`` on a masked gap), ``valid[name]`` (bool) and ``index[name]`` (int64: the chosen
    sample's position in the stream as given, the earlier one for ``"linear"``, ``-1`` on a gap)."""

    clock: np.ndarray
    values: dict[str, np.ndarray] = field(default_factory=dict)
    error: dict[str, np.ndarray] = field(default_factory=dict)
    valid: dict[str, np.ndarray] = field(default_factory=dict)
    index: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        """The number of clock ticks (rows of every stream)."""
        return len(self.clock)

    def columns(self, prefix: str = SYNC_PREFIX) -> dict[str, np.ndarray]:
        """Step columns: each stream's values under its name, its alignment error under ``prefix + name``."""
        out: dict[str, np.ndarray] = {}
        for name in self.values:
            out[name] = self.values[name]
            out[prefix + name] = self.error[name]
        return out


def align(
    streams: Mapping[str, TimedValues | tuple[Any, Any]],
    clock: Any,
    *,
    method: Method | Mapping[str, Method] = "latest",
    tolerance: float | Mapping[str, float | None] | None = None,
    on_gap: Literal["raise", "mask"] = "raise",
    unordered: Literal["sort", "raise"] = "sort",
) -> Aligned:
    """Align timestamped ``streams`` to the ticks of ``clock`` (seconds); the rules are the module's.

    Args:
        streams: name -> :class:`TimedValues` or ``(timestamps, values)``; ``n`` finite timestamps in seconds
            and ``n`` value rows (leading axis).
        clock: the control clock's tick times in seconds, strictly increasing.
        method: ``"latest"``, ``"nearest"`` or ``"linear"``, or a mapping stream name -> method
            (streams it leaves out get ``"latest"``).
        tolerance: the largest error a tick may have, in seconds (``None``: no limit), or a mapping per
            stream name (left out: no limit).
        on_gap: ``"raise"`` a :class:`ValidationError` on the first gap, or ``"mask"`` it.
        unordered: ``"sort"`` out-of-order samples by timestamp (stable), or ``"raise"``.

    Returns:
        :class:`Aligned`, one row per tick for every stream.

    Raises:
        ArgumentError: an unknown method, ``on_gap`` or ``unordered``; ``"linear"`` on a non-float stream.
        ValidationError: a bad clock or stream (names it and the sample), out-of-order samples with
            ``unordered="raise"``, or a gap with ``on_gap="raise"`` (names the stream, tick and time).
    """
    if on_gap not in ON_GAP:
        raise ArgumentError(f"align: on_gap={on_gap!r}; use one of {ON_GAP}")
    if unordered not in UNORDERED:
        raise ArgumentError(f"align: unordered={unordered!r}; use one of {UNORDERED}")
    c = _clock(clock)
    out = Aligned(clock=c)
    for name, stream in streams.items():
        m = method.get(name, "latest") if isinstance(method, Mapping) else method
        tol = tolerance.get(name) if isinstance(tolerance, Mapping) else tolerance
        t, values = stream if isinstance(stream, tuple) else (stream.t, stream.values)
        ts, vals, order = _stream(name, t, values, unordered)
        idx, err, vout = _choose(name, m, ts, vals, c)
        if tol is not None:
            if not (isinstance(tol, (int, float)) and tol >= 0):
                raise ArgumentError(f"align: stream {name!r}: tolerance {tol!r} must be a number >= 0 (seconds)")
            err = np.where(err > tol, np.inf, err)
        bad = ~np.isfinite(err)
        if bad.any() and on_gap == "raise":
            step = int(np.flatnonzero(bad)[0])
            raise ValidationError(_gap_message(name, m, tol, ts, c, step))
        if bad.any():
            vout = vout.copy()
            vout[bad] = np.nan if vout.dtype.kind in "fc" else 0
        out.values[name] = vout
        out.error[name] = err
        out.valid[name] = ~bad
        out.index[name] = np.where(bad, -1, order[np.maximum(idx, 0)] if len(order) else -1).astype(np.int64)
    return out


def _clock(clock: Any) -> np.ndarray:
    c = np.asarray(clock, dtype=np.float64)
    if c.ndim != 1:
        raise ValidationError(f"align: clock must be one-dimensional (tick times in seconds), got shape {c.shape}")
    if not np.isfinite(c).all():
        raise ValidationError(f"align: clock tick {int(np.flatnonzero(~np.isfinite(c))[0])} is not finite")
    if len(c) > 1 and not (np.diff(c) > 0).all():
        step = int(np.flatnonzero(np.diff(c) <= 0)[0]) + 1
        raise ValidationError(
            f"align: clock not strictly increasing at tick {step} ({c[step]} s after {c[step - 1]} s)"
        )
    return c


def _stream(name: str, t: Any, values: Any, unordered: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Timestamps (float64 seconds) and values in time order, and each sorted sample's position as given."""
    ts = np.asarray(t, dtype=np.float64)
    vals = np.asarray(values)
    if ts.ndim != 1:
        raise ValidationError(f"align: stream {name!r}: timestamps must be one-dimensional, got shape {ts.shape}")
    if vals.ndim == 0 or len(vals) != len(ts):
        raise ValidationError(
            f"align: stream {name!r}: {len(ts)} timestamps but values of shape {vals.shape} (one row per timestamp)"
        )
    if not np.isfinite(ts).all():
        raise ValidationError(
            f"align: stream {name!r}: timestamp of sample {int(np.flatnonzero(~np.isfinite(ts))[0])} is not finite"
        )
    order = np.arange(len(ts))
    back = np.diff(ts) < 0
    if back.any():
        if unordered == "raise":
            i = int(np.flatnonzero(back)[0]) + 1
            raise ValidationError(
                f"align: stream {name!r}: sample {i} at {ts[i]} s comes after sample {i - 1} at {ts[i - 1]} s "
                "(out of order); pass unordered='sort' to sort by timestamp"
            )
        order = np.argsort(ts, kind="stable")
        ts, vals = ts[order], vals[order]
    return ts, vals, order


def _choose(
    name: str, method: str, ts: np.ndarray, vals: np.ndarray, c: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted index chosen or -1, error with inf on no sample, values) for each tick."""
    if method not in METHODS:
        raise ArgumentError(f"align: stream {name!r}: method {method!r}; use one of {METHODS}")
    n = len(ts)
    before = np.searchsorted(ts, c, side="right") - 1  # last sample at or before each tick (last among equals)
    has_before = before >= 0
    t_before = ts[np.maximum(before, 0)] if n else np.zeros(len(c))
    if method == "latest":
        err = np.where(has_before, c - t_before, np.inf)
        return before, err, _take(vals, before)
    after = before + 1  # first sample after the tick ...
    has_after = after < n
    t_after = ts[np.minimum(after, n - 1)] if n else np.zeros(len(c))
    after = np.searchsorted(ts, t_after, side="right") - 1  # ... the last of its equal timestamps
    d_before, d_after = c - t_before, t_after - c
    if method == "nearest":
        take_before = has_before & (~has_after | (d_before <= d_after))
        idx = np.where(take_before, before, np.where(has_after, after, -1))
        err = np.where(take_before, d_before, np.where(has_after, d_after, np.inf))
        return idx, err, _take(vals, idx)
    if vals.dtype.kind != "f":
        raise ArgumentError(f"align: stream {name!r}: method 'linear' needs float values, got {vals.dtype}")
    exact = has_before & (d_before == 0)
    both = has_before & has_after
    ok = exact | both
    idx = np.where(ok, before, -1)
    err = np.where(exact, 0.0, np.where(both, np.maximum(d_before, d_after), np.inf))
    span = np.where(both & ~exact, t_after - t_before, 1.0)
    w = np.where(both & ~exact, d_before / span, 0.0).reshape((-1,) + (1,) * (vals.ndim - 1))
    lo = _take(vals, idx).astype(np.float64)
    hi = _take(vals, np.where(both, after, -1)).astype(np.float64)
    out = np.where(w > 0, lo + w * (hi - lo), lo)
    return idx, err, out.astype(vals.dtype)


def _take(vals: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``vals[idx]`` with a zero row where ``idx`` is -1 (also from an empty stream)."""
    if len(vals) == 0:
        return np.zeros((len(idx), *vals.shape[1:]), dtype=vals.dtype)
    out = vals[np.maximum(idx, 0)]
    if (idx < 0).any():
        out[idx < 0] = 0
    return out


def _gap_message(name: str, method: str, tol: float | None, ts: np.ndarray, c: np.ndarray, step: int) -> str:
    at = c[step]
    if len(ts) == 0:
        why = "the stream has no samples"
    else:
        before = ts[ts <= at]
        after = ts[ts > at]
        near = []
        if len(before):
            near.append(f"last sample before at {before[-1]} s ({at - before[-1]:.6g} s earlier)")
        if len(after):
            near.append(f"next at {after[0]} s ({after[0] - at:.6g} s later)")
        limit = f"tolerance {tol} s" if tol is not None else f"method {method!r} (no sample to use)"
        why = f"{'; '.join(near)}; beyond {limit}"
    return (
        f"align: stream {name!r} has a gap at step {step} (clock time {at} s): {why}; "
        "pass on_gap='mask' to keep the step with the field masked"
    )
