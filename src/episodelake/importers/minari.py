"""Minari datasets -> episodes, read through Minari's own reader.

Minari episodes are already action-in: ``observations`` has ``T + 1`` rows
(reset observation first), ``actions``/``rewards``/``terminations``/
``truncations`` have ``T``. Observation and action spaces map to fields as
in :func:`episodelake.schema.schema_from_gym_spaces` (Dict spaces become
``/``-keyed fields; Tuple and Text spaces are not supported); rewards keep
Minari's dtype. Numeric ``infos`` become extras holding each step's info
(rows ``1..T``; the reset info is not imported). Per-episode meta:
``seed`` and ``source_episode`` (Minari's episode id). The descriptor
``info`` keeps the dataset id, env spec and both spaces.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..core.schema import DatasetSchema, FieldSpec, flatten_role, schema_from_gym_spaces
from ..dataset import Dataset
from .common import SOURCE_EPISODE, fields_from_arrays, write_import

SEED = FieldSpec("seed", (), "uint64", role="meta", description="seed of env.reset, as Minari recorded it")


def open_minari(src: Any) -> Any:
    """A ``MinariDataset`` from an instance, a dataset folder (``<root>/<id>`` or its ``data``) or a dataset id."""
    import minari

    if isinstance(src, minari.MinariDataset):
        return src
    path = Path(os.fspath(src))
    if path.is_dir():
        return minari.MinariDataset(path / "data" if (path / "data").is_dir() else path)
    return minari.load_dataset(str(src))


def _infos(infos: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    """Numeric info arrays (nested dicts flattened to ``a/b``), the rows after the reset info."""
    out = {}
    for k, v in flatten_role(infos or {}).items():
        arr = np.asarray(v)
        if arr.dtype.kind in "biuf" and arr.ndim >= 1:
            out[k] = arr[1:]
    return out


def load(
    src: Any,
    dst: str | None = None,
    *,
    infos: bool = True,
    progress: bool | None = None,
    **create_options: Any,
) -> Dataset:
    """Import a Minari dataset (instance, folder or id) into a new dataset at ``dst``.

    ``infos=False`` skips the per-step infos.
    """
    import minari

    from ..integrations.gymnasium import space_to_json

    mds = open_minari(src)
    storage = mds.storage
    indices = mds.episode_indices
    first = next(iter(mds.iterate_episodes([int(indices[0])]))) if len(indices) else None
    reward_dtype = first.rewards.dtype if first is not None else np.float64
    extras = _infos(first.infos) if (infos and first is not None) else {}
    base = schema_from_gym_spaces(mds.observation_space, mds.action_space, reward_dtype, meta=[SEED, SOURCE_EPISODE])
    schema = DatasetSchema([*base.fields, *fields_from_arrays(extras, "extra")])

    def episodes() -> Iterator[dict[str, Any]]:
        metas = storage.get_episode_metadata(indices)
        for ep, meta in zip(mds.iterate_episodes(indices), metas, strict=True):
            episode = {
                "observations": ep.observations,
                "actions": ep.actions,
                "rewards": ep.rewards,
                # per-step flags: a flag before the last step is rejected, naming the step
                "terminated": np.asarray(ep.terminations, bool),
                "truncated": np.asarray(ep.truncations, bool) & ~np.asarray(ep.terminations, bool),
                "meta": {"seed": meta.get("seed"), "source_episode": int(ep.id)},
            }
            if extras:
                episode["extras"] = _infos(ep.infos)
            yield episode

    env_spec = mds.env_spec
    info = {
        "source": {
            "format": "minari",
            "dataset_id": mds.id,
            "minari_version": mds.minari_version,
            "importer_minari_version": minari.__version__,
            "episodes": len(indices),
            "data_path": str(storage.data_path),
        },
        "env_id": env_spec.id if env_spec is not None else None,
        "env_spec": None if env_spec is None else json.loads(env_spec.to_json()),
        "observation_space": space_to_json(mds.observation_space),
        "action_space": space_to_json(mds.action_space),
    }
    return write_import(
        schema,
        episodes(),
        dst,
        info=info,
        total=len(indices),
        desc="import minari",
        progress=progress,
        **create_options,
    )
