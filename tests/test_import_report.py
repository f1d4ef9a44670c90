"""Importer hardening shared by every importer (issue 43, item 4): the summary, --dry-run, the quality gate
applied as the import goes on, rejects counted.

The source is a D4RL ``.npz`` written with NumPy (D4RL's own file form); the expected episodes are cut
from the arrays the test wrote.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

import episodelake as el
from episodelake.importers import import_dataset, import_report


def write_d4rl(path, lengths, seed=0, tail=0):
    """A D4RL file of terminal episodes of ``lengths``, then ``tail`` rows without an end flag; episode i's
    rewards are all ``i % 3 - 1`` (-1, 0, 1)."""
    rng = np.random.default_rng(seed)
    n = sum(lengths) + tail
    terminals = np.zeros(n, bool)
    terminals[np.cumsum(lengths) - 1] = True
    rewards = np.concatenate([np.full(k, i % 3 - 1, np.float32) for i, k in enumerate([*lengths, tail])])
    np.savez(
        path,
        observations=rng.normal(size=(n, 3)).astype(np.float32),
        actions=rng.normal(size=(n, 2)).astype(np.float32),
        rewards=rewards,
        terminals=terminals,
    )
    return path


LENGTHS = [5, 1, 7, 3, 9, 4, 6, 2, 8, 5, 3, 6]


def test_rejected_episodes_are_left_out_and_counted_and_the_import_goes_on(tmp_path):
    src = write_d4rl(tmp_path / "src.npz", LENGTHS)
    checks = [
        el.Check("positive", '"return" >= 0'),  # rejects every episode with reward -1 (i % 3 == 0)
        el.Check("short", "length <= 7", on_fail="quarantine"),  # holds back episodes longer than 7,
    ]
    report = import_report("d4rl", src, str(tmp_path / "ds"), checks=checks, progress=False)
    kept = [i for i in range(len(LENGTHS)) if i % 3 != 0]
    held = [i for i in kept if LENGTHS[i] > 7]
    ds = report.dataset
    assert sorted(int(e.meta["source_episode"]) for e in ds.episodes()) == [i for i in kept if i not in held]
    assert sorted(int(e.meta["source_episode"]) for e in ds.quality.quarantine().episodes()) == held
    assert report.skipped == {"rejected: positive": len(LENGTHS) - len(kept)}
    assert (report.episodes, report.steps, report.quarantined) == (len(kept), sum(LENGTHS[i] for i in kept), len(held))
    assert report.bytes_in == src.stat().st_size
    assert report.bytes_out == sum(f.stat().st_size for f in (tmp_path / "ds").rglob("*") if f.is_file())
    assert f"imported {len(kept)} episodes" in str(report) and "skipped 4: rejected: positive" in str(report)
    # import_dataset keeps its all-or-nothing promise: the first rejection ends it and leaves nothing
    with pytest.raises(el.QualityError, match="positive"):
        import_dataset("d4rl", src, str(tmp_path / "strict"), checks=checks, progress=False)
    assert not (tmp_path / "strict").exists()
    with pytest.raises(el.QualityError, match="positive"):
        import_report("d4rl", src, str(tmp_path / "strict"), checks=checks, on_reject="raise", progress=False)
    assert not (tmp_path / "strict").exists()


@pytest.mark.parametrize("commit_bytes", [None, 1])
def test_a_rejecting_constraint_mid_chunk_keeps_the_episodes_around_it(tmp_path, commit_bytes):
    """Chunks of 4: rejections at a chunk's first and last episode and in its middle; the rest is kept, also
    when the chunk's episodes before a rejection were already committed (``commit_bytes=1``: one per commit)."""
    from episodelake.importers.report import ImportReport, gated_write

    rng = np.random.default_rng(2)
    schema = el.DatasetSchema(
        [
            el.FieldSpec("observation", (3,), "float32"),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward", min=0),  # a gate the dataset declares
            el.FieldSpec("source_episode", (), "int64", role="meta"),
        ]
    )
    episodes = [
        {
            "observations": rng.normal(size=(k + 1, 3)).astype(np.float32),
            "actions": rng.normal(size=(k, 2)).astype(np.float32),
            "rewards": np.full(k, i % 3 - 1, np.float32),
            "terminated": True,
            "meta": {"source_episode": i},
        }
        for i, k in enumerate(LENGTHS)
    ]
    options = {} if commit_bytes is None else {"commit_bytes": commit_bytes}
    ds = el.Dataset.create(schema, str(tmp_path / "gated"), **options)
    report = ImportReport("test", "memory", None)
    gated_write(ds, schema, episodes, report, chunk_episodes=4)
    ds.flush()
    kept = [i for i in range(len(LENGTHS)) if i % 3 != 0]
    assert sorted(int(e.meta["source_episode"]) for e in ds.episodes()) == kept
    assert report.skipped == {"rejected: reward: min": len(LENGTHS) - len(kept)}
    assert (report.episodes, report.steps) == (len(kept), sum(LENGTHS[i] for i in kept))


def test_dry_run_writes_nothing_and_counts_what_would_be_imported(tmp_path):
    src = write_d4rl(tmp_path / "src.npz", LENGTHS, seed=1, tail=1)  # one unfinished row: no transition
    dst = tmp_path / "ds"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dry = import_report("d4rl", src, str(dst), dry_run=True, progress=False)
        real = import_report("d4rl", src, str(tmp_path / "real"), progress=False)
    assert not dst.exists() and dry.dataset is None and dry.bytes_out is None
    assert (dry.episodes, dry.steps, dry.skipped) == (real.episodes, real.steps, real.skipped)
    assert real.skipped == {"source episodes with no transition to keep": 1}
    assert str(dry).startswith(f"would import {real.episodes} episodes")


def test_cli_dry_run_and_check_in_a_subprocess(tmp_path):
    src = write_d4rl(tmp_path / "src.npz", LENGTHS)
    dst = tmp_path / "ds"
    cmd = [sys.executable, "-m", "episodelake.cli", "import", "d4rl", str(src), str(dst), "--quiet"]
    dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert not dst.exists()
    assert f"would import {len(LENGTHS)} episodes ({sum(LENGTHS)} steps)" in dry.stdout
    run = subprocess.run([*cmd, "--check", 'positive="return" >= 0'], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "skipped 4: rejected: positive" in run.stdout
    assert len(el.Dataset.open(str(dst))) == 8
