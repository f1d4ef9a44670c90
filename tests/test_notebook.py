"""docs/notebooks/episode_stats.ipynb runs top to bottom on a generated dataset and reports true numbers."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import numpy as np
import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbclient import NotebookClient

import episodelake as el

from .conftest import robot_schema
from .reference import random_episode

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "notebooks" / "episode_stats.ipynb"


def python3_kernel() -> str:
    """The ``python3`` kernel: ipykernel's native spec runs this interpreter, installed or not."""
    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:  # a fresh environment without an installed spec: nothing to run the notebook with
        pytest.fail("no python3 Jupyter kernel; install ipykernel (it is in the dev extra)")
    return "python3"


def test_episode_stats_notebook(tmp_path, monkeypatch):
    rng = np.random.default_rng(21)
    raws = [random_episode(rng, int(rng.integers(2, 30))) for _ in range(16)]
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(robot_schema(), path, partition_by=["task"])
    ds.append_episodes(e.as_dict(unwrap_action=True) for e in raws)
    ds.flush()
    monkeypatch.setenv("EPISODELAKE_DATASET", path)

    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb, kernel_name=python3_kernel(), timeout=600, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # histograms, success rate, per-channel statistics, failures per check

    printed = [line for o in outputs if o.output_type == "stream" for line in o.text.splitlines()]
    summary = json.loads(next(line for line in printed if line.startswith('{"episodes"')))
    assert summary["episodes"] == len(raws)
    assert summary["steps"] == sum(r.length for r in raws)
    tasks = sorted({r.meta["task"] for r in raws})
    assert sorted(summary["tasks"]) == tasks
    for task in tasks:
        mine = [r for r in raws if r.meta["task"] == task]
        got = summary["tasks"][task]
        assert got["episodes"] == len(mine)
        assert got["success_rate"] == pytest.approx(np.mean([r.meta["success"] for r in mine]))
        assert got["mean_return"] == pytest.approx(np.mean([r.reward.astype(np.float64).sum() for r in mine]))
    successes = sum(r.meta["success"] for r in raws)
    assert f"{successes} of {len(raws)} episodes succeeded" in printed

    # the quality audit, against a pure-Python reference over the raw episodes (one writer: ids in append order)
    audit = json.loads(next(line for line in printed if line.startswith('{"audit"')))["audit"]
    by_id = list(zip(ds.episode_ids.tolist(), raws, strict=True))
    pays = [i for i, r in by_id if r.meta["success"] and not r.reward.astype(np.float64).sum() > 0]
    short = [i for i, r in by_id if r.length < 10]
    wild = [(i, int(np.flatnonzero(np.abs(r.reward) > 2)[0])) for i, r in by_id if (np.abs(r.reward) > 2).any()]
    assert audit["success_pays"] == {"episode_ids": pays, "steps": None}
    assert audit["long_enough"] == {"episode_ids": short, "steps": None}
    assert audit["bounded_reward"] == {"episode_ids": [i for i, _ in wild], "steps": [t for _, t in wild]}
    assert short and wild  # the data exercises the checks
