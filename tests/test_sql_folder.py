"""The queries of the top-level ``sql/`` folder answer what their comments say (issue 45, item 5).

One generated dataset with known answers: every answer is computed here in
NumPy from the arrays the episodes were made of, and each query's rows must
equal it. Each file runs through ``Dataset.sql`` with its ``$name`` parameters
and through ``episodelake sql PATH --file ... --param ...``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import episodelake as el
from episodelake.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
SQL = ROOT / "sql"
TASKS = ("pick", "place", "push")
N = 24


def _episodes() -> list[dict[str, Any]]:
    """24 episodes: lengths 1-30, three tasks, some frozen cameras, stalled clocks and odd outcomes."""
    rng = np.random.default_rng(45)
    out = []
    for i in range(N):
        length = int(rng.integers(1, 31))
        frames = rng.integers(0, 256, (length + 1, 4, 4), dtype=np.uint8)
        t = np.cumsum(rng.uniform(0.5, 1.5, length + 1))
        if i % 5 == 1 and length >= 8:  # frozen for 5 transitions from step 2 (frames 2..7 equal)
            frames[3:8] = frames[2]
        if i % 7 == 3 and length >= 4:  # the clock stalls at step 1 and goes back at step 3
            t[2] = t[1]
            t[4] = t[3] - 0.25
        reward = rng.normal(0.0, 1.0, length).astype(np.float32)
        success = bool(rng.random() < 0.5)
        if i == 4:
            success, reward = True, -np.abs(reward) - 0.1  # a success without a positive return
        out.append(
            {
                "observations": {"camera": frames, "t": t},
                "actions": rng.normal(size=length).astype(np.float32),
                "rewards": reward,
                "terminated": bool(i % 2),
                "truncated": not i % 2,
                "meta": {"task": TASKS[i % 3], "success": success},
            }
        )
    return out


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[el.Dataset, list[dict[str, Any]], list[int]]:
    """The dataset on disk, its episodes as written, and their ids in the same order."""
    schema = el.DatasetSchema(
        [
            el.FieldSpec("camera", (4, 4), "uint8"),  # 16 bytes a step: a table column, so in `steps`
            el.FieldSpec("t", (), "float64"),
            el.FieldSpec("action", (), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("task", (), "str", role="meta"),
            el.FieldSpec("success", (), "bool", role="meta"),
        ]
    )
    path = tmp_path_factory.mktemp("sql") / "lake"
    episodes = _episodes()
    ds = el.Dataset.create(schema, str(path))
    ds.append_episodes(episodes)
    ds.flush()
    ids = [int(i) for i in ds.episode_ids]
    return ds, episodes, ids


def _run(ds: el.Dataset, name: str, **params: Any) -> list[dict[str, Any]]:
    result = ds.sql((SQL / name).read_text(), params or None)
    assert result is not None
    return result.to_arrow_table().to_pylist()


def _returns(episodes: list[dict[str, Any]]) -> np.ndarray:
    return np.array([float(np.sum(e["rewards"].astype(np.float64))) for e in episodes])


def test_success_by_task(lake):
    ds, episodes, _ = lake
    returns = _returns(episodes)
    want = []
    for task in sorted(TASKS):
        pick = [i for i, e in enumerate(episodes) if e["meta"]["task"] == task]
        want.append(
            {
                "task": task,
                "episodes": len(pick),
                "success_rate": float(np.mean([episodes[i]["meta"]["success"] for i in pick])),
                "mean_return": float(np.mean(returns[pick])),
                "min_return": float(np.min(returns[pick])),
                "max_return": float(np.max(returns[pick])),
            }
        )
    got = _run(ds, "success_by_task.sql")
    assert [r["task"] for r in got] == [w["task"] for w in want]
    for g, w in zip(got, want, strict=True):
        assert g["episodes"] == w["episodes"]
        for key in ("success_rate", "mean_return", "min_return", "max_return"):
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-5), key


@pytest.mark.parametrize("width", [5, 10])
def test_length_distribution(lake, width):
    ds, episodes, _ = lake
    lengths = np.array([len(e["rewards"]) for e in episodes])
    bins, counts = np.unique(lengths // width * width, return_counts=True)
    got = _run(ds, "length_distribution.sql", bin_width=width)
    assert [(r["bin_start"], r["episodes"]) for r in got] == list(zip(bins.tolist(), counts.tolist(), strict=True))


def test_return_distribution(lake):
    ds, episodes, _ = lake
    bins, counts = np.unique(np.floor(_returns(episodes) / 0.5) * 0.5, return_counts=True)
    got = _run(ds, "return_distribution.sql", bin_width=0.5)
    assert [r["episodes"] for r in got] == counts.tolist()
    assert [r["bin_start"] for r in got] == pytest.approx(bins.tolist())


def test_length_return_summary(lake):
    ds, episodes, _ = lake
    lengths = np.array([len(e["rewards"]) for e in episodes], dtype=np.float64)
    returns = _returns(episodes)
    (got,) = _run(ds, "length_return_summary.sql")
    assert got["episodes"] == N
    for name, values in (("length", lengths), ("return", returns)):
        want = {
            f"mean_{name}": np.mean(values),
            f"min_{name}": np.min(values),
            f"median_{name}": np.quantile(values, 0.5),
            f"p90_{name}": np.quantile(values, 0.9),
            f"max_{name}": np.max(values),
        }
        for key, value in want.items():
            assert got[key] == pytest.approx(float(value), rel=1e-5, abs=1e-5), key


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """(first index, length) of each run of True in ``flags``."""
    out, start = [], None
    for i, flag in enumerate([*flags.tolist(), False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            out.append((start, i - start))
            start = None
    return out


@pytest.mark.parametrize("min_repeat", [1, 3, 5])
def test_frozen_camera(lake, min_repeat):
    ds, episodes, ids = lake
    want = []
    for eid, e in zip(ids, episodes, strict=True):
        frames = e["observations"]["camera"]
        same = np.all(frames[1:] == frames[:-1], axis=(1, 2))
        runs = [r for r in _runs(same) if r[1] >= min_repeat]
        if runs:
            want.append({"episode_id": eid, "first_step": runs[0][0], "longest_freeze": max(n for _, n in runs)})
    want.sort(key=lambda r: r["episode_id"])
    assert want, "the generated data has frozen cameras"
    assert _run(ds, "frozen_camera.sql", min_repeat=min_repeat) == want


def test_stalled_timestamps(lake):
    ds, episodes, ids = lake
    want = []
    for eid, e in zip(ids, episodes, strict=True):
        t = e["observations"]["t"]
        stalled = np.flatnonzero(t[1:] <= t[:-1])
        if len(stalled):
            want.append({"episode_id": eid, "first_step": int(stalled[0]), "stalled_steps": len(stalled)})
    want.sort(key=lambda r: r["episode_id"])
    assert want, "the generated data has stalled clocks"
    assert _run(ds, "stalled_timestamps.sql") == want


def test_common_checks(lake):
    ds, episodes, ids = lake
    returns = _returns(episodes)
    want = []
    for eid, e, ret in zip(ids, episodes, returns, strict=True):
        if len(e["rewards"]) < 5:
            want.append(("too_short", eid))
        if not math.isfinite(ret):
            want.append(("non_finite_return", eid))
        if e["meta"]["success"] and ret <= 0:
            want.append(("success_without_return", eid))
    got = [(r["failed_check"], r["episode_id"]) for r in _run(ds, "common_checks.sql", min_length=5)]
    assert got == sorted(want)
    assert ("success_without_return", ids[4]) in got


def test_every_file_says_what_it_answers_and_is_tested():
    tested = {
        "success_by_task.sql",
        "length_distribution.sql",
        "return_distribution.sql",
        "length_return_summary.sql",
        "frozen_camera.sql",
        "stalled_timestamps.sql",
        "common_checks.sql",
    }
    files = {p.name for p in SQL.glob("*.sql")}
    assert files == tested, f"sql/ files without a test, or tests without a file: {files ^ tested}"
    for name in files:
        text = (SQL / name).read_text()
        assert text.startswith("-- "), f"sql/{name} does not open with a comment saying what it answers"
        assert f"--file sql/{name}" in text, f"sql/{name} does not show its command line"


def test_the_command_line_runs_a_file_with_params(lake, capsys):
    ds, _, _ = lake
    path = ds.location.url
    assert main(["sql", path, "--file", str(SQL / "length_distribution.sql"), "--param", "bin_width=10", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sum(r["episodes"] for r in rows) == N
    assert main(["sql", path, "--file", str(SQL / "success_by_task.sql")]) == 0
    assert "success_rate" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["sql", "X"],  # neither SQL nor --file
        ["sql", "X", "SELECT 1", "--file", "sql/success_by_task.sql"],  # both
        ["sql", "X", "--file", "sql/length_distribution.sql", "--param", "no-equals"],
    ],
)
def test_the_command_line_refuses_a_wrong_use(argv, capsys):
    try:
        status = main(argv)
    except SystemExit as stop:  # found while parsing
        status = stop.code
    assert status == 2
    assert "error" in capsys.readouterr().err
