"""episodelake: a lakehouse for RL, robotics and world-model episodes.

Delta Lake episode table + Zarr v3 tensors (TensorStore) + DuckDB SQL + a
transition-aligned sampler. ``import episodelake as el``.
"""

from .concat import concat
from .core.errors import (
    ArgumentError,
    CommitConflictError,
    CorruptionError,
    DatasetExistsError,
    DatasetNotFoundError,
    EpisodeLakeError,
    EpisodeStateError,
    FieldKeyError,
    ForkedProcessError,
    LocationError,
    MissingDependencyError,
    QualityError,
    QueryError,
    ReadOnlyError,
    SchemaError,
    StorageError,
    StreamStoppedError,
    ValidationError,
)
from .core.quality import Check
from .core.schema import DatasetSchema, FieldSpec, infer_schema, schema_from_gym_spaces
from .core.segments import RoleView, Segment
from .core.transforms import FrameTransform
from .dataset import Dataset, DatasetView, EpisodeRef, merge
from .exporters.rrd import to_rerun
from .lineage import load_state, save_state, stream_from_state
from .sampling.batch import SegmentBatch as Batch
from .sampling.options import Anchors, Prioritized, Sequential, Shard, Uniform, Weighted, Window
from .sampling.samplers import PrioritizedSampler
from .storage.location import StorageTimeouts
from .storage.retention import Capacity
from .viewer import view
from .write.writer import EpisodeWriter, VectorEpisodeWriter

__version__ = "0.8.0"

__all__ = [
    "Anchors",
    "ArgumentError",
    "Batch",
    "Capacity",
    "Check",
    "CommitConflictError",
    "CorruptionError",
    "Dataset",
    "DatasetExistsError",
    "DatasetNotFoundError",
    "DatasetSchema",
    "DatasetView",
    "EpisodeLakeError",
    "EpisodeRef",
    "EpisodeStateError",
    "EpisodeWriter",
    "FieldKeyError",
    "FieldSpec",
    "ForkedProcessError",
    "FrameTransform",
    "LocationError",
    "MissingDependencyError",
    "Prioritized",
    "PrioritizedSampler",
    "QualityError",
    "QueryError",
    "ReadOnlyError",
    "RoleView",
    "SchemaError",
    "Segment",
    "Sequential",
    "Shard",
    "StorageError",
    "StorageTimeouts",
    "StreamStoppedError",
    "Uniform",
    "ValidationError",
    "VectorEpisodeWriter",
    "Weighted",
    "Window",
    "concat",
    "infer_schema",
    "load_state",
    "merge",
    "save_state",
    "schema_from_gym_spaces",
    "stream_from_state",
    "to_rerun",
    "view",
]
