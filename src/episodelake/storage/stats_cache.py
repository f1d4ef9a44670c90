"""The statistics cache: each local table file's statistics columns, decoded once and kept beside the table.

A view's first ``stats()`` at a million episodes spent most of its time
decoding the statistics lists of the Parquet files holding the view (and
faulting in the fresh memory they decode into). Table files are immutable
and uniquely named, so their decoded columns never go stale: the first read
of a file writes them to ``cache/stats/<file>.arrow`` (uncompressed Arrow IPC,
:func:`~episodelake.storage.layout.stats_cache_parts`), and every later read,
in any process, maps that file instead: no decode, no copy, and pages the
kernel may reclaim.

The cache is never the truth. An entry names the byte size of the table file
it was decoded from and holds its row count, and one that is missing,
truncated, for another file or unreadable is ignored (decoded again and
rewritten). Entries are written to a temporary sibling and renamed, so a
crash leaves no partial entry under the entry's name; :func:`prune` (run by
every table vacuum) removes the entries of removed files and stale temporary
files. ``EPISODELAKE_STATS_CACHE=0`` turns the cache off; a dataset directory
that cannot be written to simply keeps none.
"""

from __future__ import annotations

import contextlib
import os
import time

import pyarrow as pa

from . import layout
from .location import Location

SOURCE_BYTES = b"episodelake.source_bytes"  # schema metadata: the byte size of the table file decoded
ROWS = b"episodelake.rows"


def enabled(loc: Location) -> bool:
    """Whether reads of ``loc``'s table use the cache: local datasets, unless ``EPISODELAKE_STATS_CACHE=0``."""
    return loc.is_local and os.environ.get("EPISODELAKE_STATS_CACHE", "1") != "0"


def source_path(loc: Location, file: str) -> str:
    """The table file ``file`` (its path relative to the table) on local disk."""
    return loc.child(*layout.table_parts(file))


def load(loc: Location, file: str) -> pa.Table | None:
    """The cached columns of table file ``file``, memory-mapped; None when there is no valid entry.

    Valid: complete, decoded from a file of the table file's current size,
    holding the row count it records, and structurally sound (offsets in
    bounds: Arrow's full validation).
    """
    path = loc.child(*layout.stats_cache_parts(file))
    try:
        size = os.stat(source_path(loc, file)).st_size
        table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        meta = table.schema.metadata or {}
        if int(meta.get(SOURCE_BYTES, b"-1")) != size or int(meta.get(ROWS, b"-1")) != table.num_rows:
            return None
        table.validate(full=True)
    except (OSError, ValueError, pa.ArrowException):
        return None
    return table.replace_schema_metadata(None)


def store(loc: Location, file: str, table: pa.Table) -> pa.Table:
    """Keep ``table`` (every row of table file ``file``) as its entry; the entry, mapped (``table`` when not written).

    A failure to write (a read-only directory, a full disk) leaves no entry and is not an error.
    """
    path = loc.child(*layout.stats_cache_parts(file))
    temp = layout.temp_name(path)
    try:
        size = os.stat(source_path(loc, file)).st_size
        os.makedirs(os.path.dirname(path), exist_ok=True)
        meta = {SOURCE_BYTES: str(size).encode(), ROWS: str(table.num_rows).encode()}
        tagged = table.replace_schema_metadata(meta)
        with pa.OSFile(temp, "wb") as sink, pa.ipc.new_file(sink, tagged.schema) as writer:
            writer.write_table(tagged, max_chunksize=max(1, table.num_rows))
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(temp)
        return table
    mapped = load(loc, file)
    return table if mapped is None else mapped


def prune(loc: Location, older_than_s: float) -> list[str]:
    """Remove the entries whose table file is gone, and temporary files older than ``older_than_s``; their paths."""
    root = loc.child(*layout.stats_cache_parts())
    if not loc.is_local or not os.path.isdir(root):
        return []
    table = loc.child(*layout.table_parts())
    cutoff = time.time() - older_than_s
    removed = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if name.endswith(layout.TEMP_SUFFIX):
                with contextlib.suppress(OSError):
                    gone = os.stat(path).st_mtime < cutoff
                    if gone:
                        os.remove(path)
                        removed.append(path)
            elif name.endswith(layout.STATS_CACHE_SUFFIX):
                if not os.path.exists(os.path.join(table, rel[: -len(layout.STATS_CACHE_SUFFIX)])):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)
                        removed.append(path)
    return sorted(removed)
