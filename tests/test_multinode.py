"""Many nodes, no coordinator: 3 ranks (real processes, ``torch.distributed`` gloo) stream one S3 snapshot.

Each rank opens the same dataset on the local S3 server (with its own disk cache) and streams its shard
of a shuffled pass (``segment_stream(L, sampler=el.Uniform(replacement=False), shard=(rank, 3))``)
through epoch 0, into epoch 1, saves its state and exits; fresh processes
resume from the state files and finish epoch 1. Checked by exit status and by
the batches the ranks wrote to disk, against a plan computed here in plain
NumPy (the segment enumeration and the seeded permutation) and the episodes'
recorded arrays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import episodelake as el

from .conftest import robot_schema
from .reference import expected_segment, random_episode

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

WORLD, L, B, SEED, RESUME_AFTER = 3, 3, 4, 21, 2
ROOT = Path(__file__).resolve().parents[1]


def starts(length: int) -> range:
    return range(max(length - L, 0) + 1)


def expected_plan(lengths: list[int], ids: list[int], epoch: int, rank: int) -> list[list[tuple[int, int]]]:
    """Rank ``rank``'s batches of pass ``epoch``, as (episode id, start) pairs.

    Segments: starts ``0 .. T - L`` of each episode (one padded segment when ``T < L``: pad="suffix", stride 1),
    in episode order, permuted by ``default_rng([SEED, epoch])``, dealt round-robin in global batches of
    ``B * WORLD``; the last batch wraps to the start of the pass ("wrap").
    """
    segments = [(eid, s) for eid, n in zip(ids, lengths, strict=True) for s in starts(n)]
    n = len(segments)
    perm = np.random.default_rng([SEED, epoch]).permutation(n)
    batches, consumed = [], 0
    while consumed < n:
        b = min(B, -(-(n - consumed) // WORLD))
        pos = (consumed + rank + WORLD * np.arange(b)) % n
        batches.append([segments[int(perm[p])] for p in pos])
        consumed += b * WORLD
    return batches


def run_ranks(config: dict, tmp: Path, phase: str) -> None:
    config = dict(config, phase=phase, init_method=f"file://{tmp / f'rendezvous-{phase}'}")
    path = tmp / f"config-{phase}.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.workers.multinode", str(rank), str(path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(WORLD)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for rank, (proc, output) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} ({phase}) exited {proc.returncode}:\n{output[-3000:]}"


def written(out: Path, phase: str, rank: int) -> list[dict[str, np.ndarray]]:
    files = sorted(out.glob(f"{phase}-{rank}-*.npz"))
    return [dict(np.load(f)) for f in files]


def test_three_ranks_stream_disjoint_equal_shards_through_an_epoch_and_resume(s3_server, s3_url, tmp_path):
    rng = np.random.default_rng(8)
    raws = [random_episode(rng, int(rng.integers(2, 10))) for _ in range(16)]
    ds = el.Dataset.create(robot_schema(), s3_url, storage_options=s3_server.storage_options, partition_by=["task"])
    for i in range(0, len(raws), 6):  # three commits: three tensor arrays per writer on S3
        ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws[i : i + 6])
        ds.flush()
    ids = ds.episode_ids.tolist()
    truth = dict(zip(ids, raws, strict=True))
    out = tmp_path / "out"
    out.mkdir()
    config = {
        "url": s3_url,
        "storage_options": s3_server.storage_options,
        "world": WORLD,
        "L": L,
        "B": B,
        "seed": SEED,
        "resume_after": RESUME_AFTER,
        "out": str(out),
    }
    run_ranks(config, tmp_path, "first")
    assert sorted(p.name for p in out.glob("state-*.json")) == [f"state-{r}.json" for r in range(WORLD)]
    run_ranks(config, tmp_path, "resume")
    for rank in range(WORLD):  # each rank read through its own disk cache
        assert any(p.is_file() and p.stat().st_size for p in (out / f"cache-{rank}").rglob("*")), rank

    lengths = [r.length for r in raws]
    per_epoch: dict[int, list[set[tuple[int, int]]]] = {0: [], 1: []}
    for rank in range(WORLD):
        batches = written(out, "first", rank) + written(out, "resume", rank)
        want = expected_plan(lengths, ids, 0, rank) + expected_plan(lengths, ids, 1, rank)
        assert len(written(out, "resume", rank)) == len(expected_plan(lengths, ids, 1, rank)) - RESUME_AFTER
        assert [int(b["epoch"]) for b in batches] == [0] * (len(want) // 2) + [1] * (len(want) // 2)
        assert len(batches) == len(want)
        for got, plan in zip(batches, want, strict=True):
            assert list(zip(got["episode_id"].tolist(), got["start"].tolist(), strict=True)) == plan
            for i, (eid, start) in enumerate(plan):
                ref = expected_segment(truth[eid], start, L)
                real = ref["mask"]  # padded slots hold no recorded value: compare the real transitions
                np.testing.assert_array_equal(got["mask"][i], real)
                np.testing.assert_array_equal(got["camera"][i, :L][real], ref["obs/camera"][real])
                np.testing.assert_array_equal(got["camera"][i, 1:][real], ref["next_obs/camera"][real])
                np.testing.assert_array_equal(got["reward"][i][real], ref["reward"][real])
        for epoch in (0, 1):
            per_epoch[epoch].append(
                {
                    (int(e), int(s))
                    for b in batches
                    if b["epoch"] == epoch
                    for e, s in zip(b["episode_id"], b["start"], strict=True)
                }
            )
    n = sum(len(starts(x)) for x in lengths)
    for shards in per_epoch.values():
        assert set().union(*shards) == {(eid, s) for eid, raw in truth.items() for s in starts(raw.length)}
        # equal shards: ceil(n / WORLD) each; disjoint except the wrapped tail of the last global batch
        assert sum(len(s) for s in shards) - n == -n % WORLD
