"""Vacuum cannot destroy committed data, whatever runs concurrently (docs/reliability.md, "Vacuum and compaction").

* A file a commit in flight has written (not yet in the log) survives any
  vacuum, at the shortest retention allowed and with the override; the commit
  then lands and every episode reads back as written.
* Data no version references goes only once older than the floor (1 h).
* A retention below 1 h needs ``break_old_versions=True``.
* Compactions, deletes and vacuums raced in real processes lose nothing (slow).

Expected episodes come from the writer's own record of what it wrote (ground
truth), never from the library.
"""

from __future__ import annotations

import os


def age_files(root: str, hours: float) -> None:
    """Move the modification time of every file under ``root`` back by ``hours``, as if written that long ago."""
    shift = hours * 3600.0
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            os.utime(path, (st.st_atime - shift, st.st_mtime - shift))
