"""Field specifications, the dataset schema and its Arrow encoding.

The schema is authoritative: it fixes every field's key, role, per-step shape,
dtype and where it is stored (a list column of the episode table, or a Zarr v3
tensor array). Delta Lake has no unsigned integers, no float16 and no complex
numbers, so table columns use a lossless *storage* dtype and reads restore the
schema dtype exactly (see :func:`storage_dtype`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from . import codecs
from .errors import SchemaError
from .spellings import Refused, refuse_options, seed_episode

ROLES = ("observation", "action", "reward", "extra", "meta")
STEP_ROLES = ("observation", "action", "reward", "extra")
# THE role table: each step role's other names. The first is its plural, the role's key in a
# dict-form episode (Dataset.from_episodes, infer_schema). Every name, and the role itself, is
# accepted as a FieldSpec role, as a role of Segment/Transitions and as a key of an add_step
# dict; "infos" (Gymnasium's name) only as an add_step key. Segments read observations as
# ``obs``/``observation``, ``next_obs``/``next_observation`` and ``all_obs``/``all_observations``.
_ROLE_NAMES = {
    "observation": ("observations", "obs"),
    "action": ("actions",),
    "reward": ("rewards",),
    "extra": ("extras",),
}
EPISODE_KEYS = {names[0]: role for role, names in _ROLE_NAMES.items()}
ROLE_ALIASES = {name: role for role, names in _ROLE_NAMES.items() for name in (role, *names)}
STEP_KEYS = {**ROLE_ALIASES, "infos": "extra"}
# Columns of the episode table that no field may shadow.
RESERVED_COLUMNS = frozenset(
    {
        "episode_id",
        "length",
        "terminated",
        "truncated",
        "return",
        "created_at",
        "writer",
        "seq",
        "observation",
        "action",
        "reward",
        "extra",
        "t",
        "checks_failed",
        "quarantined",
    }
)
TABLE_STEP_LIMIT = 1024  # bytes per step under which "auto" stores a field in the table
STRING_LIMIT = 4096  # longest accepted meta string, in bytes
COMPRESSED_CHUNK_ROWS = 8  # most rows per compressed chunk by default: a segment decodes ~7 rows it does not need
FRAMES_PER_SHARD = 64  # frames per shard file of a lossy field by default

_NAME_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_NUMERIC_KINDS = "biufc"
_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}  # a value may be of its field's kind or a narrower one


def role_of(name: str) -> str:
    """The role ``name`` spells (see the role table); any other name is returned unchanged."""
    return ROLE_ALIASES.get(name, name)


def normalize_dtype(dtype: Any) -> np.dtype:
    """Return the NumPy dtype for ``dtype`` ("str" for strings); reject the rest."""
    if dtype in ("str", "string", str):
        return np.dtype("U")
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise SchemaError(f"unsupported dtype {dtype!r}") from exc
    if dt.kind not in _NUMERIC_KINDS and dt.kind != "U":
        raise SchemaError(f"unsupported dtype {dt} (numeric, bool or str only)")
    return dt.newbyteorder("=") if dt.kind != "U" else np.dtype("U")


# Schema dtypes (``dtype.str`` without byte order) that table columns store as another dtype.
_STORAGE_DTYPES: dict[str, np.dtype] = {
    "u1": np.dtype("int16"),
    "u2": np.dtype("int32"),
    "u4": np.dtype("int64"),
    "u8": np.dtype("int64"),
    "f2": np.dtype("float32"),
    "c8": np.dtype("float32"),
    "c16": np.dtype("float64"),
}


def storage_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a table column stores ``dtype`` as (lossless; restored on read).

    uint8/16/32 widen to the next signed integer so SQL sees true values;
    uint64 is bit-reinterpreted as int64 (documented: SQL sees it signed);
    float16 widens to float32; complex is stored as a trailing (re, im) axis.
    """
    return _STORAGE_DTYPES.get(dtype.str[1:], dtype)


def to_storage(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Encode ``values`` (of schema ``dtype``) into its table storage dtype."""
    if dtype.kind == "c":
        return values.view(storage_dtype(dtype)).reshape(*values.shape, 2)
    if dtype == np.uint64:
        return values.view(np.int64)
    return values.astype(storage_dtype(dtype), copy=False)


def from_storage(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Decode table storage ``values`` back to schema ``dtype`` exactly."""
    if dtype.kind == "c":
        return np.ascontiguousarray(values).view(dtype)[..., 0]
    if dtype == np.uint64:
        return values.view(np.uint64)
    return values.astype(dtype, copy=False)


def validate_name(name: str, what: str = "field") -> str:
    """Check a field name: `/`-separated parts, none empty, `.` or `..`."""
    if not isinstance(name, str) or not name:
        raise SchemaError(f"{what} name must be a non-empty string, got {name!r}")
    for part in name.split("/"):
        if part in ("", ".", "..") or not _NAME_PART.match(part):
            raise SchemaError(
                f"invalid {what} name {name!r}: parts must match "
                "[A-Za-z0-9_][A-Za-z0-9_.-]* and may not be empty, '.' or '..'"
            )
    return name


@dataclass(frozen=True)
class FieldSpec:
    """One field of the schema.

    Args:
        name: key inside its role; nested keys use ``/`` (``"keyboard/jump"``).
        shape: per-step shape (per-episode for ``role="meta"``).
        dtype: any NumPy numeric dtype, ``bool``, or ``"str"`` (meta only).
        role: observation, action, reward, extra (per-step) or meta (per-episode).
        layout: optional axis labels, e.g. ``"CHW"``; the ``C`` axis gets
            per-channel statistics.
        storage: ``"auto"`` (table up to 1 KiB per step), ``"table"`` or ``"tensor"``.
        finite: reject NaN and infinity on write.
        min, max: quality constraints, element-wise: every value ``>= min``
            / ``<= max`` (a NaN fails both). ``monotonic``: ``"increasing"``
            (each row greater than the one before, element-wise, within an
            episode) or ``"nondecreasing"`` (greater or equal): for
            time-like step fields. ``max_repeat``: at most ``k`` identical
            consecutive rows (bit for bit) within an episode: a frozen
            camera or sensor. Numeric fields only; ``min``/``max`` also on
            meta fields (NULL passes). What a violation does is ``on_fail``'s.
        on_fail: what a violated constraint of this field does to the episode
            (``core.constraints``), as :class:`~episodelake.Check`'s
            ``on_fail``: ``"reject"`` (default: :class:`QualityError` and
            nothing of the episode is stored), ``"quarantine"`` (committed,
            left out of every snapshot but ``ds.quality.quarantine()``'s) or
            ``"warn"`` (committed normally); both record
            ``"<field key>: <constraint>"`` in the episode's
            ``checks_failed``. One string for every constraint of the field,
            or a mapping from constraint names to actions
            (``{"max_repeat": "quarantine"}``: the others reject). Only with
            constraints; dtype, shape and ``finite`` errors always raise.
        chunk_rows: rows per Zarr chunk for tensor fields (default: ~1 MiB chunks).
        compression: lossless compression of tensor fields: ``None`` (raw
            bytes), ``"zstd"`` or Blosc ``"blosc-lz4"``, ``"blosc-zstd"``,
            ``"blosc-lz4hc"``, each optionally suffixed ``-bitshuffle`` or
            ``-noshuffle`` (default: byte shuffle); see :mod:`episodelake.codecs`.
        codec: lossy image codec of a ``uint8`` ``HWC``/``CHW`` camera field:
            ``"jpeg"``, ``"webp"`` or ``"avif"`` (one compressed image per
            frame), or ``"video:h264"`` / ``"video:av1"`` (3-channel frames of
            at least 8 x 8 pixels; one closed GOP per chunk of ``chunk_rows``
            frames, default 16); implies tensor storage; no ``compression``
            with it. Reads, checksums and statistics see the decoded frames.
            Or an exact image codec, ``"webp-lossless"`` / ``"jpegxl-lossless"``
            (1, 3 or 4 channels; no ``quality``): the same per-frame storage,
            reads return the written frames exactly.
        quality: the codec's quality, 1..100 (default per codec: jpeg 90,
            webp 90, avif 80, video:h264 60, video:av1 55; video maps it to
            crf ``round((100 - quality) * max_crf / 99)``, max_crf 51 for
            h264, 63 for av1); only with ``codec``.
        description: free text, kept in the descriptor.
        required: meta fields only. ``True``: every episode must have a value
            (not None) when it is handed over for commit, else
            :class:`ValidationError`; an episode whose required fields are
            still missing waits for them after its last step. ``False``
            (default): the field is nullable (missing -> NULL).
        default: step fields only. A value of the field's shape (and dtype, or a
            narrower kind, as for writes) stored when a step omits the field;
            ``None`` (default): the field must be given. Checked here, so a bad
            default raises :class:`SchemaError` naming the field; kept
            normalized as nested lists (``default_value`` is the array).
        derived: a column added after the fact (``ds.columns.add`` /
            ``ds.columns.update``, see docs/replay.md): never written with
            episodes, stored in the table (not tensors); a step field's
            ``default`` fills steps of episodes never updated (else NaN for
            floats, zero otherwise), a meta field reads None there.
        stored_as: the key a renamed tensor field's arrays keep
            (``ds.columns.rename``: tensors are never moved); None: its key.
    """

    name: str
    shape: tuple[int, ...] = ()
    dtype: Any = "float32"
    role: str = "observation"
    layout: str | None = None
    storage: str = "auto"
    finite: bool = False
    chunk_rows: int | None = None
    compression: str | None = None
    description: str = ""
    required: bool = False
    default: Any = field(default=None, hash=False)  # normalized to nested lists (unhashable)
    derived: bool = False
    codec: str | None = None
    quality: int | None = None
    stored_as: str | None = None
    min: float | None = None
    max: float | None = None
    monotonic: str | None = None
    max_repeat: int | None = None
    on_fail: str | Mapping[str, str] = field(default="reject", hash=False)  # a mapping is kept as a dict
    np_dtype: np.dtype = field(init=False, repr=False, compare=False)
    default_value: np.ndarray | None = field(init=False, repr=False, compare=False)

    def __new__(cls, *args: Any, **kwargs: Any) -> FieldSpec:
        """episodata's FieldSpec keywords (``key=``, ``low=``, ``high=``, ``optional=``) are refused (ArgumentError)."""
        refuse_options("FieldSpec", kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        role = role_of(self.role)
        if role == "info":
            raise SchemaError(
                f"field {self.name!r}: episodata's role 'info' is role='extra' here (each step's info; the reset's "
                "info is not stored)"
            )
        if role not in ROLES:
            raise SchemaError(f"field {self.name!r}: unknown role {self.role!r}; use one of {ROLES}")
        object.__setattr__(self, "role", role)
        validate_name(self.name)
        try:
            shape = tuple(int(s) for s in self.shape)
        except TypeError as exc:
            raise SchemaError(f"field {self.name!r}: shape must be a tuple of ints") from exc
        if any(s <= 0 for s in shape):
            raise SchemaError(f"field {self.name!r}: shape {shape} must be positive")
        object.__setattr__(self, "shape", shape)
        dt = normalize_dtype(self.dtype)
        if dt.kind == "U" and role != "meta":
            raise SchemaError(f"field {self.name!r}: str dtype is only allowed for meta fields")
        object.__setattr__(self, "np_dtype", dt)
        object.__setattr__(self, "dtype", "str" if dt.kind == "U" else dt.name)
        if self.storage not in ("auto", "table", "tensor"):
            raise SchemaError(f"field {self.name!r}: storage must be auto, table or tensor")
        if role == "meta" and self.storage == "tensor":
            raise SchemaError(f"meta field {self.name!r} cannot use tensor storage")
        if self.layout is not None and len(self.layout) != len(shape):
            raise SchemaError(f"field {self.name!r}: layout {self.layout!r} does not match shape {shape}")
        try:
            codecs.lossless_codecs(self.compression, 1)
        except ValueError as exc:
            raise SchemaError(f"field {self.name!r}: {exc}") from None
        self._check_codec(role)
        if self.chunk_rows is not None and self.chunk_rows <= 0:
            raise SchemaError(f"field {self.name!r}: chunk_rows must be positive")
        if not isinstance(self.required, bool):
            raise SchemaError(f"field {self.name!r}: required must be a bool")
        if self.required and role != "meta":
            raise SchemaError(f"field {self.name!r}: only meta fields can be required (step fields always are)")
        if not isinstance(self.derived, bool):
            raise SchemaError(f"field {self.name!r}: derived must be a bool")
        if self.derived and (self.storage == "tensor" or self.required):
            raise SchemaError(
                f"derived field {self.name!r}: derived columns live in the table (no storage='tensor') "
                "and are never required"
            )
        _check_constraints(self)
        value = None if self.default is None else _check_default(self)
        object.__setattr__(self, "default_value", value)
        if value is not None:
            object.__setattr__(self, "default", value.tolist())

    def _check_codec(self, role: str) -> None:
        """Validate ``codec``/``quality`` and store the effective quality (so the descriptor records it)."""
        if self.codec is None:
            if self.quality is not None:
                raise SchemaError(f"field {self.name!r}: quality is for a lossy codec (codec='jpeg', ...)")
            return
        if role == "meta" or self.derived or self.storage == "table":
            raise SchemaError(f"field {self.name!r}: codec {self.codec!r} is for step fields stored as tensors")
        if self.compression is not None:
            raise SchemaError(f"field {self.name!r}: codec {self.codec!r} and compression cannot both be set")
        try:
            quality = codecs.check_lossy(self.codec, self.quality, self.shape, self.layout, self.np_dtype)
        except ValueError as exc:
            raise SchemaError(f"field {self.name!r}: {exc}") from None
        object.__setattr__(self, "quality", quality)

    def on_fail_of(self, constraint: str) -> str:
        """What a violation of ``constraint`` (one of :data:`CONSTRAINTS`) does: reject, quarantine or warn."""
        if isinstance(self.on_fail, str):
            return self.on_fail
        return self.on_fail.get(constraint, "reject")

    @property
    def lossy(self) -> bool:
        """True when reads return decoded lossy frames (a lossy ``codec``), not the written values."""
        return self.codec in codecs.LOSSY

    @property
    def framed(self) -> bool:
        """True when ``codec`` is set: frames stored one image (or GOP) per inner chunk (``storage.frames``)."""
        return self.codec is not None

    @property
    def key(self) -> str:
        """Stable key across roles: ``role`` when the name is the role, else ``role/name``."""
        if self.role == "meta" or self.name == self.role:
            return self.name
        return f"{self.role}/{self.name}"

    @property
    def array_key(self) -> str:
        """The key the field's tensor arrays are stored under (``stored_as``, else its key)."""
        return self.stored_as or self.key

    @property
    def step_bytes(self) -> int:
        return self.np_dtype.itemsize * math.prod(self.shape) if self.np_dtype.kind != "U" else 0

    @property
    def in_tensor(self) -> bool:
        """True when the field lives in a Zarr tensor array rather than the table."""
        if self.role == "meta" or self.derived:
            return False
        if self.codec is not None:
            return True
        if self.storage == "auto":
            return self.step_bytes > TABLE_STEP_LIMIT
        return self.storage == "tensor"

    @property
    def channel_axis(self) -> int | None:
        """Axis (of the per-step shape) that statistics keep separate, if any."""
        if self.layout and "C" in self.layout:
            return self.layout.index("C")
        if len(self.shape) == 1:
            return 0
        return None

    @property
    def stat_channels(self) -> int:
        axis = self.channel_axis
        return 1 if axis is None else self.shape[axis]

    @property
    def rows_per_chunk(self) -> int:
        """Rows per stored chunk (image codecs: frames per shard file, each frame its own inner chunk; video
        codecs: frames per inner chunk, one GOP).

        Defaults: ~1 MiB of raw rows; compressed fields at most
        :data:`COMPRESSED_CHUNK_ROWS` rows, so a random segment decodes few
        rows it does not need; image codecs :data:`FRAMES_PER_SHARD` frames;
        video codecs :data:`codecs.VIDEO_GOP` frames.
        """
        if self.chunk_rows:
            return self.chunk_rows
        if self.codec in codecs.VIDEO:
            return codecs.VIDEO_GOP
        if self.codec is not None:
            return FRAMES_PER_SHARD
        rows = max(1, min(4096, (1 << 20) // max(1, self.step_bytes)))
        return min(rows, COMPRESSED_CHUNK_ROWS) if self.compression is not None else rows

    def arrow_type(self) -> pa.DataType:
        """Arrow type of this field's table column (list over time, then dims)."""
        if self.np_dtype.kind == "U":
            return pa.string()
        value = pa.from_numpy_dtype(storage_dtype(self.np_dtype))
        dims = len(self.shape) + (1 if self.np_dtype.kind == "c" else 0)
        typ = value
        for _ in range(dims):
            typ = pa.list_(typ)
        return typ if self.role == "meta" else pa.list_(typ)

    def to_json(self) -> dict[str, Any]:
        """The descriptor form; ``required``/``codec`` only when set, so 0.1.0 readers still open the dataset."""
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "role": self.role,
            "layout": self.layout,
            "storage": self.storage,
            "finite": self.finite,
            "chunk_rows": self.chunk_rows,
            "compression": self.compression,
            "description": self.description,
            **({"required": True} if self.required else {}),
            **({"default": _default_to_json(self.default_value)} if self.default_value is not None else {}),
            **({"derived": True} if self.derived else {}),
            **({"codec": self.codec, "quality": self.quality} if self.codec is not None else {}),
            **{k: getattr(self, k) for k in CONSTRAINTS if getattr(self, k) is not None},
            **({"on_fail": self.on_fail} if self.on_fail != "reject" else {}),
            **({"stored_as": self.stored_as} if self.stored_as is not None else {}),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FieldSpec:
        spec = {**obj, "shape": tuple(obj["shape"])}
        if "default" in obj:
            spec["default"] = _default_from_json(obj["default"], normalize_dtype(obj["dtype"]))
        return cls(**spec)


CONSTRAINTS = ("min", "max", "monotonic", "max_repeat")  # FieldSpec's quality constraints (core.constraints)
MONOTONIC = ("increasing", "nondecreasing")
ON_FAIL = ("reject", "quarantine", "warn")  # what a failed constraint or check does (core.quality's Check too)


def _check_constraints(f: FieldSpec) -> None:
    """Validate ``f``'s quality constraints (SchemaError naming the field); store min/max as floats."""
    given = [k for k in CONSTRAINTS if getattr(f, k) is not None]
    _check_on_fail(f, given)
    if not given:
        return
    if f.np_dtype.kind not in "biuf":
        raise SchemaError(f"field {f.name!r}: constraints {given} need a real numeric or bool dtype, not {f.dtype}")
    if f.role == "meta" and (f.monotonic is not None or f.max_repeat is not None):
        raise SchemaError(f"meta field {f.name!r}: monotonic and max_repeat are for step fields")
    for bound in ("min", "max"):
        value = getattr(f, bound)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating) or value != value:
            raise SchemaError(f"field {f.name!r}: {bound} must be a number, got {value!r}")
        object.__setattr__(f, bound, float(value))
    if f.min is not None and f.max is not None and f.min > f.max:
        raise SchemaError(f"field {f.name!r}: min {f.min} is above max {f.max}")
    if f.monotonic is not None and f.monotonic not in MONOTONIC:
        raise SchemaError(f"field {f.name!r}: monotonic must be one of {MONOTONIC}, got {f.monotonic!r}")
    k = f.max_repeat
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise SchemaError(f"field {f.name!r}: max_repeat must be an int >= 1, got {k!r}")
        object.__setattr__(f, "max_repeat", int(k))  # a NumPy integer would not serialize


def _check_on_fail(f: FieldSpec, given: list[str]) -> None:
    """Validate ``f.on_fail`` against the constraints ``given`` (SchemaError naming the field); a mapping is kept
    as a plain dict in :data:`CONSTRAINTS` order."""
    on_fail = f.on_fail
    if isinstance(on_fail, str):
        if on_fail not in ON_FAIL:
            raise SchemaError(f"field {f.name!r}: on_fail must be one of {ON_FAIL}, got {on_fail!r}")
        if on_fail != "reject" and not given:
            raise SchemaError(
                f"field {f.name!r}: on_fail={on_fail!r} applies to the field's constraints {CONSTRAINTS}, "
                "and it sets none"
            )
        return
    if not isinstance(on_fail, Mapping):
        raise SchemaError(
            f"field {f.name!r}: on_fail must be one of {ON_FAIL} or a mapping from constraint names to them, "
            f"got {type(on_fail).__name__}"
        )
    for name, action in on_fail.items():
        if name not in given:
            raise SchemaError(
                f"field {f.name!r}: on_fail names {name!r}, which is not a constraint the field sets {given}"
            )
        if action not in ON_FAIL:
            raise SchemaError(f"field {f.name!r}: on_fail[{name!r}] must be one of {ON_FAIL}, got {action!r}")
    kept = {k: on_fail[k] for k in CONSTRAINTS if k in on_fail}
    object.__setattr__(f, "on_fail", kept or "reject")


def _check_default(f: FieldSpec) -> np.ndarray:
    """``f.default`` as a read-only array of ``f``'s dtype and shape (write rules), or SchemaError."""
    if f.role == "meta":
        raise SchemaError(f"meta field {f.name!r}: default is for step fields (a missing meta value is NULL)")
    try:
        arr = np.asarray(f.default)
    except Exception as exc:
        raise SchemaError(f"field {f.name!r}: default is not array-like: {exc}") from exc
    dt = f.np_dtype
    if arr.shape != f.shape:
        raise SchemaError(f"field {f.name!r}: default has shape {arr.shape}, expected {f.shape}")
    if arr.dtype.kind not in _KIND_RANK or _KIND_RANK[arr.dtype.kind] > _KIND_RANK[dt.kind]:
        raise SchemaError(f"field {f.name!r}: default has dtype {arr.dtype}, expected {dt}")
    if dt.kind in "iu" and arr.size and arr.dtype.kind in "iu":
        info = np.iinfo(dt)
        if arr.min() < info.min or arr.max() > info.max:
            raise SchemaError(f"field {f.name!r}: default values do not fit {dt}")
    out = arr.astype(dt)
    if f.finite and dt.kind in "fc" and not np.isfinite(out).all():
        raise SchemaError(f"field {f.name!r}: default has NaN or infinity but the field is finite=True")
    out.flags.writeable = False
    return out


def _default_to_json(value: np.ndarray) -> Any:
    # JSON has no complex numbers: a trailing (re, im) axis, as in the table's storage.
    return np.stack([value.real, value.imag], axis=-1).tolist() if value.dtype.kind == "c" else value.tolist()


def _default_from_json(value: Any, dtype: np.dtype) -> np.ndarray:
    # JSON numbers are exact for their dtype; reading them as it keeps e.g. uint64 above 2**63 integral.
    if dtype.kind != "c":
        return np.asarray(value, dtype=dtype)
    pairs = np.asarray(value, dtype=dtype.type(0).real.dtype)
    return pairs[..., 0] + 1j * pairs[..., 1]


class DatasetSchema:
    """An ordered, validated collection of :class:`FieldSpec`.

    Contract: keys are unique, meta names do not collide with reserved table
    columns, and at least one observation, action and reward field exist.
    """

    def __init__(self, fields: Iterable[FieldSpec]) -> None:
        self.fields: tuple[FieldSpec, ...] = tuple(fields)
        for f in self.fields:
            if not isinstance(f, FieldSpec):
                raise SchemaError(f"schema entries must be FieldSpec, got {type(f).__name__}")
        keys = [f.key for f in self.fields]
        dup = {k for k in keys if keys.count(k) > 1}
        if dup:
            raise SchemaError(f"duplicate field keys: {sorted(dup)}")
        for f in self.fields:
            if f.role == "meta" and f.name in RESERVED_COLUMNS:
                raise SchemaError(
                    f"meta field name {f.name!r} is reserved (a column of the episode table); "
                    f"reserved names: {', '.join(sorted(RESERVED_COLUMNS))}"
                )
            if f.role == "meta" and "/" in f.name:
                raise SchemaError(f"meta field name {f.name!r} is nested ('/'): meta fields are one column each")
        for role in ("observation", "action", "reward"):
            if not any(f.role == role and not f.derived for f in self.fields):
                raise SchemaError(f"schema needs at least one {role} field")
        self._by_key = {f.key: f for f in self.fields}
        self._by_role = {r: tuple(f for f in self.fields if f.role == r) for r in ROLES}

    def __iter__(self):
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __getitem__(self, key: str) -> FieldSpec:
        try:
            return self._by_key[key]
        except KeyError:
            raise KeyError(f"no field with key {key!r}; keys: {list(self._by_key)}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DatasetSchema) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        inner = ", ".join(f"{f.key}:{f.dtype}{list(f.shape)}" for f in self.fields)
        return f"DatasetSchema({inner})"

    def role_fields(self, role: str) -> tuple[FieldSpec, ...]:
        return self._by_role.get(role, ())

    def unwrapped(self, role: str) -> bool:
        """A role built from exactly one field reads as that array, not a mapping."""
        return len(self.role_fields(role)) == 1

    @property
    def step_fields(self) -> tuple[FieldSpec, ...]:
        return tuple(f for f in self.fields if f.role != "meta")

    @property
    def meta_fields(self) -> tuple[FieldSpec, ...]:
        return self.role_fields("meta")

    @property
    def tensor_fields(self) -> tuple[FieldSpec, ...]:
        return tuple(f for f in self.fields if f.in_tensor)

    @property
    def table_step_fields(self) -> tuple[FieldSpec, ...]:
        return tuple(f for f in self.step_fields if not f.in_tensor)

    @property
    def derived_fields(self) -> tuple[FieldSpec, ...]:
        """The derived columns (``FieldSpec(derived=True)``), in declaration order."""
        return tuple(f for f in self.fields if f.derived)

    @property
    def base(self) -> DatasetSchema:
        """The schema without derived columns: what episodes are written with."""
        return DatasetSchema(f for f in self.fields if not f.derived) if self.derived_fields else self

    def with_derived(self, derived: Iterable[FieldSpec]) -> DatasetSchema:
        """This schema plus the derived columns ``derived`` (none: this schema itself)."""
        extra = tuple(derived)
        return DatasetSchema([*self.fields, *extra]) if extra else self

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.fields]

    @classmethod
    def from_json(cls, obj: Sequence[Mapping[str, Any]]) -> DatasetSchema:
        return cls(FieldSpec.from_json(o) for o in obj)

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def infer(cls, example_episode: Mapping[str, Any], alignment: str | None = None) -> DatasetSchema:
        """episodata's spelling of :func:`infer_schema`, its episode keys too (:func:`.spellings.seed_episode`)."""
        return infer_schema(seed_episode(example_episode, alignment))

    # episodata's other schema methods: refused with what to write instead (:mod:`.spellings`)
    field, field_keys, resolve_fields = (Refused("DatasetSchema") for _ in range(3))
    validate_fields, to_dict, from_dict = (Refused("DatasetSchema") for _ in range(3))


def flatten_role(value: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into ``/``-joined keys; leaves are kept as is."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten_role(v, f"{prefix}{k}/"))
        return out
    return {prefix[:-1]: value}


def _infer_spec(name: str, value: Any, role: str, per_step: bool) -> FieldSpec:
    arr = np.asarray(value)
    if arr.dtype.kind in "US":
        return FieldSpec(name, (), "str", role=role)
    if arr.dtype == np.float64 and role == "reward":
        arr = arr.astype(np.float32)
    shape = arr.shape[1:] if per_step else arr.shape
    return FieldSpec(name, shape, arr.dtype, role=role)


def infer_schema(episode: Mapping[str, Any]) -> DatasetSchema:
    """Infer a schema from one episode in the dict form of :meth:`Dataset.from_episodes`.

    ``observations``/``actions``/``rewards`` (and optional ``extras``) are arrays
    with a leading time axis or (nested) dicts of them; ``meta`` is a dict of
    per-episode values. A plain array becomes a field named after its role.
    """
    fields: list[FieldSpec] = []
    for key, role in EPISODE_KEYS.items():
        if key not in episode:
            continue
        for name, value in flatten_role(episode[key]).items():
            fields.append(_infer_spec(name or role, value, role, per_step=True))
    for name, value in (episode.get("meta") or {}).items():
        fields.append(_infer_spec(name, value, "meta", per_step=False))
    return DatasetSchema(fields)


def schema_from_gym_spaces(
    observation_space: Any,
    action_space: Any,
    reward_dtype: Any = "float32",
    meta: Sequence[FieldSpec] = (),
) -> DatasetSchema:
    """Build a schema from Gymnasium spaces (Box, Discrete, MultiDiscrete, MultiBinary, Dict).

    Dict spaces (nested too) become ``/``-keyed fields of the role; any other
    space becomes one field named after its role.
    """
    fields = _space_fields(observation_space, "observation", "observation")
    fields += _space_fields(action_space, "action", "action")
    fields.append(FieldSpec("reward", (), reward_dtype, role="reward"))
    return DatasetSchema([*fields, *meta])


def _space_fields(space: Any, name: str, role: str) -> list[FieldSpec]:
    kind = type(space).__name__
    if kind == "Dict":
        out: list[FieldSpec] = []
        for k, sub in space.spaces.items():
            out += _space_fields(sub, k if name == role else f"{name}/{k}", role)
        return out
    if kind == "Discrete":
        return [FieldSpec(name, (), np.int64, role=role)]
    if kind in ("Box", "MultiDiscrete", "MultiBinary"):
        layout = None
        shape = tuple(space.shape)
        if kind == "Box" and len(shape) == 3 and np.dtype(space.dtype) == np.uint8:
            layout = "HWC" if shape[-1] in (1, 3, 4) else "CHW"
        return [FieldSpec(name, shape, space.dtype, role=role, layout=layout)]
    raise SchemaError(f"unsupported gym space {kind} for {role} {name!r}")
