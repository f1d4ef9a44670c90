"""The ``episodelake`` command at its edges, in real subprocesses: one-line errors, --debug, closed pipes, S3.

Every case runs ``python -m episodelake.cli`` as a user's shell would and checks
the exit status, stderr and what the command left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import episodelake as el
from episodelake.integrations.plots import episode_histograms

from .conftest import build_robot_dataset, robot_schema
from .reference import random_episode
from .test_query import reference_stats

CLI = [sys.executable, "-m", "episodelake.cli"]


def run_cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=300, cwd=cwd)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The single ``episodelake: error: ...`` line a failing command prints (and nothing else)."""
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("episodelake: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory) -> tuple[str, list]:
    path = tmp_path_factory.mktemp("cli-edges") / "ds"
    raws = build_robot_dataset(str(path), seed=21, episodes=10, per_commit=5, max_length=14)
    return str(path), raws


# ---------------------------------------------------------------- errors


def test_missing_dataset_is_one_line_without_traceback(tmp_path):
    line = one_error_line(run_cli("info", str(tmp_path / "nope")))
    assert "no episodelake dataset" in line and "nope" in line
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(tmp_path, where):
    argv = ["info", str(tmp_path / "nope")]
    proc = run_cli(*(["--debug", *argv] if where == "before" else [*argv, "--debug"]))
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith("episodelake.core.errors.DatasetNotFoundError")


@pytest.mark.slow
def test_query_errors_and_bad_options(local_ds):
    path, _ = local_ds
    assert "nope" in one_error_line(run_cli("sql", path, "SELECT nope FROM episodes"))
    assert "where()" in one_error_line(run_cli("stats", path, "--where", "task = "))
    bad = run_cli("info", path, "--options", "{not json")  # a command line that does not parse: usage, status 2
    assert bad.returncode == 2 and "--options" in bad.stderr and "not valid JSON" in bad.stderr
    wrong = run_cli("import", "episodata", "x", "y", "--lenient")
    assert wrong.returncode == 2 and "do not apply to episodata" in wrong.stderr


def test_damaged_table_file_is_one_line_naming_it(local_ds, tmp_path):
    import shutil

    root = tmp_path / "damaged"
    shutil.copytree(local_ds[0], root)
    victim = sorted((root / "episodes").glob("task=*/*.parquet"))[0]
    victim.unlink()
    line = one_error_line(run_cli("sql", str(root), "SELECT count(*) FROM episodes"))
    assert victim.name in line and "missing" in line


# ---------------------------------------------------------------- closed pipes


def test_stdout_closed_before_any_output_ends_quietly(local_ds):
    path, _ = local_ds
    r, w = os.pipe()
    proc = subprocess.Popen([*CLI, "info", path], stdout=w, stderr=subprocess.PIPE, text=True)
    os.close(w)
    os.close(r)  # the reader is gone before the command writes a byte
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 141
    assert err == ""


@pytest.mark.slow
def test_head_closing_the_pipe_mid_output_ends_quietly(local_ds):
    path, _ = local_ds
    # about 2 MB of JSON rows: far more than a pipe buffer, so writes continue after head exits
    writer = subprocess.Popen(
        [*CLI, "sql", path, "SELECT range AS i FROM range(100000)", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    head = subprocess.Popen(["head", "-4"], stdin=writer.stdout, stdout=subprocess.PIPE)
    writer.stdout.close()  # only head holds the read end now
    shown, _ = head.communicate(timeout=300)
    err = writer.stderr.read()
    writer.wait(timeout=300)
    assert shown.decode().splitlines() == ["[", "  {", '    "i": 0', "  },"]
    assert writer.returncode == 141
    assert err == b""


# ---------------------------------------------------------------- every command on S3 with --options


@pytest.mark.slow  # nine CLI processes against the S3 server: about a minute on 2 cores
def test_every_command_on_s3_with_options(s3_server, s3_url, tmp_path):
    opts = json.dumps(s3_server.storage_options)
    rng = np.random.default_rng(8)
    raws = [random_episode(rng, int(rng.integers(2, 15))) for _ in range(7)]
    ds = el.Dataset.create(robot_schema(), s3_url, storage_options=s3_server.storage_options, partition_by=["task"])
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.close()

    def ok(*argv: str) -> str:
        proc = run_cli(*argv)
        assert proc.returncode == 0, (argv, proc.stderr)
        return proc.stdout

    info = json.loads(ok("info", s3_url, "--options", opts, "--json"))
    assert (info["episodes"], info["steps"]) == (len(raws), sum(r.length for r in raws))

    rows = json.loads(
        ok(
            "sql",
            s3_url,
            "SELECT (SELECT count(*) FROM steps) AS n, sum(length * length) AS s FROM episodes",
            "--options",
            opts,
            "--json",
        )
    )
    assert rows == [{"n": sum(r.length for r in raws), "s": sum(r.length**2 for r in raws)}]

    picks = [r for r in raws if r.meta["task"] == "pick"]
    hist_stats = tmp_path / "stats.png"
    got = json.loads(
        ok("stats", s3_url, "--options", opts, "--where", "task = 'pick'", "--plot", str(hist_stats), "--json")
    )
    want = reference_stats(picks)
    assert got["episodes"]["count"] == len(picks)
    np.testing.assert_allclose(got["reward"]["mean"], want["reward"]["mean"], rtol=1e-9)

    plot = tmp_path / "plot.png"
    ok("plot", s3_url, str(plot), "--options", opts, "--where", "task = 'pick'")
    reader = el.Dataset.open(s3_url, storage_options=s3_server.storage_options, read_only=True)
    assert_same_histograms(plot, reader.where("task = 'pick'"), tmp_path, bins=30)
    assert_same_histograms(hist_stats, reader.where("task = 'pick'"), tmp_path, bins=30)

    ok("export", "parquet", s3_url, str(tmp_path / "e.parquet"), "--options", opts)
    assert pq.read_table(tmp_path / "e.parquet").column("length").to_pylist() == [r.length for r in raws]

    np.savez(
        tmp_path / "d4rl.npz",
        observations=rng.normal(size=(30, 2)).astype(np.float32),
        actions=rng.normal(size=(30, 1)).astype(np.float32),
        rewards=rng.normal(size=30).astype(np.float32),
        terminals=np.arange(30) % 10 == 9,
    )
    ok("import", "d4rl", str(tmp_path / "d4rl.npz"), s3_url + "-imported", "--options", opts, "--quiet")
    imported = el.Dataset.open(s3_url + "-imported", storage_options=s3_server.storage_options)
    assert (len(imported), imported.num_steps) == (3, 30)

    ok("copy", s3_url, s3_url + "-copy", "--src-options", opts, "--dst-options", opts, "--quiet")
    copy = el.Dataset.open(s3_url + "-copy", storage_options=s3_server.storage_options)
    assert copy.episode_ids.tolist() == reader.episode_ids.tolist()

    assert ok("validate", s3_url + "-copy", "--options", opts).rstrip().endswith("OK")
    report = json.loads(ok("vacuum", s3_url, "--options", opts, "--dry-run", "--json"))
    assert report["dry_run"] and report["table_files"] == [] and report["tensor_arrays"] == []
    # without --options the same command fails in one line instead of a traceback (wrong endpoint: refused)
    bad = json.dumps({**s3_server.storage_options, "endpoint_url": "http://127.0.0.1:9"})
    assert one_error_line(run_cli("info", s3_url, "--options", bad))


# ---------------------------------------------------------------- plots show the histogram


def assert_same_histograms(png: Path, collection, tmp_path: Path, bins: int) -> None:
    """``png`` is the picture of ``collection``'s histograms: blue bars in both panels, pixel-equal to an
    in-process render whose counts are checked against NumPy in test_exporters."""
    import matplotlib.image

    got = matplotlib.image.imread(png)
    ref = tmp_path / "reference.png"
    drawn = episode_histograms(collection, ref, bins=bins)
    assert drawn["length"][0].sum() == len(collection)
    np.testing.assert_array_equal(got, matplotlib.image.imread(ref))
    # the bars are matplotlib's default blue (C0); each panel holds a substantial area of them
    blue = np.abs(got[..., :3] - np.array([0x1F, 0x77, 0xB4]) / 255).max(axis=-1) < 0.02
    width = blue.shape[1]
    for panel in (blue[:, : width // 2], blue[:, width // 2 :]):
        assert panel.mean() > 0.01


@pytest.mark.slow
def test_plot_and_stats_plot_draw_the_histograms(local_ds, tmp_path):
    path, raws = local_ds
    out = tmp_path / "p.png"
    assert run_cli("plot", path, str(out), "--where", "task = 'pick'", "--bins", "4").returncode == 0
    ds = el.Dataset.open(path, read_only=True)
    assert_same_histograms(out, ds.where("task = 'pick'"), tmp_path, bins=4)
    other = tmp_path / "all.png"
    assert run_cli("stats", path, "--plot", str(other)).returncode == 0
    assert_same_histograms(other, ds, tmp_path, bins=30)
    import matplotlib.image

    assert not np.array_equal(matplotlib.image.imread(out), matplotlib.image.imread(other))
    assert len(raws) == len(ds)
