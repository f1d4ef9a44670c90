"""Checks of values offered for writing, before anything changes.

Values are accepted when their kind is the schema's or narrower (bool -> int ->
float -> complex), integers fit the target dtype, finite numbers fit a float
or complex target's range (a conversion that only rounds, float64 -> float32,
is allowed; one that would turn ``1e40`` into ``inf`` is not; inf and NaN
given as such stay what they are), shapes match exactly,
``FieldSpec(finite=True)`` fields hold no NaN/inf, and ``required`` meta
fields have a value when an episode is handed over. Errors are
:class:`ValidationError` naming the field and the step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import numpy as np

from .episode import EpisodeBatch, FinishedEpisode, rows_for
from .errors import ValidationError
from .schema import EPISODE_KEYS, STEP_KEYS, STRING_LIMIT, DatasetSchema, FieldSpec, flatten_role

_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def check_values(f: FieldSpec, value: Any, lead: tuple[int, ...], where: str) -> np.ndarray:
    """Return ``value`` as ``f``'s dtype with shape ``lead + f.shape``, or raise.

    Accepted: same or wider kind (bool -> int -> float -> complex), integers
    within the target's range, finite numbers within a float target's range
    (rounding allowed), finite values when ``f.finite``.
    """
    try:
        arr = np.asarray(value)
    except Exception as exc:
        raise ValidationError(f"{where}: field {f.key!r} is not array-like: {exc}") from exc
    want = lead + f.shape
    if arr.shape != want:
        raise ValidationError(f"{where}: field {f.key!r} has shape {arr.shape}, expected {want}")
    dt = f.np_dtype
    if arr.dtype == dt:
        out = arr
    else:
        kind = arr.dtype.kind
        if kind not in _KIND_RANK or _KIND_RANK[kind] > _KIND_RANK[dt.kind]:
            raise ValidationError(f"{where}: field {f.key!r} has dtype {arr.dtype}, expected {dt}")
        if dt.kind in "iu" and kind in "iu" and arr.size:
            info = np.iinfo(dt)
            lo, hi = arr.min(), arr.max()
            if lo < info.min or hi > info.max:
                raise ValidationError(f"{where}: field {f.key!r} values [{lo}, {hi}] do not fit {dt}")
        if dt.kind in "fc" and arr.size:
            _check_float_range(f, arr, bool(lead), where)
        out = arr.astype(dt)
    if f.finite and dt.kind in "fc" and not np.isfinite(out).all():
        bad = np.argwhere(~np.isfinite(out.reshape(len(out), -1) if lead else out.reshape(1, -1)))[0][0]
        step = f" (first at row {bad})" if lead else ""
        raise ValidationError(f"{where}: field {f.key!r} has NaN or infinity{step}")
    return out


@functools.cache
def _float_limit(dt: np.dtype) -> float:
    """The magnitude from which a value rounds to infinity in float/complex dtype ``dt`` (its parts).

    Round to nearest takes everything below ``max + ulp(max) / 2`` to a finite value (exact in float64
    for the narrower dtypes); that half ulp and above rounds (ties to even) to infinity.
    """
    top = np.finfo(dt).max
    ulp = float(top) - float(np.nextafter(top, top.dtype.type(0)))  # the same binade as max: its ulp
    return float(top) + ulp / 2


def _source_max(dt: np.dtype) -> float:
    """The largest magnitude values of dtype ``dt`` (bool, int, float, complex) can have."""
    if dt.kind == "b":
        return 1.0
    return float(np.iinfo(dt).max) if dt.kind in "iu" else float(np.finfo(dt).max)


def _check_float_range(f: FieldSpec, arr: np.ndarray, rows: bool, where: str) -> None:
    """Raise if a finite value of ``arr`` lies beyond the range of ``f``'s float/complex dtype.

    Casting would store it as inf (NumPy only warns); inf and NaN given as such are not this error.
    """
    dt = f.np_dtype
    limit = _float_limit(dt)
    if _source_max(arr.dtype) < limit:
        return  # no value of the source dtype can overflow the target
    parts = (arr.real, arr.imag) if arr.dtype.kind == "c" else (arr,)
    over = np.zeros(arr.shape, dtype=bool)
    for part in parts:
        over |= np.isfinite(part) & ((part >= limit) | (part <= -limit))
    if not over.any():
        return
    first = np.argwhere(over)[0]
    value = arr[tuple(first)].item()
    at = f" (first at row {first[0]})" if rows else ""
    top = float(np.finfo(dt).max)
    raise ValidationError(f"{where}: field {f.key!r} value {value!r}{at} does not fit {dt} (largest {top!r})")


def plain(value: Any) -> Any:
    """``value`` with NumPy scalars and arrays (also inside dicts, lists and tuples) as plain Python values.

    For messages: ``{'seed': 3}``, never ``{'seed': array(3, dtype=uint64)}``.
    """
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    return value


StepPlan = dict[str, tuple[str, np.dtype, tuple[int, ...], bool]]


def step_plan(schema: DatasetSchema, roles: tuple[str, ...]) -> StepPlan:
    """Step key -> ``(field key, dtype, shape, finite)`` for each of ``roles`` made of one field (every alias).

    What :func:`plain_value` needs to accept a value without the general path;
    a role of several fields has no entry (its values come as mappings).
    """
    plan: StepPlan = {}
    for key, role in STEP_KEYS.items():
        fields = schema.role_fields(role)
        if role in roles and len(fields) == 1:
            f = fields[0]
            plan[key] = (f.key, f.np_dtype, f.shape, f.finite)
    return plan


def plain_value(dtype: np.dtype, shape: tuple[int, ...], finite: bool, value: Any) -> Any:
    """``value`` if it needs no conversion to be stored (an array of exactly ``dtype`` and ``shape``, or a
    float for a float scalar field), finite when ``finite``; else None: let :func:`check_values` judge it.

    Why: the same acceptance as :func:`check_values` at a fraction of its cost, for the per-step path.
    """
    if type(value) is np.ndarray:
        if value.dtype != dtype or value.shape != shape:
            return None
        if finite and dtype.kind in "fc" and not np.isfinite(value).all():
            return None
        return value
    if type(value) is float and not shape and not finite and dtype.kind in "fc":
        if abs(value) >= _float_limit(dtype) and not math.isinf(value):
            return None  # beyond a narrower float's range: check_values refuses it
        return value  # stored by assignment: the same cast check_values' astype does
    return None


def split_role(schema: DatasetSchema, role: str, value: Any, where: str) -> dict[str, Any]:
    """Map a role's value (array, or nested dict of arrays) to field keys; exact key set."""
    fields = schema.role_fields(role)
    if schema.unwrapped(role) and not isinstance(value, Mapping):
        return {fields[0].key: value}
    if not isinstance(value, Mapping):
        raise ValidationError(f"{where}: {role} must be a dict with keys {[f.name for f in fields]}")
    flat = flatten_role(value)
    names = {f.name: f.key for f in fields}
    unknown = sorted(set(flat) - set(names))
    missing = sorted(set(names) - set(flat))
    if unknown:
        raise ValidationError(f"{where}: unknown {role} field(s) {unknown}; schema has {sorted(names)}")
    if missing:
        raise ValidationError(f"{where}: missing {role} field(s) {missing}")
    return {names[k]: v for k, v in flat.items()}


def check_meta(schema: DatasetSchema, meta: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validate per-episode meta values (all of them before returning any).

    None means "no value": stored as NULL for a nullable field, still missing
    for a ``required`` one (see :func:`missing_required`).
    """
    fields = {f.name: f for f in schema.meta_fields}
    unknown = sorted(set(meta) - set(fields))
    if unknown:
        raise ValidationError(f"{where}: unknown meta field(s) {unknown}; schema has {sorted(fields)}")
    return {name: meta_value(fields[name], value, where) for name, value in meta.items()}


def meta_value(f: FieldSpec, value: Any, where: str) -> Any:
    """One checked meta value of ``f`` (None stays None)."""
    if value is None:
        return None
    if f.np_dtype.kind == "U":
        if not isinstance(value, str):
            raise ValidationError(f"{where}: meta field {f.name!r} must be str, got {type(value).__name__}")
        if len(value.encode()) > STRING_LIMIT:
            raise ValidationError(f"{where}: meta field {f.name!r} is longer than {STRING_LIMIT} bytes")
        return value
    return check_values(f, value, (), where)


def missing_required(schema: DatasetSchema, meta: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the schema's ``required`` meta fields that ``meta`` has no value (or None) for."""
    return tuple(f.name for f in schema.meta_fields if f.required and meta.get(f.name) is None)


def check_flags(terminated: Any, truncated: Any, where: str) -> tuple[bool, bool]:
    if type(terminated) is bool and type(truncated) is bool and not (terminated and truncated):
        return terminated, truncated  # the common case, without building arrays
    flags = []
    for name, v in (("terminated", terminated), ("truncated", truncated)):
        arr = np.asarray(v)
        if arr.shape != () or arr.dtype.kind not in "bui":
            raise ValidationError(f"{where}: {name} must be a scalar bool, got {plain(v)!r}")
        if arr.dtype.kind != "b" and int(arr) not in (0, 1):
            raise ValidationError(f"{where}: {name} must be a bool, got {plain(v)!r}")
        flags.append(bool(arr))
    if flags[0] and flags[1]:
        raise ValidationError(f"{where}: terminated and truncated are both set")
    return flags[0], flags[1]


_MISSING: Any = object()


def with_default_rows(schema: DatasetSchema, role: str, value: Any, length: int | np.ndarray) -> Any:
    """A whole episode's (or batch's) ``value`` of ``role`` with declared defaults filled in for omitted fields.

    A field with ``FieldSpec(default=...)`` that the value omits gets its
    default on every row (``rows_for(field, length)`` rows; ``length`` may be
    an array of episode lengths: their total). ``value`` is ``_MISSING`` when
    the role is omitted: filled only when every field of the role has a
    default. Anything else is returned for :func:`split_role` to judge.
    """
    fields = schema.role_fields(role)
    defaults = {f.name: f for f in fields if f.default_value is not None}
    if not defaults or not (value is _MISSING or isinstance(value, Mapping)):
        return value
    if value is _MISSING:
        if len(defaults) < len(fields):
            return value
        value = {}
    given = flatten_role(value)
    steps = np.asarray(length, dtype=np.int64)
    filled = {
        name: np.broadcast_to(np.asarray(f.default_value), (int(rows_for(f, steps).sum()), *f.shape))
        for name, f in defaults.items()
        if name not in given
    }
    return {**filled, **given}


def episode_from_dict(schema: DatasetSchema, episode: Mapping[str, Any], where: str) -> FinishedEpisode:
    """Validate one episode in dict form (see :meth:`Dataset.from_episodes`)."""
    known = {"initial_observation", "terminated", "truncated", "meta", *EPISODE_KEYS}
    unknown = sorted(set(episode) - known)
    if unknown:
        raise ValidationError(f"{where}: unknown key(s) {unknown}; expected {sorted(known)}")
    if "actions" not in episode:
        raise ValidationError(f"{where}: missing actions")
    data: dict[str, np.ndarray] = {}
    acts = split_role(schema, "action", episode["actions"], where)
    first = next(iter(acts.values()))
    length = len(first) if hasattr(first, "__len__") else 0
    if length == 0:
        raise ValidationError(f"{where}: an episode needs at least one step")
    for role_key, role in EPISODE_KEYS.items():
        fields = schema.role_fields(role)
        if not fields:
            continue
        value = with_default_rows(schema, role, episode.get(role_key, _MISSING), length)
        if value is _MISSING:
            raise ValidationError(f"{where}: missing {role_key}")
        values = split_role(schema, role, value, where)
        if role == "observation" and "initial_observation" in episode:
            init = split_role(schema, role, episode["initial_observation"], f"{where} initial observation")
            for k, v in values.items():
                head = check_values(schema[k], init[k], (), f"{where} initial observation")
                rows = check_values(schema[k], v, (length,), f"{where} observations")
                data[k] = np.concatenate([head[None], rows])
        else:
            for k, v in values.items():
                data[k] = check_values(schema[k], v, (rows_for(schema[k], length),), f"{where} {role_key}")
    terminated, truncated = _episode_flags(episode, length, where)
    meta = check_meta(schema, episode.get("meta") or {}, where)
    missing = missing_required(schema, meta)
    if missing:
        raise ValidationError(f"{where}: missing required meta field(s) {list(missing)}")
    return FinishedEpisode(data, length, terminated, truncated, meta)


def _episode_flags(episode: Mapping[str, Any], length: int, where: str) -> tuple[bool, bool]:
    """Episode-level flags from scalars or per-step arrays (set on the last step only)."""
    flags = []
    for name in ("terminated", "truncated"):
        value = np.asarray(episode.get(name, False))
        if value.ndim == 1:
            if value.shape != (length,) or value.dtype.kind not in "bui":
                raise ValidationError(f"{where}: {name} must be a bool or bool[{length}]")
            early = np.flatnonzero(value[:-1])
            if early.size:
                raise ValidationError(f"{where}: {name} is set at step {early[0]} before the last step")
            value = value[-1]
        flags.append(value)
    return check_flags(flags[0], flags[1], where)


def batch_from_columns(schema: DatasetSchema, columns: Mapping[str, Any], lengths: Any) -> EpisodeBatch:
    """Validate episodes given as concatenated columns (see :meth:`Dataset.append_episodes`), vectorized.

    ``lengths[i]`` is episode ``i``'s number of transitions; each role holds
    every episode's rows one after the other (``rows_for(field, lengths)``
    rows per episode: observations ``T + 1``). ``terminated``/``truncated``
    are one bool per episode (or one for all), ``meta`` maps a field to one
    value per episode (None: NULL). Errors name the episode (and step) and
    the field; nothing is returned until everything passed.
    """
    n_lengths = check_lengths(lengths)
    n = len(n_lengths)
    known = {"terminated", "truncated", "meta", *EPISODE_KEYS}
    unknown = sorted(set(columns) - known)
    if unknown:
        raise ValidationError(f"episode columns: unknown key(s) {unknown}; expected {sorted(known)}")
    data: dict[str, np.ndarray] = {}
    for role_key, role in EPISODE_KEYS.items():
        if not schema.role_fields(role):
            continue
        value = with_default_rows(schema, role, columns.get(role_key, _MISSING), n_lengths)
        if value is _MISSING:
            raise ValidationError(f"episode columns: missing {role_key}")
        for k, v in split_role(schema, role, value, "episode columns").items():
            data[k] = _check_rows(schema[k], v, n_lengths, role_key)
    flags = [_batch_flag(columns.get(name, False), n, name) for name in ("terminated", "truncated")]
    both = np.flatnonzero(flags[0] & flags[1])
    if both.size:
        raise ValidationError(f"episode {both[0]}: terminated and truncated are both set")
    meta = _meta_columns(schema, columns.get("meta") or {}, n)
    now = np.datetime64(datetime.now(UTC).replace(tzinfo=None), "us")
    return EpisodeBatch(data, n_lengths, flags[0], flags[1], meta, np.full(n, now))


def check_lengths(lengths: Any) -> np.ndarray:
    """Episode lengths as int64 [n], every one at least 1 (ValidationError naming the first bad episode)."""
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValidationError(f"lengths must be a 1-D integer array (one per episode), got {arr.dtype} {arr.shape}")
    bad = np.flatnonzero(arr < 1)
    if bad.size:
        raise ValidationError(f"episode {bad[0]}: length {arr[bad[0]]}; an episode needs at least one step")
    return arr.astype(np.int64)


def _check_rows(f: FieldSpec, value: Any, lengths: np.ndarray, role_key: str) -> np.ndarray:
    """``check_values`` over all episodes' rows at once; on failure, the error names the first bad episode."""
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(rows_for(f, lengths), out=starts[1:])
    arr = np.asarray(value)
    if arr.shape[:1] != (starts[-1],):
        raise ValidationError(
            f"episode columns: {role_key} field {f.key!r} has {arr.shape[:1]} rows, the lengths need {starts[-1]} "
            f"({'T + 1' if rows_for(f, 0) else 'T'} per episode)"
        )
    try:
        return np.ascontiguousarray(check_values(f, arr, (int(starts[-1]),), "episode columns"))
    except ValidationError:
        # find the first episode that fails on its own, for an error naming it and its step
        for i in range(len(lengths)):
            check_values(f, arr[starts[i] : starts[i + 1]], (int(starts[i + 1] - starts[i]),), f"episode {i}")
        raise


def _batch_flag(value: Any, n: int, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = np.full(n, arr)
    if arr.shape != (n,) or arr.dtype.kind not in "bui" or (arr.dtype.kind != "b" and not np.isin(arr, (0, 1)).all()):
        raise ValidationError(f"episode columns: {name} must be a bool or {n} bools (one per episode)")
    return arr.astype(bool)


def _meta_columns(schema: DatasetSchema, meta: Mapping[str, Any], n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Meta values, one per episode (None: NULL), as ``(values, valid)`` per field; required ones present."""
    fields = {f.name: f for f in schema.meta_fields}
    unknown = sorted(set(meta) - set(fields))
    if unknown:
        raise ValidationError(f"episode columns: unknown meta field(s) {unknown}; schema has {sorted(fields)}")
    out = {}
    for f in schema.meta_fields:
        given = meta.get(f.name)
        if given is None:
            values, valid = _empty_meta(f, n), np.zeros(n, dtype=bool)
        else:
            if len(given) != n:
                raise ValidationError(
                    f"episode columns: meta field {f.name!r} has {len(given)} values for {n} episodes"
                )
            values, valid = _meta_values(f, given, n)
        if f.required and not valid.all():
            raise ValidationError(f"episode {np.flatnonzero(~valid)[0]}: missing required meta field(s) {[f.name]}")
        out[f.name] = (values, valid)
    return out


def _empty_meta(f: FieldSpec, n: int) -> np.ndarray:
    return np.full(n, "", dtype=object) if f.np_dtype.kind == "U" else np.zeros((n, *f.shape), f.np_dtype)


def _meta_values(f: FieldSpec, given: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(values, valid)`` of one meta field's per-episode values: one vectorized check when none is None."""
    if f.np_dtype.kind != "U" and (isinstance(given, np.ndarray) or all(v is not None for v in given)):
        try:
            return check_values(f, given, (n,), "episode columns meta"), np.ones(n, dtype=bool)
        except ValidationError:
            # name the first bad episode; if none is bad on its own (a list mixing ints beyond int64 with
            # smaller ones reads as float64 as a whole), the values checked one by one are the column
            checked = [meta_value(f, given[i], f"episode {i}") for i in range(n)]
            return np.stack(checked).astype(f.np_dtype, copy=False), np.ones(n, dtype=bool)
    valid = np.array([v is not None for v in given], dtype=bool)
    values = _empty_meta(f, n)
    for i in np.flatnonzero(valid).tolist():
        values[i] = meta_value(f, given[i], f"episode {i}")
    return values, valid
