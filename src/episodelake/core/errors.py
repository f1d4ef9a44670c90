"""Exception types. Every error a user can trigger derives from EpisodeLakeError.

Each class also derives from the builtin exception it refines (``ValueError``,
``FileExistsError``, ...), so handlers written for the builtin keep working.
docs/errors.md lists when each one is raised.
"""


class EpisodeLakeError(Exception):
    """Base class of all episodelake errors."""


class SchemaError(EpisodeLakeError, ValueError):
    """A schema or field specification is invalid."""


class ValidationError(EpisodeLakeError, ValueError):
    """Data offered for writing failed a check (shape, dtype, range, flags, meta); nothing was written.

    :class:`ArgumentError`, the error of a wrong call argument, is a subclass,
    so ``except ValidationError`` catches both.
    """


class QualityError(ValidationError):
    """An episode failed a quality gate at commit: a ``FieldSpec`` constraint or a ``reject`` check; nothing of it
    was stored.

    The message names the episode, the field or check and the first failing step; ``check`` (the constraint,
    ``"<field key>: min"``, or the check's name), ``episode`` (the episode's index in the call that finished
    it) and ``step`` (None for an episode-level check or a meta field) say the same for code.
    """

    def __init__(self, message: str, check: str = "", episode: int = 0, step: int | None = None) -> None:
        super().__init__(message)
        self.check, self.episode, self.step = check, episode, step


class ArgumentError(ValidationError):
    """A call's argument is wrong (a non-positive length, an unknown option, a malformed state); not data."""


class EpisodeStateError(EpisodeLakeError, RuntimeError):
    """A writer was used after it finished, or out of order."""


class LocationError(EpisodeLakeError, ValueError):
    """A path/URL or its storage options cannot be resolved."""


class DatasetNotFoundError(EpisodeLakeError, FileNotFoundError):
    """No episodelake dataset exists at the given location."""


class DatasetExistsError(EpisodeLakeError, FileExistsError):
    """A dataset (or export) already exists where a new one was to be created; pass ``overwrite=True``."""


class ReadOnlyError(EpisodeLakeError, PermissionError):
    """A write was attempted on a dataset opened read-only."""


class CorruptionError(EpisodeLakeError, IOError):
    """Stored data disagrees with its references or checksums."""


class FieldKeyError(EpisodeLakeError, KeyError):
    """A batch, segment, transition batch or role view has no field (or key) of that name.

    The message names the key and lists the ones there are.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # KeyError would quote the message


class CommitConflictError(EpisodeLakeError, RuntimeError):
    """A commit kept conflicting with concurrent writers and was given up."""


class QueryError(EpisodeLakeError, ValueError):
    """A SQL query, predicate or statistics request is invalid for this dataset."""


class ForkedProcessError(EpisodeLakeError, RuntimeError):
    """TensorStore work was asked of a process forked from one that used TensorStore; use a spawned process."""


class StreamStoppedError(EpisodeLakeError, RuntimeError):
    """A segment stream's prefetch thread was stopped (interpreter exit) before the next batch arrived."""


class MissingDependencyError(EpisodeLakeError, ImportError):
    """An optional dependency a call needs is not installed; the message names the extra to install."""


class StorageError(EpisodeLakeError, OSError):
    """The storage under a dataset failed: endpoint unreachable, permission denied, disk full, read-only, timed out.

    Nothing is known to be damaged (that is :class:`CorruptionError`). ``errno`` is set where the fault has one
    (``ENOSPC``, ``EACCES``, ``EROFS``, ``ETIMEDOUT``, ``ECONNREFUSED``); ``dataset`` and ``object`` name where it
    happened; the original exception is chained as ``__cause__``.
    """

    def __init__(self, message: str, *, errno: int | None = None, dataset: str = "", object: str = "") -> None:
        if errno is None:
            super().__init__(message)
        else:
            super().__init__(errno, message)
        self.message = message
        self.dataset = dataset
        self.object = object

    def __str__(self) -> str:
        return self.message
