"""The on-disk layout of a dataset root: the one module that spells its names.

::

    episodelake.json                      descriptor (written last: marks a complete dataset)
    episodes/                             the Delta episode table
        _delta_log/                       its commit log (JSON entries, Parquet checkpoints)
        _episodelake_compact.lock         compaction lock (local disks)
        [<partition>=<value>/]*.parquet   data files
    derived/                              the Delta table of derived columns (one row per episode ever updated)
    tensors/<writer>/<key>/               a writer's single array (local datasets, 0.1.0 object stores)
    tensors/<writer>/<commit>/<key>/      one commit's array (object stores; commit = 1, 2, ...)
        zarr.json                         Zarr v3 array metadata
        c/<chunk>/0[/0...]                chunk (or shard) files, chunked along time only
    cache/                                decoded table columns, memory-mapped by later reads (table_cache.py)
        stats/<file>.arrow                a table file's statistics columns
        keys/{visible,quarantined}.arrow  a version's order keys (created_at, episode_id) in episode order
    *.tmp                                 a small file being replaced atomically

Every function returns path parts relative to the root, for
:meth:`~episodelake.location.Location.child` and friends. A field key may hold
``/`` (``observation/camera``): it becomes nested directories.
"""

from __future__ import annotations

import uuid

DESCRIPTOR = "episodelake.json"
TABLE = "episodes"
LOG = "_delta_log"
LOG_ENTRY_PATTERN = "*.json"  # one commit entry per version
CHECKPOINT_PATTERN = "*.checkpoint*.parquet"
DATA_SUFFIX = ".parquet"
COMPACT_LOCK = "_episodelake_compact.lock"  # underscore: Delta's vacuum and readers ignore it
TENSORS = "tensors"
DERIVED = "derived"
ARRAY_METADATA = "zarr.json"
CHUNKS = "c"
TEMP_SUFFIX = ".tmp"
CACHE = ("cache",)
CACHE_SUFFIX = ".arrow"
TENSOR_ROOT = f"{TENSORS}/<writer>/<key>"  # as recorded in the descriptor's ``tensor_layout``


def table_parts(*rel: str) -> tuple[str, ...]:
    """The episode table directory, or a path relative to it (a data file as the log names it)."""
    return (TABLE, *rel)


def log_parts() -> tuple[str, ...]:
    """The Delta commit log directory."""
    return (TABLE, LOG)


def log_entry_parts(version: int) -> tuple[str, ...]:
    """The Delta commit entry of ``version`` (every commit writes one)."""
    return (*log_parts(), f"{version:020d}.json")


def last_checkpoint_parts() -> tuple[str, ...]:
    """Delta's pointer to the latest checkpoint (JSON with its ``version``)."""
    return (*log_parts(), "_last_checkpoint")


def derived_parts() -> tuple[str, ...]:
    """The Delta table of derived columns (``ds.columns.update``)."""
    return (DERIVED,)


def compact_lock_parts() -> tuple[str, ...]:
    return (TABLE, COMPACT_LOCK)


def writer_parts(writer: str, commit: int = 0) -> tuple[str, ...]:
    """A writer's tensor directory, or (``commit`` > 0) one of its commit directories."""
    return (TENSORS, writer) if commit == 0 else (TENSORS, writer, str(commit))


def array_parts(writer: str, key: str, commit: int = 0) -> tuple[str, ...]:
    """A writer's array of field ``key``: its single array (``commit`` 0) or one commit's array."""
    return (*writer_parts(writer, commit), *key.split("/"))


def is_commit_dir(name: str) -> bool:
    """Whether an entry of a writer directory is a commit directory (field keys start with a role name)."""
    return name.isdigit()


def metadata_parts(array: tuple[str, ...]) -> tuple[str, ...]:
    """The Zarr metadata file of the array at ``array`` (parts)."""
    return (*array, ARRAY_METADATA)


def chunk_parts(chunk: int, ndim: int) -> tuple[str, ...]:
    """A chunk (shard) file relative to its array, for an array chunked along time only (``ndim`` inner dims)."""
    return (CHUNKS, str(chunk), *("0",) * ndim)


def stats_cache_parts(file: str = "") -> tuple[str, ...]:
    """The statistics cache directory, or the entry of a table file (its path relative to the table, as logged)."""
    if not file:
        return (*CACHE, "stats")
    *dirs, name = file.split("/")
    return (*CACHE, "stats", *dirs, name + CACHE_SUFFIX)


def keys_cache_parts(quarantined: bool) -> tuple[str, ...]:
    """The order-keys entry of snapshots of quarantined episodes, or of the others."""
    return (*CACHE, "keys", ("quarantined" if quarantined else "visible") + CACHE_SUFFIX)


def temp_name(name: str) -> str:
    """A unique temporary sibling of ``name`` (renamed over it once complete)."""
    return f"{name}.{uuid.uuid4().hex}{TEMP_SUFFIX}"


def temp_pattern() -> str:
    """Glob pattern of temporary files at the root."""
    return f"*{TEMP_SUFFIX}"
