"""Storage faults told apart from damaged data, in one place.

deltalake, TensorStore, botocore, fsspec and the OS each report a full disk, a read-only mount, a refused
permission or an unreachable endpoint in their own words (``RESOURCE_EXHAUSTED``, ``DeltaError: Failed to parse
parquet ... No space left on device``, ``EndpointConnectionError``, ...). :func:`storage_fault` reads an exception
(and its chain) and returns the :class:`~episodelake.errors.StorageError` a user should see, or ``None`` when the
exception is not a storage fault (then the caller keeps its own classification, e.g. corruption).
"""

from __future__ import annotations

import errno as _errno
import re
from collections.abc import Iterator

from .errors import EpisodeLakeError, StorageError

# (errno, plain words, patterns matched case-insensitively against the exception's text and type name).
_FAULTS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (_errno.ENOSPC, "no space left on the device", ("no space left", "enospc", "disk quota exceeded")),
    (_errno.EROFS, "the file system is read-only", ("read-only file system", "erofs")),
    (_errno.EACCES, "permission denied", ("permission denied", "permission_denied", "access denied", "accessdenied",
                                         "eacces", "403 forbidden", "status code: 403", "http status 403")),
    (_errno.ETIMEDOUT, "the storage did not answer in time", ("deadline_exceeded", "timed out", "timeout",
                                                              "readtimeout", "connecttimeout")),
    (_errno.ECONNREFUSED, "the storage endpoint is unreachable", (
        "connection refused", "endpointconnectionerror", "could not connect", "failed to connect",
        "connection reset", "connection aborted", "error trying to connect", "dns error", "unavailable",
        "service unavailable", "connection closed", "broken pipe", "connecterror", "tcp connect",
    )),
    (_errno.EIO, "the storage kept failing", ("retries exhausted", "max retries", "slowdown", "slow down", "503 service", "status code: 503")),
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RESOURCE_EXHAUSTED = "resource_exhausted"


def clean_text(text: str) -> str:
    """``text`` without terminal colour codes and with TensorStore's NUL path separators shown as ``/``."""
    return _ANSI.sub("", text).replace("\x00", "/")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _classify(exc: BaseException) -> tuple[int, str] | None:
    for e in _chain(exc):
        if isinstance(e, StorageError):
            return (e.errno or _errno.EIO), e.message
        code = getattr(e, "errno", None)
        if isinstance(e, OSError) and code in (_errno.ENOSPC, _errno.EROFS, _errno.EACCES, _errno.EPERM,
                                                _errno.ETIMEDOUT, _errno.ECONNREFUSED, _errno.EDQUOT):
            words = {_errno.ENOSPC: "no space left on the device", _errno.EDQUOT: "no space left on the device",
                     _errno.EROFS: "the file system is read-only", _errno.ETIMEDOUT: "the storage did not answer in time",
                     _errno.ECONNREFUSED: "the storage endpoint is unreachable"}
            return (_errno.ENOSPC if code == _errno.EDQUOT else code), words.get(code, "permission denied")
    for e in _chain(exc):
        if isinstance(e, EpisodeLakeError):
            return None
        text = f"{type(e).__name__} {e}".lower()
        for code, words, patterns in _FAULTS:
            if any(p in text for p in patterns):
                return code, words
        if _RESOURCE_EXHAUSTED in text:  # TensorStore's name for a full disk when the OS text is missing
            return _errno.ENOSPC, "no space left on the device"
    return None


def storage_fault(exc: BaseException, *, dataset: str = "", object: str = "", doing: str = "") -> StorageError | None:
    """The :class:`StorageError` ``exc`` stands for, or ``None`` when it is not a storage fault.

    The message names the dataset, the object and what was being done, says the cause in plain words, and
    ends with the original text (colour codes and NUL separators removed). The caller chains ``exc``:
    ``raise err from exc``.
    """
    found = _classify(exc)
    if found is None:
        return None
    code, words = found
    if isinstance(exc, StorageError):
        return exc
    where = " ".join(p for p in (f"dataset {dataset}" if dataset else "", f"object {object}" if object else "") if p)
    head = f"{doing} failed" if doing else "storage failed"
    detail = clean_text(str(exc)).strip().splitlines()
    tail = f" ({type(exc).__name__}: {detail[0][:300]})" if detail else f" ({type(exc).__name__})"
    message = f"{head}{' at ' + where if where else ''}: {words}{tail}"
    return StorageError(message, errno=code, dataset=dataset, object=object)
