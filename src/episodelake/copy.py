"""Copy a dataset or view to another location (memory, local disk, object storage), verified.

:func:`copy_to` writes the episodes of the collection's snapshot into a new
dataset at ``dest``, optionally with other tensor chunking or compression:

* every table column is copied as stored (episode ids, ``created_at``, flags,
  meta, small per-step fields, statistics, CRC-32s), so the copy orders and
  identifies episodes exactly as the source does;
* tensor rows are re-written through TensorStore into arrays under the same
  writer names (ids embed the writer number, so new writers at the
  destination can never collide with copied ids); only the row references
  change;
* tensors stream in batches of about ``batch_bytes``, one table commit per
  batch; the table rows of the copied episodes are held in memory.

The destination's history starts fresh (its versions are the copy's commits).
With ``verify`` (default), the copy is reopened and checked: the same episode
ids in the same order, every table column equal, and every episode's tensor
rows matching the CRC-32 the original writer stored.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .errors import CorruptionError, LocationError, ValidationError
from .location import resolve
from .progress import bar
from .schema import DatasetSchema, FieldSpec
from .snapshot import Snapshot
from .table import arrow_schema
from .tensors import TensorArray

if TYPE_CHECKING:
    from .dataset import Dataset, EpisodeCollection

KEEP: Any = object()  # "leave this setting as the source has it"


def copy_to(
    collection: EpisodeCollection,
    dest: str | None,
    storage_options: Mapping[str, Any] | None = None,
    *,
    chunk_rows: int | Mapping[str, int] | None = KEEP,
    compression: str | Mapping[str, str | None] | None = KEEP,
    overwrite: bool = False,
    progress: bool | None = None,
    verify: bool = True,
    batch_bytes: int = 256 << 20,
) -> Dataset:
    """Copy ``collection`` (a Dataset or view) to ``dest`` (None: in memory) and return the copy.

    ``chunk_rows`` / ``compression`` apply to every tensor field, or per field
    key when given as a mapping (``None`` chunk_rows: the default ~1 MiB
    chunks; ``None`` compression: raw bytes). ``progress``: a bar per
    episode (None: only on a terminal; see :mod:`progress`).
    Raises :class:`CorruptionError` if verification finds a difference.
    """
    from .dataset import Dataset, DatasetView

    source = collection.dataset if isinstance(collection, DatasetView) else collection
    snap = collection.snapshot()
    target = resolve(dest, dict(storage_options or {}))
    if target.url == source.location.url:
        raise LocationError(f"cannot copy {source.location.url} onto itself")
    schema = _rechunked(snap.schema, chunk_rows, compression)
    out = Dataset.create(
        schema,
        target.url,
        storage_options=target.storage_options,
        partition_by=source.descriptor.get("partition_by", []),
        overwrite=overwrite,
        info=source.info,
    )
    positions = np.asarray(collection.positions, dtype=np.int64)
    rows = _source_rows(snap, positions)
    arrays: dict[tuple[str, str], TensorArray] = {}
    with bar(len(positions), f"copy to {target.url}", progress, unit="episode") as shown:
        for lo, hi in _batches(snap, positions, batch_bytes):
            batch = rows.slice(lo, hi - lo)
            for f in schema.tensor_fields:
                refs = _copy_tensor_rows(snap, out, f, positions[lo:hi], batch["writer"].to_pylist(), arrays)
                batch = batch.set_column(batch.schema.get_field_index(f"ref/{f.key}"), f"ref/{f.key}", refs)
            out._table.append(batch)
            out._on_commit()
            shown.update(hi - lo)
    copy = Dataset.open(target.url, storage_options=target.storage_options)
    if verify:
        verify_copy(rows, copy)
    return copy


def _rechunked(schema: DatasetSchema, chunk_rows: Any, compression: Any) -> DatasetSchema:
    """``schema`` with tensor fields' chunk_rows/compression replaced where asked."""

    def pick(setting: Any, f: FieldSpec, current: Any) -> Any:
        if setting is KEEP:
            return current
        if isinstance(setting, Mapping):
            return setting.get(f.key, current)
        return setting

    tensor_keys = {f.key for f in schema.tensor_fields}
    for name, setting in (("chunk_rows", chunk_rows), ("compression", compression)):
        unknown = sorted(set(setting) - tensor_keys) if isinstance(setting, Mapping) else []
        if unknown:
            raise ValidationError(f"{name}: {unknown} are not tensor fields (tensor fields: {sorted(tensor_keys)})")
    fields = []
    for f in schema.fields:
        if f.in_tensor:
            f = dataclasses.replace(
                f, chunk_rows=pick(chunk_rows, f, f.chunk_rows), compression=pick(compression, f, f.compression)
            )
        fields.append(f)
    return DatasetSchema(fields)


def _source_rows(snap: Snapshot, positions: np.ndarray) -> pa.Table:
    """All table columns of the episodes at ``positions``, in that order."""
    tbl = snap.arrow_dataset().to_table()
    where = snap.positions_of(tbl["episode_id"].to_numpy())
    row_of_position = np.empty(snap.num_episodes, np.int64)
    row_of_position[where] = np.arange(tbl.num_rows)
    return tbl.take(pa.array(row_of_position[positions])).select(arrow_schema(snap.schema).names)


def _batches(snap: Snapshot, positions: np.ndarray, batch_bytes: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) slices of ``positions`` holding about ``batch_bytes`` of tensor rows each (>= 1 episode)."""
    row_bytes = sum(f.step_bytes for f in snap.schema.tensor_fields)
    sizes = (snap.lengths[positions] + 1) * row_bytes
    lo, acc = 0, 0
    for i, size in enumerate(sizes):
        if acc and acc + size > batch_bytes:
            yield lo, i
            lo, acc = i, 0
        acc += int(size)
    if lo < len(positions):
        yield lo, len(positions)


def _copy_tensor_rows(
    snap: Snapshot,
    out: Dataset,
    f: FieldSpec,
    positions: np.ndarray,
    writers: Sequence[str],
    arrays: dict[tuple[str, str], TensorArray],
) -> pa.Array:
    """Append the episodes' rows of ``f`` to the destination's arrays; return their new refs."""
    extra = 1 if f.role == "observation" else 0
    lengths = snap.lengths[positions] + extra
    values = snap.read_ranges(f, positions.tolist(), [0] * len(positions), lengths.tolist())
    refs = np.empty(len(positions), np.int64)
    futures = []
    for writer in dict.fromkeys(writers):
        mine = [i for i, w in enumerate(writers) if w == writer]
        key = (writer, f.key)
        if key not in arrays:
            arrays[key] = TensorArray.create(out.location, writer, f, out._ts_context)
        lengths = np.array([len(values[i]) for i in mine], np.int64)
        start, future = arrays[key].append_block(np.concatenate([values[i] for i in mine]))
        refs[mine] = start + np.cumsum(lengths) - lengths
        futures.append(future)
    for future in futures:
        future.result()  # data before the commit that references it
    return pa.array(refs, pa.int64())


def verify_copy(expected: pa.Table, copy: Dataset) -> None:
    """Check ``copy`` holds exactly ``expected``'s episodes: ids, order, columns, tensor CRC-32s."""
    snap = copy.snapshot()
    ids = expected["episode_id"].to_numpy()
    got_ids = snap.index["episode_id"]
    if len(got_ids) != len(ids) or (got_ids != ids).any():
        raise CorruptionError(f"copy at {copy.location.url}: episode ids or their order differ from the source")
    positions = np.arange(len(ids))
    actual = _source_rows(snap, positions)
    refs = {f"ref/{f.key}" for f in copy.schema.tensor_fields}
    for name in expected.column_names:
        if name not in refs and not actual[name].equals(expected[name]):
            raise CorruptionError(f"copy at {copy.location.url}: column {name!r} differs from the source")
    for f in copy.schema.tensor_fields:
        extra = 1 if f.role == "observation" else 0
        crcs = snap.index[f"crc/{f.key}"]
        for lo, hi in _batches(snap, positions, 64 << 20):
            part = positions[lo:hi]
            values = snap.read_ranges(f, part.tolist(), [0] * len(part), (snap.lengths[part] + extra).tolist())
            for p, rows in zip(part, values, strict=True):
                if zlib.crc32(np.ascontiguousarray(rows).data) != int(crcs[p]):
                    raise CorruptionError(
                        f"copy at {copy.location.url}: episode {int(ids[p])} field {f.key!r} fails its CRC-32"
                    )
