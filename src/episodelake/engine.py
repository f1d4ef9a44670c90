"""Which process may run TensorStore.

TensorStore aborts a process that uses it after ``fork()`` from a process that
did (its threads do not survive the fork). Every module that starts a
TensorStore operation records the process here first, and a process forked
from it reads through plain file and fsspec reads instead.
"""

from __future__ import annotations

import os

from .errors import ForkedProcessError

_ENGINE_PID: int | None = None  # process that started TensorStore


def engine_usable() -> bool:
    """False in a process forked from one that used TensorStore (TensorStore would abort it)."""
    return _ENGINE_PID is None or os.getpid() == _ENGINE_PID


def start_engine(where: str) -> None:
    """Record that this process runs TensorStore operations; refuse clearly where TensorStore would abort."""
    global _ENGINE_PID
    if not engine_usable():
        raise ForkedProcessError(
            f"{where}: TensorStore cannot run in a process forked from one that used it; "
            "write from a spawned process (multiprocessing context 'spawn')"
        )
    _ENGINE_PID = os.getpid()
