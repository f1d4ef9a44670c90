"""Object-store faults through a fault-injecting proxy in front of the real S3 server (SeaweedFS).

A dead endpoint (the proxy stops listening: connection refused, as from a
killed server) ends every call in a :class:`StorageError` naming the dataset
and the object: open, create, reads, the prefetch thread, writes and commits.
Transient faults (503 SlowDown, dropped connections, lost responses) lose
nothing: a fresh process reopening the dataset directly finds every committed
episode byte for byte. A writer whose flush failed while the endpoint was
down commits those episodes with its next flush once it is back.
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
from episodelake.storage.location import StorageTimeouts

from .conftest import robot_schema
from .fault_proxy import FaultProxy
from .test_s3 import assert_episode, make_episodes

ROOT = Path(__file__).resolve().parents[1]
# a dead endpoint fails a call after a few fast retries, so these tests do not wait out the defaults
FAST = {
    "connect_timeout": 2,
    "read_timeout": 5,
    "max_retries": 3,
    "initial_delay": 0.01,
    "max_delay": 0.1,
    "deadline": 15,
}


def options(proxy: FaultProxy, base: dict, timeouts: dict | None = FAST) -> dict:
    opts = proxy.storage_options(base)
    return opts if timeouts is None else {**opts, "timeouts": timeouts}


def check_in_fresh_process(url: str, opts: dict, seed: int, count: int, n: int) -> None:
    """A new process reopening ``url`` finds exactly the first ``n`` of ``make_episodes(seed, count)``."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.scripts.check_s3_episodes", url, json.dumps(opts), str(seed), str(count), str(n)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith(f"ok {n}")


def assert_names(err: el.StorageError, url: str) -> None:
    assert isinstance(err, OSError) and isinstance(err, el.EpisodeLakeError)
    assert err.dataset == url and url in str(err)
    assert err.object, "the error names the object"
    assert err.__cause__ is not None


def test_timeouts_are_validated():
    with pytest.raises(el.ArgumentError, match="max_delay"):
        StorageTimeouts(initial_delay=2, max_delay=1)
    with pytest.raises(el.ArgumentError, match="deadline"):
        StorageTimeouts(deadline=0)
    with pytest.raises(el.ArgumentError, match=r"timeouts: unknown key\(s\)"):
        el.Dataset.open("s3://episodes/x", storage_options={"timeouts": {"retries": 3}})


@pytest.mark.slow
def test_open_and_create_on_a_dead_endpoint_raise_storage_error(s3_server, s3_url):
    el.Dataset.create(robot_schema(), s3_url, storage_options=s3_server.storage_options)
    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.set_down(True)
        with pytest.raises(el.StorageError, match="unreachable") as opened:
            el.Dataset.open(s3_url, storage_options=options(proxy, s3_server.storage_options))
        assert_names(opened.value, s3_url)
        opts = options(proxy, s3_server.storage_options)
        with pytest.raises(el.StorageError) as created:
            el.Dataset.create(robot_schema(), s3_url + "-new", storage_options=opts)
        assert_names(created.value, s3_url + "-new")


def test_reads_and_prefetch_on_a_dead_endpoint_raise_storage_error(s3_server, s3_url):
    eps = make_episodes(11, 6)
    ds = el.Dataset.create(robot_schema(), s3_url, storage_options=s3_server.storage_options)
    ds.append_episodes(e.as_dict(unwrap_action=True) for e in eps)
    ds.flush()
    with FaultProxy(s3_server.endpoint) as proxy:
        reader = el.Dataset.open(s3_url, storage_options=options(proxy, s3_server.storage_options), read_only=True)
        assert_episode(reader.episode(0), eps[0])  # the table and the first tensors are read while it is up
        stream = iter(reader.segment_stream(2, batch_size=4, seed=0, prefetch=2))
        proxy.set_down(True)
        with pytest.raises(el.StorageError) as read:
            for i in range(1, len(eps)):
                reader.episode(i).read()
        assert_names(read.value, s3_url)
        with pytest.raises(el.StorageError) as sampled:  # the prefetch thread's error reaches the caller
            for _ in range(50):
                next(stream)
        assert_names(sampled.value, s3_url)


@pytest.mark.slow
def test_flush_on_a_dead_endpoint_raises_then_commits_once_it_is_back(s3_server, s3_url):
    """Camera tensors pending when the endpoint dies: flush raises StorageError (no hang), nothing partial is
    visible, and the next flush after the endpoint returns commits them."""
    eps = make_episodes(12, 8)
    with FaultProxy(s3_server.endpoint) as proxy:
        opts = options(proxy, s3_server.storage_options)
        ds = el.Dataset.create(robot_schema(), s3_url, storage_options=opts)
        ds.append_episodes(e.as_dict(unwrap_action=True) for e in eps[:4])
        ds.flush()
        ds.append_episodes(e.as_dict(unwrap_action=True) for e in eps[4:])  # pending: not yet committed
        proxy.set_down(True)
        with pytest.raises(el.StorageError) as flushed:
            ds.flush()
        assert_names(flushed.value, s3_url)
        check_in_fresh_process(s3_url, s3_server.storage_options, 12, 8, 4)  # the failed commit left nothing visible
        proxy.set_down(False)
        ds.flush()
    check_in_fresh_process(s3_url, s3_server.storage_options, 12, 8, 8)


@pytest.mark.slow
def test_exit_commit_on_a_dead_endpoint_names_the_lost_episodes_once(s3_server, s3_url):
    """A script whose endpoint died before its exit commit ends normally; one stderr line names the episodes
    not committed and the cause; nothing of them is visible."""
    with FaultProxy(s3_server.endpoint) as proxy:
        env = {**os.environ, "EXIT_STORAGE_OPTIONS": json.dumps(options(proxy, s3_server.storage_options))}
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.scripts.exit_record", s3_url, "3", "2", "--end", "wait"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proxy.set_down(True)
        _, err = proc.communicate("\n", timeout=300)
    assert proc.returncode == 0, err
    assert err.count("not committed at exit") == 1, err
    assert "2 finished episode(s)" in err and s3_url in err and "unreachable" in err, err
    assert "Traceback" not in err and "panicked" not in err, err
    check_in_fresh_process(s3_url, s3_server.storage_options, 3, 2, 0)


@pytest.mark.slow
def test_default_timeouts_end_a_dead_endpoint_in_an_error(s3_server, s3_url):
    """With the default policy (no timeouts option) a dead endpoint still ends in StorageError, not a hang."""
    el.Dataset.create(robot_schema(), s3_url, storage_options=s3_server.storage_options)
    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.set_down(True)
        with pytest.raises(el.StorageError) as opened:
            el.Dataset.open(s3_url, storage_options=options(proxy, s3_server.storage_options, timeouts=None))
        assert_names(opened.value, s3_url)


@pytest.mark.slow
def test_503s_dropped_connections_and_lost_responses_lose_nothing(s3_server, s3_url):
    """10% SlowDown, 3% dropped connections and 3% lost responses under a writer and a reader: every committed
    episode reads back byte for byte, in this process (through the faults) and in a fresh one (directly)."""
    eps = make_episodes(13, 24)
    with FaultProxy(s3_server.endpoint, slow_down=0.10, drop=0.03, lose=0.03, seed=5) as proxy:
        opts = options(proxy, s3_server.storage_options, timeouts=None)
        ds = el.Dataset.create(robot_schema(), s3_url, storage_options=opts)
        for i in range(0, len(eps), 4):
            ds.append_episodes(e.as_dict(unwrap_action=True) for e in eps[i : i + 4])
            ds.flush()
        reader = el.Dataset.open(s3_url, storage_options=opts, read_only=True)
        for i, raw in enumerate(eps):
            assert_episode(reader.episode(i), raw)
        batch = next(iter(reader.segment_stream(3, batch_size=16, seed=1)))
        assert np.isin(batch.episode_id, reader.episode_ids).all()
        assert proxy.injected["503"] > 0 and proxy.injected["drop"] > 0 and proxy.injected["lose"] > 0
    check_in_fresh_process(s3_url, s3_server.storage_options, 13, 24, 24)


def test_an_outage_after_the_descriptor_and_under_refresh_and_sql_is_a_storage_error_naming_the_endpoint(
    s3_server, s3_url
):
    """Issue 40, 2: with the Delta log unreachable after the descriptor was read, ``Dataset.open`` raised a raw
    ``OSError`` with ANSI colour codes; ``ds.refresh()`` did too with the endpoint down. Each is a StorageError
    naming the dataset and the endpoint, in plain text; a SQL read during the outage is no CorruptionError."""
    eps = make_episodes(14, 2)
    with FaultProxy(s3_server.endpoint, match="_delta_log") as proxy:
        opts = options(proxy, s3_server.storage_options)
        endpoint = opts["endpoint_url"]
        ds = el.Dataset.create(robot_schema(), s3_url, storage_options=opts)
        ds.append_episodes(e.as_dict(unwrap_action=True) for e in eps)
        ds.flush()
        proxy.set_faults(drop=1.0)  # the descriptor reads, the log does not
        with pytest.raises(el.StorageError) as opened:
            el.Dataset.open(s3_url, storage_options=opts)
        proxy.set_faults()
        proxy.set_down(True)
        with pytest.raises(el.StorageError) as refreshed:
            ds.refresh()
        with pytest.raises(el.StorageError) as queried:
            ds.sql("SELECT count(*) FROM steps").fetchall()
        for err in (opened.value, refreshed.value, queried.value):
            assert_names(err, s3_url)
            assert endpoint in str(err) and "\x1b" not in str(err), str(err)
            assert not isinstance(err, el.CorruptionError)
        proxy.set_down(False)
        ds.refresh()
        assert len(ds) == 2
