"""episodelake: a lakehouse for RL, robotics and world-model episodes.

Delta Lake episode table + Zarr v3 tensors (TensorStore) + DuckDB SQL + a
transition-aligned sampler. ``import episodelake as el``.
"""

from .dataset import Dataset, DatasetView, EpisodeRef
from .errors import (
    CommitConflictError,
    CorruptionError,
    DatasetNotFoundError,
    EpisodeLakeError,
    EpisodeStateError,
    LocationError,
    QueryError,
    ReadOnlyError,
    SchemaError,
    ValidationError,
)
from .schema import DatasetSchema, FieldSpec, infer_schema, schema_from_gym_spaces
from .segments import Batch, RoleView, Segment
from .writer import EpisodeWriter, VectorEpisodeWriter

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "CommitConflictError",
    "CorruptionError",
    "Dataset",
    "DatasetNotFoundError",
    "DatasetSchema",
    "DatasetView",
    "EpisodeLakeError",
    "EpisodeRef",
    "EpisodeStateError",
    "EpisodeWriter",
    "FieldSpec",
    "LocationError",
    "QueryError",
    "ReadOnlyError",
    "RoleView",
    "SchemaError",
    "Segment",
    "ValidationError",
    "VectorEpisodeWriter",
    "infer_schema",
    "schema_from_gym_spaces",
]
