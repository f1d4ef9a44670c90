"""Arrays that grow at their end in amortized ``O(new rows)``: what lets a newer snapshot extend an older one's.

:func:`append_rows` returns ``old`` followed by ``new`` as one array. The
result is a prefix view of a larger buffer with spare room; appending to
that view again writes into the room instead of copying everything. Only
the view that ends where the buffer's rows end may write there, so a view
handed out earlier (an older snapshot's column) never sees a later append,
and two appends to the same view cannot overwrite each other (the second
one copies).
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

GROWTH = 2  # a new buffer holds this many times the rows it starts with

_ENDS: dict[int, int] = {}  # id(buffer) -> rows written in it
_LOCK = threading.Lock()


def append_rows(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``np.concatenate([old, new])`` (same dtype as ``old``), in place when ``old`` ends a growth buffer."""
    n, m = len(old), len(new)
    buf = old.base
    with _LOCK:
        if (
            isinstance(buf, np.ndarray)
            and _ENDS.get(id(buf)) == n
            and n + m <= len(buf)
            and buf.dtype == old.dtype
            and buf.shape[1:] == old.shape[1:]
            and old.__array_interface__["data"][0] == buf.__array_interface__["data"][0]
        ):
            buf[n : n + m] = new
            _ENDS[id(buf)] = n + m
            return buf[: n + m]
    buf = np.empty((max(GROWTH * (n + m), 16), *old.shape[1:]), old.dtype)
    buf[:n] = old
    buf[n : n + m] = new
    with _LOCK:
        _ENDS[id(buf)] = n + m
    weakref.finalize(buf, _forget, id(buf))
    return buf[: n + m]


def _forget(key: int) -> None:
    with _LOCK:
        _ENDS.pop(key, None)
