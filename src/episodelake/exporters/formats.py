"""Exporters: the episode table to Arrow / Parquet / Polars, a whole dataset to Minari.

The episode table is one row per episode, in episode order, restricted to the
collection (a Dataset or a view from ``where()``): ``episode_id``, ``length``,
``terminated``, ``truncated``, ``return``, ``created_at``, ``writer``, the
meta fields and the small per-step fields as nested list columns. List
columns use the table's storage dtypes (uint8 as int16, float16 as float32,
complex as a trailing (re, im) axis; see :func:`episodelake.schema.storage_dtype`).
Tensor references, checksums and statistics columns are left out unless
``internal=True``.

:func:`to_minari` writes every episode (observations ``T + 1``, actions,
rewards, per-step flags, ``seed`` meta when the schema has it) to a Minari
dataset readable by ``minari.MinariDataset`` / ``minari.load_dataset``.
Spaces come from the arguments, else from the descriptor ``info`` (recorded by
:mod:`episodelake.integrations.gymnasium` and the Minari importer), else from
the schema (unbounded Boxes). Images are stored raw (no JPEG), so values
survive exactly. Extras are not exported: Minari infos pair with every
observation including the reset one, which extras have no row for.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.errors import ArgumentError, DatasetExistsError, SchemaError
from ..core.progress import track
from ..core.schema import DatasetSchema

if TYPE_CHECKING:
    from ..read.collection import EpisodeCollection

INTERNAL_PREFIXES = ("ref/", "crc/", "stats/")


def episode_table(collection: EpisodeCollection, columns: list[str] | None = None, internal: bool = False) -> pa.Table:
    """The collection's episode rows as an Arrow table, in episode order."""
    snap = collection.snapshot()
    arrow = snap.arrow_dataset()
    if columns is None:
        columns = [c for c in arrow.schema.names if internal or not c.startswith(INTERNAL_PREFIXES)]
    read = columns if "episode_id" in columns else [*columns, "episode_id"]
    table = snap._read_table(read)  # a damaged table file is a CorruptionError naming it
    ids = pa.array(np.asarray(collection.episode_ids, dtype=np.int64))
    rank = pc.index_in(table.column("episode_id"), value_set=ids)  # position in episode order, null if outside
    keep = pc.is_valid(rank)
    table, rank = table.filter(keep), rank.filter(keep)
    return table.take(pc.sort_indices(rank)).select(columns)


def to_parquet(collection: EpisodeCollection, path: str | os.PathLike, **options: Any) -> None:
    """Write the episode table to one Parquet file (``options``: :func:`episode_table` arguments)."""
    import pyarrow.parquet as pq

    pq.write_table(episode_table(collection, **options), os.fspath(path))


def to_arrow_file(collection: EpisodeCollection, path: str | os.PathLike, **options: Any) -> None:
    """Write the episode table to one Arrow IPC (Feather v2) file."""
    import pyarrow.feather as feather

    feather.write_feather(episode_table(collection, **options), os.fspath(path))


def to_polars(collection: EpisodeCollection, **options: Any) -> Any:
    """The episode table as a ``polars.DataFrame`` (zero copy from Arrow where possible)."""
    import polars as pl

    return pl.from_arrow(episode_table(collection, **options))


# ---------------------------------------------------------------- Minari


def _schema_space(schema: DatasetSchema, role: str) -> Any:
    """A Gymnasium space for a role from the schema alone: unbounded Boxes, Dict for nested names."""
    import gymnasium as gym

    def box(f: Any) -> Any:
        dt = f.np_dtype
        if dt.kind == "f":
            return gym.spaces.Box(-np.inf, np.inf, f.shape, dt)
        if dt.kind in "iu":
            return gym.spaces.Box(np.iinfo(dt).min, np.iinfo(dt).max, f.shape, dt)
        if dt.kind == "b":
            return gym.spaces.MultiBinary(list(f.shape)) if f.shape else gym.spaces.Discrete(2)
        raise SchemaError(f"field {f.key!r}: {dt} has no Gymnasium space; pass the space explicitly")

    fields = schema.role_fields(role)
    if schema.unwrapped(role) and fields[0].name == role:
        return box(fields[0])
    tree: dict[str, Any] = {}
    for f in fields:
        node = tree
        *parents, leaf = f.name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = box(f)

    def build(node: dict[str, Any]) -> Any:
        return gym.spaces.Dict({k: build(v) if isinstance(v, dict) else v for k, v in node.items()})

    return build(tree)


def _nest(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _role_value(seg: Any, role: str, space: Any) -> Any:
    """The segment's role in the shape Minari expects for ``space`` (bare array or nested dict)."""
    import gymnasium as gym

    value = seg.role(role)
    if isinstance(space, gym.spaces.Dict):
        flat = value.flat() if hasattr(value, "flat") else {seg.schema.role_fields(role)[0].name: value}
        return _nest({k: np.ascontiguousarray(v) for k, v in flat.items()})
    return np.ascontiguousarray(value)


def to_minari(
    collection: EpisodeCollection,
    path: str | os.PathLike | None = None,
    dataset_id: str | None = None,
    *,
    observation_space: Any = None,
    action_space: Any = None,
    data_format: str = "hdf5",
    progress: bool | None = None,
) -> Any:
    """Write every episode to a new Minari dataset; returns it as a ``minari.MinariDataset``.

    ``path`` is the dataset folder (its data goes to ``path/data``); None
    writes to Minari's own root (``MINARI_DATASETS_PATH``) under
    ``dataset_id`` so ``minari.load_dataset(dataset_id)`` finds it.
    ``dataset_id`` defaults to ``<folder name>-v0``.
    """
    import minari
    from gymnasium.envs.registration import EnvSpec
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage
    from minari.storage.datasets_root_dir import get_dataset_path

    from ..integrations.gymnasium import space_from_json

    if path is None:
        if dataset_id is None:
            raise ArgumentError("to_minari needs a path or a dataset_id")
        root = Path(get_dataset_path(dataset_id))
    else:
        root = Path(os.fspath(path)).absolute()  # Minari's size accounting breaks on relative paths
        dataset_id = dataset_id or f"{root.name}-v0"
    if root.exists():
        raise DatasetExistsError(f"{root} already exists")
    schema = collection.schema
    info = dict(collection.info)  # a view's dataset's
    spaces = {}
    for role, given in (("observation", observation_space), ("action", action_space)):
        if given is None and f"{role}_space" in info:
            given = space_from_json(info[f"{role}_space"])
        spaces[role] = given if given is not None else _schema_space(schema, role)
    env_spec = None
    if info.get("env_spec"):
        try:
            env_spec = EnvSpec.from_json(json.dumps(info["env_spec"]))
        except (ValueError, TypeError, KeyError):
            env_spec = None  # a spec this Gymnasium cannot rebuild; the spaces are enough to read the data
    (root / "data").mkdir(parents=True)
    storage = MinariStorage.new(
        root / "data", spaces["observation"], spaces["action"], env_spec, data_format, jpeg_encoding=False
    )
    storage.update_metadata({"dataset_id": dataset_id, "minari_version": minari.__version__})
    has_seed = any(f.name == "seed" for f in schema.meta_fields)

    def buffers() -> Iterator[Any]:
        for i, ep in enumerate(
            track(list(collection.episodes()), desc="export minari", progress=progress, unit="episode")
        ):
            seg = ep.read()
            seed = ep.meta.get("seed") if has_seed else None
            yield EpisodeBuffer(
                id=i,
                seed=None if seed is None else int(seed),
                observations=_role_value(seg, "observation", spaces["observation"]),
                actions=_role_value(seg, "action", spaces["action"]),
                rewards=np.asarray(seg.reward),
                terminations=np.asarray(seg.terminated, bool),
                truncations=np.asarray(seg.truncated, bool),
            )

    storage.update_episodes(buffers())
    return minari.MinariDataset(root / "data")
