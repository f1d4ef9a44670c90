"""Arrays of camera frames stored per image or GOP (``FieldSpec(codec=...)``: ``"jpeg"``, ``"webp"``,
``"avif"``, ``"video:h264"``, ``"video:av1"``, and the exact ``"webp-lossless"``, ``"jpegxl-lossless"``).

Same Zarr v3 layout as every tensor array (:func:`arrays.zarr_metadata`):
shape ``[rows, *shape]``, ``sharding_indexed`` shards of inner chunks. An
inner chunk is one compressed image (image codecs) or one short video GOP of
``chunk_rows`` consecutive frames (video codecs). TensorStore cannot encode
either, so :class:`FrameArray` encodes chunks in a thread pool (imagecodecs
and PyAV release the GIL), assembles each shard (the chunks' bytes, then the
index of ``(offset, nbytes)`` pairs and its CRC-32C) and writes it through
TensorStore's key-value store (local files, S3, GCS alike). Reading is
:class:`~episodelake.storage.planned.PlainArray`'s: byte ranges of the wanted chunks,
decoded in parallel; it never needs TensorStore, so forked workers read the
same way.

References and reservations follow :class:`~episodelake.storage.tensors.TensorArray`:
commit 0 is a writer's single local array (each commit appends; the last,
partly filled shard is rewritten with its earlier chunks' bytes kept at their
offsets, so a reader's cached index stays valid; a partly filled video chunk
gets one more segment after its earlier bytes), other commits are one array
each (object stores, capacity datasets), written once.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import tensorstore as ts

from ..core import codecs
from ..core.errors import CorruptionError, ValidationError
from ..core.schema import FieldSpec
from . import layout
from .arrays import COMMIT_SHIFT, NO_CHUNK, ROW_MASK, array_parts, zarr_metadata
from .engine import start_engine
from .location import Location
from .planned import PlainArray
from .tensors import Writes, await_op


class FrameArray(PlainArray):
    """A writer's frames of one ``codec=`` field: written here, read as a :class:`PlainArray`."""

    def __init__(self, loc: Location, writer: str, field: FieldSpec, context: ts.Context, commit: int = 0) -> None:
        """Open an existing array (``commit`` 0: the writer's single array) for reading, appending or shrinking."""
        super().__init__(loc, writer, field, commit)
        self._writer, self._context = writer, context
        self._kv: Any = None
        self._per_commit = commit != 0
        # round_trip's last result, the row it was encoded for and its bytes
        self._encoded: tuple[np.ndarray, int, list[bytes]] | None = None

    @classmethod
    def create(
        cls, loc: Location, writer: str, field: FieldSpec, context: ts.Context, per_commit: bool = False
    ) -> FrameArray:
        """The writing side of ``writer``'s frames of ``field``: one array per commit (``per_commit``, always on
        object stores), else its single array, created now (see :meth:`TensorArray.create`)."""
        if loc.is_local and not per_commit:
            _write_metadata(loc, array_parts(writer, field), field, context, 0, False)
            return cls(loc, writer, field, context)
        arr = cls.__new__(cls)  # no array until the first reserve()
        arr.loc, arr.field, arr.commit, arr.rows = loc, field, 0, 0
        arr.where = loc.child_url(*array_parts(writer, field, 1))
        arr._writer, arr._context, arr._kv, arr._per_commit, arr._encoded = writer, context, None, True, None
        return arr

    @property
    def write_rows(self) -> int:
        """Frames per shard: writes aligned to it never rewrite a shard."""
        return self.per_shard * self.chunk_rows

    def _store(self) -> Any:
        if self._kv is None:
            start_engine(self.where)
            parts = array_parts(self._writer, self.field, self.commit)
            opened = ts.KvStore.open(self.loc.kvstore(*parts), context=self._context)
            self._kv = await_op(opened, self.loc, self.where, "opening")
        return self._kv

    def _next_row(self) -> int:
        """The row (within its array) where the next :meth:`reserve` starts."""
        return 0 if self._per_commit else self.rows

    def reserve(self, rows: int) -> int:
        """Make room for ``rows`` more frames; return the reference of the first of them."""
        if not self._per_commit:
            start = self.rows
            parts = array_parts(self._writer, self.field, 0)
            _write_metadata(self.loc, parts, self.field, self._context, start + rows, False)
            self.rows = start + rows
            return start
        if rows > ROW_MASK:
            raise ValidationError(f"{self.where}: one commit of {rows} rows exceeds the limit of {ROW_MASK}")
        commit = self.commit + 1
        parts = array_parts(self._writer, self.field, commit)
        _write_metadata(self.loc, parts, self.field, self._context, rows, True)
        PlainArray.__init__(self, self.loc, self._writer, self.field, commit)
        self._kv = None
        return commit << COMMIT_SHIFT

    def aligned_end(self, start: int, rows: int) -> int:
        """The largest ``n <= rows`` such that frames ``[start, start + n)`` end on a shard boundary."""
        row, S = start & ROW_MASK, self.write_rows
        return (row + rows) // S * S - row

    def _pieces(self, row: int, n: int) -> list[tuple[int, int, int]]:
        """``(inner chunk, first, stop)`` of frames ``[row, row + n)``, split at chunk boundaries."""
        R = self._gop()
        return [(c, max(row, c * R), min(row + n, (c + 1) * R)) for c in range(row // R, -(-(row + n) // R))]

    def _gop(self) -> int:
        """Frames per inner chunk (also before the first :meth:`reserve` of a per-commit array)."""
        return self.field.rows_per_chunk if self.field.codec in codecs.VIDEO else 1

    def encode(self, row: int, block: np.ndarray) -> list[bytes]:
        """Frames ``block``, to be written at ``row``, compressed per piece of :meth:`_pieces` (in the pool)."""
        f = self.field
        assert f.codec is not None and f.layout is not None
        codec, quality, layout_, R = f.codec, f.quality, f.layout, self._gop()

        def one(piece: tuple[int, int, int]) -> bytes:
            c, lo, hi = piece
            if codec in codecs.VIDEO:
                assert quality is not None
                return codecs.encode_segment(codec, quality, layout_, lo - c * R, block[lo - row : hi - row])
            return codecs.encode_frame(codec, quality, layout_, block[lo - row])

        return list(codecs.codec_pool().map(one, self._pieces(row, len(block))))

    def round_trip(self, block: np.ndarray) -> np.ndarray:
        """``block`` as reads will return it once written by the next :meth:`reserve` + :meth:`write` (encoded,
        then decoded); writing the returned array next reuses the encoding (re-encoding decoded frames would
        store other bytes). Checksums and statistics are computed on this. An exact codec returns ``block``
        itself, encoded but not decoded: reads return it bit for bit."""
        f = self.field
        assert f.codec is not None and f.layout is not None
        R, row = self._gop(), self._next_row()
        if not f.lossy:
            self._encoded = (block, row, self.encode(row, block))
            return block
        chain = [codecs.lossy_codec(f.codec, f.quality, f.layout)]
        decode = codecs.chunk_decoder(chain, (R, *f.shape), f.np_dtype)
        pieces = self._pieces(row, len(block))
        blobs = self.encode(row, block)
        out = np.empty(block.shape, block.dtype)

        def one(i: int) -> None:
            c, lo, hi = pieces[i]
            out[lo - row : hi - row] = decode(blobs[i])[lo - c * R : hi - c * R]

        list(codecs.codec_pool().map(one, range(len(blobs))))
        self._encoded = (out, row, blobs)
        return out

    def write(self, start: int, values: np.ndarray) -> Writes:
        """Write frames ``values`` at references ``[start, start + len(values))`` of reserved space."""
        row, n, P, R = start & ROW_MASK, len(values), self.per_shard, self.chunk_rows
        cached = self._encoded
        reuse = cached is not None and cached[0] is values and cached[1] == row
        blobs = cached[2] if reuse and cached is not None else self.encode(row, values)
        self._encoded = None
        pieces = self._pieces(row, n)
        kv = self._store()
        futures = []
        for s in sorted({c // P for c, _, _ in pieces}):
            data, index = self._kept(s, max(row, s * P * R))
            parts = [data]
            offset = len(data)
            for (c, _, _), blob in zip(pieces, blobs, strict=True):
                if c // P != s:
                    continue
                at, size = index[c % P].tolist()
                if at == NO_CHUNK:
                    at, size = offset, 0
                elif at + size != offset:
                    raise CorruptionError(f"{self.where}: shard {s} does not end with chunk {c}; cannot append")
                index[c % P] = (at, size + len(blob))  # a partly filled chunk gets one more segment
                parts.append(blob)
                offset += len(blob)
            futures.append(kv.write(self._key(s), _shard_bytes(b"".join(parts), index)))
            self._indexes.pop(s, None)
        return Writes(futures, self.loc, self.where, values.nbytes)

    def append_block(self, block: np.ndarray) -> tuple[int, Writes]:
        """Reserve ``len(block)`` frames and write ``block`` there; await the result before committing."""
        start = self.reserve(len(block))
        return start, self.write(start, block)

    def _key(self, shard: int) -> str:
        return "/".join(layout.chunk_parts(shard, len(self.field.shape)))

    def _kept(self, shard: int, first: int) -> tuple[bytes, np.ndarray]:
        """The data bytes and index of shard ``shard``'s chunks holding frames before row ``first`` (a chunk
        ``first`` falls inside included; none when the shard starts there)."""
        P, R = self.per_shard, self.chunk_rows
        index = np.full((P, 2), NO_CHUNK, "<u8")
        if first == shard * P * R:
            return b"", index
        got = self._store().read(self._key(shard)).result()
        size = P * 16 + 4
        if got.state != "value" or len(got.value) < size:
            raise CorruptionError(f"{self.where}: shard {shard} is missing or truncated; cannot append to it")
        blob = bytes(got.value)
        old = np.frombuffer(blob[-size:-4], "<u8").reshape(P, 2)
        keep = -(-(first - shard * P * R) // R)
        index[:keep] = old[:keep]
        ends = [int(o + n) for o, n in old[:keep] if o != NO_CHUNK]
        return blob[: max(ends, default=0)], index


def _shard_bytes(data: bytes, index: np.ndarray) -> bytes:
    """A shard: the frames' bytes, then the index and its CRC-32C (Zarr v3 ``sharding_indexed``, index at end)."""
    raw = index.astype("<u8").tobytes()
    return data + raw + int(codecs.optional("google_crc32c").value(raw)).to_bytes(4, "little")


def _write_metadata(
    loc: Location, parts: tuple[str, ...], field: FieldSpec, context: ts.Context, rows: int, fit: bool
) -> None:
    """Write the array's metadata (creating it) for ``rows`` frames."""
    where = loc.child_url(*parts)
    start_engine(where)
    kv = await_op(ts.KvStore.open(loc.kvstore(*parts), context=context), loc, where, "creating")
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        **zarr_metadata(field, sharded=True, rows=rows, fit=fit and rows > 0),
    }
    await_op(kv.write(layout.ARRAY_METADATA, json.dumps(meta).encode()), loc, where, "creating")
