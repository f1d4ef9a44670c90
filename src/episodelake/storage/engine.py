"""Which process may run TensorStore, and how long its HTTP requests may stall.

TensorStore aborts a process that uses it after ``fork()`` from a process that
did (its threads do not survive the fork). Every module that starts a
TensorStore operation records the process here first, and a process forked
from it reads through plain file and fsspec reads instead.

TensorStore's only per-request time limit is libcurl's low-speed limit, read
once per process from the environment (:func:`http_stall_timeout`); it has no
per-dataset setting. :func:`wait` bounds a whole operation instead.
"""

from __future__ import annotations

import os
from typing import Any

import tensorstore as ts

from ..core.errors import ForkedProcessError

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


STALL_ENV = "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS"
STALL_BYTES_ENV = "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES"


def http_stall_timeout(seconds: float) -> None:
    """Make TensorStore abort (and retry) an HTTP transfer that receives nothing for ``seconds``.

    libcurl's low-speed limit, read by TensorStore from the environment when
    it makes its first request: process-wide, so the first object-store
    location wins, and a value the user already set is kept.
    """
    os.environ.setdefault(STALL_ENV, str(max(1, round(seconds))))
    os.environ.setdefault(STALL_BYTES_ENV, "1")


def wait(future: ts.Future, seconds: float) -> Any:
    """``future``'s result, waiting at most ``seconds``; then cancel it and raise ``TimeoutError``.

    TensorStore errors are raised as they come (``ValueError``); the caller
    turns both into a :class:`~episodelake.errors.StorageError` where they are storage faults.
    """
    try:
        return future.result(timeout=seconds)
    except TimeoutError as exc:
        future.cancel()
        raise TimeoutError(f"no answer within {seconds:g} s") from exc
