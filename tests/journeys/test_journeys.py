"""User journeys: real scripts run as a user runs them (``python script.py ...``), checked by their exit
status, their output and the dataset they leave. Every subprocess is bounded by a hang guard (``HANG_S``),
never by how fast it should run: a loaded machine only makes them slower."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

import episodelake as el

from .pipeline import HANG_S, actor_into_learner

SCRIPTS = Path(__file__).parent / "scripts"
CLI = str(Path(sys.executable).parent / "episodelake")


def run(*cmd: str, cwd: Path, timeout: float = HANG_S, script: bool = True) -> subprocess.CompletedProcess:
    """Run a journey script (or a command) to completion; a non-zero exit fails with its output."""
    argv = [sys.executable, str(SCRIPTS / cmd[0]), *cmd[1:]] if script else list(cmd)
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def check_recording(ds: el.Dataset, truth: list[dict]) -> None:
    """Reopened recording vs the script's own ground truth: episodes, outcomes, where(), stats()."""
    assert len(ds) == len(truth)
    mine, theirs = defaultdict(list), defaultdict(list)
    for ep in ds.episodes():  # each env's episodes keep their order
        mine[int(ep.meta["env_index"])].append(ep)
    for t in truth:
        theirs[t["env_index"]].append(t)
    assert sorted(mine) == sorted(theirs)
    table = ds.sql('SELECT episode_id, "return" AS r FROM episodes').to_arrow_table().to_pydict()
    returns = dict(zip(table["episode_id"], table["r"], strict=True))
    success_ids = set()
    for i in theirs:
        assert len(mine[i]) == len(theirs[i])
        for ep, t in zip(mine[i], theirs[i], strict=True):
            assert (ep.length, bool(ep.meta["success"])) == (t["length"], t["success"])
            assert ep.meta["success"] is not None
            assert math.isclose(returns[ep.episode_id], t["return"], rel_tol=1e-12, abs_tol=1e-12)
            if t["success"]:
                success_ids.add(ep.episode_id)
    assert 0 < len(success_ids) < len(truth)  # both outcomes occur
    assert set(ds.where("success").episode_ids) == success_ids
    assert set(ds.where("NOT success").episode_ids) == {e.episode_id for e in ds.episodes()} - success_ids

    # stats() against NumPy over the raw data read back
    segs = [ep.read() for ep in ds.episodes()]
    obs = np.concatenate([s.all_obs for s in segs]).astype(np.float64)  # [rows, C, H, W]
    stats = ds.stats()
    per_channel = obs.transpose(1, 0, 2, 3).reshape(3, -1)
    for name, ref in {"mean": per_channel.mean(1), "std": per_channel.std(1), "min": per_channel.min(1)}.items():
        np.testing.assert_allclose(stats["observation"][name], ref, rtol=1e-9)
    np.testing.assert_array_equal(stats["observation"]["max"], per_channel.max(1))
    for key, values in {
        "reward": np.concatenate([s.reward for s in segs]),
        "extra/reward_dist": np.concatenate([s.extra for s in segs]),
        "length": np.array([len(s) for s in segs]),
        "return": np.array([s.reward.sum() for s in segs]),
    }.items():
        got = stats[key]
        np.testing.assert_allclose([got["mean"], got["std"]], [values.mean(), values.std()], rtol=1e-9, atol=1e-12)
        assert (got["min"], got["max"], got["count"]) == (values.min(), values.max(), len(values))


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_record_vector_env_exit_without_flush_then_reopen(mode, tmp_path):
    """Journey 1: record with RecordVectorEpisodes, exit without flush(); a new process sees every finished episode."""
    out = run("record_reach.py", "ds", "truth.json", "--mode", mode, "--commit-episodes", "8", cwd=tmp_path)
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert json.loads(out.stdout)["finished"] == len(truth) > 8  # more than one commit, the last one at exit
    check_recording(el.Dataset.open(str(tmp_path / "ds")), truth)


@pytest.mark.slow
def test_record_on_s3_with_zstd_then_train_with_forked_workers(s3_server, s3_url, tmp_path):
    """Journey 2: the same on S3 with zstd images; then train from segments() in a 2-worker fork DataLoader."""
    opts = json.dumps(s3_server.storage_options)
    for mode in ("next_step", "same_step"):
        url = f"{s3_url}-{mode}"
        args = ("--mode", mode, "--options", opts, "--compression", "zstd")
        run("record_reach.py", url, "truth.json", *args, cwd=tmp_path)
        ds = el.Dataset.open(url, storage_options=s3_server.storage_options)
        assert ds.schema["observation"].compression == "zstd"
        check_recording(ds, json.loads((tmp_path / "truth.json").read_text()))
    out = run("train_segments.py", url, "--options", opts, "--steps", "300", cwd=tmp_path)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["steps"] == 300 and math.isfinite(result["last"])
    assert result["last"] < result["first"]


def ddp_dataset(path: Path) -> int:
    """Episodes whose segment count is divisible by neither 2 nor 3; returns the count."""
    rng = np.random.default_rng(0)
    lengths = [5, 7, 9, 11, 13, 4, 6]
    while len(el.Dataset.from_episodes(episodes(rng, lengths)).segments(4)) % 6 not in (1, 5):
        lengths[-1] += 1
    el.Dataset.from_episodes(episodes(rng, lengths), str(path))
    return len(el.Dataset.open(str(path)).segments(4))


def episodes(rng: np.random.Generator, lengths: list[int]) -> list[dict]:
    return [
        {
            "observations": rng.normal(size=(n + 1, 4)).astype(np.float32),
            "actions": rng.integers(0, 3, n),
            "rewards": rng.normal(size=n).astype(np.float32),
            "terminated": True,
        }
        for n in lengths
    ]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_ddp_two_epochs_rank_equal_and_exact_resume(world, tmp_path):
    """Journey 3: DDP ranks get equal batch counts (no hang), cover every segment, and resume exactly."""
    n_segments = ddp_dataset(tmp_path / "ds")
    assert n_segments % world
    out = tmp_path / "out"
    out.mkdir()
    save_at = 2
    run("ddp_train.py", "ds", "out", "--world", str(world), "--phase", "full", "--save-at", str(save_at), cwd=tmp_path)
    run("ddp_train.py", "ds", "out", "--world", str(world), "--phase", "resume", cwd=tmp_path)
    full = [json.loads((out / f"full-rank{r}.json").read_text()) for r in range(world)]
    resumed = [json.loads((out / f"resume-rank{r}.json").read_text()) for r in range(world)]
    all_segments = {(int(s.episode_id), int(s.start)) for s in el.Dataset.open(str(tmp_path / "ds")).segments(4)}
    assert len(all_segments) == n_segments
    padded = math.ceil(n_segments / world) * world
    for epoch in (0, 1):
        batches = [[b for b in log if b["epoch"] == epoch] for log in full]
        assert len({len(b) for b in batches}) == 1  # every rank the same number of batches
        seen = [(i, s) for rank in batches for b in rank for i, s in zip(b["ids"], b["starts"], strict=True)]
        assert len(seen) == padded and set(seen) == all_segments  # disjoint up to the wrap padding
    for r in range(world):
        last_epoch = [b for b in full[r] if b["epoch"] == 1]
        assert resumed[r] == last_epoch[save_at:]


def test_online_actor_and_learner(tmp_path):
    """Journey 4: the learner sees every committed episode, each complete, while the actor records."""
    result = actor_into_learner(tmp_path, ["online_actor.py", "ds", "30"], ["online_learner.py", "ds"])
    assert result["episodes"] == result["verified"] == 30
    assert result["batches"] > 0 and result["refreshes"] > 1
    assert len(el.Dataset.open(str(tmp_path / "ds"))) == 30


@pytest.mark.slow
def test_cli_on_s3(s3_server, s3_url, tmp_path):
    """Journey 5: every dataset command reaches s3:// through --options."""
    opts = json.dumps(s3_server.storage_options)
    run("record_reach.py", s3_url, "truth.json", "--options", opts, "--compression", "zstd", cwd=tmp_path)
    truth = json.loads((tmp_path / "truth.json").read_text())
    n, successes = len(truth), sum(t["success"] for t in truth)

    def cli(*args: str) -> str:
        return run(CLI, *args, cwd=tmp_path, script=False).stdout

    info = json.loads(cli("info", s3_url, "--options", opts, "--json"))
    assert info["episodes"] == n
    query = "SELECT count(*) AS n FROM episodes WHERE success"
    rows = json.loads(cli("sql", s3_url, query, "--options", opts, "--json"))
    assert rows == [{"n": successes}]
    stats = json.loads(cli("stats", s3_url, "--options", opts, "--json", "--plot", "stats.png"))
    assert stats["episodes"]["count"] == n and stats["length"]["sum"] == sum(t["length"] for t in truth)
    cli("plot", s3_url, "plot.svg", "--options", opts)
    for image in ("stats.png", "plot.svg"):
        assert (tmp_path / image).stat().st_size > 1000
    assert (tmp_path / "plot.svg").read_text().count("<path") > 2
    cli("export", "parquet", s3_url, "eps.parquet", "--where", "success", "--options", opts, "--quiet")
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "eps.parquet").num_rows == successes
    cli("export", "minari", s3_url, "minari", "--options", opts, "--quiet")
    imported = f"{s3_url}-imported"
    cli("import", "minari", "minari", imported, "--options", opts, "--quiet")
    assert json.loads(cli("info", imported, "--options", opts, "--json"))["episodes"] == n
    copied = f"{s3_url}-copy"
    cli("copy", s3_url, copied, "--src-options", opts, "--dst-options", opts, "--where", "success", "--quiet")
    assert json.loads(cli("info", copied, "--options", opts, "--json"))["episodes"] == successes
    for url in (s3_url, imported, copied):
        assert json.loads(cli("validate", url, "--options", opts, "--json"))["ok"] is True
    report = json.loads(cli("vacuum", s3_url, "--dry-run", "--options", opts, "--json"))
    assert (report["table_files"], report["tensor_arrays"], report["unreferenced_rows"]) == ([], [], 0)  # healthy
    cli("vacuum", s3_url, "--options", opts)
    assert len(el.Dataset.open(s3_url, storage_options=s3_server.storage_options)) == n
