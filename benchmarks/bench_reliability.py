"""Cost of the reliability features: read-time checksums, validate(), vacuum(dry_run=True).

Same data, same process: reading every episode with and without
``verify=True`` (ratio = checksum overhead), a full ``validate()`` and one
without tensor reads, measured against one plain pass over the data.

    .venv/bin/python benchmarks/bench_reliability.py [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

import episodelake as el


def build(path: str, episodes: int, length: int) -> el.Dataset:
    rng = np.random.default_rng(0)
    schema = el.DatasetSchema(
        [
            el.FieldSpec("state", (8,), "float32"),
            el.FieldSpec("camera", (3, 64, 64), "uint8", layout="CHW", storage="tensor", chunk_rows=64),
            el.FieldSpec("action", (4,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    ds = el.Dataset.create(schema, path)
    for _ in range(episodes):
        ds.append_episodes(
            [
                {
                    "observations": {
                        "state": rng.standard_normal((length + 1, 8)).astype(np.float32),
                        "camera": rng.integers(0, 256, (length + 1, 3, 64, 64), dtype=np.uint8),
                    },
                    "actions": rng.standard_normal((length, 4)).astype(np.float32),
                    "rewards": rng.standard_normal(length).astype(np.float32),
                    "terminated": True,
                }
            ]
        )
    ds.flush()
    return ds


def timed(fn) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def read_all(path: str, verify: bool) -> None:
    ds = el.Dataset.open(path, read_only=True, verify=verify)
    for i in range(len(ds)):
        ds.episode(i).read()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    episodes, length = (20, 100) if args.quick else (100, 200)
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/ds"
        ds = build(path, episodes, length)
        mb = episodes * (length + 1) * 3 * 64 * 64 / 1e6
        plain = timed(lambda: read_all(path, False))
        rows = [
            ("read every episode", plain),
            ("read every episode, verify=True", timed(lambda: read_all(path, True))),
            ("validate()", timed(lambda: ds.maintenance.validate().raise_if_failed())),
            ("validate(tensors=False)", timed(lambda: ds.maintenance.validate(tensors=False).raise_if_failed())),
            ("vacuum(dry_run=True)", timed(lambda: ds.maintenance.vacuum(dry_run=True, retention_hours=0))),
        ]
    print(f"{episodes} episodes x {length} steps, camera uint8 [3,64,64] ({mb:.0f} MB of tensors)")
    print(f"{'operation':34} {'seconds':>9} {'MB/s':>8} {'vs plain read':>14}")
    for name, secs in rows:
        print(f"{name:34} {secs:9.3f} {mb / secs:8.0f} {secs / plain:13.2f}x")


if __name__ == "__main__":
    main()
