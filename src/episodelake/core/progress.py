"""Progress bars for long operations (import, export, copy, validate, vacuum, compact).

Every long operation takes ``progress=``: ``None`` (default) shows a tqdm bar
only when the output stream is a terminal, ``True`` always shows one, ``False``
never does. Without tqdm installed (extra ``progress``) nothing is shown, so
library code can call these helpers unconditionally.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

T = TypeVar("T")


def enabled(progress: bool | None, file: IO[str] | None = None) -> bool:
    """Whether a bar should be drawn for ``progress`` on ``file`` (default stderr)."""
    if progress is False:
        return False
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    if progress is True:
        return True
    stream = file if file is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class _NullBar:
    """Stands in for a tqdm bar when progress is off: every call is a no-op."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _NullBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def bar(
    total: int | None = None,
    desc: str | None = None,
    progress: bool | None = None,
    unit: str = "it",
    file: IO[str] | None = None,
) -> Any:
    """A context-managed bar with ``update(n)``: tqdm when enabled, else a no-op object."""
    if not enabled(progress, file):
        return _NullBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=file if file is not None else sys.stderr)


def track(
    iterable: Iterable[T],
    total: int | None = None,
    desc: str | None = None,
    progress: bool | None = None,
    unit: str = "it",
    file: IO[str] | None = None,
) -> Iterator[T]:
    """Iterate ``iterable``, advancing a bar per item when progress is enabled."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with bar(total, desc, progress, unit, file) as b:
        for item in iterable:
            yield item
            b.update(1)
