"""D4RL-style flat transition dicts -> episodes.

Input (a mapping, or a ``.hdf5``/``.h5``/``.npz`` file holding one): arrays
with one row per step, in action-out form (row ``t``: the observation where
action ``t`` was taken, its reward): ``observations``, ``actions``,
``rewards``, ``terminals``, optional ``timeouts``, optional
``next_observations``, optional ``infos/<name>`` (kept as extras). Groups
such as ``observations/<name>`` become dict-shaped roles; ``metadata/*`` is
ignored.

Episodes end at every row where ``terminals`` or ``timeouts`` is set (rows
after the last such row form one more episode, ended with neither flag).
Each is converted by :func:`episodelake.importers.common.action_out_episode`: with
``next_observations`` every row is a transition. Without them a terminal
episode keeps every transition (its final observation row repeats the last
recorded one: a terminal next observation is never bootstrapped from), and a
timeout or unfinished episode drops its last transition, whose next
observation was never recorded, and keeps its flag. No end flag is lost: a
one-row episode left with no transition is skipped with a warning and listed
in ``info["source"]["skipped_episodes"]``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..core.errors import ArgumentError, ValidationError
from ..core.schema import DatasetSchema
from ..dataset import Dataset
from .common import SOURCE_EPISODE, action_out_episode, fields_from_arrays, kept_transitions, write_import

ROLE_KEYS = {"observations": "observation", "actions": "action", "rewards": "reward"}


def read_flat(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of an HDF5 (datasets, ``group/name`` keys) or npz file (no pickles)."""
    path = os.fspath(path)
    if path.endswith((".hdf5", ".h5")):
        import h5py

        out: dict[str, np.ndarray] = {}
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        return out
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    raise ArgumentError(f"{path}: expected a .hdf5, .h5 or .npz file")


def group(data: Mapping[str, Any], key: str, name: str) -> dict[str, np.ndarray] | None:
    """``data[key]`` as ``{name: array}``, or the ``key/<sub>`` arrays as ``{sub: array}``; None if absent."""
    if key in data:
        value = data[key]
        if isinstance(value, Mapping):
            return {k: np.asarray(v) for k, v in value.items()}
        return {name: np.asarray(value)}
    prefix = f"{key}/"
    sub = {k[len(prefix) :]: np.asarray(v) for k, v in data.items() if k.startswith(prefix)}
    return sub or None


def _flags(data: Mapping[str, Any], key: str, n: int) -> np.ndarray:
    if key not in data:
        return np.zeros(n, dtype=bool)
    arr = np.asarray(data[key])
    if arr.shape != (n,) or (arr.dtype != bool and not np.isin(arr, (0, 1)).all()):
        raise ValidationError(f"{key!r} must be {n} booleans (0/1), got shape {arr.shape} dtype {arr.dtype}")
    return arr.astype(bool)


def episode_bounds(terminals: np.ndarray, timeouts: np.ndarray) -> list[tuple[int, int]]:
    """``[start, stop)`` row ranges: each ends after a terminal/timeout row; a trailing rest is one more."""
    stops = (np.flatnonzero(terminals | timeouts) + 1).tolist()
    if not stops or stops[-1] != len(terminals):
        stops.append(len(terminals))
    starts = [0, *stops[:-1]]
    return [(a, b) for a, b in zip(starts, stops, strict=True) if b > a]


def load(
    src: Mapping[str, Any] | str | os.PathLike,
    dst: str | None = None,
    *,
    strict: bool = True,
    progress: bool | None = None,
    **create_options: Any,
) -> Dataset:
    """Import a D4RL-style dict (or file) into a new dataset at ``dst``.

    ``strict``: with ``next_observations``, require them to equal the next
    row's observations inside an episode (the error names the row).
    """
    data = read_flat(src) if isinstance(src, str | os.PathLike) else src
    roles: dict[str, dict[str, np.ndarray]] = {}
    for key, role in ROLE_KEYS.items():
        found = group(data, key, role)
        if found is None:
            raise ValidationError(f"D4RL data has no {key!r}")
        roles[role] = found
    n = len(next(iter(roles["reward"].values())))
    next_obs = group(data, "next_observations", "observation")
    extras = group(data, "infos", "info") or {}
    for label, arrays in (*roles.items(), ("next_observations", next_obs or {}), ("infos", extras)):
        for k, a in arrays.items():
            if a.ndim == 0 or len(a) != n:
                raise ValidationError(f"{label} {k!r} has {a.shape[:1]} rows, rewards have {n}")
    if next_obs is not None and set(next_obs) != set(roles["observation"]):
        raise ValidationError(
            f"next_observations {sorted(next_obs)} do not match observations {sorted(roles['observation'])}"
        )
    terminals, timeouts = _flags(data, "terminals", n), _flags(data, "timeouts", n)
    bounds = episode_bounds(terminals, timeouts)
    skipped = [
        i for i, (a, b) in enumerate(bounds) if kept_transitions(b - a, terminals[b - 1], next_obs is not None) == 0
    ]
    if skipped:
        warnings.warn(
            f"D4RL import: {len(skipped)} one-row episode(s) without next_observations have no transition to keep "
            f"and are skipped (source episodes {skipped[:10]}{'...' if len(skipped) > 10 else ''}); "
            'listed in info["source"]["skipped_episodes"]',
            stacklevel=2,
        )

    schema = DatasetSchema(
        fields_from_arrays(roles["observation"], "observation")
        + fields_from_arrays(roles["action"], "action")
        + fields_from_arrays(roles["reward"], "reward")
        + fields_from_arrays(extras, "extra")
        + [SOURCE_EPISODE]
    )

    def episodes() -> Iterator[dict[str, Any]]:
        for i, (a, b) in enumerate(bounds):
            ep = action_out_episode(
                {k: v[a:b] for k, v in roles["observation"].items()},
                {k: v[a:b] for k, v in roles["action"].items()},
                {k: v[a:b] for k, v in roles["reward"].items()},
                next_observations=None if next_obs is None else {k: v[a:b] for k, v in next_obs.items()},
                extras={k: v[a:b] for k, v in extras.items()},
                terminated=bool(terminals[b - 1]),
                truncated=bool(timeouts[b - 1]),
                meta={"source_episode": i},
                strict=strict,
                where=f"episode {i}",
                first_row=a,
            )
            if ep is not None:
                yield ep

    info = {
        "source": {
            "format": "d4rl",
            "path": os.fspath(src) if isinstance(src, str | os.PathLike) else None,
            "rows": n,
            "episodes": len(bounds),
            "next_observations": next_obs is not None,
            "skipped_episodes": skipped,
            # without next_observations a terminal episode's final observation row repeats the last recorded one
            "terminal_final_observation": "recorded" if next_obs is not None else "repeats the last observation",
        }
    }
    return write_import(
        schema, episodes(), dst, info=info, total=len(bounds), desc="import d4rl", progress=progress, **create_options
    )
