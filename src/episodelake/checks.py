"""Checks of values offered for writing, before anything changes.

Values are accepted when their kind is the schema's or narrower (bool -> int ->
float -> complex), integers fit the target dtype, shapes match exactly, and
``FieldSpec(finite=True)`` fields hold no NaN/inf, and ``required`` meta
fields have a value when an episode is handed over. Errors are
:class:`ValidationError` naming the field and the step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .episode import FinishedEpisode, rows_for
from .errors import ValidationError
from .schema import EPISODE_KEYS, STRING_LIMIT, DatasetSchema, FieldSpec, flatten_role

_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def check_values(f: FieldSpec, value: Any, lead: tuple[int, ...], where: str) -> np.ndarray:
    """Return ``value`` as ``f``'s dtype with shape ``lead + f.shape``, or raise.

    Accepted: same or wider kind (bool -> int -> float -> complex), integers
    within the target's range, finite values when ``f.finite``.
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
        out = arr.astype(dt)
    if f.finite and dt.kind in "fc" and not np.isfinite(out).all():
        bad = np.argwhere(~np.isfinite(out.reshape(len(out), -1) if lead else out.reshape(1, -1)))[0][0]
        step = f" (first at row {bad})" if lead else ""
        raise ValidationError(f"{where}: field {f.key!r} has NaN or infinity{step}")
    return out


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
    out: dict[str, Any] = {}
    for name, value in meta.items():
        f = fields[name]
        if value is None:
            out[name] = None
        elif f.np_dtype.kind == "U":
            if not isinstance(value, str):
                raise ValidationError(f"{where}: meta field {name!r} must be str, got {type(value).__name__}")
            if len(value.encode()) > STRING_LIMIT:
                raise ValidationError(f"{where}: meta field {name!r} is longer than {STRING_LIMIT} bytes")
            out[name] = value
        else:
            out[name] = check_values(f, value, (), where)
    return out


def missing_required(schema: DatasetSchema, meta: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the schema's ``required`` meta fields that ``meta`` has no value (or None) for."""
    return tuple(f.name for f in schema.meta_fields if f.required and meta.get(f.name) is None)


def check_flags(terminated: Any, truncated: Any, where: str) -> tuple[bool, bool]:
    flags = []
    for name, v in (("terminated", terminated), ("truncated", truncated)):
        arr = np.asarray(v)
        if arr.shape != () or arr.dtype.kind not in "bui":
            raise ValidationError(f"{where}: {name} must be a scalar bool, got {v!r}")
        if arr.dtype.kind != "b" and int(arr) not in (0, 1):
            raise ValidationError(f"{where}: {name} must be a bool, got {v!r}")
        flags.append(bool(arr))
    if flags[0] and flags[1]:
        raise ValidationError(f"{where}: terminated and truncated are both set")
    return flags[0], flags[1]


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
        if role_key not in episode:
            raise ValidationError(f"{where}: missing {role_key}")
        values = split_role(schema, role, episode[role_key], where)
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
