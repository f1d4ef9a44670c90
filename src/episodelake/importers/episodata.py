"""episodata datasets -> episodes, read through episodata's own reader.

episodata already stores action-in episodes of ``T`` transitions and
``T + 1`` observation rows, with the same role-first field model, so fields
map one to one: observation, action and reward fields keep their keys,
``info`` fields become extras holding each step's info (``next_info``; the
reset row's info has no transition to belong to and is not imported).
Ongoing (unfinished) episodes are skipped. An episode marked both terminated
and truncated is stored as terminated.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..core.errors import SchemaError
from ..core.schema import DatasetSchema, FieldSpec
from ..dataset import Dataset
from .common import SOURCE_EPISODE, write_import

ROLES = {"observation": "observation", "action": "action", "reward": "reward", "info": "extra"}


def _role(view: Any, role: str) -> dict[str, np.ndarray]:
    """A segment role view (bare array or episodata ``Fields``) as ``{key: array}``."""
    if isinstance(view, np.ndarray):
        return {role: view}
    return {k: np.asarray(view[k]) for k in view}


def load(src: Any, dst: str | None = None, *, progress: bool | None = None, **create_options: Any) -> Dataset:
    """Import an episodata dataset (a path, or an open ``episodata.Dataset``) into a new dataset at ``dst``."""
    import episodata

    source = src if isinstance(src, episodata.Dataset) else episodata.Dataset.open(os.fspath(src))
    fields = [
        FieldSpec(key, spec.shape, spec.dtype, role=ROLES[spec.role], layout=spec.layout)
        for key, spec in source.schema.fields.items()
    ]
    if not any(f.role == "reward" for f in fields):
        raise SchemaError("the episodata dataset has no reward field; episodelake needs one")
    schema = DatasetSchema([*fields, SOURCE_EPISODE])
    has_info = any(f.role == "extra" for f in fields)

    def episodes() -> Iterator[dict[str, Any]]:
        for ep in source.episodes():
            if ep.ongoing or len(ep) == 0:
                continue
            seg = ep.read()
            episode = {
                "observations": _role(seg.all_observations, "observation"),
                "actions": _role(seg.action, "action"),
                "rewards": _role(seg.reward, "reward"),
                "terminated": ep.terminated,
                "truncated": ep.truncated and not ep.terminated,
                "meta": {"source_episode": ep.id},
            }
            if has_info:
                episode["extras"] = _role(seg.next_info, "info")
            yield episode

    info = {
        "source": {
            "format": "episodata",
            "path": None if isinstance(src, episodata.Dataset) else os.fspath(src),
            "episodata_version": episodata.__version__,
            "episodes": source.num_episodes,
        }
    }
    return write_import(
        schema,
        episodes(),
        dst,
        info=info,
        total=source.num_episodes,
        desc="import episodata",
        progress=progress,
        **create_options,
    )
