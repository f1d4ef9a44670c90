"""Segments anchored on steps (issue 22): ``el.Anchors`` in segment_stream and sample_transitions.

The expected segments come from a NumPy reference over the raw episodes (the
anchors are the steps whose reward passes a threshold, found with NumPy; each
segment's rows are gathered by hand with zeros outside the episode), never
from the code under test.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

from .reference import RawEpisode

OBS = 3


def schema(camera: bool = False) -> el.DatasetSchema:
    fields = [el.FieldSpec("state", (OBS,), "float32")]
    if camera:  # a Zarr tensor field, read at the anchors like the table fields
        fields.append(el.FieldSpec("camera", (2, 4, 4), "uint8", layout="CHW", storage="tensor", chunk_rows=4))
    fields += [
        el.FieldSpec("action", (), "int64", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
        el.FieldSpec("n", (), "int64", role="meta"),
    ]
    return el.DatasetSchema(fields)


def raw_episodes(seed: int, lengths: list[int], camera: bool = False) -> list[RawEpisode]:
    rng = np.random.default_rng(seed)
    out = []
    for n, T in enumerate(lengths):
        obs = {"state": rng.standard_normal((T + 1, OBS)).astype(np.float32)}
        if camera:
            obs["camera"] = rng.integers(0, 256, (T + 1, 2, 4, 4), dtype=np.uint8)
        out.append(
            RawEpisode(
                obs=obs,
                action={"action": rng.integers(0, 9, T).astype(np.int64)},
                reward=rng.random(T).astype(np.float32),
                terminated=bool(n % 2),
                truncated=False,
                meta={"n": n},
            )
        )
    return out


def write(raw: list[RawEpisode], path=None, camera: bool = False, storage_options=None) -> el.Dataset:
    ds = el.Dataset.create(schema(camera), path, storage_options=storage_options)
    ds.append_episodes(e.as_dict(unwrap_action=True) for e in raw)
    ds.flush()
    return ds


def reference(raw: list[RawEpisode], threshold: float, offset: int, L: int, pad) -> list[tuple[int, int]]:
    """``(episode n, first transition)`` of every anchored segment, in (episode, step) order: a loop over steps."""
    out = []
    for n, ep in enumerate(raw):
        for t in range(ep.length):
            if not ep.reward[t] > threshold:
                continue
            s = t + offset
            inside = s >= 0 and s + L <= ep.length
            overlaps = s < ep.length and s + L > 0
            if inside if pad is None else overlaps:
                out.append((n, s))
    return out


def rows(values: np.ndarray, start: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """``values[start .. start + L)`` with zeros outside ``[0, len)``, and which rows are inside."""
    r = start + np.arange(L)
    inside = (r >= 0) & (r < len(values))
    out = np.zeros((L, *values.shape[1:]), values.dtype)
    out[inside] = values[r[inside]]
    return out, inside


def items(batches) -> list[tuple[int, int]]:
    return [(int(n), int(s)) for b in batches for n, s in zip(b.meta["n"], b.start, strict=True)]


def check_batch(batch, raw: list[RawEpisode], L: int, camera: bool = False) -> None:
    """Every item of ``batch`` holds its episode's rows from its start, zeros and mask False outside it."""
    for i, (n, s) in enumerate(zip(batch.meta["n"], batch.start, strict=True)):
        ep = raw[int(n)]
        reward, inside = rows(ep.reward, int(s), L)
        np.testing.assert_array_equal(batch.mask[i], inside)
        np.testing.assert_array_equal(batch.reward[i], reward)
        np.testing.assert_array_equal(batch.action[i], rows(ep.action["action"], int(s), L)[0])
        # T + 1 observation rows: slot j holds observation s + j and next observation s + j + 1 where they exist
        np.testing.assert_array_equal(batch["observation/state"][i], rows(ep.obs["state"], int(s), L)[0])
        np.testing.assert_array_equal(batch.next_obs["state"][i], rows(ep.obs["state"], int(s) + 1, L)[0])
        if camera:
            np.testing.assert_array_equal(batch["observation/camera"][i], rows(ep.obs["camera"], int(s), L)[0])


def one_pass(ds, anchors, L, pad=None, **kw):
    stream = ds.segment_stream(el.Window(L, pad=pad), batch_size=7, sampler=el.Sequential(), anchors=anchors, **kw)
    return list(stream)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 14), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
    threshold=st.sampled_from([0.0, 0.5, 0.8, 0.95]),
    L=st.sampled_from([1, 3, 6]),
)
def test_a_pass_yields_exactly_one_segment_per_anchor_as_the_reference(lengths, seed, threshold, L):
    raw = raw_episodes(seed, lengths)
    ds = write(raw)
    # one dataset per example, every offset (before, on and after the anchor; past both edges) and pad rule
    for offset in range(-L - 2, 4):
        for pad in (None, "suffix", "prefix"):
            anchors = el.Anchors("reward > $x", offset=offset, params={"x": threshold})
            batches = one_pass(ds, anchors, L, pad, prefetch=0)
            assert items(batches) == reference(raw, threshold, offset, L, pad), (offset, pad)
            for b in batches:
                check_batch(b, raw, L)


def test_sixteen_steps_ending_at_each_anchor_on_disk_with_tensors(tmp_path):
    raw = raw_episodes(3, [20, 5, 31, 16, 1, 40], camera=True)
    ds = write(raw, str(tmp_path / "ds"), camera=True)
    reopened = el.Dataset.open(str(tmp_path / "ds"))
    anchors = el.Anchors("reward > 0.7", offset=-15)
    for pad in (None, "suffix"):
        batches = one_pass(reopened, anchors, 16, pad)
        assert items(batches) == reference(raw, 0.7, -15, 16, pad)
        for b in batches:
            check_batch(b, raw, 16, camera=True)
            # the anchor is the last transition of its segment
            assert (b.reward[:, -1] > 0.7).all()
    ds.close()


def test_anchors_on_s3(s3_server, s3_url):
    raw = raw_episodes(4, [12, 3, 25, 9], camera=True)
    write(raw, s3_url, camera=True, storage_options=s3_server.storage_options)
    ds = el.Dataset.open(s3_url, storage_options=s3_server.storage_options)
    batches = one_pass(ds, el.Anchors("reward > 0.6", offset=-2), 4, "suffix")
    assert items(batches) == reference(raw, 0.6, -2, 4, "suffix")
    for b in batches:
        check_batch(b, raw, 4, camera=True)


@pytest.fixture(scope="module")
def lake():
    raw = raw_episodes(11, [30, 4, 17, 1, 25, 9, 40, 12])
    return raw, write(raw)


def test_where_narrows_the_episodes_first(lake):
    raw, ds = lake
    batches = one_pass(ds, el.Anchors("reward > 0.5", offset=-1), 3, where="length >= 12")
    expected = [(n, s) for n, s in reference(raw, 0.5, -1, 3, None) if raw[n].length >= 12]
    assert items(batches) == expected and expected


def test_shuffled_pass_resumes_mid_pass_with_exactly_the_remaining_segments(lake, tmp_path):
    raw, ds = lake
    anchors = el.Anchors("reward > ?", offset=-4, params=[0.4])
    expected = reference(raw, 0.4, -4, 6, "suffix")

    def stream():
        return ds.segment_stream(6, batch_size=5, sampler=el.Uniform(replacement=False), seed=9, anchors=anchors)

    whole = items(stream())
    assert sorted(whole) == sorted(expected)  # one segment per anchor, in a seeded order
    first = stream()
    head = [next(first) for _ in range(3)]
    state = first.state_dict()
    assert state["params"]["anchors"]["predicate"] == "reward > ?"
    assert state["params"]["anchors"]["offset"] == -4 and state["params"]["anchors"]["params"] == [0.4]
    resumed = stream()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert items(head) + items(rest) == whole
    for b in rest:
        check_batch(b, raw, 6)
    # lineage: a state file rebuilds the anchored stream and continues identically
    el.save_state(state, tmp_path / "state.json")
    again = el.stream_from_state(tmp_path / "state.json", collection=ds)
    assert items(again) == items(rest)


def test_a_state_loads_only_into_a_stream_with_the_same_anchors(lake):
    _, ds = lake

    def stream(anchors):
        return ds.segment_stream(4, batch_size=3, sampler=el.Sequential(), anchors=anchors, prefetch=0)

    state = stream(el.Anchors("reward > 0.5", offset=-1)).state_dict()
    # as many segments either way (padding keeps every anchor): the anchors tell the streams apart
    with pytest.raises(el.ArgumentError, match="state_dict: anchors"):
        stream(el.Anchors("reward > 0.5", offset=0)).load_state_dict(state)
    for other in (el.Anchors("reward > 0.6", offset=-1), None):  # the first parameter that differs is named
        with pytest.raises(el.ArgumentError, match=r"state_dict: (segments|anchors)"):
            stream(other).load_state_dict(state)


@pytest.mark.parametrize("policy", ["wrap", "drop"])
def test_shards_split_the_anchors(lake, policy):
    raw, ds = lake
    expected = reference(raw, 0.3, -2, 4, "suffix")
    world = 3
    parts = [
        items(
            ds.segment_stream(
                4,
                batch_size=4,
                sampler=el.Sequential(),
                shard=el.Shard(r, world, policy),
                anchors=el.Anchors("reward > 0.3", offset=-2),
            )
        )
        for r in range(world)
    ]
    N = len(expected)
    # rank r deals global positions r, r + world, ...; wrap repeats the first positions, drop leaves the last out
    positions = np.arange(-(-N // world) * world if policy == "wrap" else N // world * world) % N
    for r, part in enumerate(parts):
        assert part == [expected[p] for p in positions[r::world]]
    union = set().union(*map(set, parts))
    assert union == (set(expected) if policy == "wrap" else set(expected[: N // world * world]))


def test_draws_with_replacement_take_anchors_uniformly_or_by_weight(lake):
    raw, ds = lake
    expected = Counter(reference(raw, 0.5, 0, 2, "suffix"))
    stream = ds.segment_stream(2, batch_size=512, seed=5, anchors=el.Anchors("reward > 0.5"))
    drawn = Counter(items(next(stream) for _ in range(8)))
    assert set(drawn) == set(expected)  # every anchor and nothing else
    share = np.array([drawn[a] for a in expected]) / sum(drawn.values())
    assert np.abs(share - 1 / len(expected)).max() < 0.5 / len(expected)  # uniform, within sampling noise
    # weights: an anchor at an even step 3 times as likely as one at an odd step
    weighted = el.Anchors("reward > 0.5", weights="CASE WHEN t % 2 = 0 THEN 3 ELSE 1 END")
    draws = Counter(items(next(ds.segment_stream(2, batch_size=4096, seed=6, anchors=weighted)) for _ in range(2)))
    even = [a for a in expected if a[1] % 2 == 0]
    mass = 3 * len(even) + (len(expected) - len(even))
    even_share = sum(draws[a] for a in even) / sum(draws.values())
    assert abs(even_share - 3 * len(even) / mass) < 0.03
    zero = el.Anchors("reward > 0.5", weights="CASE WHEN t % 2 = 0 THEN 1 ELSE 0 END")
    only_even = items(next(ds.segment_stream(2, batch_size=1024, seed=7, anchors=zero)) for _ in range(1))
    assert set(only_even) == set(even)


def test_weighted_episodes_times_anchor_weights(lake):
    raw, ds = lake
    expected = reference(raw, 0.5, 0, 2, "suffix")
    # episode weight: 1 for n = 0 only; anchor weight 1: every draw is an anchor of episode 0
    stream = ds.segment_stream(
        2,
        batch_size=256,
        seed=1,
        sampler=el.Weighted("CASE WHEN n = 0 THEN 1 ELSE 0 END"),
        anchors=el.Anchors("reward > 0.5", weights="1"),
    )
    drawn = set(items([next(stream)]))
    assert drawn == {a for a in expected if a[0] == 0}


def test_follow_finds_the_anchors_of_new_episodes(tmp_path):
    raw = raw_episodes(21, [15, 8, 22, 5, 30, 11])
    path = str(tmp_path / "ds")
    ds = write(raw[:3], path)
    stream = ds.segment_stream(3, batch_size=256, seed=2, follow=True, anchors=el.Anchors("reward > 0.6", offset=-1))
    even = el.Anchors("reward > 0.6", offset=-1, weights="CASE WHEN t % 2 = 0 THEN 1 ELSE 0 END")
    weighted = ds.segment_stream(3, batch_size=512, seed=2, follow=True, anchors=even)
    first = set(items([next(stream)]))
    assert first <= set(reference(raw[:3], 0.6, -1, 3, "suffix"))
    next(weighted)
    writer = el.Dataset.open(path)
    writer.append_episodes(e.as_dict(unwrap_action=True) for e in raw[3:])
    writer.flush()
    drawn = set(items(next(stream) for _ in range(4)))
    expected = reference(raw, 0.6, -1, 3, "suffix")
    assert drawn == set(expected)  # the new episodes' anchors are drawn too, and nothing else
    assert stream.state_dict()["params"]["segments"] == len(expected)
    # the new anchors' weights join the draw: every even-step anchor of all six episodes, no odd one
    assert set(items(next(weighted) for _ in range(2))) == {(n, s) for n, s in expected if (s + 1) % 2 == 0}


def test_sample_transitions_at_the_anchors(lake):
    raw, ds = lake
    tr = ds.sample_transitions(2048, seed=3, anchors=el.Anchors("action = 4", offset=1))
    expected = {(n, t + 1) for n, ep in enumerate(raw) for t in range(ep.length - 1) if ep.action["action"][t] == 4}
    got = set(zip(tr.buffers["meta/n"].tolist(), tr.buffers["start"].tolist(), strict=True))
    assert got == expected  # transitions t + 1 inside their episode, every one of them at this draw size
    for n, t, r in zip(tr.buffers["meta/n"], tr.buffers["start"], tr.buffers["reward"], strict=True):
        assert r == raw[int(n)].reward[int(t)]


def test_bad_anchors_get_clear_errors_and_change_nothing(lake):
    raw, ds = lake
    version = ds.version
    with pytest.raises(el.QueryError, match="Anchors"):
        el.Anchors("reward >")
    with pytest.raises(el.QueryError, match="Anchors"):
        el.Anchors("")
    with pytest.raises(el.QueryError, match="placeholders"):
        el.Anchors("reward > ?")
    with pytest.raises(el.ArgumentError, match="offset"):
        el.Anchors("reward > 0", offset=1.5)
    with pytest.raises(el.ArgumentError, match="weights"):
        el.Anchors("reward > 0", weights=2)
    with pytest.raises(el.ArgumentError, match="anchors must be"):
        ds.segment_stream(4, anchors="reward > 0")
    with pytest.raises(el.QueryError, match="no_such_column"):
        ds.segment_stream(4, anchors=el.Anchors("no_such_column > 0"))
    with pytest.raises(el.QueryError, match="refused"):
        ds.segment_stream(4, anchors=el.Anchors("reward > (SELECT count(*) FROM read_csv('/etc/passwd'))"))
    with pytest.raises(el.ArgumentError, match=r"episode \d+ step \d+ has weight -1"):
        ds.segment_stream(4, anchors=el.Anchors("reward > 0.5", weights="-1"))
    with pytest.raises(el.ArgumentError, match="weights apply to draws with replacement"):
        ds.segment_stream(4, sampler=el.Sequential(), anchors=el.Anchors("reward > 0.5", weights="1"))
    with pytest.raises(el.ArgumentError, match="stride"):
        ds.segment_stream(el.Window(4, stride=2), anchors=el.Anchors("reward > 0.5"))
    with pytest.raises(el.ArgumentError, match="no segments"):
        ds.segment_stream(4, anchors=el.Anchors("reward > 2"))
    assert one_pass(ds, el.Anchors("reward > 2"), 4) == []  # a pass over no anchor is empty
    assert ds.version == version and len(ds) == len(raw)


def test_predicates_over_observations_and_columns_they_do_not_name(lake):
    raw, ds = lake
    # observation row t and t + 1 of a step (the steps view's "<key>" and "next_<key>")
    falling = el.Anchors('"observation/state"[1] > "next_observation/state"[1] AND action >= 2', offset=-1)
    expected = [
        (n, t - 1)
        for n, ep in enumerate(raw)
        for t in range(ep.length)
        if ep.obs["state"][t, 0] > ep.obs["state"][t + 1, 0] and ep.action["action"][t] >= 2 and t >= 1
    ]
    assert items(one_pass(ds, falling, 2)) == expected and expected
    # a predicate that reads columns by pattern (COLUMNS) still sees every step column
    pattern = one_pass(ds, el.Anchors("COLUMNS('^rew') > 0.5"), 2)
    assert items(pattern) == reference(raw, 0.5, 0, 2, None)


def test_anchors_over_a_derived_per_step_column_follow_its_versions(tmp_path):
    raw = raw_episodes(5, [9, 14, 6])
    derived = el.DatasetSchema([*schema().fields, el.FieldSpec("score", (), "float32", role="extra", derived=True)])
    ds = el.Dataset.create(derived, str(tmp_path / "ds"))
    ds.append_episodes(e.as_dict(unwrap_action=True) for e in raw)
    ds.flush()
    scores = [np.arange(ep.length, dtype=np.float32) % 4 for ep in raw]  # 3 at t = 3, 7, 11
    ds.columns.update({"extra/score": scores})
    high = el.Anchors('"extra/score" = 3', offset=-1)
    expected = [(n, t - 1) for n, ep in enumerate(raw) for t in range(ep.length) if t % 4 == 3 and t + 1 <= ep.length]
    assert items(one_pass(ds, high, 2)) == expected
    state = ds.segment_stream(2, sampler=el.Sequential(), anchors=high).state_dict()
    ds.columns.update({"extra/score": [np.full(ep.length, 3, np.float32) for ep in raw]})  # every step now
    assert len(items(one_pass(ds, high, 2))) == sum(ep.length - 1 for ep in raw)
    with pytest.raises(el.ArgumentError, match="state_dict"):  # same episodes, other anchors
        ds.segment_stream(2, sampler=el.Sequential(), anchors=high).load_state_dict(state)


def test_prioritized_draws_take_the_anchors_by_priority(lake):
    raw, ds = lake
    expected = reference(raw, 0.5, -1, 3, "suffix")
    stream = ds.segment_stream(
        3, batch_size=1024, seed=4, sampler=el.Prioritized(1.0), anchors=el.Anchors("reward > 0.5", offset=-1)
    )
    first = next(stream)
    assert set(items([first])) == set(expected)  # the items are the anchors, every one drawn at this size
    keep = (int(first.meta["n"][0]), int(first.start[0]))
    stream.update_priorities(first.indices, (first.meta["n"] == keep[0]) & (first.start == keep[1]))
    assert set(items([next(stream)])) == {keep}  # only the anchor whose priority stayed above zero


def test_positional_params_number_the_predicate_before_the_weights(lake):
    raw, ds = lake
    anchors = el.Anchors("reward > ?", weights="CASE WHEN t % 2 = 0 THEN ? ELSE 0 END", params=[0.5, 1])
    drawn = set(items([next(ds.segment_stream(2, batch_size=1024, seed=8, anchors=anchors))]))
    assert drawn == {a for a in reference(raw, 0.5, 0, 2, "suffix") if a[1] % 2 == 0}


def test_a_second_stream_over_the_same_version_runs_no_query(tmp_path):
    raw = raw_episodes(6, [12, 20, 7])
    path = tmp_path / "ds"
    write(raw, str(path))
    ds = el.Dataset.open(str(path))
    anchors = el.Anchors("reward > 0.5", offset=-2)
    expected = reference(raw, 0.5, -2, 3, "suffix")
    assert items(one_pass(ds, anchors, 3, "suffix")) == expected  # reads the table columns and finds the anchors
    for table_file in (f for f in (path / "episodes").rglob("*.parquet") if "_delta_log" not in f.parts):
        table_file.rename(table_file.with_suffix(".gone"))  # any new query of this version now fails
    assert items(one_pass(ds, anchors, 3, "suffix")) == expected
    with pytest.raises(el.EpisodeLakeError):
        one_pass(ds, el.Anchors("reward > 0.6"), 3)


def test_anchor_weights_all_zero_and_index_misuse_are_refused(lake):
    _, ds = lake
    with pytest.raises(el.ArgumentError, match="every anchor has weight zero"):
        ds.segment_stream(2, anchors=el.Anchors("reward > 0.5", weights="0"))
    stream = ds.segment_stream(2, sampler=el.Sequential(), anchors=el.Anchors("reward > 0.5"))
    index = stream.index
    with pytest.raises(el.ArgumentError, match="old episodes and then the appended ones"):
        index.extend(index.positions[:-1], index.lengths[-1:])
    with pytest.raises(el.ArgumentError, match="same shape"):
        index.reset(index.positions, index.lengths[:-1])
