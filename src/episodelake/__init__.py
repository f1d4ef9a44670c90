"""episodelake: a lakehouse for RL, robotics and world-model episodes.

Delta Lake episode table + Zarr v3 tensors (TensorStore) + DuckDB SQL + a
transition-aligned sampler. ``import episodelake as el``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names for type checkers and editors; at run time they load on first use
    from .concat import concat
    from .core.align import Aligned, TimedValues, align
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

__version__ = "0.9.0"

_ERRORS = (
    "ArgumentError CommitConflictError CorruptionError DatasetExistsError DatasetNotFoundError EpisodeLakeError "
    "EpisodeStateError FieldKeyError ForkedProcessError LocationError MissingDependencyError QualityError QueryError "
    "ReadOnlyError SchemaError StorageError StreamStoppedError ValidationError"
)
#: Each public name -> (the module that defines it, its name there). ``import episodelake`` loads none of
#: them: TensorStore, DuckDB, deltalake, pandas and PyArrow's dataset layer load with the first name used,
#: so the command line's ``--help`` and ``--version`` answer at once (tests/test_fast_start.py).
_LAZY: dict[str, tuple[str, str]] = {
    **{name: (".core.errors", name) for name in _ERRORS.split()},
    "concat": (".concat", "concat"),
    **{name: (".core.align", name) for name in ("Aligned", "TimedValues", "align")},
    "Check": (".core.quality", "Check"),
    **{
        name: (".core.schema", name)
        for name in ("DatasetSchema", "FieldSpec", "infer_schema", "schema_from_gym_spaces")
    },
    "RoleView": (".core.segments", "RoleView"),
    "Segment": (".core.segments", "Segment"),
    "FrameTransform": (".core.transforms", "FrameTransform"),
    **{name: (".dataset", name) for name in ("Dataset", "DatasetView", "EpisodeRef", "merge")},
    "to_rerun": (".exporters.rrd", "to_rerun"),
    **{name: (".lineage", name) for name in ("load_state", "save_state", "stream_from_state")},
    "Batch": (".sampling.batch", "SegmentBatch"),
    **{
        name: (".sampling.options", name)
        for name in ("Anchors", "Prioritized", "Sequential", "Shard", "Uniform", "Weighted", "Window")
    },
    "PrioritizedSampler": (".sampling.samplers", "PrioritizedSampler"),
    "StorageTimeouts": (".storage.location", "StorageTimeouts"),
    "Capacity": (".storage.retention", "Capacity"),
    "view": (".viewer", "view"),
    "EpisodeWriter": (".write.writer", "EpisodeWriter"),
    "VectorEpisodeWriter": (".write.writer", "VectorEpisodeWriter"),
}


def __getattr__(name: str) -> Any:
    """Load a public name on first use (PEP 562); episodata's names without a counterpart are refused.

    A public name is imported from its module and cached in the package's
    namespace, so later reads cost nothing. A subpackage or module read as an
    attribute (``episodelake.sampling``) is imported as ``import`` would. An
    episodata top-level name with no counterpart here raises ArgumentError
    saying what to write instead; any other name AttributeError.
    """
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module, __name__), attribute)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)
    from .core.spellings import refuse

    refuse("episodelake", name)


def __dir__() -> list[str]:
    """The public names and what is loaded (``dir(episodelake)`` lists names not yet loaded too)."""
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Aligned",
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
    "TimedValues",
    "Uniform",
    "ValidationError",
    "VectorEpisodeWriter",
    "Weighted",
    "Window",
    "align",
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
