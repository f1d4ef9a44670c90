"""Storage faults told apart from damaged data, in one place.

deltalake, TensorStore, botocore, fsspec and the OS each report a full disk, a read-only mount, a refused
permission or an unreachable endpoint in their own words (``RESOURCE_EXHAUSTED``, ``DeltaError: Failed to parse
parquet ... No space left on device``, ``EndpointConnectionError``, ...). :func:`storage_fault` reads an exception
(and its chain) and returns the :class:`~episodelake.errors.StorageError` a user should see, or ``None`` when the
exception is not a storage fault (then the caller keeps its own classification, e.g. corruption).
"""

from __future__ import annotations

import contextlib
import errno as _errno
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import IO

from ..core.errors import EpisodeLakeError, StorageError

NO_CREDENTIALS = "no credentials were found for the storage"
# (errno, plain words, patterns matched case-insensitively against the exception's text and type name).
_FAULTS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (_errno.ENOSPC, "no space left on the device", ("no space left", "enospc", "disk quota exceeded")),
    (_errno.EROFS, "the file system is read-only", ("read-only file system", "erofs")),
    (
        _errno.EACCES,
        NO_CREDENTIALS,
        (
            "unable to locate credentials",
            "nocredentialserror",
            "partialcredentialserror",
            "missing credentials",
            "no credentials",
        ),
    ),
    (
        _errno.EACCES,
        "permission denied",
        (
            "permission denied",
            "permission_denied",
            "access denied",
            "accessdenied",
            "eacces",
            "403 forbidden",
            "status code: 403",
            "http status 403",
        ),
    ),
    (
        _errno.ETIMEDOUT,
        "the storage did not answer in time",
        ("deadline_exceeded", "timed out", "timeout", "readtimeout", "connecttimeout"),
    ),
    (
        _errno.ECONNREFUSED,
        "the storage endpoint is unreachable",
        (
            "connection refused",
            "endpointconnectionerror",
            "could not connect",
            "failed to connect",
            "connection reset",
            "connection aborted",
            "error trying to connect",
            "dns error",
            "unavailable",
            "service unavailable",
            "connection closed",
            "broken pipe",
            "connecterror",
            "tcp connect",
        ),
    ),
    (
        _errno.EIO,
        "the storage kept failing",
        ("retries exhausted", "max retries", "slowdown", "slow down", "503 service", "status code: 503"),
    ),
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_WORDS = {
    _errno.ENOSPC: "no space left on the device",
    _errno.EDQUOT: "no space left on the device",
    _errno.EROFS: "the file system is read-only",
    _errno.EACCES: "permission denied",
    _errno.EPERM: "permission denied",
    _errno.ETIMEDOUT: "the storage did not answer in time",
    _errno.ECONNREFUSED: "the storage endpoint is unreachable",
}
# The OS error number as TensorStore (os_error_code='28'), Rust (os error 28; Os { code: 28, ...) and Python
# ([Errno 28]) print it.
_OS_CODE = re.compile(r"os_error_code='(\d+)'|os error (\d+)\b|os \{ code: (\d+),|\[errno (\d+)\]")
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
        if isinstance(e, OSError) and code in _WORDS:
            return _known(code)
    for e in _chain(exc):
        if isinstance(e, EpisodeLakeError):
            return None
        text = f"{type(e).__name__} {e}".lower()
        for match in _OS_CODE.finditer(text):  # the OS's own number beats the library's category name
            number = int(next(g for g in match.groups() if g))
            if number in _WORDS:
                return _known(number)
        for code, words, patterns in _FAULTS:
            if any(p in text for p in patterns):
                return code, words
        if _RESOURCE_EXHAUSTED in text:  # TensorStore's name for a full disk when the OS text is missing
            return _errno.ENOSPC, "no space left on the device"
    return None


def _known(code: int) -> tuple[int, str]:
    return (_errno.ENOSPC if code == _errno.EDQUOT else code), _WORDS[code]


def storage_fault(
    exc: BaseException, *, dataset: str = "", object: str = "", doing: str = "", endpoint: str = ""
) -> StorageError | None:
    """The :class:`StorageError` ``exc`` stands for, or ``None`` when it is not a storage fault.

    The message names the dataset, the object, the object store's ``endpoint`` (when given) and what was
    being done, says the cause in plain words, and ends with the original text (colour codes and NUL
    separators removed). The caller chains ``exc``: ``raise err from exc``.
    """
    found = _classify(exc)
    if found is None:
        return None
    code, words = found
    if isinstance(exc, StorageError):
        return exc
    parts = (f"dataset {dataset}" if dataset else "", f"object {object}" if object else "")
    where = " ".join(p for p in (*parts, f"(endpoint {endpoint})" if endpoint else "") if p)
    head = f"{doing} failed" if doing else "storage failed"
    detail = clean_text(str(exc)).strip().splitlines()
    tail = f" ({type(exc).__name__}: {detail[0][:300]})" if detail else f" ({type(exc).__name__})"
    message = f"{head}{' at ' + where if where else ''}: {words}{tail}"
    return StorageError(message, errno=code, dataset=dataset, object=object)


# Rust panic reports (deltalake's tokio workers print one when a write fails mid-file, e.g. on a full disk:
# "thread 'tokio-rt-worker' (N) panicked at .../buffered.rs:369:41:" / "Already shut down" / backtrace / note).
_PANIC_HEAD = re.compile(r"^thread '[^']*'( \(\d+\))? panicked at ")
_FRAME = re.compile(r"^\s+(\d+: |at )")
_capture_lock = threading.Lock()
_capture_depth = 0
_capture_failed = False
_capture_saved_fd = -1
_capture_file: IO[bytes] | None = None
_capture_pid = -1


def without_panics(text: str) -> str:
    """``text`` without Rust panic reports (header, message, backtrace, ``note:`` line)."""
    out: list[str] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if not _PANIC_HEAD.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        if out and not out[-1].strip():
            out.pop()  # the blank line Rust prints before the report
        i += 1
        while i < len(lines) and not lines[i].startswith(("note: ", "stack backtrace:")):
            i += 1  # the panic message
        if i < len(lines) and lines[i].startswith("stack backtrace:"):
            i += 1
            while i < len(lines) and _FRAME.match(lines[i]):
                i += 1
        if i < len(lines) and lines[i].startswith("note: "):
            i += 1
    return "".join(out)


@contextlib.contextmanager
def quiet_panics() -> Iterator[None]:
    """Run the block with this process's stderr (file descriptor 2) collected, then written out after it.

    When the block (or one running at the same time in another thread) raised, Rust panic reports are
    dropped from what was collected: deltalake's runtime prints one when a storage fault ends a write
    (the caller raises the fault as a :class:`StorageError`, and the panic text would only add noise).
    Everything else written to stderr meanwhile, by any thread, comes out unchanged once the last block
    ends. Without a file descriptor 2 the block just runs.
    """
    started = _capture_start()
    try:
        yield
    except BaseException:
        global _capture_failed
        _capture_failed = True
        raise
    finally:
        if started:
            _capture_end()


def _capture_start() -> bool:
    global _capture_depth, _capture_saved_fd, _capture_file, _capture_failed, _capture_pid
    with _capture_lock:
        if _capture_depth == 0:
            try:
                saved = os.dup(2)
            except OSError:
                return False
            if sys.stderr is not None:
                sys.stderr.flush()
            if _capture_file is None or _capture_pid != os.getpid():  # a forked child shares its parent's offset
                # one file per process, emptied after each block (a commit pays no file creation)
                _capture_file = tempfile.TemporaryFile(buffering=0)  # noqa: SIM115  # open while the process lives
                _capture_pid = os.getpid()
            os.dup2(_capture_file.fileno(), 2)
            _capture_saved_fd, _capture_failed = saved, False
        _capture_depth += 1
        return True


def _capture_end() -> None:
    global _capture_depth
    with _capture_lock:
        _capture_depth -= 1
        if _capture_depth or _capture_file is None:
            return
        if sys.stderr is not None:
            sys.stderr.flush()
        os.dup2(_capture_saved_fd, 2)
        os.close(_capture_saved_fd)
        fd = _capture_file.fileno()
        size = os.lseek(fd, 0, os.SEEK_END)
        data = os.pread(fd, size, 0) if size else b""
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        failed = _capture_failed
    if failed:
        data = without_panics(data.decode(errors="replace")).encode()
    while data:
        data = data[os.write(2, data) :]
