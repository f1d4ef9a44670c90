"""Copy a dataset or view to another location (memory, local disk, object storage), verified.

:func:`copy_to` writes the episodes of the collection's snapshot into a new
dataset at ``dest``, optionally with other tensor chunking, compression or
lossy codecs:

* every table column is copied as stored (episode ids, ``created_at``, flags,
  meta, small per-step fields, statistics, CRC-32s), so the copy orders and
  identifies episodes exactly as the source does;
* tensor rows are re-written through TensorStore into arrays under the same
  writer names (ids embed the writer number, so new writers at the
  destination can never collide with copied ids); only the row references
  change; a field re-encoded with a lossy codec (``codecs=``) gets its CRC-32s
  and statistics recomputed on the decoded frames, as a write computes them;
* tensors stream in batches of about ``batch_bytes``, one table commit per
  batch; the table rows of the copied episodes are held in memory.

The destination's history starts fresh (its versions are the copy's commits).
Every dataset-level setting of the source is carried unless the caller
overrides it: tensor chunking, compression and codecs (``chunk_rows``,
``compression``, ``codecs``), the stored quality checks of the copied version
(``checks``: recorded before any episode, so an episode appended to the copy
later is gated, quarantined or warned about as at the source; the copied
episodes are copied as they are, not checked again), the capacity
(``capacity``: a copy larger than it keeps the newest episodes that fit, as
the buffer's own FIFO eviction would), the hive partitioning
(``partition_by``), ``info`` and the derived columns.
Derived columns (:mod:`derived`) are declared at the destination and their
values of the copied episodes written in one update after the episodes.
With ``verify`` (default), the copy is reopened and checked: the same episode
ids in the same order, every table column and derived value equal, and every
episode's tensor rows matching the CRC-32 the original writer stored.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.episode import rows_for
from ..core.errors import ArgumentError, CorruptionError, LocationError
from ..core.progress import bar
from ..core.quality import Check, check_list, with_added
from ..core.schema import DatasetSchema, FieldSpec
from ..core.stats import episode_stats, has_stats
from ..read.snapshot import Snapshot
from ..storage.frames import FrameArray
from ..storage.location import Location
from ..storage.retention import Capacity, evict_count
from ..storage.rows import stat_columns
from ..storage.store import Store
from ..storage.table import arrow_schema
from ..storage.tensors import TensorArray
from ..write import derived
from ..write.quality import record_checks

KEEP: Any = object()  # "leave this setting as the source has it"


def copy_to(
    source: Store,
    snap: Snapshot,
    positions: np.ndarray,
    target: Location,
    *,
    chunk_rows: int | Mapping[str, int] | None = KEEP,
    compression: str | Mapping[str, str | None] | None = KEEP,
    codecs: Mapping[str, str | tuple[str, int] | None] = KEEP,
    capacity: Capacity | None = KEEP,
    checks: Iterable[Check] = KEEP,
    partition_by: Sequence[str] = KEEP,
    overwrite: bool = False,
    progress: bool | None = None,
    verify: bool = True,
    batch_bytes: int = 256 << 20,
) -> Store:
    """Copy the episodes of ``snap`` (a version of ``source``) at ``positions`` to a new dataset at ``target``.

    Omitted (``KEEP``), ``capacity``, ``checks`` and ``partition_by`` are the
    source's (its descriptor's capacity and partitioning, ``snap``'s stored
    checks); given, they replace them: ``capacity=None`` copies into a dataset
    without one, ``checks=()`` stores no check (the caller binds given checks
    over the views first). With a capacity, only the newest episodes that fit
    it are copied (FIFO in episode order, :func:`~episodelake.retention.evict_count`),
    in table commits of at most :meth:`Capacity.file_share`.

    Returns the copy, opened afresh. ``chunk_rows`` / ``compression`` apply
    to every tensor field, or per field key when given as a mapping (``None``
    chunk_rows: the default ~1 MiB chunks; ``None`` compression: raw bytes).
    ``codecs`` maps field keys to a frame codec (``"jpeg"``, ``("webp", 80)``:
    with its quality; the exact ``"webp-lossless"``, ``"jpegxl-lossless"``)
    or ``None`` (store the decoded frames losslessly);
    a field given a lossy codec drops its ``compression``. One
    ``compression`` for every field applies to the lossless ones: a field
    that keeps a lossy codec keeps it (naming such a field in a
    ``compression`` mapping is an :class:`ArgumentError` saying so).
    ``progress``: a bar per episode (None: only on a terminal; see
    :mod:`progress`). Raises :class:`LocationError` when ``target`` is the
    source, :class:`CorruptionError` if verification finds a difference.
    """
    if target.url == source.location.url:
        raise LocationError(f"cannot copy {source.location.url} onto itself")
    schema = _rechunked(snap.schema.base, chunk_rows, compression, codecs)
    capacity = source.capacity if capacity is KEEP else capacity
    kept_checks = snap.checks if checks is KEEP else check_list(checks)
    out = create_like(source, target, schema, overwrite, capacity=capacity, partition_by=partition_by)
    record_stored_checks(out, kept_checks)
    positions = np.asarray(positions, dtype=np.int64)
    rows = _source_rows(snap, positions)
    if capacity is not None:
        kept = fifo_kept(rows, capacity)
        positions, rows = positions[kept], rows.filter(pa.array(kept))
    arrays: dict[tuple[str, str], TensorArray | FrameArray] = {}
    recomputed: list[pa.Table] = []  # per batch: the CRC-32 and statistics columns of lossy fields
    with bar(len(positions), f"copy to {target.url}", progress, unit="episode") as shown:
        for lo, hi in _batches(snap, positions, batch_bytes, capacity):
            batch = rows.slice(lo, hi - lo)
            fresh: dict[str, pa.Array] = {}
            for f in schema.tensor_fields:
                refs, stored = _copy_tensor_rows(snap, out, f, positions[lo:hi], batch["writer"].to_pylist(), arrays)
                batch = batch.set_column(batch.schema.get_field_index(f"ref/{f.key}"), f"ref/{f.key}", refs)
                if f.lossy:
                    fresh.update(_summary_columns(f, stored, arrow_schema(schema)))
            for name, column in fresh.items():
                batch = batch.set_column(batch.schema.get_field_index(name), name, column)
            recomputed.append(pa.table(fresh) if fresh else pa.table({}))
            out.table.append(batch)
            out.committed()
            shown.update(hi - lo)
    for name in recomputed[0].column_names if recomputed else []:
        column = pa.concat_arrays([t[name].combine_chunks() for t in recomputed])
        rows = rows.set_column(rows.schema.get_field_index(name), name, column)
    values = _copy_derived(snap, positions, out)
    copy = Store.open(target)
    if verify:
        verify_copy(rows, Snapshot(copy), values)
    return copy


def _copy_derived(
    snap: Snapshot, positions: np.ndarray, out: Store, new_ids: pa.ChunkedArray | None = None
) -> pa.Table | None:
    """Declare ``snap``'s derived columns at ``out`` and write the values of the copied episodes; return them.

    ``new_ids``: the episodes' ids at ``out`` when they differ from the source's (a merge).
    """
    if not snap.derived.fields:
        return None
    derived.declare(out, out.schema, snap.derived.fields)
    values = snap.derived_values().take(pa.array(positions))
    if new_ids is not None:
        values = values.set_column(values.schema.get_field_index("episode_id"), "episode_id", new_ids)
    columns = [values[f.key].combine_chunks() for f in snap.derived.fields]
    held = np.logical_or.reduce([c.is_valid().to_numpy(zero_copy_only=False) for c in columns])
    if held.any():
        keep = pa.array(np.flatnonzero(held))
        ids = values["episode_id"].to_numpy()[held]
        derived.write(out, ids, {f.key: c.take(keep) for f, c in zip(snap.derived.fields, columns, strict=True)})
    return values


def _rechunked(schema: DatasetSchema, chunk_rows: Any, compression: Any, codecs: Any = KEEP) -> DatasetSchema:
    """``schema`` with tensor fields' chunk_rows/compression/codec replaced where asked."""

    def pick(setting: Any, f: FieldSpec, current: Any) -> Any:
        if setting is KEEP:
            return current
        if isinstance(setting, Mapping):
            return setting.get(f.key, current)
        return setting

    tensor_keys = {f.key for f in schema.tensor_fields}
    if codecs is not KEEP and not isinstance(codecs, Mapping):
        raise ArgumentError(f"codecs must map field keys to a codec, (codec, quality) or None, got {codecs!r}")
    for name, setting in (("chunk_rows", chunk_rows), ("compression", compression), ("codecs", codecs)):
        unknown = sorted(set(setting) - tensor_keys) if isinstance(setting, Mapping) else []
        if unknown:
            raise ArgumentError(f"{name}: {unknown} are not tensor fields (tensor fields: {sorted(tensor_keys)})")
    fields = []
    for f in schema.fields:
        if f.in_tensor:
            codec, quality = f.codec, f.quality
            if codecs is not KEEP and f.key in codecs:
                codec, quality = _codec_setting(f.key, codecs[f.key])
            default = None if codec is not None and codec != f.codec else f.compression
            # chunk_rows means rows per chunk, frames per shard or frames per GOP by codec: a new codec gets its own
            rows = f.chunk_rows if codec == f.codec else None
            packed = pick(compression, f, default)
            if codec is not None and packed is not None:
                if isinstance(compression, Mapping):  # asked for by name: say what would make it apply
                    raise ArgumentError(
                        f"compression[{f.key!r}]: {f.key!r} keeps the lossy codec {codec!r}, which compresses "
                        f"its frames itself; add codecs={{{f.key!r}: None}} to store it losslessly with {packed!r}"
                    )
                packed = None  # one setting for every field: a lossy field keeps its codec
            f = dataclasses.replace(
                f,
                chunk_rows=pick(chunk_rows, f, rows),
                compression=packed,
                codec=codec,
                quality=quality,
                storage="tensor" if f.codec is not None and codec is None else f.storage,
            )
        fields.append(f)
    return DatasetSchema(fields)


def _codec_setting(key: str, value: Any) -> tuple[str | None, int | None]:
    """``(codec, quality)`` of one ``codecs=`` entry."""
    if value is None or isinstance(value, str):
        return value, None
    if isinstance(value, tuple) and len(value) == 2:
        return value[0], value[1]
    raise ArgumentError(f"codecs[{key!r}]: give a codec name, (codec, quality) or None, got {value!r}")


def _summary_columns(f: FieldSpec, stored: Sequence[np.ndarray], target: pa.Schema) -> dict[str, pa.Array]:
    """The ``crc/<key>`` and statistics columns of episodes whose rows of ``f`` are ``stored`` (decoded frames)."""
    out = {f"crc/{f.key}": pa.array([zlib.crc32(np.ascontiguousarray(v).data) for v in stored], pa.int64())}
    if has_stats(f):
        per = [episode_stats(f, v) for v in stored]
        channels = f.stat_channels
        parts: dict[str, np.ndarray] = {"count": np.array([p["count"] for p in per], np.int64)}
        for part in ("sum", "sumsq", "min", "max"):
            parts[part] = np.stack([np.zeros(channels) if p[part] is None else p[part] for p in per])
        out.update(stat_columns(f, parts, target))
    return out


def create_like(
    source: Store,
    target: Location,
    schema: DatasetSchema,
    overwrite: bool,
    capacity: Capacity | None = None,
    partition_by: Sequence[str] = KEEP,
) -> Store:
    """A new dataset at ``target`` with ``schema``, ``capacity``, and ``source``'s info and partitioning
    (``partition_by`` given: that one) (copies and merges)."""
    parts = source.descriptor.get("partition_by", []) if partition_by is KEEP else list(partition_by)
    return Store.create(
        target,
        schema,
        partition_by=parts,
        overwrite=overwrite,
        info=source.descriptor.get("info", {}),
        capacity=capacity,
    )


def record_stored_checks(out: Store, checks: Sequence[Check]) -> None:
    """Store ``checks`` (already bound) with the new dataset ``out`` in one commit, before any episode."""
    if checks:
        chosen = tuple(checks)
        record_checks(out, lambda current: with_added(current, chosen), "ADD CHECK")


def fifo_kept(rows: pa.Table, capacity: Capacity) -> np.ndarray:
    """Which of ``rows`` (table rows, any order) a buffer of ``capacity`` keeps: the newest in episode order
    (``created_at``, ``episode_id``) that fit, as its FIFO eviction would (a boolean mask in ``rows``' order)."""
    created = rows["created_at"].combine_chunks().cast(pa.int64()).to_numpy()
    order = np.lexsort((rows["episode_id"].to_numpy(), created))
    k = evict_count(rows["length"].to_numpy()[order], capacity)
    kept = np.ones(len(order), bool)
    kept[order[:k]] = False
    return kept


def _source_rows(snap: Snapshot, positions: np.ndarray) -> pa.Table:
    """All table columns of the episodes at ``positions``, in that order."""
    tbl = snap.visible_dataset().to_table()
    where = snap.positions_of(tbl["episode_id"].to_numpy())
    row_of_position = np.empty(snap.num_episodes, np.int64)
    row_of_position[where] = np.arange(tbl.num_rows)
    return tbl.take(pa.array(row_of_position[positions])).select(arrow_schema(snap.schema.base).names)


def _batches(
    snap: Snapshot, positions: np.ndarray, batch_bytes: int, capacity: Capacity | None = None
) -> Iterator[tuple[int, int]]:
    """[lo, hi) slices of ``positions`` holding about ``batch_bytes`` of tensor rows each (>= 1 episode).

    With a destination ``capacity``, a slice also holds at most its :meth:`Capacity.file_share` of
    episodes and steps: one table file each, so an eviction at the copy rewrites a small file.
    """
    row_bytes = sum(f.step_bytes for f in snap.schema.tensor_fields)
    lengths = snap.lengths[positions]
    sizes = (lengths + 1) * row_bytes
    most_episodes, most_steps = capacity.file_share() if capacity is not None else (None, None)
    lo, acc, steps = 0, 0, 0
    for i, size in enumerate(sizes):
        full = (most_episodes is not None and i - lo >= most_episodes) or (
            most_steps is not None and steps + int(lengths[i]) > most_steps
        )
        if i > lo and (acc + size > batch_bytes or full):
            yield lo, i
            lo, acc, steps = i, 0, 0
        acc += int(size)
        steps += int(lengths[i])
    if lo < len(positions):
        yield lo, len(positions)


def _copy_tensor_rows(
    snap: Snapshot,
    out: Store,
    f: FieldSpec,
    positions: np.ndarray,
    writers: Sequence[str],
    arrays: dict[tuple[str, str], TensorArray | FrameArray],
    into: FieldSpec | None = None,
) -> tuple[pa.Array, list[np.ndarray]]:
    """Append the episodes' rows of ``f`` to the destination's arrays (of writers ``writers``, as field ``into``,
    default ``f``); return their new refs and stored rows.

    The stored rows are what reads of the copy return: the source rows, or
    their decoded frames when ``f`` is lossy at the destination.
    """
    lengths = rows_for(f, snap.lengths[positions])
    # read as stored at the source: a field given another codec is read with its source codec's reader
    values = snap.read_ranges(snap.schema[f.key], positions.tolist(), [0] * len(positions), lengths.tolist())
    refs = np.empty(len(positions), np.int64)
    stored: list[np.ndarray] = list(values)
    futures = []
    for writer in dict.fromkeys(writers):
        mine = [i for i, w in enumerate(writers) if w == writer]
        key = (writer, f.key)
        if key not in arrays:
            arrays[key] = out.new_array(writer, into or f)
        arr = arrays[key]
        lengths = np.array([len(values[i]) for i in mine], np.int64)
        block = np.concatenate([values[i] for i in mine])
        if isinstance(arr, FrameArray):
            block = arr.round_trip(block)
            for i, piece in zip(mine, np.split(block, np.cumsum(lengths)[:-1]), strict=True):
                stored[i] = piece
        start, future = arr.append_block(block)
        refs[mine] = start + np.cumsum(lengths) - lengths
        futures.append(future)
    for future in futures:
        future.result()  # data before the commit that references it
    return pa.array(refs, pa.int64()), stored


def verify_copy(expected: pa.Table, snap: Snapshot, derived_values: pa.Table | None = None) -> None:
    """Check the copy's snapshot ``snap`` holds exactly ``expected``'s episodes: ids, order, columns, tensor CRC-32s.

    ``derived_values``: the derived columns it must hold too (as :meth:`Snapshot.derived_values` gives them).
    """
    ids = expected["episode_id"].to_numpy()
    got_ids = snap.index["episode_id"]
    if len(got_ids) != len(ids) or (got_ids != ids).any():
        raise CorruptionError(f"copy at {snap.loc.url}: episode ids or their order differ from the source")
    positions = np.arange(len(ids))
    actual = _source_rows(snap, positions)
    refs = {f"ref/{f.key}" for f in snap.schema.tensor_fields}
    for name in expected.column_names:
        if name not in refs and not actual[name].equals(expected[name]):
            raise CorruptionError(f"copy at {snap.loc.url}: column {name!r} differs from the source")
    if derived_values is not None and not snap.derived_values().equals(derived_values):
        raise CorruptionError(f"copy at {snap.loc.url}: derived column values differ from the source")
    for f in snap.schema.tensor_fields:
        crcs = snap.index[f"crc/{f.key}"]
        for lo, hi in _batches(snap, positions, 64 << 20):
            part = positions[lo:hi]
            values = snap.read_ranges(f, part.tolist(), [0] * len(part), rows_for(f, snap.lengths[part]).tolist())
            for p, rows in zip(part, values, strict=True):
                if zlib.crc32(np.ascontiguousarray(rows).data) != int(crcs[p]):
                    raise CorruptionError(
                        f"copy at {snap.loc.url}: episode {int(ids[p])} field {f.key!r} fails its CRC-32"
                    )
