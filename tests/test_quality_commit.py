"""Stored checks at commit (issue 22): reject, quarantine, warn; the quarantine view, release and delete.

The reference judges each check with NumPy over the episodes as given
(:func:`judged`), independently of DuckDB and ``write/gate.py``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.importers import import_dataset


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("obs", (2,), "float32"),
            el.FieldSpec("camera", (4, 4), "uint8", storage="tensor"),
            el.FieldSpec("action", (), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("n", (), "int64", role="meta"),
            el.FieldSpec("success", (), "bool", role="meta"),
        ]
    )


def episode(n: int, rewards, actions, success: bool = False) -> dict:
    t = len(rewards)
    return {
        "observations": {
            "obs": np.full((t + 1, 2), n, np.float32),
            "camera": np.full((t + 1, 4, 4), n % 256, np.uint8),
        },
        "actions": np.asarray(actions, np.float32),
        "rewards": np.asarray(rewards, np.float32),
        "terminated": True,
        "meta": {"n": n, "success": success},
    }


def judged(check: str, ep: dict) -> int | bool:
    """The reference: False when ``ep`` passes; else True (episode level) or the first failing step."""
    if check == "ret":  # episode level: "return" >= 1
        return not float(np.sum(ep["rewards"], dtype=np.float64)) >= 1
    bad = np.flatnonzero(~(np.abs(ep["actions"]) <= 1))  # step level: abs("action") <= 1
    return int(bad[0]) if len(bad) else False


PREDICATES = {"ret": ('"return" >= 1', "episode"), "act": ('abs("action") <= 1', "step")}


def checks_of(on_fail: dict[str, str]) -> list[el.Check]:
    return [el.Check(name, *PREDICATES[name], on_fail=how) for name, how in on_fail.items()]


@st.composite
def cases(draw):
    names = draw(st.permutations(["ret", "act"]))
    on_fail = {n: draw(st.sampled_from(["reject", "quarantine", "warn"])) for n in names}
    episodes = []
    for n in range(draw(st.integers(1, 6))):
        t = draw(st.integers(1, 5))
        rewards = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=t, max_size=t))
        actions = draw(st.lists(st.sampled_from([-2.0, -1.0, 0.0, 1.0]), min_size=t, max_size=t))
        episodes.append(episode(n, rewards, actions))
    return on_fail, episodes


def expected_outcome(on_fail: dict[str, str], episodes: list[dict]):
    """(first rejection (episode, check, step) or None, {n: failed non-reject checks}, quarantined ns)."""
    for i, ep in enumerate(episodes):
        for name, how in on_fail.items():  # the checks' order: the first failing reject check is named
            verdict = judged(name, ep)
            if how == "reject" and verdict is not False:
                return (i, name, None if verdict is True else verdict), {}, set()
    failed, held = {}, set()
    for ep in episodes:
        n = ep["meta"]["n"]
        failed[n] = [name for name, how in on_fail.items() if judged(name, ep) is not False]
        held |= {n} if any(on_fail[name] == "quarantine" for name in failed[n]) else set()
    return None, failed, held


def rows(collection) -> dict[int, list[str] | None]:
    """n -> checks_failed of the collection's episodes (the column joins the table with its first failure)."""
    has = "checks_failed" in collection.sql("SELECT * FROM episodes LIMIT 0").columns
    found = collection.sql(f"SELECT n, {'checks_failed' if has else 'NULL'} FROM episodes ORDER BY n").fetchall()
    return {n: names for n, names in found}


@settings(max_examples=20, deadline=None)
@given(cases())
def test_checks_at_commit_against_a_numpy_reference(case):
    on_fail, episodes = case
    ds = el.Dataset.create(schema(), checks=checks_of(on_fail))
    version = ds.version
    rejection, failed, held = expected_outcome(on_fail, episodes)
    if rejection is not None:
        with pytest.raises(el.QualityError) as info:
            ds.append_episodes(episodes)
        i, name, step = rejection
        assert (info.value.episode, info.value.check, info.value.step) == (i, name, step)
        assert str(info.value).startswith(f"episode {i}: check {name!r}")
        ds.flush()
        assert ds.version == version and len(ds) == 0
        return
    ds.append_episodes(episodes)
    visible = sorted(set(failed) - held)
    assert len(ds) == len(visible)
    assert sorted(int(ref.meta["n"]) for ref in ds.episodes()) == visible
    seen = rows(ds)
    assert sorted(seen) == visible
    for n in visible:
        assert (seen[n] or []) == failed[n]  # warn failures recorded, visible in SQL
    quarantine = ds.quality.quarantine()
    assert sorted(rows(quarantine)) == sorted(held)
    for n in held:
        assert rows(quarantine)[n] == failed[n]
    assert ds.stats()["episodes"]["count"] == len(visible)


def flagged_dataset(path=None, **options) -> el.Dataset:
    checks = [
        el.Check("positive", '"return" > 0', on_fail="quarantine"),
        el.Check("calm", 'abs("action") <= 1', level="step", on_fail="warn"),
    ]
    ds = el.Dataset.create(schema(), path, checks=checks, **options)
    ds.append_episodes(
        [
            episode(0, [1.0, 1.0], [0.0, 0.0]),
            episode(1, [0.0, 0.0], [0.0, 0.0]),  # quarantined
            episode(2, [1.0], [3.0]),  # warned
            episode(3, [0.0], [5.0]),  # quarantined and warned
        ]
    )
    ds.flush()
    return ds


@pytest.mark.parametrize("where", ["memory", "disk", "s3"])
def test_quarantined_episodes_are_left_out_and_can_be_released_or_deleted(where, tmp_path, request):
    if where == "s3":
        server = request.getfixturevalue("s3_server")
        path, options = request.getfixturevalue("s3_url"), {"storage_options": server.storage_options}
    else:
        path, options = (None if where == "memory" else str(tmp_path / "ds")), {}
    ds = flagged_dataset(path, **options)
    assert len(ds) == 2 and [int(r.meta["n"]) for r in ds.episodes()] == [0, 2]
    assert rows(ds) == {0: [], 2: ["calm"]}
    assert ds.sql("SELECT count(*) FROM steps").fetchone() == (3,)  # 2 + 1 transitions
    stream = ds.segment_stream(1, batch_size=64, sampler=el.Sequential())
    sampled = {int(i) for b in stream for i in np.asarray(b.episode_id)}
    assert sampled == set(ds.episode_ids.tolist())

    quarantine = ds.quality.quarantine()
    assert len(quarantine) == 2 and rows(quarantine) == {1: ["positive"], 3: ["positive", "calm"]}
    first = quarantine.episode(0).read()
    np.testing.assert_array_equal(first.all_obs["camera"], np.full((3, 4, 4), 1, np.uint8))
    held = {int(r.meta["n"]): r.episode_id for r in quarantine.episodes()}

    if where == "disk":  # a copy holds what the dataset shows
        copied = ds.copy_to(str(tmp_path / "copy"))
        assert sorted(int(r.meta["n"]) for r in copied.episodes()) == [0, 2]

    version = ds.quality.release([held[1]])
    assert version == ds.version and ds.history()[0]["operation"] == "RELEASE"
    assert len(ds) == 3 and rows(ds)[1] == ["positive"]  # released: the record of the failure stays
    assert ds.delete([held[3]]) == 1
    assert len(ds.quality.quarantine()) == 0 and len(ds) == 3
    if path is not None:
        reopened = el.Dataset.open(path, **options)
        assert sorted(int(r.meta["n"]) for r in reopened.episodes()) == [0, 1, 2]
        assert len(reopened.quality.quarantine()) == 0
        before = el.Dataset.open(path, version=version - 1, **options)  # time travel: the flags of that version
        assert sorted(int(r.meta["n"]) for r in before.episodes()) == [0, 2]


def test_release_refuses_ids_that_are_not_quarantined():
    ds = flagged_dataset()
    version = ds.version
    with pytest.raises(el.ArgumentError, match="not quarantined"):
        ds.quality.release([int(ds.episode_ids[0])])
    with pytest.raises(el.ArgumentError, match="needs episode ids"):
        ds.quality.release([])
    assert ds.version == version


def test_a_dataset_without_quality_columns_takes_flagged_appends(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path)
    ds.append_episodes([episode(0, [0.0], [0.0])])
    ds.flush()
    old = ds.version
    ds.quality.add(el.Check("positive", '"return" > 0', on_fail="quarantine"))
    ds.append_episodes([episode(1, [0.0], [0.0]), episode(2, [1.0], [0.0])])
    ds.flush()
    reopened = el.Dataset.open(path)
    # episode 0 was committed before the check: stored unjudged (NULL flags), it stays visible
    assert rows(reopened) == {0: None, 2: []}
    assert rows(reopened.quality.quarantine()) == {1: ["positive"]}
    assert len(el.Dataset.open(path, version=old)) == 1  # the version before the columns opens unchanged
    ds.append_episodes([episode(3, [1.0], [0.0])])  # rows of a commit with no failure fit the merged table
    ds.flush()
    assert sorted(rows(el.Dataset.open(path))) == [0, 2, 3]


def reject_checks() -> list[el.Check]:
    return [el.Check("positive", '"return" > 0')]


def test_online_writer_rejects_at_the_last_step_and_goes_on():
    ds = el.Dataset.create(schema(), checks=reject_checks(), commit_episodes=1)
    w = ds.new_episode({"obs": np.zeros(2, np.float32), "camera": np.zeros((4, 4), np.uint8)}, n=0)
    step = {"observation": {"obs": np.zeros(2, np.float32), "camera": np.zeros((4, 4), np.uint8)}, "action": 0.0}
    w.add_step({**step, "reward": 0.0})
    with pytest.raises(el.QualityError, match=r"check 'positive' \(episode level: \"return\" > 0\) failed"):
        w.add_step({**step, "reward": 0.0, "terminated": True})
    assert len(ds) == 0
    w = ds.new_episode({"obs": np.zeros(2, np.float32), "camera": np.zeros((4, 4), np.uint8)}, n=1)
    w.add_step({**step, "reward": 1.0, "terminated": True})
    assert [int(r.meta["n"]) for r in ds.episodes()] == [1]


def test_vector_writer_rejects_the_env_whose_episode_fails_and_records_the_others():
    ds = el.Dataset.create(schema(), checks=reject_checks(), commit_episodes=1)
    obs = {"obs": np.zeros((2, 2), np.float32), "camera": np.zeros((2, 4, 4), np.uint8)}
    vw = ds.vector_writer(obs, 2, meta=lambda i: {"n": i})
    ended = np.array([True, True])
    with pytest.raises(el.QualityError, match=r"env 1, .*check 'positive'"):
        vw.add_steps(obs, np.zeros(2, np.float32), np.array([1.0, 0.0], np.float32), ended, ~ended)
    assert [int(r.meta["n"]) for r in ds.episodes()] == [0]  # env 0's episode was stored
    vw.add_steps(obs, np.zeros(2, np.float32), np.zeros(2, np.float32), ~ended, ~ended)  # both reset
    vw.add_steps(obs, np.zeros(2, np.float32), np.array([2.0, 3.0], np.float32), ended, ~ended)
    assert sorted(ds.snapshot().index["return"].tolist()) == [1.0, 2.0, 3.0]


def test_from_episodes_and_append_episodes_are_all_or_nothing(tmp_path):
    good, bad = episode(0, [1.0], [0.0]), episode(1, [0.0], [0.0])
    with pytest.raises(el.QualityError, match="episode 1: check 'positive'"):
        el.Dataset.from_episodes([good, bad], str(tmp_path / "a"), schema=schema(), checks=reject_checks())
    ds = el.Dataset.from_episodes([good], str(tmp_path / "b"), schema=schema(), checks=reject_checks())
    version = ds.version
    with pytest.raises(el.QualityError, match="episode 2: check 'positive'"):
        ds.append_episodes([good, good, bad])
    ds.flush()
    assert ds.version == version and len(el.Dataset.open(str(tmp_path / "b"))) == 1


def test_an_importer_honours_the_checks(tmp_path):
    data = {
        "observations": np.zeros((4, 3), np.float32),
        "actions": np.zeros((4, 1), np.float32),
        "rewards": np.array([1.0, 1.0, 0.0, 0.0], np.float32),
        "terminals": np.array([False, True, False, True]),
        "timeouts": np.zeros(4, bool),
    }
    quarantine = [el.Check("positive", '"return" > 0', on_fail="quarantine")]
    ds = import_dataset("d4rl", data, str(tmp_path / "q"), checks=quarantine)
    assert len(ds) == 1 and len(ds.quality.quarantine()) == 1
    with pytest.raises(el.QualityError, match="episode 1: check 'positive'"):
        import_dataset("d4rl", data, str(tmp_path / "r"), checks=reject_checks())
    assert not (tmp_path / "r").exists()  # an import is all or nothing


def test_the_gymnasium_recorder_honours_the_checks(tmp_path):
    from episodelake.integrations.gymnasium import RecordEpisodes

    checks = [el.Check("long", "length >= 15", on_fail="quarantine")]
    env = RecordEpisodes(gym.make("CartPole-v1"), str(tmp_path / "ds"), checks=checks)
    lengths = []
    for seed in range(4):
        env.reset(seed=seed)
        for t in range(1, 501):
            _, _, terminated, truncated, _ = env.step(0 if t % 2 and seed % 2 else 1)
            if terminated or truncated:
                lengths.append(t)
                break
    env.close()
    ds = el.Dataset.open(str(tmp_path / "ds"))
    assert sorted(ds.snapshot().lengths.tolist()) == sorted(n for n in lengths if n >= 15)
    assert sorted(ds.quality.quarantine().snapshot().lengths.tolist()) == sorted(n for n in lengths if n < 15)


def test_set_meta_that_completes_a_held_episode_raises_the_rejection():
    fields = [*schema().fields, el.FieldSpec("operator", (), "str", role="meta", required=True)]
    checks = [el.Check("known", "operator <> 'nobody'")]
    ds = el.Dataset.create(el.DatasetSchema(fields), checks=checks, commit_episodes=1)
    w = ds.new_episode({"obs": np.zeros(2, np.float32), "camera": np.zeros((4, 4), np.uint8)}, n=0)
    step = {"observation": {"obs": np.zeros(2, np.float32), "camera": np.zeros((4, 4), np.uint8)}, "action": 0.0}
    w.add_step({**step, "reward": 1.0, "terminated": True})  # held: operator is required
    with pytest.raises(el.QualityError, match="check 'known'"):
        w.set_meta(operator="nobody")
    ds.flush()  # nothing waits for meta any more, nothing was stored
    assert len(ds) == 0


def test_changes_count_the_quarantine_as_absent():
    ds = flagged_dataset()
    n_of = {int(r.meta["n"]): r.episode_id for view in (ds, ds.quality.quarantine()) for r in view.episodes()}
    assert sorted(ds.changes(ds.version - 1).added.tolist()) == sorted([n_of[0], n_of[2]])  # not 1, 3
    before = ds.version
    ds.quality.release([n_of[1]])
    c = ds.changes(before)
    assert (c.added.tolist(), c.removed.tolist(), c.updated.tolist()) == ([n_of[1]], [], [])
    before = ds.version
    ds.delete([n_of[3]])  # never shown: its deletion removes nothing the dataset showed
    c = ds.changes(before)
    assert (len(c.added), len(c.removed), len(c.updated)) == (0, 0, 0)
