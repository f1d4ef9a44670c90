"""memmap-replay-buffer folders -> episodes, read with NumPy alone (no torch, no pickle).

A ``ReplayBuffer`` folder holds ``<field>.data.npy`` (``[max_episodes,
max_timesteps, ...]``), ``<meta>.data.meta.npy`` (``[max_episodes, ...]``,
including ``episode_lens``) and ``*.state.npy`` (``episode_index``,
``timestep_index``, ...). Its ``metadata.pkl`` is never unpickled: the
``.npy`` headers carry every shape and dtype.

Which slots: every slot with ``episode_lens > 0``, oldest first (a circular
buffer that wrapped starts at ``episode_index``), except the slot being
written (``timestep_index > 0``), which is not a finished episode. Slots are
action-out runs (``state[t]`` is where ``action[t]`` was taken), converted by
:func:`episodelake.importers.common.action_out_episode`; without a next-observation
field each episode keeps ``len - 1`` transitions.

Roles default by field name, and every argument overrides them:
``rewards`` = ``reward``/``rewards``; ``actions`` = fields whose name starts
with ``action``; ``terminated`` = the first of ``terminated``, ``terminal``,
``done``, ``dones`` present; ``truncated`` = ``truncated``/``timeout``;
``next_observations`` = ``next_<obs>`` fields; ``observations`` = every
remaining field. Per-episode meta fields are imported as meta.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ArgumentError, ValidationError
from ..core.schema import DatasetSchema
from ..dataset import Dataset
from .common import SOURCE_EPISODE, action_out_episode, fields_from_arrays, write_import

INTERNAL_META = ("episode_lens", "_initted")
TERMINATED_NAMES = ("terminated", "terminal", "done", "dones")
TRUNCATED_NAMES = ("truncated", "timeout")


class ReplayFolder:
    """The arrays of a memmap-replay-buffer folder, memory-mapped read-only."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        if not (self.folder / "episode_lens.data.meta.npy").exists():
            raise ValidationError(f"{self.folder} is not a memmap-replay-buffer folder (no episode_lens.data.meta.npy)")
        self.fields = self._load(".data.npy")
        self.meta = {k: v for k, v in self._load(".data.meta.npy").items() if k not in INTERNAL_META}
        self.lens = np.load(self.folder / "episode_lens.data.meta.npy", allow_pickle=False)
        state = self._load(".state.npy")
        self.episode_index = int(state["episode_index"])
        self.timestep_index = int(state["timestep_index"])

    def _load(self, suffix: str) -> dict[str, np.ndarray]:
        return {
            p.name[: -len(suffix)]: np.load(p, mmap_mode="r", allow_pickle=False)
            for p in sorted(self.folder.glob(f"*{suffix}"))
            if not (suffix == ".data.npy" and p.name.endswith(".data.meta.npy"))
        }

    def slots(self) -> list[int]:
        """Finished episodes' slots, oldest first."""
        n = len(self.lens)
        order = [(self.episode_index + k) % n for k in range(n)]
        if self.timestep_index > 0:
            order = order[1:]  # the slot being written holds a partial episode
        return [s for s in order if self.lens[s] > 0]


def _first(names: Sequence[str], present: Mapping[str, Any]) -> str | None:
    return next((n for n in names if n in present), None)


def load(
    src: str | os.PathLike,
    dst: str | None = None,
    *,
    observations: Sequence[str] | None = None,
    actions: Sequence[str] | None = None,
    rewards: str | None = None,
    terminated: str | None = None,
    truncated: str | None = None,
    next_observations: Mapping[str, str] | None = None,
    extras: Sequence[str] = (),
    strict: bool = True,
    progress: bool | None = None,
    **create_options: Any,
) -> Dataset:
    """Import a memmap-replay-buffer folder into a new dataset at ``dst`` (roles: see module doc)."""
    buf = ReplayFolder(src)
    fields = buf.fields
    rewards = rewards or _first(("reward", "rewards"), fields)
    actions = list(actions) if actions is not None else [k for k in fields if k.startswith("action")]
    terminated = terminated or _first(TERMINATED_NAMES, fields)
    truncated = truncated or _first(TRUNCATED_NAMES, fields)
    if not rewards or not actions:
        raise ArgumentError(f"{src}: cannot tell the reward and action fields among {sorted(fields)}; name them")
    claimed = {n for n in (rewards, *actions, terminated, truncated, *extras) if n is not None}
    if observations is None:
        observations = [k for k in fields if k not in claimed and not k.startswith("next_")]
    if next_observations is None:
        next_observations = {k: f"next_{k}" for k in observations if f"next_{k}" in fields}
        if set(next_observations) != set(observations):
            next_observations = {}
    unknown = sorted({*observations, *claimed, *next_observations.values()} - set(fields))
    if unknown:
        raise ArgumentError(f"{src}: no field(s) {unknown}; the buffer has {sorted(fields)}")
    if next_observations and set(next_observations) != set(observations):
        raise ArgumentError(f"next_observations must map every observation field {sorted(observations)}")

    def rows(names: Sequence[str], slot: int) -> dict[str, np.ndarray]:
        n = int(buf.lens[slot])
        return {k: np.asarray(fields[k][slot, :n]) for k in names}

    def flag(name: str | None, slot: int) -> bool:
        if name is None:
            return False
        values = np.asarray(fields[name][slot, : int(buf.lens[slot])]).reshape(int(buf.lens[slot]), -1)
        early = np.flatnonzero(values[:-1].any(axis=1))
        if early.size:
            raise ValidationError(f"slot {slot}: {name!r} is set at step {early[0]} before the episode's last step")
        return bool(values[-1].any())

    example = {k: v[0] for k, v in fields.items()}
    schema = DatasetSchema(
        fields_from_arrays({k: example[k] for k in observations}, "observation")
        + fields_from_arrays({k: example[k] for k in actions}, "action")
        + fields_from_arrays({rewards: example[rewards]}, "reward")
        + fields_from_arrays({k: example[k] for k in extras}, "extra")
        + fields_from_arrays({k: v[0] for k, v in buf.meta.items()}, "meta", per_step=False)
        + [SOURCE_EPISODE]
    )
    slots = buf.slots()

    def episodes() -> Iterator[dict[str, Any]]:
        for slot in slots:
            meta = {k: np.asarray(v[slot]) for k, v in buf.meta.items()}
            ep = action_out_episode(
                rows(observations, slot),
                rows(actions, slot),
                rows([rewards], slot),
                next_observations={k: rows([v], slot)[v] for k, v in next_observations.items()} or None,
                extras=rows(extras, slot),
                terminated=flag(terminated, slot),
                truncated=flag(truncated, slot),
                meta={**meta, "source_episode": slot},
                strict=strict,
                where=f"slot {slot}",
            )
            if ep is not None:
                yield ep

    info = {
        "source": {
            "format": "memmap-replay",
            "path": os.fspath(src),
            "episodes": len(slots),
            "roles": {
                "observations": list(observations),
                "actions": list(actions),
                "rewards": rewards,
                "terminated": terminated,
                "truncated": truncated,
                "next_observations": dict(next_observations),
                "extras": list(extras),
            },
        }
    }
    return write_import(
        schema,
        episodes(),
        dst,
        info=info,
        total=len(slots),
        desc="import memmap-replay",
        progress=progress,
        **create_options,
    )
