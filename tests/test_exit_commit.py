"""Finished episodes commit at interpreter exit (normal, uncaught exception, Ctrl-C).

SIGKILL loses only uncommitted ones.

Each case runs tests/scripts/exit_record.py in a real subprocess that never
calls flush()/close(), checks its exit status, then reopens the dataset here and
compares every episode with the ground truth regenerated from the seed
(tests/workers/common.episode). Ctrl-C is a real SIGINT sent once the script
printed ``ready``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import episodelake as el

from .workers.common import assert_all_match, episode

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "exit_record.py"
SEED = 7


@pytest.fixture(params=["disk", "s3"])
def target(request, tmp_path) -> tuple[str, dict]:
    """(dataset URL, storage options) on local disk or the test S3 server."""
    if request.param == "disk":
        return str(tmp_path / "ds"), {}
    server = request.getfixturevalue("s3_server")
    return request.getfixturevalue("s3_url"), server.storage_options


def start(url: str, options: dict, n: int, *flags: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EXIT_STORAGE_OPTIONS": json.dumps(options)}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), url, str(SEED), str(n), *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def wait_ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    if line != "ready\n":
        proc.kill()
        pytest.fail(f"script did not get ready: {line!r}\n{proc.communicate(timeout=600)[1]}")


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


def reopen(url: str, options: dict) -> el.Dataset:
    return el.Dataset.open(url, storage_options=options, read_only=True)


def check_episodes(url: str, options: dict, count: int) -> None:
    assert_all_match(reopen(url, options), [episode(SEED, i) for i in range(count)])


@pytest.mark.parametrize("holder", ["global", "local"])
@pytest.mark.slow
def test_normal_exit_commits_finished_episodes(target, holder):
    url, options = target
    proc = start(url, options, 5, "--holder", holder, "--open")
    wait_ready(proc)
    status, err = finish(proc)
    assert status == 0, err
    assert err == ""
    check_episodes(url, options, 5)  # the still running 6th episode is not committed


@pytest.mark.slow
def test_uncaught_exception_commits_finished_episodes(target):
    url, options = target
    proc = start(url, options, 4, "--end", "raise")
    wait_ready(proc)
    status, err = finish(proc)
    assert status == 1
    assert err.rstrip().endswith("RuntimeError: the user's script failed"), err
    check_episodes(url, options, 4)


@pytest.mark.slow
def test_ctrl_c_commits_finished_episodes(target):
    url, options = target
    proc = start(url, options, 4, "--end", "wait", "--open")
    wait_ready(proc)
    proc.send_signal(signal.SIGINT)
    status, err = finish(proc)
    assert status == -signal.SIGINT, err
    assert "KeyboardInterrupt" in err and "episodelake:" not in err
    check_episodes(url, options, 4)


@pytest.mark.slow
def test_ctrl_c_while_recording_commits_each_finished_episode_once(tmp_path):
    # Small commits: the SIGINT often lands inside one. The dataset must hold exactly the episodes
    # 0..k-1 for some k >= the count finished before the signal: none lost, none twice, none torn.
    url = str(tmp_path / "ds")
    proc = start(url, {}, 6, "--end", "loop", "--commit-episodes", "3")
    wait_ready(proc)
    proc.send_signal(signal.SIGINT)
    status, err = finish(proc)
    assert status == -signal.SIGINT, err
    ds = reopen(url, {})
    assert len(ds) >= 6
    check_episodes(url, {}, len(ds))


@pytest.mark.slow
def test_ctrl_c_inside_a_commit_never_commits_an_episode_twice(tmp_path):
    # The SIGINT arrives right after the first commit (episodes 0-2) was recorded; the interrupt must wait
    # until the sink forgot them, or the exit commit would store them a second time.
    url = str(tmp_path / "ds")
    proc = start(url, {}, 6, "--commit-episodes", "3", "--sigint-in-commit")
    status, err = finish(proc)
    assert status == -signal.SIGINT, err
    assert "KeyboardInterrupt" in err
    check_episodes(url, {}, 3)


@pytest.mark.slow
def test_sigkill_loses_only_uncommitted_episodes(target):
    url, options = target
    proc = start(url, options, 10, "--end", "wait", "--commit-episodes", "4")
    wait_ready(proc)
    proc.kill()
    status, _ = finish(proc)
    assert status == -signal.SIGKILL
    check_episodes(url, options, 8)  # two automatic commits of 4; episodes 8 and 9 were only pending


def test_episode_awaiting_required_meta_at_exit_is_named_and_the_rest_commit(tmp_path):
    url = str(tmp_path / "ds")
    proc = start(url, {}, 3, "--await-last")
    wait_ready(proc)
    status, err = finish(proc)
    assert status == 0, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("episodelake: not committed at exit: EpisodeWriter(")
    assert "awaiting meta ['success']" in lines[0] and "'index': 2" in lines[0]
    check_episodes(url, {}, 2)


def _child_reads(ds: el.Dataset, queue) -> None:
    queue.put(len(ds))  # a read in the child; then the child exits through threading's exit hooks


def test_a_forked_child_never_commits_the_parents_episodes(tmp_path):
    import multiprocessing

    from .workers.common import crash_schema, write_stepwise

    path = str(tmp_path / "ds")
    ds = el.Dataset.create(crash_schema(), path)
    for i in range(3):
        write_stepwise(ds, episode(SEED, i))
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_reads, args=(ds, queue))
    child.start()
    seen = queue.get(timeout=600)
    child.join(timeout=600)
    assert child.exitcode == 0
    assert seen == 0  # the parent's pending episodes are not the child's to commit
    assert el.Dataset.open(path).version == 0
    ds.flush()
    assert_all_match(el.Dataset.open(path), [episode(SEED, i) for i in range(3)])
