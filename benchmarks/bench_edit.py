"""Benchmark (issue 23): edits in one commit vs rewriting the dataset with ``copy_to``, same data, same run.

Parts (each on its own local dataset, built first and not timed):

* ``trim``: ``--camera-episodes`` camera episodes (``--steps`` steps,
  3x64x64 uint8 frames in tensor arrays) each trimmed by ``--trim`` steps
  (``ds.edit.trim(head=...)``): the kept frames are read once (checksums and
  statistics recomputed), no frame is written;
* ``relabel``: the task label of half of ``--relabel-episodes`` small
  episodes set (``ds.edit.set_meta``): only table rows are rewritten, which
  for a table-only dataset is what ``copy_to`` writes too;
* ``relabel camera``: the task label of every camera episode set (the trim
  part's dataset): the table rows rewritten, no frame touched, against a
  ``copy_to`` that copies the frames too;
* ``drop field``: the per-step ``state`` field dropped from the camera
  dataset (``ds.columns.drop``): the table rows rewritten, no frame touched.

Each part prints seconds and bytes written (files under the dataset root
that the edit created or grew), against ``copy_to`` of the same dataset (the
rewrite an edit without references would need: every row and frame read,
written and verified), and the ratios. Other parts append to ``PARTS``.

    python benchmarks/bench_edit.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import episodelake as el


@dataclass(frozen=True)
class Sizes:
    camera_episodes: int
    steps: int
    trim: int
    relabel_episodes: int


def sizes(args: argparse.Namespace) -> Sizes:
    if args.quick:
        return Sizes(camera_episodes=100, steps=200, trim=20, relabel_episodes=10_000)
    return Sizes(args.camera_episodes, args.steps, args.trim, args.relabel_episodes)


def files(root: str) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: path -> (bytes, mtime ns)."""
    out = {}
    for base, _, names in os.walk(root):
        for name in names:
            st = os.stat(os.path.join(base, name))
            out[os.path.join(base, name)] = (st.st_size, st.st_mtime_ns)
    return out


def written(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> int:
    """Bytes of the files created or rewritten between two listings."""
    return sum(size for path, (size, stamp) in after.items() if before.get(path, (None, None))[1] != stamp)


def measure(root: str, fn: Callable[[], object]) -> tuple[float, int]:
    """(seconds, bytes written under ``root``) of ``fn()``."""
    before = files(root)
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return seconds, written(before, files(root))


def camera_dataset(path: str, s: Sizes) -> el.Dataset:
    schema = el.DatasetSchema(
        [
            el.FieldSpec("camera", (3, 64, 64), "uint8", layout="CHW", storage="tensor"),
            el.FieldSpec("state", (6,), "float32"),
            el.FieldSpec("action", (6,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("task", (), "str", role="meta"),
        ]
    )
    ds = el.Dataset.create(schema, path)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (s.steps + 1, 3, 64, 64), dtype=np.uint8)  # one block of frames, reused
    for lo in range(0, s.camera_episodes, 50):
        ds.append_episodes(
            {
                "observations": {"camera": frames, "state": rng.standard_normal((s.steps + 1, 6), dtype=np.float32)},
                "actions": rng.standard_normal((s.steps, 6), dtype=np.float32),
                "rewards": rng.standard_normal(s.steps, dtype=np.float32),
                "meta": {"task": "pick"},
            }
            for _ in range(lo, min(s.camera_episodes, lo + 50))
        )
        ds.flush()
    return ds


def small_dataset(path: str, s: Sizes) -> el.Dataset:
    schema = el.DatasetSchema(
        [
            el.FieldSpec("state", (4,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("task", (), "str", role="meta"),
        ]
    )
    n, T = s.relabel_episodes, 10
    rng = np.random.default_rng(1)
    columns = {
        "observations": rng.standard_normal((n * (T + 1), 4), dtype=np.float32),
        "actions": rng.integers(0, 4, n * T),
        "rewards": rng.standard_normal(n * T, dtype=np.float32),
        "meta": {"task": np.where(np.arange(n) % 2 == 0, "pick", "place")},
    }
    return el.Dataset.from_episodes(columns, path, schema=schema, lengths=np.full(n, T))


def part_trim(root: str, s: Sizes) -> tuple[str, float, int, float, int]:
    ds = camera_dataset(f"{root}/trim", s)
    steps = ds.num_steps
    t_copy, b_copy = measure(root, lambda: ds.copy_to(f"{root}/trim-copy", progress=False))
    t_edit, b_edit = measure(f"{root}/trim", lambda: ds.edit.trim(head=s.trim))
    assert ds.num_steps == steps - s.trim * s.camera_episodes
    what = f"trim {s.camera_episodes} camera episodes ({s.steps} steps, 3x64x64) by {s.trim} steps"
    return what, t_edit, b_edit, t_copy, b_copy


def part_relabel(root: str, s: Sizes) -> tuple[str, float, int, float, int]:
    ds = small_dataset(f"{root}/relabel", s)
    t_copy, b_copy = measure(root, lambda: ds.copy_to(f"{root}/relabel-copy", progress=False))
    t_edit, b_edit = measure(f"{root}/relabel", lambda: ds.edit.set_meta({"task": "stack"}, where="task = 'pick'"))
    assert ds.sql("SELECT count(*) AS n FROM episodes WHERE task = 'stack'").fetchnumpy()["n"][0] == -(
        -s.relabel_episodes // 2
    )
    return (
        f"relabel the task of {s.relabel_episodes // 2} of {s.relabel_episodes} episodes",
        t_edit,
        b_edit,
        t_copy,
        b_copy,
    )


def part_relabel_camera(root: str, s: Sizes) -> tuple[str, float, int, float, int]:
    ds = camera_dataset(f"{root}/relabel-camera", s)
    t_copy, b_copy = measure(root, lambda: ds.copy_to(f"{root}/relabel-camera-copy", progress=False))
    t_edit, b_edit = measure(
        f"{root}/relabel-camera", lambda: ds.edit.set_meta({"task": "stack"}, where="task = 'pick'")
    )
    assert ds.sql("SELECT count(*) AS n FROM episodes WHERE task = 'stack'").fetchnumpy()["n"][0] == s.camera_episodes
    return f"relabel the task of {s.camera_episodes} camera episodes", t_edit, b_edit, t_copy, b_copy


def part_drop_field(root: str, s: Sizes) -> tuple[str, float, int, float, int]:
    ds = camera_dataset(f"{root}/drop", s)
    t_copy, b_copy = measure(root, lambda: ds.copy_to(f"{root}/drop-copy", progress=False))
    t_edit, b_edit = measure(f"{root}/drop", lambda: ds.columns.drop("observation/state"))
    assert [f.key for f in ds.schema.fields] == ["observation/camera", "action", "reward", "task"]
    return f"drop one field of {s.camera_episodes} camera episodes ({s.steps} steps)", t_edit, b_edit, t_copy, b_copy


# (name, part): each builds its dataset under the root and returns (what, edit s, edit bytes, copy s, copy bytes).
PARTS: list[tuple[str, Callable[[str, Sizes], tuple[str, float, int, float, int]]]] = [
    ("trim", part_trim),
    ("relabel", part_relabel),
    ("relabel camera", part_relabel_camera),
    ("drop field", part_drop_field),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (100 camera episodes, 10,000 relabeled)")
    parser.add_argument("--camera-episodes", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--trim", type=int, default=20)
    parser.add_argument("--relabel-episodes", type=int, default=100_000)
    parser.add_argument("--parts", default=",".join(name for name, _ in PARTS), help="comma-separated parts to run")
    args = parser.parse_args()
    s = sizes(args)
    wanted = set(args.parts.split(","))
    print(
        f"{'part':58s} {'edit s':>8s} {'edit MB':>9s} {'copy_to s':>9s} {'copy MB':>9s} {'speedup':>8s} {'bytes':>8s}"
    )
    for name, part in PARTS:
        if name not in wanted:
            continue
        root = tempfile.mkdtemp(prefix=f"bench_edit_{name.replace(' ', '_')}_")
        try:
            what, t_edit, b_edit, t_copy, b_copy = part(root, s)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(
            f"{what:58s} {t_edit:8.2f} {b_edit / 1e6:9.3f} {t_copy:9.2f} {b_copy / 1e6:9.1f} "
            f"{t_copy / t_edit:7.1f}x {b_copy / max(b_edit, 1):7.0f}x"
        )


if __name__ == "__main__":
    main()
