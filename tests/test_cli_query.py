"""The info / sql / stats / history subcommands, checked against NumPy over the raw episodes."""

from __future__ import annotations

import json

import numpy as np
import pytest

import episodelake as el
from episodelake.cli.main import main

from .conftest import robot_schema
from .reference import random_episode
from .test_query import reference_stats


@pytest.fixture
def two_commits(tmp_path):
    """A dataset on disk written in two commits; returns (path, first batch, second batch)."""
    rng = np.random.default_rng(11)
    first = [random_episode(rng, int(rng.integers(1, 25))) for _ in range(6)]
    second = [random_episode(rng, int(rng.integers(1, 25))) for _ in range(5)]
    path = str(tmp_path / "cli")
    ds = el.Dataset.create(robot_schema(), path, partition_by=["task"])
    for batch in (first, second):
        ds.append_episodes(e.as_dict(unwrap_action=True) for e in batch)
        ds.flush()
    return path, first, second


def run_json(capsys, *argv: str):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_info(two_commits, capsys):
    path, first, second = two_commits
    raws = first + second
    info = run_json(capsys, "info", path)
    assert info["episodes"] == len(raws)
    assert info["steps"] == sum(r.length for r in raws)
    assert info["version"] == info["latest_version"] == 2
    assert info["partition_by"] == ["task"]
    assert info["table_bytes"] > 0 and info["tensor_bytes"] > 0
    stored = {f["key"]: f["storage"] for f in info["schema"]}
    assert stored == {
        "observation/state": "table",
        "observation/camera": "tensor",
        "action": "table",
        "reward": "table",
        "task": "meta",
        "success": "meta",
    }
    old = run_json(capsys, "info", path, "--version", "1")
    assert (old["episodes"], old["version"]) == (len(first), 1)
    assert main(["info", path]) == 0
    text = capsys.readouterr().out
    assert f"{len(raws)} episodes" in text and "observation/camera" in text


def test_sql(two_commits, capsys):
    path, first, second = two_commits
    raws = first + second
    query = "SELECT task, count(*) AS n, sum(length) AS steps FROM episodes GROUP BY task ORDER BY task"
    rows = run_json(capsys, "sql", path, query)
    tasks = sorted({r.meta["task"] for r in raws})
    assert rows == [
        {
            "task": t,
            "n": sum(r.meta["task"] == t for r in raws),
            "steps": sum(r.length for r in raws if r.meta["task"] == t),
        }
        for t in tasks
    ]
    # time travel and --where restrict what the views hold
    assert run_json(capsys, "sql", path, "SELECT count(*) AS n FROM steps", "--version", "1") == [
        {"n": sum(r.length for r in first)}
    ]
    assert run_json(capsys, "sql", path, "SELECT count(*) AS n FROM episodes", "--where", "success") == [
        {"n": sum(r.meta["success"] for r in raws)}
    ]
    assert main(["sql", path, query]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["task", "n", "steps"]
    assert lines[-1] == f"({len(tasks)} rows)"


def test_sql_error_exit_status(two_commits, capsys):
    path, _, _ = two_commits
    assert main(["sql", path, "SELECT nope FROM episodes"]) == 1
    assert "nope" in capsys.readouterr().err
    assert main(["stats", path, "--where", "task = "]) == 1
    assert "where()" in capsys.readouterr().err


def test_stats(two_commits, capsys):
    path, first, second = two_commits
    raws = first + second
    got = run_json(capsys, "stats", path, "--where", "task = 'pick'")
    subset = [r for r in raws if r.meta["task"] == "pick"]
    want = reference_stats(subset)
    assert got["episodes"]["count"] == len(subset)
    for key, ref in want.items():
        assert got[key]["count"] == ref["count"]
        for m in ("mean", "std", "min", "max"):
            np.testing.assert_allclose(got[key][m], np.squeeze(ref[m]), rtol=1e-9, atol=1e-9, err_msg=f"{key}/{m}")
    only = run_json(capsys, "stats", path, "--fields", "reward")
    assert set(only) == {"episodes", "length", "return", "reward"}
    assert main(["stats", path]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{len(raws)} episodes")
    assert sum(line.startswith("observation/camera") for line in text.splitlines()) == 3  # one row per channel


def test_stats_plot(two_commits, capsys, tmp_path):
    path = two_commits[0]
    out = tmp_path / "hist.png"
    assert main(["stats", path, "--where", "task = 'pick'", "--plot", str(out)]) == 0
    assert f"wrote return/length histograms to {out}" in capsys.readouterr().out
    from .test_cli_edges import assert_same_histograms

    assert_same_histograms(out, el.Dataset.open(path).where("task = 'pick'"), tmp_path, bins=30)


def test_history(two_commits, capsys):
    path, first, second = two_commits
    entries = run_json(capsys, "history", path)
    assert [e["version"] for e in entries] == [2, 1, 0]
    assert [e["operationMetrics"].get("num_added_rows") for e in entries[:2]] == [len(second), len(first)]
    assert main(["history", path]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:2] == ["version", "time"]
