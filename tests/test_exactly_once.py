"""Exactly once under faults: a commit whose outcome is unknown is resolved before anything else is committed.

``write/commit.py``: a commit that fails after its log write may have been
sent (its reply lost) is *in doubt*; before the writer commits again it asks
the log whether a commit with that attempt's token landed after the version
it read (``CommitSink.settle``). Landed: its episodes count as committed and
leave the pending ones; not landed: they stay pending; the log unreadable:
``StorageError``, nothing committed. So a grown batch (more episodes finished
meanwhile) never commits an episode a second time.

Through ``tests/fault_proxy.py`` in front of the real S3 server: the reply to
the log-entry PUT is lost and the endpoint goes down as it arrives (the
commit landed, the writer cannot hear of it), then the endpoint comes back and
the writer commits a grown batch. A hypothesis property runs random fault
schedules (lost replies, outages, dropped connections, 503s between episodes
of random batch shapes, step-by-step and bulk) and asserts that every finished
episode is in the table exactly once, checked by ``maintenance.validate()``
and by a fresh process reading the dataset directly.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

from .conftest import robot_schema
from .fault_proxy import FaultProxy
from .test_s3 import make_episodes
from .test_s3_faults import assert_names, check_in_fresh_process, options
from .workers.common import write_stepwise

LOG_PUT = ("PUT ", "_delta_log/0", ".json")  # a commit's log entry (a conditional PUT)
_URLS = itertools.count()


def _add(ds: el.Dataset, raws: list, bulk: bool) -> None:
    """Finish ``raws`` as pending episodes: one bulk call, or step by step."""
    if bulk:
        ds.append_episodes([e.as_dict(unwrap_action=True) for e in raws])
        return
    for raw in raws:
        write_stepwise(ds, raw)


def _assert_once(ds: el.Dataset, n: int) -> None:
    ds.refresh()
    ids = np.asarray(ds.episode_ids)
    assert len(ids) == n and len(np.unique(ids)) == n, f"{len(ids)} episodes, {len(np.unique(ids))} ids, {n} finished"
    report = ds.maintenance.validate()
    assert report.ok, report


def test_a_lost_commit_reply_then_an_outage_then_a_grown_batch_commits_each_episode_once(s3_server, s3_url):
    """The issue's reproduction: the reply to the log-entry PUT is lost, the endpoint refuses connections, the
    writer finishes one more episode and flushes once the endpoint is back: both episodes are in the table
    once each (on fd0b29e the first was in it twice and validate() failed)."""
    eps = make_episodes(31, 3)
    with FaultProxy(s3_server.endpoint) as proxy:
        ds = el.Dataset.create(robot_schema(), s3_url, storage_options=options(proxy, s3_server.storage_options))
        _add(ds, eps[:1], bulk=True)
        proxy.fail_next("lose-down", *LOG_PUT)
        with pytest.raises(el.StorageError) as flushed:
            ds.flush()
        assert proxy.went_down.is_set(), "the log-entry PUT went through the proxy"
        assert_names(flushed.value, s3_url)
        proxy.set_down(False)
        _add(ds, eps[1:2], bulk=True)  # the grown batch: the one in doubt and a new one
        ds.flush()
        _assert_once(ds, 2)
        _add(ds, eps[2:], bulk=True)
        ds.flush()
        _assert_once(ds, 3)
    check_in_fresh_process(s3_url, s3_server.storage_options, 31, 3, 3)


def test_a_commit_in_doubt_is_resolved_not_guessed_while_the_log_is_unreadable(s3_server, s3_url):
    """While the log cannot be read the next flush raises StorageError and commits nothing; the step-by-step
    writer's commit that did land is then found, and its episode stays once in the table."""
    eps = make_episodes(32, 2)
    with FaultProxy(s3_server.endpoint) as proxy:
        ds = el.Dataset.create(robot_schema(), s3_url, storage_options=options(proxy, s3_server.storage_options))
        _add(ds, eps[:1], bulk=False)
        proxy.fail_next("lose-down", *LOG_PUT)
        with pytest.raises(el.StorageError):
            ds.flush()
        _add(ds, eps[1:], bulk=False)
        with pytest.raises(el.StorageError) as again:  # still down: the outcome stays unknown
            ds.flush()
        assert_names(again.value, s3_url)
        proxy.set_down(False)
        ds.flush()
        _assert_once(ds, 2)
    check_in_fresh_process(s3_url, s3_server.storage_options, 32, 2, 2)


FAULTS = st.sampled_from([None, "lose-down", "lose", "drop", "503", "down"])
STEP = st.tuples(st.integers(1, 3), st.booleans(), FAULTS)  # episodes finished, bulk?, the fault of the flush


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(schedule=st.lists(STEP, min_size=1, max_size=4))
def test_every_finished_episode_is_committed_exactly_once_under_random_faults(s3_server, s3_url, schedule):
    """Random fault schedules: before each flush a fault on the log-entry PUT (its reply lost, with or without
    the endpoint going down as it arrives; the connection dropped; a 503) or the endpoint down; each flush
    either commits or raises StorageError; at the end, with the endpoint back, one flush commits the rest and
    every finished episode is in the table exactly once."""
    url = f"{s3_url}-{next(_URLS)}"
    total = sum(n for n, _, _ in schedule)
    eps = make_episodes(33, total)
    done = 0
    with FaultProxy(s3_server.endpoint) as proxy:
        ds = el.Dataset.create(robot_schema(), url, storage_options=options(proxy, s3_server.storage_options))
        for n, bulk, fault in schedule:
            _add(ds, eps[done : done + n], bulk)
            done += n
            if fault == "down":
                proxy.set_down(True)
            elif fault is not None:
                proxy.fail_next(fault, *LOG_PUT)
            try:
                ds.flush()
            except el.StorageError as err:
                assert_names(err, url)
            proxy.set_down(False)
            proxy.went_down.clear()
        ds.flush()
        _assert_once(ds, total)
    check_in_fresh_process(url, s3_server.storage_options, 33, total, total)
