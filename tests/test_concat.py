"""``el.concat``: one view over datasets with the same schema, checked against the arrays that were written."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

import episodelake as el

from .conftest import robot_schema
from .reference import expected_all_obs, expected_segment, random_episode, segment_starts


def build(lengths, path=None, seed=0, storage_options=None, tasks=("pick", "place")):
    rng = np.random.default_rng(seed)
    raws = [random_episode(rng, T, tasks=tasks) for T in lengths]
    ds = el.Dataset.create(robot_schema(), path, storage_options=storage_options)
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    return ds, raws


@pytest.fixture
def two(tmp_path):
    """Demos on disk (source 0) and online data in memory (source 1), with their raw episodes by id."""
    demos, demo_raws = build([3, 8, 5, 12], str(tmp_path / "demos"), seed=1, tasks=("pick",))
    online, online_raws = build([2, 9, 4, 6, 7, 1], None, seed=2, tasks=("place", "pick"))
    by_key = {}
    for s, (ds, raws) in enumerate(((demos, demo_raws), (online, online_raws))):
        for eid, raw in zip(ds.episode_ids.tolist(), raws, strict=True):
            by_key[(s, eid)] = raw
    return demos, online, [demo_raws, online_raws], by_key


def test_different_schemas_are_rejected_naming_the_field(two):
    demos, _, _, _ = two
    wider = el.Dataset.create(
        el.DatasetSchema([el.FieldSpec("state", (5,), "float64"), *robot_schema().fields[1:]])
    )  # fmt: skip
    mismatch = r"'observation/state' is observation float64\[5\] \(table\) in source 1 but observation float32\[5\]"
    with pytest.raises(el.SchemaError, match=mismatch):
        el.concat([demos, wider])
    no_camera = el.Dataset.create(robot_schema(image=False))
    with pytest.raises(el.SchemaError, match=r"field 'observation/camera' is missing in source 1"):
        el.concat([demos, no_camera])
    with pytest.raises(
        el.SchemaError,
        match=r"camera' is observation uint8\[3, 8, 8\] layout CHW \(tensor\) in source 1 but missing in source 0",
    ):
        el.concat([no_camera, demos])
    auto_camera = el.DatasetSchema(
        [el.FieldSpec("camera", (3, 8, 8), "uint8", layout="CHW") if f.name == "camera" else f for f in robot_schema()]
    )
    with pytest.raises(
        el.SchemaError, match=r"'observation/camera' is observation uint8\[3, 8, 8\] layout CHW \(table\)"
    ):
        el.concat([demos, el.Dataset.create(auto_camera)])
    named = el.DatasetSchema([*robot_schema().fields, el.FieldSpec("source", (), "str", role="meta")])
    with pytest.raises(el.SchemaError, match=r"meta field 'source' would shadow"):
        el.concat([el.Dataset.create(named)])
    with pytest.raises(el.ArgumentError, match=r"non-empty list"):
        el.concat([])
    with pytest.raises(el.ArgumentError, match=r"source 1 is a str"):
        el.concat([demos, "path"])
    with pytest.raises(el.ArgumentError, match=r"one weight per source \(2\), got shape \(3,\)"):
        el.concat([demos, demos], weights=[1, 2, 3])
    with pytest.raises(el.ArgumentError, match=r"finite and >= 0"):
        el.concat([demos, demos], weights=[1, -1])


def test_sql_stacks_episodes_and_steps_with_a_source_column(two):
    demos, online, raws, _ = two
    cat = el.concat([demos, online.where("length > 1")])
    assert len(cat) == 4 + 5 and cat.num_steps == 28 + 28
    rows = cat.sql(
        "SELECT source, count(*) AS n, sum(length) AS steps FROM episodes GROUP BY source ORDER BY source"
    ).to_arrow_table()
    assert rows.to_pydict() == {"source": [0, 1], "n": [4, 5], "steps": [28, 28]}
    got = cat.sql("SELECT source, sum(reward) AS r FROM steps GROUP BY source ORDER BY source").fetchnumpy()
    want = [sum(float(r.reward.astype(np.float64).sum()) for r in raws[0])]
    want.append(sum(float(r.reward.astype(np.float64).sum()) for r in raws[1] if r.length > 1))
    np.testing.assert_allclose(got["r"], want, rtol=1e-6)
    tasks = cat.sql("SELECT task, count(*) AS n FROM episodes WHERE source = ? GROUP BY task", [0]).fetchnumpy()
    assert tasks["task"].tolist() == ["pick"] and tasks["n"].tolist() == [4]
    with pytest.raises(el.QueryError, match=r"SQL error in 'SELECT nope FROM episodes'"):
        cat.sql("SELECT nope FROM episodes").to_arrow_table()


def test_a_concat_is_pinned_to_its_sources_snapshots(two):
    demos, online, _, _ = two
    cat = el.concat([demos, online])
    before = cat.sql("SELECT count(*) AS n FROM episodes").fetchnumpy()["n"].tolist()
    online.append_episodes(
        [{**random_episode(np.random.default_rng(9), 4).as_dict(unwrap_action=True)}]
    )  # fmt: skip
    online.flush()
    assert len(online) == 7 and len(cat) == 10
    assert cat.sql("SELECT count(*) AS n FROM episodes").fetchnumpy()["n"].tolist() == before == [10]
    assert len(el.concat([demos, online])) == 11


def test_where_selects_per_source(two):
    demos, online, raws, _ = two
    cat = el.concat([demos, online], weights=[1, 2])
    sub = cat.where("source = 1 AND length > 5 OR source = 0 AND length < 5")
    assert [len(s) for s in sub.sources] == [1, 3]
    assert sub.weights.tolist() == [1.0, 2.0]
    got = sub.to_numpy()
    assert got["length"].tolist() == [3, 9, 6, 7] and got["source"].tolist() == [0, 1, 1, 1]
    want = [raws[0][0], raws[1][1], raws[1][3], raws[1][4]]
    np.testing.assert_array_equal(got["observation/state"], np.concatenate([r.obs["state"] for r in want]))
    with pytest.raises(el.QueryError, match=r"invalid where\(\) predicate 'nope > 1'"):
        cat.where("nope > 1")


def test_stats_merge_exactly(two):
    demos, online, raws, _ = two
    cat = el.concat([demos, online])
    got = cat.stats()
    allraw = raws[0] + raws[1]
    reward = np.concatenate([r.reward for r in allraw]).astype(np.float64)
    state = np.concatenate([r.obs["state"] for r in allraw]).astype(np.float64)
    lengths = np.array([r.length for r in allraw], np.float64)
    assert got["episodes"]["count"] == 10
    for key, values in (("reward", reward), ("observation/state", state), ("length", lengths)):
        assert got[key]["count"] == len(values)
        np.testing.assert_allclose(got[key]["sum"], values.sum(axis=0), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(got[key]["mean"], values.mean(axis=0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got[key]["std"], values.std(axis=0), rtol=1e-7)
        np.testing.assert_array_equal(got[key]["min"], values.min(axis=0))
        np.testing.assert_array_equal(got[key]["max"], values.max(axis=0))
    empty_one = cat.where("source = 0")
    np.testing.assert_allclose(empty_one.stats()["reward"]["mean"], demos.stats()["reward"]["mean"])


def test_to_numpy_flat_and_padded(two):
    demos, online, raws, _ = two
    cat = el.concat([demos, online])
    flat = cat.to_numpy()
    allraw = raws[0] + raws[1]
    np.testing.assert_array_equal(flat["observation/camera"], np.concatenate([r.obs["camera"] for r in allraw]))
    np.testing.assert_array_equal(flat["action"], np.concatenate([r.action["action"] for r in allraw]))
    assert flat["source"].tolist() == [0] * 4 + [1] * 6
    assert flat["offsets"].tolist() == np.concatenate([[0], np.cumsum([r.length for r in allraw])]).tolist()
    assert flat["obs_offsets"][-1] == len(flat["observation/state"])
    padded = cat.to_numpy(pad=True)
    assert padded["mask"].shape == (10, 12) and padded["observation/state"].shape == (10, 13, 5)
    for i, r in enumerate(allraw):
        np.testing.assert_array_equal(padded["observation/state"][i, : r.length + 1], r.obs["state"])
        assert not padded["observation/state"][i, r.length + 1 :].any()


@pytest.fixture
def cat_and_union(two):
    """A concat of the two sources and, built independently from the same raw episodes, one dataset of their union."""
    demos, online, raws, _ = two
    union, _ = build([], None)
    union.append_episodes(r.as_dict(unwrap_action=True) for r in raws[0] + raws[1])
    union.flush()
    return el.concat([demos, online]), union


def _same_arrays(got, want, skip=("episode_id", "source")):
    assert set(got) - set(skip) == set(want) - set(skip)
    for key in set(want) - set(skip):
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_every_read_method_gives_what_a_dataset_of_the_union_gives(cat_and_union):
    cat, union = cat_and_union
    assert len(cat) == len(union) == 10 and cat.num_steps == union.num_steps == 57
    for pad in (False, True):
        _same_arrays(cat.to_numpy(pad=pad), union.to_numpy(pad=pad))
    got, want = cat.stats(), union.stats()
    assert got.keys() == want.keys()
    for key in want:
        for part in want[key]:
            np.testing.assert_allclose(got[key][part], want[key][part], rtol=1e-9, err_msg=f"{key} {part}")
    mine, theirs = list(cat.episodes()), list(union.episodes())
    assert [e.length for e in mine] == [e.length for e in theirs]
    assert [e.meta for e in mine] == [e.meta for e in theirs]
    for i in (0, 3, 4, 9, -1, -10):
        a, b = cat.episode(i), union.episode(i)
        assert (a.length, a.terminated, a.truncated, a.meta) == (b.length, b.terminated, b.truncated, b.meta)
        np.testing.assert_array_equal(a.read().obs.state, b.read().obs.state)
    with pytest.raises(IndexError, match=r"episode index 10 out of range for 10 episodes"):
        cat.episode(10)
    with pytest.raises(TypeError, match=r"episode index must be an int"):
        cat.episode(1.0)
    with pytest.raises(el.ArgumentError, match=r"exactly one of them"):
        cat.episode()
    assert cat.episode_ids.tolist() == cat.sources[0].episode_ids.tolist() + cat.sources[1].episode_ids.tolist()
    query = "SELECT task, count(*), sum(length) FROM episodes WHERE length > ? GROUP BY task ORDER BY task"
    for params in ([1], [5]):
        assert cat.sql(query, params).fetchall() == union.sql(query, params).fetchall()
    steps = "SELECT count(*) AS n, sum(reward) AS r FROM steps WHERE t >= $t"
    np.testing.assert_allclose(
        cat.sql(steps, {"t": 2}).fetchall(), union.sql(steps, {"t": 2}).fetchall(), rtol=1e-6
    )  # fmt: skip
    assert cat.sql("SET threads = 1") is None and union.sql("SET threads = 1") is None
    for collection in (cat, union):
        with pytest.raises(el.QueryError, match=r"sandboxed SQL must be exactly one SELECT"):
            collection.sql("SELECT 1; SELECT 2", sandbox=True)
        with pytest.raises(el.QueryError, match=r"read_csv\('x.csv'\).*: refused, sandboxed SQL reads nothing but"):
            collection.sql("SELECT count(*) FROM read_csv('x.csv')", sandbox=True).fetchall()


def test_sql_returns_the_datasets_lazy_result(cat_and_union):
    cat, union = cat_and_union
    got = cat.sql("SELECT length FROM episodes ORDER BY source, episode_id")
    want = union.sql("SELECT length FROM episodes ORDER BY episode_id")
    assert type(got) is type(want)
    assert got.columns == want.columns == ["length"] and got.types == want.types
    assert got.fetchone() == want.fetchone() == (3,)
    assert got.fetchmany(2) == want.fetchmany(2) == [(8,), (5,)]
    assert got.to_arrow_table().equals(want.to_arrow_table())
    assert [b.num_rows for b in got.arrow(batch_size=4)] == [4, 4, 2]


def test_where_and_select_episodes_take_params_as_on_a_dataset(cat_and_union):
    cat, union = cat_and_union
    for predicate, params in (
        ("length > ?", [4]),
        ("length BETWEEN $lo AND $hi AND task = $task", {"lo": 2, "hi": 8, "task": "pick"}),
        ("length > 5 -- a trailing comment", None),
    ):
        mine, theirs = cat.where(predicate, params), union.where(predicate, params)
        assert len(mine) == len(theirs) > 0
        _same_arrays(mine.to_numpy(), theirs.to_numpy())
        again = mine.where("length < ?", [8])  # views compose
        _same_arrays(again.to_numpy(), theirs.where("length < ?", [8]).to_numpy())
    assert [len(s) for s in cat.where("source = ? AND length > ?", [1, 5]).sources] == [0, 3]
    chosen = cat.select_episodes("SELECT source, episode_id FROM episodes WHERE length < ?", [5])
    theirs = union.select_episodes("SELECT episode_id FROM episodes WHERE length < ?", [5])
    _same_arrays(chosen.to_numpy(), theirs.to_numpy())
    for collection in (cat, union):
        with pytest.raises(el.QueryError, match=r"invalid where\(\) predicate 'length > \?'.*pass params="):
            collection.where("length > ?")
        with pytest.raises(el.QueryError, match=r"invalid where\(\) predicate 'length > 1\) OR \(true'"):
            collection.where("length > 1) OR (true")
        with pytest.raises(el.ArgumentError, match=r"where\(\): params must be a list"):
            collection.where("length > ?", 3)
    with pytest.raises(el.QueryError, match=r"must return source and episode_id columns"):
        cat.select_episodes("SELECT episode_id FROM episodes")
    with pytest.raises(el.QueryError, match=r"source must be a source index in \[0, 2\)"):
        cat.select_episodes("SELECT 2 AS source, episode_id FROM episodes")
    narrowed = cat.where("source = 1 AND length > 5")
    left_out = int(np.setdiff1d(cat.sources[1].episode_ids, narrowed.sources[1].episode_ids)[0])
    with pytest.raises(el.QueryError, match=rf"episode ids not in source 1: \[{left_out}\]"):
        narrowed.select_episodes(f"SELECT 1 AS source, {left_out} AS episode_id")


def test_episode_by_id_names_the_ambiguity(two):
    demos, _, _, _ = two
    cat = el.concat([demos, demos.where("length > 5")])  # ids are unique within a source only
    both = int(np.intersect1d(cat.sources[0].episode_ids, cat.sources[1].episode_ids)[0])
    with pytest.raises(el.ArgumentError, match=rf"episode id {both} is in sources \[0, 1\]"):
        cat.episode(id=both)
    only = int(np.setdiff1d(cat.sources[0].episode_ids, cat.sources[1].episode_ids)[0])
    assert cat.episode(id=only).length == demos.episode(id=only).length
    with pytest.raises(KeyError, match=r"no episode with id 999"):
        cat.episode(id=999)


def test_sample_transitions_mix_by_weight_and_are_exact(two):
    demos, online, _, by_key = two
    weighted = el.concat([demos, online], weights=[1, 3])
    t = weighted.sample_transitions(4000, seed=7)
    counts = np.bincount(t.source, minlength=2)
    assert chisquare(counts, [1000, 3000]).pvalue > 1e-4
    again = weighted.sample_transitions(4000, seed=7)
    for k, v in t.buffers.items():
        np.testing.assert_array_equal(again.buffers[k], v, err_msg=k)
    for i in range(0, 4000, 37):  # each item is the transition its (source, episode_id, start) names
        raw = by_key[(int(t.source[i]), int(t.episode_id[i]))]
        s = int(t.start[i])
        np.testing.assert_array_equal(t.obs.state[i], raw.obs["state"][s])
        np.testing.assert_array_equal(t.next_obs.camera[i], raw.obs["camera"][s + 1])
        assert t.reward[i] == raw.reward[s] and t.action[i] == raw.action["action"][s]
    n3 = weighted.sample_transitions(300, seed=2, n_step=3, gamma=0.5)  # options apply within each source
    for i in range(300):
        raw, s = by_key[(int(n3.source[i]), int(n3.episode_id[i]))], int(n3.start[i])
        m = min(3, raw.length - s)
        want = sum(0.5**k * float(raw.reward[s + k]) for k in range(m))
        assert n3.n_steps[i] == m and n3.reward[i] == pytest.approx(want, rel=1e-5, abs=1e-6)
        np.testing.assert_array_equal(n3.next_obs.state[i], raw.obs["state"][s + m])
    # no weights: uniform over the union's transitions, so sources in proportion to their steps (28 : 29)
    plain = el.concat([demos, online]).sample_transitions(6000, seed=3)
    assert chisquare(np.bincount(plain.source, minlength=2), np.array([28, 29]) / 57 * 6000).pvalue > 1e-4
    rng = np.random.default_rng(5)
    a, b = weighted.sample_transitions(8, rng=rng), weighted.sample_transitions(8, rng=rng)
    assert not np.array_equal(np.stack([a.start, a.source]), np.stack([b.start, b.source]))
    long = weighted.sample_transitions(200, seed=1, where="length > 8")
    assert {by_key[(s, e)].length for s, e in zip(long.source.tolist(), long.episode_id.tolist(), strict=True)} == {
        9,
        12,
    }
    # weights are exact or refused: demos hold no 'place' episode, so weight 1 cannot be honoured
    with pytest.raises(el.ArgumentError, match=r"source 0 has weight 1.0 but nothing to sample"):
        weighted.sample_transitions(4, seed=0, where="task = 'place'")


def test_segment_stream_mixes_by_weight_and_resumes_exactly(two):
    demos, online, _, by_key = two
    cat = el.concat([demos, online], weights=[2, 1])
    stream = cat.segment_stream(4, batch_size=16, seed=11, prefetch=0)
    sources = np.concatenate([stream.sample().source for _ in range(150)])
    assert chisquare(np.bincount(sources, minlength=2), np.array([2, 1]) / 3 * len(sources)).pvalue > 1e-4
    b = stream.sample()
    for i in range(16):
        raw = by_key[(int(b.source[i]), int(b.episode_id[i]))]
        want = expected_segment(raw, int(b.start[i]), 4)
        rows = expected_all_obs(raw, int(b.start[i]), 4)
        np.testing.assert_array_equal(b.all_obs.state[i], rows["state"])
        np.testing.assert_array_equal(b.all_obs.camera[i], rows["camera"])
        np.testing.assert_array_equal(b.action[i], want["action/action"])
        np.testing.assert_array_equal(b.mask[i], want["mask"])
    state = stream.state_dict()
    expected = [stream.sample() for _ in range(4)]
    resumed = cat.segment_stream(4, batch_size=16, seed=11)
    resumed.load_state_dict(state)
    for want_batch in expected:
        got = resumed.sample()
        for name in ("source", "episode_id", "start"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want_batch, name))
        np.testing.assert_array_equal(got.all_obs.camera, want_batch.all_obs.camera)
    resumed.close()
    with pytest.raises(el.ArgumentError, match=r"source probabilities"):
        el.concat([demos, online], weights=[1, 1]).segment_stream(4, seed=11).load_state_dict(state)


def test_segment_stream_without_weights_is_uniform_over_segments(two):
    demos, online, raws, _ = two
    n = [len(segment_starts([r.length for r in rs], 4)) for rs in raws]
    stream = el.concat([demos, online]).segment_stream(4, batch_size=32, seed=0)
    sources = np.concatenate([stream.sample().source for _ in range(100)])
    assert chisquare(np.bincount(sources, minlength=2), np.array(n) / sum(n) * len(sources)).pvalue > 1e-4


def test_segment_stream_arguments(two):
    demos, online, _, by_key = two
    with pytest.raises(el.ArgumentError, match=r"per-episode el.Weighted on a concat needs source weights"):
        el.concat([demos, online]).segment_stream(4, sampler=el.Weighted("length"))
    with pytest.raises(el.ArgumentError, match=r"window: give both context and target"):
        el.concat([demos, online]).segment_stream(el.Window(context=4))
    cat = el.concat([demos, online], weights=[1, 1])
    b = cat.segment_stream(
        el.Window(context=2, target=2),
        batch_size=64,
        seed=0,
        sampler=el.Weighted("CASE WHEN success THEN 1 ELSE 0 END"),
    ).sample()
    assert all(by_key[(s, e)].meta["success"] for s, e in zip(b.source.tolist(), b.episode_id.tolist(), strict=True))
    assert b.context.obs.state.shape == (64, 2, 5) and b.target.action.shape == (64, 2)


def test_trajectories_over_a_concat(two):
    demos, online, _, by_key = two
    ordered = el.concat([demos, online]).trajectories(4, sampler=el.Sequential())
    batches = list(ordered)
    assert [s for b in batches for s in b.source.tolist()] == [0] * 4 + [1] * 6
    for b in batches:
        for i in range(len(b.episode_id)):
            raw = by_key[(int(b.source[i]), int(b.episode_id[i]))]
            np.testing.assert_array_equal(b.all_obs.camera[i, : raw.length + 1], raw.obs["camera"])
            assert b.lengths[i] == raw.length
    plain = el.concat([demos, online]).trajectories(100, seed=1)  # no weights: uniform over the 10 episodes
    sources = np.concatenate([plain.sample().source for _ in range(20)])
    assert chisquare(np.bincount(sources, minlength=2), [800, 1200]).pvalue > 1e-4
    mixed = el.concat([demos, online], weights=[3, 1]).trajectories(100, seed=4)
    sources = np.concatenate([mixed.sample().source for _ in range(20)])
    assert chisquare(np.bincount(sources, minlength=2), [1500, 500]).pvalue > 1e-4
    with pytest.raises(el.ArgumentError, match=r"weights apply to sampling with replacement"):
        el.concat([demos, online], weights=[3, 1]).trajectories(4, sampler=el.Sequential())


def test_concat_of_object_storage_and_local_disk(s3_server, s3_url, tmp_path):
    remote, remote_raws = build([5, 3, 7], s3_url, seed=4, storage_options=s3_server.storage_options)
    local, local_raws = build([2, 6], str(tmp_path / "local"), seed=5)
    cat = el.concat([remote, local], weights=[1, 1])
    counts = cat.sql("SELECT source, count(*) AS n FROM steps GROUP BY source ORDER BY source").fetchnumpy()
    assert counts["n"].tolist() == [15, 8]
    flat = cat.to_numpy()
    np.testing.assert_array_equal(
        flat["observation/camera"], np.concatenate([r.obs["camera"] for r in remote_raws + local_raws])
    )
    t = cat.sample_transitions(64, seed=0)
    by_key = {(0, e): r for e, r in zip(remote.episode_ids.tolist(), remote_raws, strict=True)}
    by_key.update({(1, e): r for e, r in zip(local.episode_ids.tolist(), local_raws, strict=True)})
    for i in range(64):
        raw = by_key[(int(t.source[i]), int(t.episode_id[i]))]
        np.testing.assert_array_equal(t.obs.camera[i], raw.obs["camera"][int(t.start[i])])
