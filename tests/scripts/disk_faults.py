"""Write or read a dataset while its file system fails under it (for tests/test_disk_faults.py).

``python tests/scripts/disk_faults.py MODE URL SEED [--tensors]`` records
``episode(SEED, i)`` for i = 0, 1, ... with new_episode/add_step
(``commit_episodes=2``), as a collection loop does, until a write raises. The
robot schema keeps its camera in a tensor field with ``--tensors`` (the disk
fills on the tensor path), else every field lives in the table (it fills on
the table path). Lines on stdout are JSON objects:

* ``{"error": {...}}`` when a write raised: its type, errno, dataset, str()
  and the index of the episode whose ``finish()`` raised;
* ``fill``: then waits for one line on stdin (the parent freed space), calls
  ``flush()`` and prints ``{"flushed": version}``;
* ``exit``: returns at once, leaving the episodes pending for the exit commit
  (which fails too: the disk is still full).

``prefetch`` instead opens the dataset read-only, takes one batch of a stream
with ``prefetch=2``, prints ``{"ready": true}``, waits for one line on stdin
(the parent made the tensor files unreadable), then pulls batches until one
raises and prints ``{"raised": {...}}`` and what the next call did.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from tests.workers.common import crash_schema, episode, write_stepwise

import episodelake as el

LIMIT = 100_000  # episodes: far more than any test file system holds


def schema(tensors: bool) -> el.DatasetSchema:
    fields = crash_schema().fields
    if tensors:
        return el.DatasetSchema(fields)
    return el.DatasetSchema(dataclasses.replace(f, storage="table") if f.name == "camera" else f for f in fields)


def describe(exc: BaseException, **extra: object) -> dict:
    return {
        "type": type(exc).__name__,
        "storage": isinstance(exc, el.StorageError),
        "errno": getattr(exc, "errno", None),
        "dataset": getattr(exc, "dataset", None),
        "text": str(exc),
        "cause": type(exc.__cause__).__name__,
        **extra,
    }


def say(**line: object) -> None:
    print(json.dumps(line), flush=True)


def record(url: str, seed: int, tensors: bool) -> el.Dataset:
    ds = el.Dataset.create(schema(tensors), url, commit_episodes=2)
    for i in range(LIMIT):
        try:
            write_stepwise(ds, episode(seed, i))
        except el.StorageError as exc:
            say(error=describe(exc, index=i))
            return ds
    raise AssertionError("the file system never filled")


def prefetch(url: str) -> None:
    ds = el.Dataset.open(url, read_only=True)
    stream = ds.segment_stream(2, batch_size=4, prefetch=2, seed=0)
    next(stream)
    say(ready=True)
    sys.stdin.readline()
    for _ in range(LIMIT):
        try:
            next(stream)
        except el.EpisodeLakeError as exc:
            raised = describe(exc)
            break
    else:
        raise AssertionError("the stream never failed")
    try:
        next(stream)
        after = "a batch"
    except StopIteration:
        after = "StopIteration"
    except Exception as exc:
        after = f"{type(exc).__name__}: {exc}"
    say(raised=raised, after=after)


def main() -> None:
    mode, url, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "prefetch":
        prefetch(url)
        return
    if mode == "write":
        ds = el.Dataset.open(url)
        raw = episode(seed, len(ds))
        try:
            ds.new_episode({k: v[0] for k, v in raw.obs.items()})
        except el.EpisodeLakeError as exc:
            say(error=describe(exc))
        return
    ds = record(url, seed, "--tensors" in sys.argv)
    if mode == "fill":
        sys.stdin.readline()
        say(flushed=ds.flush())


if __name__ == "__main__":
    main()
