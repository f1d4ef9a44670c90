"""episodata's spellings that have no counterpart here, refused in one place with what to write instead.

episodata 0.2 (the API this project was specified from) names a few things
episodelake's model has no place for: per-episode ids handed out before an
episode ends, unfinished episodes kept in storage, storage backends other
than memory and Zarr. Each such spelling is refused by :func:`refuse` with
one :class:`~episodelake.errors.ArgumentError` naming the episodata spelling
and the episodelake form (classes hold such names as :class:`Refused`
attributes); :func:`backend_path` turns episodata's
``backend=`` into the path episodelake takes, :func:`seed_episode` an
episodata dict-form episode (action-in or action-out, with ``infos``) into
episodelake's. docs/ecosystem.md ("Coming from
episodata") lists every spelling of episodata's API and what becomes of it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import numpy as np

from .errors import ArgumentError, ValidationError

BACKENDS = ("memory", "zarr")

# "<owner>.<name>": what to write instead (the owner is the class a user calls it on)
REFUSED: dict[str, str] = {
    "Dataset.add_episode": "ds.append_episodes([episode]) (the same dict-form episode; committed at the next read)",
    "Dataset.resume_episode": (
        "keep the EpisodeWriter that new_episode returned: an episode is stored only once it ends, "
        "so no unfinished episode is kept to resume"
    ),
    "Dataset.add_step": "writer.add_step(step) on the EpisodeWriter that new_episode returned",
    "Dataset.add_steps": "writer.add_step(step) per step, or ds.append_episodes([episode]) for a whole episode",
    "Dataset.end_episode": (
        "terminated=True or truncated=True in the last writer.add_step(step), or writer.finish() to end "
        "without either flag"
    ),
    "Dataset.num_episodes": "len(ds)",
    "Dataset.backend": "ds.location (memory://... for an in-memory dataset, else its path or URL)",
    "EpisodeWriter.add_steps": "writer.add_step(step) per step, or ds.append_episodes([episode]) for a whole episode",
    "EpisodeWriter.end": (
        "terminated=True or truncated=True in the last writer.add_step(step), or writer.finish() to end "
        "without either flag"
    ),
    "EpisodeWriter.episode_id": (
        "an episode gets its id when it is committed: ds.flush(), then ds.episode(-1).episode_id"
    ),
    "VectorEpisodeWriter.reset": "ds.vector_writer(obs, num_envs): the writer starts at the reset observations",
    "VectorEpisodeWriter.step": "writer.add_steps(obs, actions, rewards, terminated, truncated, infos) per envs.step",
    "SegmentStream.sample_transitions": "ds.sample_transitions(batch_size, seed=...) (time axis removed)",
    "SegmentStream.segment_length": "stream.sequence_length",
    "SegmentStream.read_chunk_size": "nothing: reads are planned per batch (segment_stream(read_chunk_size=) is taken)",
    "SegmentDataset.fetch": "segments.__getitems__(indices), one batched read (what a DataLoader calls)",
    "SegmentDataset.refresh": "ds.refresh(), then ds.segments(...) again: a SegmentDataset is pinned to its snapshot",
    "SegmentDataset.segment_length": "segments.sequence_length",
    "EpisodeRef.id": "ep.episode_id (ids are not positions: ds.episode(i) takes a position, ds.episode(id=) an id)",
    "EpisodeRef.segment": "ep.read(start, stop) (transitions [start, stop))",
    "EpisodeRef.step": "ep.read(t, t + 1), which keeps the time axis",
    "EpisodeRef.ongoing": "nothing: only ended episodes are stored, so none is ongoing",
    "EpisodeRef.writer": "nothing: an ended episode takes no more steps (an open one is its EpisodeWriter)",
    **{
        f"Segment.{name}": "seg.extra (each step's infos, stored as extras; the reset's info is not stored)"
        for name in ("info", "infos", "next_info", "next_infos", "all_infos")
    },
    "Segment.select": "the fields you need by key: seg['observation/camera'] or seg.obs['camera']",
    "DatasetSchema.field": "schema[key] (a field by its key, 'observation/camera')",
    "DatasetSchema.field_keys": "[f.key for f in schema.role_fields(role)] (schema.fields is a tuple of FieldSpec)",
    "DatasetSchema.resolve_fields": "the keys themselves: batches hold every field (schema[key] checks one exists)",
    "DatasetSchema.validate_fields": "ds.append_episodes([episode], dry_run=True), which validates without writing",
    "DatasetSchema.to_dict": "schema.to_json() (a list of field dicts) or schema.dumps() (its JSON text)",
    "DatasetSchema.from_dict": "DatasetSchema.from_json(fields) (the list schema.to_json() gives)",
    "episodelake.ActionOutWriter": (
        "whole episodes with final_observation (action-out rows) through ds.append_episodes([episode]) or "
        "Dataset.from_episodes: converted once when written"
    ),
    "episodelake.VectorWriter": "ds.vector_writer(obs, num_envs) (el.VectorEpisodeWriter), then writer.add_steps(...)",
    "episodelake.Episode": "el.EpisodeRef (what ds.episode(i) returns)",
    "episodelake.Fields": "el.RoleView (what a role of several fields reads as)",
    "episodelake.FieldGroup": "el.RoleView (what a role of several fields reads as)",
    "episodelake.UniformSampler": "sampler=el.Uniform() (the default), seeded by seed=",
    "episodelake.Sampler": "any object with sample(index, batch_size) (episodelake.samplers.Sampler)",
    "episodelake.SegmentDataset": "ds.segments(...) (episodelake.sampling.segment_dataset.SegmentDataset)",
    "episodelake.SegmentStream": "ds.segment_stream(...) (episodelake.sampling.stream.SegmentStream)",
    **{
        f"episodelake.{name}": (
            "Dataset.create(schema, path) or Dataset.create(schema) (memory): one storage format (Zarr v3 "
            "tensors and a Delta episode table), no pluggable backends"
        )
        for name in (
            "StorageBackend",
            "MemoryBackend",
            "ZarrBackend",
            "NpzDirectoryBackend",
            "Selection",
            "get_backend",
            "register_backend",
        )
    },
}


def refuse(owner: str, name: str) -> NoReturn:
    """Raise for ``owner.name``, an attribute normal lookup did not find (``__getattr__``).

    An episodata spelling listed in :data:`REFUSED` is an ArgumentError
    saying what to write instead; any other name an AttributeError, as for
    any object.
    """
    instead = REFUSED.get(f"{owner}.{name}")
    if instead is None:
        raise AttributeError(f"{owner!r} object has no attribute {name!r}")
    raise ArgumentError(f"{owner}.{name} is episodata's spelling, which episodelake does not take; write {instead}")


# episodata keyword -> what to write instead, per callable that takes keywords of its own
REFUSED_OPTIONS: dict[str, dict[str, str]] = {
    "FieldSpec": {
        "key": "FieldSpec(name, ...) (the name inside its role; the field's key is 'role/name')",
        "low": "min= (a quality constraint: a value below rejects the episode) or description=; no bounds are kept",
        "high": "max= (a quality constraint: a value above rejects the episode) or description=; no bounds are kept",
        "optional": "default=value: a step that omits the field stores its default",
    },
}


def refuse_options(owner: str, given: Mapping[str, Any]) -> None:
    """ArgumentError for the first of ``given``'s keywords that is an episodata option ``owner`` does not take."""
    table = REFUSED_OPTIONS[owner]
    for name in given:
        if name in table:
            raise ArgumentError(
                f"{owner}({name}=...) is episodata's spelling, which episodelake does not take; write {table[name]}"
            )


class Refused:
    """A class attribute standing for an episodata name the class has no counterpart for: reading it refuses.

    ``info = Refused("Segment")`` in a class body makes ``seg.info`` raise
    :func:`refuse`'s ArgumentError. (A descriptor, not ``__getattr__``, so a
    property's own AttributeError is never replaced by another message.)
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self  # read on the class: calling it refuses (episodata's classmethods)
        refuse(self.owner, self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        refuse(self.owner, self.name)


def backend_path(path: Any, backend: str | None, method: str, options: Mapping[str, Any] | None = None) -> Any:
    """The ``path`` episodelake takes for episodata's ``path=`` and ``backend=`` (None: ``path`` as given).

    ``"memory"``: an in-memory dataset (``memory://<path>``, or a fresh
    ``memory://`` name without a path); ``"zarr"``: a dataset on disk or an
    object store at ``path`` (required). Any other backend is an
    ArgumentError naming the accepted ones; so are ``options``, episodata's
    ``**backend_options`` (``chunk_bytes=``, ``shard_bytes=``).
    """
    if options:
        raise ArgumentError(
            f"{method}: unknown option(s) {sorted(options)}; episodata's backend options (chunk_bytes=, "
            "shard_bytes=) are not taken: chunks are set per field, FieldSpec(chunk_rows=), and copy_to(chunk_rows=) "
            "re-chunks a copy"
        )
    if backend is None:
        return path
    if backend not in BACKENDS:
        raise ArgumentError(
            f"{method}: backend={backend!r} is not available; episodelake takes backend='memory' (in memory) or "
            "'zarr' (Zarr v3 tensors and a Delta table at path=); for an episodata npz_directory dataset, import "
            "it with episodelake.importers.episodata.load(path, dest)"
        )
    if backend == "memory":
        if path is None or str(path).startswith("memory://"):
            return path
        if not isinstance(path, str | os.PathLike):
            raise ArgumentError(f"{method}: path must be a name or None with backend='memory', got {path!r}")
        return f"memory://{os.fspath(path)}"
    if path is None:
        raise ArgumentError(f"{method}: backend='zarr' stores the dataset at a path; give path= (None: in memory)")
    if str(path).startswith("memory://"):
        raise ArgumentError(f"{method}: backend='zarr' needs a path on disk or an object store, got {path!r}")
    return path


INITIAL = ("initial_observation", "initial_info")
FINAL = ("final_observation", "final_info")
ALIGNMENTS = ("action_in", "action_out")


def _leaves(value: Any, fn: Callable[[np.ndarray], np.ndarray]) -> Any:
    """``value`` (an array or a nested dict of them) with ``fn`` applied to every leaf."""
    if isinstance(value, Mapping):
        return {k: _leaves(v, fn) for k, v in value.items()}
    return fn(np.asarray(value))


def _same_fields(rows: Any, row: Any, names: str) -> None:
    """ValidationError unless the boundary ``row`` holds the same (nested) fields as ``rows``."""
    if isinstance(rows, Mapping) or isinstance(row, Mapping):
        mine = sorted(row) if isinstance(row, Mapping) else ["<array>"]
        theirs = sorted(rows) if isinstance(rows, Mapping) else ["<array>"]
        if mine != theirs:
            raise ValidationError(f"{names} must hold the same fields, got {mine} vs {theirs}")
        for k in theirs:
            _same_fields(rows[k], row[k], names)


def _then(value: Any, last: Any) -> Any:
    """Rows ``1:`` of ``value`` followed by the row ``last`` (the same nested keys, checked before)."""
    if isinstance(value, Mapping):
        return {k: _then(v, last[k]) for k, v in value.items()}
    rows = np.asarray(value)
    return np.concatenate([rows[1:], np.asarray(last, dtype=rows.dtype)[None]])


def seed_episode(episode: Mapping[str, Any], alignment: str | None = None) -> Mapping[str, Any]:
    """An episodata dict-form episode as episodelake's (the episode itself when it uses no episodata key).

    episodata's boundary keys say the alignment: ``initial_observation`` (and
    ``initial_info``) mark action-in input, ``final_observation`` (and
    ``final_info``) action-out input, whose rows hold the action taken *at*
    each observation; it is converted once here (the observation each action
    produced is the next row's, the last one ``final_observation``).
    ``infos`` (one row per step) must come with its boundary info,
    ``initial_info`` or ``final_info``, and the other way round: info rows
    are never synthesized. They are stored as extras, the info each step
    returned; the reset observation's info has no transition to belong to
    and is not stored. ``alignment`` (``"action_in"``, ``"action_out"``)
    must agree with the keys. Broken rules raise :class:`ValidationError`.
    """
    if alignment is not None and alignment not in ALIGNMENTS:
        raise ArgumentError(f"alignment must be None, 'action_in' or 'action_out', got {alignment!r}")
    initial = [k for k in INITIAL if k in episode]
    final = [k for k in FINAL if k in episode]
    if initial and final:
        raise ValidationError(f"{initial[0]!r} (action-in) and {final[0]!r} (action-out) are mutually exclusive")
    found = "action_out" if final else "action_in" if initial else None
    if alignment is not None and found is not None and found != alignment:
        raise ValidationError(f"the episode holds {(initial or final)[0]!r}, but alignment={alignment!r} was given")
    if alignment == "action_out" and not final:
        raise ValidationError(
            "alignment='action_out' needs final_observation (the observation the last action produced); "
            "episodelake keeps every transition, so it does not drop the last action and reward"
        )
    if not final and "infos" not in episode and "initial_info" not in episode:
        return episode
    info_key = "final_info" if final else "initial_info"
    if ("infos" in episode) != (info_key in episode):
        given, missing = ("infos", info_key) if "infos" in episode else (info_key, "infos")
        raise ValidationError(
            f"{given!r} needs {missing!r}: infos pair with initial_info (action-in) or final_info (action-out), "
            "and info rows are never synthesized"
        )
    if "infos" in episode and "extras" in episode:
        raise ValidationError("give an episode's per-step infos as 'infos' or as 'extras', not both")
    if "infos" in episode:
        _same_fields(episode["infos"], episode[info_key], f"'infos' and {info_key!r}")
    out = {k: v for k, v in episode.items() if k not in ("initial_info", *FINAL, "infos")}
    if final:
        if "final_observation" not in episode:
            raise ValidationError("'final_info' needs 'final_observation' (the observation the last action produced)")
        if "observations" not in episode:
            raise ValidationError("an action-out episode needs 'observations', one row per step")
        rows = episode["observations"]
        _same_fields(rows, episode["final_observation"], "'observations' and 'final_observation'")
        out["initial_observation"] = _leaves(rows, lambda a: a[0])
        out["observations"] = _then(rows, episode["final_observation"])
        if "infos" in episode:
            out["extras"] = _then(episode["infos"], episode["final_info"])
    elif "infos" in episode:
        out["extras"] = episode["infos"]
    return out
