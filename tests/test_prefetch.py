"""The stream's prefetcher: several batches built at once, returned exactly as a stream without prefetch would.

Every stream here is compared with the same stream built with ``prefetch=0``
(batches planned and built one at a time in the caller's thread): the same
segments, the same values, the same resume states, on local disk and on the
real local S3 server behind a latency proxy (so batches really are in flight
together when a stream is read, closed or fails).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import episodelake as el
from episodelake.sampling import prefetch
from episodelake.sampling.prefetch import in_flight

from .latency_proxy import LatencyProxy
from .test_sampling import check_batch, make_dataset, raw_by_id, take

L, B = 4, 5


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return make_dataset(str(tmp_path_factory.mktemp("prefetch") / "ds"), writers=2)


@pytest.fixture(scope="module")
def s3_lake(s3_server):
    return make_dataset("s3://episodes/prefetch-lake", writers=2, storage_options=s3_server.storage_options)


@pytest.fixture
def slow_s3(s3_lake, s3_server):
    """The S3 dataset read through a proxy adding 20 ms per request, with its raw episodes by id."""
    ds, raw = s3_lake
    with LatencyProxy(s3_server.endpoint, delay_s=0.02) as proxy:
        slow = el.Dataset.open(ds.location.url, storage_options=proxy.storage_options(s3_server.storage_options))
        yield slow, raw_by_id(slow, raw)


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.buffers().keys() == b.buffers().keys()
        for key, value in a.buffers().items():
            np.testing.assert_array_equal(value, b.buffers()[key], err_msg=key)
        np.testing.assert_array_equal(a.episode_id, b.episode_id)
        np.testing.assert_array_equal(a.start, b.start)


SAMPLERS = {
    "uniform": None,
    "passes": el.Uniform(replacement=False),
    "sequential": el.Sequential(),
    "weighted": el.Weighted(np.linspace(0.0, 2.0, 14)),
}


@pytest.mark.parametrize("depth", [1, 2, 7])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_batches_equal_a_stream_without_prefetch(lake, sampler, depth):
    ds, _ = lake

    def stream(prefetch):
        return ds.segment_stream(L, batch_size=B, seed=4, sampler=SAMPLERS[sampler], prefetch=prefetch)

    want = list(stream(0)) if sampler in ("passes", "sequential") else take(stream(0), 12)
    s = stream(depth)
    got = list(s) if sampler in ("passes", "sequential") else take(s, 12)
    assert_same_batches(got, want)
    s.close()


def test_local_reads_keep_prefetch_batches_ahead(lake):
    """A local build never waits on object-store requests, so the target stays at ``prefetch``."""
    ds, _ = lake
    stream = ds.segment_stream(L, batch_size=B, seed=1, prefetch=2)
    take(stream, 20)
    assert stream._prefetcher is not None and stream._prefetcher.target == 2
    stream.close()


def test_s3_batches_through_latency_equal_a_stream_without_prefetch(slow_s3):
    ds, by_id = slow_s3
    want = take(ds.segment_stream(L, batch_size=B, seed=8, prefetch=0), 15)
    stream = ds.segment_stream(L, batch_size=B, seed=8, prefetch=2)
    got = take(stream, 15)
    stream.close()
    assert_same_batches(got, want)
    for batch in got:
        check_batch(batch, by_id, L)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_state_dict_mid_stream_resumes_exactly(lake, slow_s3, where):
    ds = lake[0] if where == "local" else slow_s3[0]
    want = take(ds.segment_stream(L, batch_size=B, seed=6, prefetch=0), 14)
    stream = ds.segment_stream(L, batch_size=B, seed=6, prefetch=6)  # batches in flight past the state taken
    assert_same_batches(take(stream, 5), want[:5])
    state = stream.state_dict()
    assert_same_batches(take(stream, 3), want[5:8])
    stream.close()
    resumed = ds.segment_stream(L, batch_size=B, seed=6, prefetch=0)
    resumed.load_state_dict(state)
    assert_same_batches(take(resumed, 9), want[5:])
    again = ds.segment_stream(L, batch_size=B, seed=6, prefetch=3)
    again.load_state_dict(state)
    assert_same_batches(take(again, 9), want[5:])
    again.close()


def build_threads(stream) -> list[threading.Thread]:
    """The prefetch thread of ``stream`` and every build thread alive."""
    own = [stream._prefetcher._thread] if stream._prefetcher is not None else []
    return [t for t in threading.enumerate() if t in own or t.name.startswith(prefetch.BUILD_THREADS)]


def test_close_with_batches_in_flight_stops_every_thread_and_the_stream_goes_on(slow_s3):
    ds, _ = slow_s3
    want = take(ds.segment_stream(L, batch_size=B, seed=3, prefetch=0), 6)
    stream = ds.segment_stream(L, batch_size=B, seed=3, prefetch=8)
    assert_same_batches(take(stream, 1), want[:1])  # seven more planned, several still fetching
    threads = build_threads(stream)
    assert threads
    stream.close()
    assert stream._prefetcher is None and not any(t.is_alive() for t in threads)
    assert_same_batches(take(stream, 5), want[1:])  # prefetching restarts after the last returned batch
    stream.close()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_an_error_in_a_build_surfaces_on_that_batchs_next(lake, slow_s3, where):
    ds = lake[0] if where == "local" else slow_s3[0]
    want = take(ds.segment_stream(L, batch_size=B, seed=2, prefetch=0), 8)
    bad = want[4].reward

    def fail_on_the_fifth(reward: np.ndarray) -> np.ndarray:
        if np.array_equal(reward, bad):
            raise RuntimeError("this batch cannot be built")
        return reward

    stream = ds.segment_stream(L, batch_size=B, seed=2, prefetch=6, transform={"reward": fail_on_the_fifth})
    assert_same_batches(take(stream, 4), want[:4])  # later batches were being built meanwhile
    with pytest.raises(RuntimeError, match="cannot be built"):
        next(stream)
    stream.close()
    assert not any(t.is_alive() for t in build_threads(stream))


def test_in_flight_is_latency_times_throughput_within_its_bounds():
    assert in_flight(0.0, 0.0, 2, 32) == 2  # nothing measured yet
    assert in_flight(0.02, 0.0, 2, 32) == 2  # local: no request wait
    assert in_flight(0.02, 0.004, 2, 32) == 2  # latency below a quarter of the work: not worth it
    assert in_flight(0.03, 0.1, 2, 32) == 6  # 0.13 s per build, 0.03 s of it work: 4 under way + 1 ready
    assert in_flight(0.03, 0.1, 8, 32) == 8  # never below prefetch
    assert in_flight(0.001, 1.0, 2, 32) == 32  # at most the limit
    assert in_flight(0.001, 1.0, 2, 5) == 5
