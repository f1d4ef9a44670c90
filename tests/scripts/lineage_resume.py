"""Checkpoint streams in one process, resume them from the state files alone in another (tests/test_lineage.py).

``python tests/scripts/lineage_resume.py checkpoint URL K STATE_DIR``: builds
every stream of :data:`CASES` on the dataset at ``URL``, takes ``K`` batches
of each (a prioritized stream gets :func:`new_priorities` after each batch)
and writes ``STATE_DIR/<case>.json`` with ``el.save_state``.

``python tests/scripts/lineage_resume.py resume STATE_DIR N OUT.npz``: for
each state file, ``el.stream_from_state(path)`` (nothing else: no URL, no
arguments) and ``N`` batches, written to ``OUT.npz`` as ``<case>/<i>/<key>``.
Storage options come as JSON in ``LINEAGE_STORAGE_OPTIONS``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

import episodelake as el
from episodelake.core.transforms import FrameTransform

# case -> (selection steps applied to the dataset, segment_stream arguments)
CASES: dict[str, tuple[list[tuple[str, str, Any]], dict[str, Any]]] = {
    "permutation_sharded": (
        [("where", "length > $n", {"n": 4})],
        {"window": 3, "batch_size": 4, "seed": 11, "sampler": el.Uniform(replacement=False), "shard": (1, 3)},
    ),
    "weighted_sql": (
        [("where", "task = ?", ["pick"])],
        {
            "window": el.Window(5, pad=None, stride=2),
            "batch_size": 3,
            "seed": 5,
            "sampler": el.Weighted("length * 1.0"),
            "transform": {"observation/camera": FrameTransform(crop=(1, 1, 6, 6), resize=(4, 4), layout="HWC")},
        },
    ),
    "prioritized_context": (
        [],
        {
            "window": el.Window(context=2, target=2),
            "batch_size": 5,
            "seed": 3,
            "sampler": el.Prioritized("1.0 + length"),
        },
    ),
    "ordered_unseeded": ([], {"window": 2, "batch_size": 6, "sampler": el.Sequential(), "shard": (0, 2)}),
    "uniform_fresh_seed": (
        [("select_episodes", "SELECT episode_id FROM episodes WHERE success", None)],
        {
            "window": 4,
            "batch_size": 2,
        },
    ),
}


def build(ds: el.Dataset, case: str) -> Any:
    steps, kwargs = CASES[case]
    collection: Any = ds
    for kind, sql, params in steps:
        collection = getattr(collection, kind)(sql, params)
    kwargs = dict(kwargs)
    return collection.segment_stream(kwargs.pop("window"), **kwargs)


def new_priorities(batch: Any) -> np.ndarray:
    """Deterministic new priorities from what the batch holds (so a resumed run can repeat them)."""
    return 0.5 + np.abs(np.asarray(batch.data["observation/state"], np.float64)).sum(axis=(1, 2))


def step(stream: Any) -> Any:
    """The next batch; at the end of a finite pass, the first of the next pass (epoch)."""
    try:
        batch = next(stream)
    except StopIteration:
        batch = next(iter(stream))
    if stream.prioritized:
        stream.update_priorities(batch.indices, new_priorities(batch))
    return batch


def arrays(batch: Any) -> dict[str, np.ndarray]:
    out = {f"data/{k}": np.asarray(v) for k, v in batch.data.items()}
    out["mask"] = np.asarray(batch.mask)
    out["terminated"] = np.asarray(batch.terminated)
    if batch.indices is not None:
        out["indices"] = np.asarray(batch.indices)
        out["weights"] = np.asarray(batch.weights)
    return out


def main() -> None:
    options = json.loads(os.environ.get("LINEAGE_STORAGE_OPTIONS", "null"))
    if sys.argv[1] == "checkpoint":
        url, k, out = sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
        ds = el.Dataset.open(url, storage_options=options, read_only=True)
        for case in CASES:
            stream = build(ds, case)
            for _ in range(k):
                step(stream)
            el.save_state(stream.state_dict(), out / f"{case}.json")
    else:
        states, n, out_file = Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        saved: dict[str, np.ndarray] = {}
        for path in sorted(states.glob("*.json")):
            stream = el.stream_from_state(path, storage_options=options)
            for i in range(n):
                for key, value in arrays(step(stream)).items():
                    saved[f"{path.stem}/{i}/{key}"] = value
        np.savez(out_file, **saved)


if __name__ == "__main__":
    main()
