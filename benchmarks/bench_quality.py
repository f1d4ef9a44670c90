"""Quality gates: the cost of constraints and SQL checks at import, and an audit against one bare DuckDB query.

Two parts, each in one process on the same data:

* **import**: a bulk ``append_episodes`` of N episodes of 100 steps (``time``
  float64, ``state`` float32[7], ``camera`` uint8[3, 16, 16] in a tensor,
  ``action`` float32[2], ``reward``, meta ``success``) into a fresh local
  dataset, with three field constraints (``time`` monotonic increasing,
  ``state`` within [-10, 10], ``camera`` max_repeat=4) and two SQL checks
  (episode level ``NOT success OR "return" > 0``, step level
  ``abs("action"[1]) <= 1``; every episode passes, so both runs store the
  same) against the same schema without them, and each half alone. Median
  of alternating runs; ratios are to the run without (goal, issue 22:
  both <= 1.2x).
* **audit**: ``ds.quality.check()`` with two episode-level checks over M
  episodes (default 1,000,000; ``--quick``: 100,000), cold (a freshly opened
  dataset) and warm (the same snapshot again), against one bare DuckDB query
  over the table's Parquet files (``read_parquet`` of the Delta file list,
  both predicates, ``IS NOT TRUE``): the bound. Ratios are ours / bare.

Run: ``.venv/bin/python benchmarks/bench_quality.py [--quick] [--episodes N] [--audit-episodes M] [--dir PATH]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
from deltalake import DeltaTable

import episodelake as el

LENGTH = 100
CHECKS = (
    el.Check("success_has_return", 'NOT success OR "return" > 0'),
    el.Check("bounded_action", 'abs("action"[1]) <= 1', level="step"),
)
AUDIT_CHECKS = (
    el.Check("success_has_return", 'NOT success OR "return" > 0'),
    el.Check("long_enough", "length >= 3"),
)


def import_schema(constrained: bool) -> el.DatasetSchema:
    c = constrained
    return el.DatasetSchema(
        [
            el.FieldSpec("time", (), "float64", role="extra", monotonic="increasing" if c else None),
            el.FieldSpec("state", (7,), "float32", min=-10.0 if c else None, max=10.0 if c else None),
            el.FieldSpec("camera", (3, 16, 16), "uint8", storage="tensor", max_repeat=4 if c else None),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("success", (), "bool", role="meta"),
        ]
    )


def import_episodes(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "observations": {
                "state": rng.uniform(-1, 1, (LENGTH + 1, 7)).astype(np.float32),
                "camera": rng.integers(0, 256, (LENGTH + 1, 3, 16, 16), dtype=np.uint8),
            },
            "actions": rng.uniform(-1, 1, (LENGTH, 2)).astype(np.float32),
            "rewards": rng.uniform(0.01, 1, LENGTH).astype(np.float32),
            "extras": {"time": np.cumsum(rng.uniform(0.01, 0.02, LENGTH))},
            "terminated": True,
            "meta": {"success": bool(i % 2)},
        }
        for i in range(n)
    ]


KINDS = {  # what each import run gates with: (field constraints, SQL checks)
    "none": (False, ()),
    "constraints only": (True, ()),
    "checks only": (False, CHECKS),
    "both": (True, CHECKS),
}


def timed_import(root: Path, episodes: list[dict], kind: str) -> float:
    constrained, checks = KINDS[kind]
    path = root / "import"
    shutil.rmtree(path, ignore_errors=True)
    # create() binds the checks once per dataset (an empty twin, ~0.1 s): a fixed cost, not the import's
    ds = el.Dataset.create(import_schema(constrained), str(path), checks=checks)
    t0 = time.perf_counter()
    ds.append_episodes(episodes)
    ds.close()
    seconds = time.perf_counter() - t0
    assert len(el.Dataset.open(str(path))) == len(episodes)  # nothing refused or quarantined: the same work stored
    return seconds


def build_audit(path: str, n: int, seed: int = 1) -> None:
    """N short episodes (length 2-5) in bulk; about 1 in 20 fails each check."""
    rng = np.random.default_rng(seed)
    schema = el.DatasetSchema(
        [
            el.FieldSpec("state", (2,), "float32"),
            el.FieldSpec("action", (), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("success", (), "bool", role="meta"),
        ]
    )
    ds = el.Dataset.create(schema, path, overwrite=True)
    per_call = 100_000
    for lo in range(0, n, per_call):
        count = min(per_call, n - lo)
        lengths = rng.integers(2, 6, count)
        steps = int(lengths.sum())
        success = rng.random(count) < 0.5
        rewards = rng.uniform(0, 1, steps).astype(np.float32)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        zero = np.flatnonzero(rng.random(count) < 0.1)  # some episodes earn nothing: success then fails
        for i in zero.tolist():
            rewards[starts[i] : starts[i] + lengths[i]] = 0
        ds.append_episodes(
            {
                "observations": rng.uniform(-1, 1, (steps + count, 2)).astype(np.float32),
                "actions": rng.uniform(-1, 1, steps).astype(np.float32),
                "rewards": rewards,
                "terminated": np.ones(count, bool),
                "meta": {"success": success},
            },
            lengths=lengths,
        )
    ds.close()


def bare_duckdb(path: str) -> int:
    """Both predicates over the raw Parquet files of the latest Delta version, in one query: the failing rows."""
    files = DeltaTable(str(Path(path) / "episodes")).file_uris()
    union = " UNION ALL ".join(
        f"SELECT '{c.name}' AS c, episode_id FROM read_parquet($files) WHERE ({c.predicate}) IS NOT TRUE"
        for c in AUDIT_CHECKS
    )
    con = duckdb.connect()
    try:
        return len(con.execute(f"SELECT * FROM ({union}) ORDER BY c, episode_id", {"files": files}).fetchall())
    finally:
        con.close()


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 import episodes, a 100,000-episode audit")
    parser.add_argument("--episodes", type=int, default=None, help="import episodes (default 2,000; quick 300)")
    parser.add_argument("--audit-episodes", type=int, default=None, help="audit episodes (default 1M; quick 100k)")
    parser.add_argument("--repeats", type=int, default=None, help="import runs of each kind (default 5; quick 3)")
    parser.add_argument("--dir", default=None, help="where to build (default: a temporary folder)")
    args = parser.parse_args()
    n = args.episodes or (300 if args.quick else 2_000)
    m = args.audit_episodes or (100_000 if args.quick else 1_000_000)
    repeats = args.repeats or (3 if args.quick else 5)
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench_quality_"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        episodes = import_episodes(n)
        print(f"import: {n} episodes x {LENGTH} steps, 3 field constraints + 2 SQL checks vs none, {repeats} runs each")
        timed_import(root, episodes[:20], "both")  # warm the imports and DuckDB
        runs: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(repeats):
            for kind in KINDS:  # alternating, so drift on a shared machine hits every kind alike
                runs[kind].append(timed_import(root, episodes, kind))
        plain = statistics.median(runs["none"])
        for kind in KINDS:
            took = statistics.median(runs[kind])
            print(f"  {kind:>16}: {took:.3f} s   ratio to none: {took / plain:.2f}x")
        print("  goal (issue 22): both <= 1.2x")

        path = str(root / "audit")
        t0 = time.perf_counter()
        build_audit(path, m)
        print(f"audit: {m} episodes (built in {time.perf_counter() - t0:.1f} s), 2 episode-level checks")
        t0 = time.perf_counter()
        ds = el.Dataset.open(path)
        report = ds.quality.check(AUDIT_CHECKS)
        cold = time.perf_counter() - t0
        warm, again = median_time(lambda: ds.quality.check(AUDIT_CHECKS), 3)
        bare, failures = median_time(lambda: bare_duckdb(path), 3)
        found = sum(r.failed for r in report)
        assert found == failures == sum(r.failed for r in again), (found, failures)  # type: ignore[attr-defined]
        print(f"  failures found: {found} ({', '.join(f'{r.check.name} {r.failed}' for r in report)})")
        print(f"  ours cold (open + audit): {cold:.3f} s   warm: {warm:.3f} s   bare DuckDB over Parquet: {bare:.3f} s")
        print(f"  ratio ours/bare: cold {cold / bare:.2f}x, warm {warm / bare:.2f}x")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
