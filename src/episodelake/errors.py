"""Exception types. Every error a user can trigger derives from EpisodeLakeError."""


class EpisodeLakeError(Exception):
    """Base class of all episodelake errors."""


class SchemaError(EpisodeLakeError, ValueError):
    """A schema or field specification is invalid."""


class ValidationError(EpisodeLakeError, ValueError):
    """Data offered for writing does not match the schema; nothing was written."""


class EpisodeStateError(EpisodeLakeError, RuntimeError):
    """A writer was used after it finished, or out of order."""


class LocationError(EpisodeLakeError, ValueError):
    """A path/URL or its storage options cannot be resolved."""


class DatasetNotFoundError(EpisodeLakeError, FileNotFoundError):
    """No episodelake dataset exists at the given location."""


class ReadOnlyError(EpisodeLakeError, PermissionError):
    """A write was attempted on a dataset opened read-only."""


class CorruptionError(EpisodeLakeError, IOError):
    """Stored data disagrees with its references or checksums."""


class CommitConflictError(EpisodeLakeError, RuntimeError):
    """A commit kept conflicting with concurrent writers and was given up."""


class QueryError(EpisodeLakeError, ValueError):
    """A SQL query, predicate or statistics request is invalid for this dataset."""
