"""Outcome meta: set an episode's meta until it is handed to the commit queue; required vs nullable fields."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el


def schema(required: bool = True, **extra: el.FieldSpec) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("observation", (2,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("task", (), "str", role="meta"),
            el.FieldSpec("success", (), "bool", role="meta", required=required),
            *extra.values(),
        ]
    )


def step(t: int, last: bool = False) -> dict:
    return {"obs": np.full(2, t + 1, np.float32), "action": t % 3, "reward": 0.5, "terminated": last}


def run_episode(ds: el.Dataset, length: int, **meta) -> el.EpisodeWriter:
    """The natural loop: step until the writer is done."""
    w = ds.new_episode(np.zeros(2, np.float32), **meta)
    while not w.done:
        w.add_step(step(w.length, last=w.length == length - 1))
    return w


def committed(path: str) -> list[tuple]:
    """(task, success, length) of every committed episode, as another process would see them."""
    return el.Dataset.open(path, read_only=True).sql("SELECT task, success, length FROM episodes").fetchall()


def test_required_outcome_set_after_the_last_step_is_never_lost(tmp_path):
    # commit_episodes=4: commits fire at the hand-over of every 4th episode. The outcome is set after the
    # last step (as with info["is_success"]); 0.1.0 lost it whenever a commit fired at that step.
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, commit_episodes=4)
    rng = np.random.default_rng(3)
    truth = []
    for i in range(300):
        length, outcome = int(rng.integers(1, 6)), bool(rng.integers(0, 2))
        w = run_episode(ds, length, task=f"t{i}")
        assert w.done and w.awaiting_meta == ("success",)
        w.meta["success"] = outcome
        assert w.awaiting_meta == ()
        truth.append((f"t{i}", outcome, length))
    ds.flush()
    got = sorted(committed(path), key=lambda r: int(r[0][1:]))
    assert got == truth


def test_every_way_to_set_meta_reaches_the_table(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(required=False), path)
    w = ds.new_episode(np.zeros(2, np.float32), task="a")
    w.add_step(step(0))
    w.add_step(step(1, last=True), meta={"success": True})  # with the last step
    w = ds.new_episode(np.zeros(2, np.float32))
    w.set_meta(task="b")  # before the last step
    w.add_step(step(0))
    w.finish(success=False)  # when ending without a flag
    w = ds.new_episode(np.zeros(2, np.float32), task="c")
    w.meta["success"] = True
    w.add_step(step(0, last=True))
    run_episode(ds, 1, task="d")  # nullable: missing -> NULL
    ds.flush()
    assert committed(path) == [("a", True, 2), ("b", False, 1), ("c", True, 1), ("d", None, 1)]


def test_nullable_meta_after_hand_over_raises_and_changes_nothing(tmp_path):
    ds = el.Dataset.create(schema(required=False), str(tmp_path / "ds"))
    w = run_episode(ds, 3, task="pick")
    assert w.done and w.awaiting_meta == ()
    with pytest.raises(el.EpisodeStateError, match=r"queued for commit.*required=True"):
        w.meta["success"] = True
    with pytest.raises(el.EpisodeStateError, match="queued for commit"):
        w.set_meta(success=True)
    with pytest.raises(el.EpisodeStateError, match="queued for commit"):
        del w.meta["task"]
    assert dict(w.meta) == {"task": "pick"}
    assert ds.episode(0).meta == {"task": "pick", "success": None}


def test_invalid_meta_is_rejected_at_once_and_changes_nothing(tmp_path):
    ds = el.Dataset.create(schema(), str(tmp_path / "ds"))
    w = ds.new_episode(np.zeros(2, np.float32), task="pick")
    w.add_step(step(0))
    with pytest.raises(el.ValidationError, match="step 1: field 'success' has dtype"):
        w.meta["success"] = "yes"
    with pytest.raises(el.ValidationError, match="step 1: field 'success' has dtype"):
        w.add_step(step(1, last=True), meta={"success": "yes"})
    with pytest.raises(el.ValidationError, match="step 1: unknown key"):
        w.add_step({**step(1), "bogus": 1}, meta={"success": True})
    with pytest.raises(el.ValidationError, match=r"unknown meta field\(s\) \['who'\]"):
        w.set_meta(success=True, who="x")  # all or nothing: success is not set either
    assert (w.length, dict(w.meta), w.done) == (1, {"task": "pick"}, False)
    w.add_step(step(1, last=True))
    assert w.awaiting_meta == ("success",)
    with pytest.raises(el.ValidationError, match="field 'success' has dtype"):
        w.meta["success"] = 2.5
    assert w.awaiting_meta == ("success",)
    w.meta["success"] = None  # None is "no value": still awaited
    assert w.awaiting_meta == ("success",)
    w.discard()


def test_flush_with_an_episode_awaiting_meta_names_it_and_commits_nothing(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path)
    run_episode(ds, 2, task="a", success=True)
    held = run_episode(ds, 3, task="b")
    for call in (ds.flush, ds.close):
        with pytest.raises(el.ValidationError, match=r"miss required meta.*awaiting meta \['success'\].*'task': 'b'"):
            call()
        assert committed(path) == []
    with pytest.raises(el.EpisodeStateError, match="already ended"):
        held.add_step(step(3))
    held.set_meta(success=False)
    ds.close()
    assert committed(path) == [("a", True, 2), ("b", False, 3)]


def test_a_discarded_held_episode_unblocks_flush(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path)
    held = run_episode(ds, 2, task="gone")
    run_episode(ds, 1, task="kept", success=True)
    held.discard()
    with pytest.raises(el.EpisodeStateError, match="discarded"):
        held.meta["success"] = True
    ds.flush()
    assert committed(path) == [("kept", True, 1)]
    held = run_episode(ds, 2, task="also gone")
    assert ds.flush(discard=True) == 1  # held episodes are pending ones too
    with pytest.raises(el.EpisodeStateError, match="discarded"):
        held.set_meta(success=True)
    assert ds.flush() is None


def test_a_held_episode_sorts_after_episodes_committed_before_its_hand_over(tmp_path):
    ds = el.Dataset.create(schema(), str(tmp_path / "ds"))
    held = run_episode(ds, 2, task="first to end")
    run_episode(ds, 1, task="second", success=True)
    assert len(ds) == 1  # a read commits what was handed over; the held episode is not
    held.meta["success"] = True
    assert [e.meta["task"] for e in ds.episodes()] == ["second", "first to end"]


def test_dict_episodes_missing_required_meta_name_field_and_index(tmp_path):
    ds = el.Dataset.create(schema(), str(tmp_path / "ds"))
    ep = {"observations": np.zeros((3, 2), np.float32), "actions": [0, 1], "rewards": [1.0, 1.0]}
    good = {**ep, "meta": {"task": "x", "success": True}}
    with pytest.raises(el.ValidationError, match=r"episode 1: missing required meta field\(s\) \['success'\]"):
        ds.append_episodes([good, {**ep, "meta": {"task": "x"}}])
    with pytest.raises(el.ValidationError, match=r"episode 0: missing required meta field\(s\) \['success'\]"):
        el.Dataset.from_episodes([{**ep, "meta": {"task": "x", "success": None}}], str(tmp_path / "d2"), schema())
    ds.append_episodes([good])
    assert len(ds) == 1  # the rejected batch left nothing behind


def test_required_flag_is_serialized_and_old_descriptors_open(tmp_path):
    s = schema()
    # only a required field carries the key, so descriptors without one stay readable by 0.1.0
    assert [f.get("required") for f in s.to_json()] == [None, None, None, None, True]
    assert el.DatasetSchema.from_json(s.to_json()) == s
    old = [{k: v for k, v in f.items() if k != "required"} for f in s.to_json()]
    assert not any(f.required for f in el.DatasetSchema.from_json(old))
    ds = el.Dataset.create(s, str(tmp_path / "ds"))
    assert el.Dataset.open(str(tmp_path / "ds")).schema["success"].required
    assert ds.schema == s
    with pytest.raises(el.SchemaError, match="only meta fields can be required"):
        el.FieldSpec("x", (), "float32", required=True)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("required", [True, False])
def test_vector_writer_records_each_envs_outcome(mode, required):
    # success = "the episode lasted over 20 steps", given as meta= on each env's ending row (required=False)
    # or with vw.set_meta(i, ...) after the step (required=True); truth is counted here from the flags.
    n = 3
    venv = SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=40)] * n, autoreset_mode=mode)
    meta = [
        el.FieldSpec("env", (), "int64", role="meta"),
        el.FieldSpec("success", (), "bool", role="meta", required=required),
    ]
    ds = el.Dataset.create(
        el.schema_from_gym_spaces(venv.single_observation_space, venv.single_action_space, meta=meta)
    )
    obs, _ = venv.reset(seed=[1, 2, 3])
    vw = ds.vector_writer(obs, n, autoreset_mode=mode, meta=lambda i: {"env": i})
    rng = np.random.default_rng(0)
    steps, truth = np.zeros(n, int), [[] for _ in range(n)]
    resetting = np.zeros(n, bool)
    for _ in range(300):
        actions = rng.integers(0, 2, n)
        obs, rew, term, trunc, info = venv.step(actions)
        steps += ~resetting
        ended = (term | trunc) & ~resetting
        outcome = [{"success": bool(steps[i] > 20)} if ended[i] else None for i in range(n)]
        vw.add_steps(obs, actions, rew, term, trunc, info, meta=None if required else outcome)
        for i in np.flatnonzero(ended):
            truth[i].append((int(steps[i]), bool(steps[i] > 20)))
            steps[i] = 0
            if required:
                assert vw.awaiting_meta[i] == ("success",)
                vw.set_meta(int(i), **outcome[i])
            else:
                with pytest.raises(el.EpisodeStateError, match="queued for commit"):
                    vw.set_meta(int(i), success=True)
        assert vw.awaiting_meta == {}
        resetting = ended if mode == AutoresetMode.NEXT_STEP else np.zeros(n, bool)
    vw.close()
    for i in range(n):
        got = ds.sql(f"SELECT length, success FROM episodes WHERE env = {i} ORDER BY created_at, episode_id").fetchall()
        assert got == truth[i] and len(got) > 3


def test_vector_meta_is_all_or_nothing():
    ds = el.Dataset.create(schema(required=False))
    vw = ds.vector_writer(np.zeros((2, 2), np.float32), 2)
    with pytest.raises(el.ValidationError, match="env 1, step 0: field 'success' has dtype"):
        vw.add_steps(np.ones((2, 2), np.float32), [0, 1], [1.0, 1.0], [True, True], [False, False],
                     meta=[{"success": True}, {"success": "no"}])  # fmt: skip
    with pytest.raises(el.ValidationError, match="meta has 1 entries for 2 envs"):
        vw.add_steps(np.ones((2, 2), np.float32), [0, 1], [1.0, 1.0], [True, True], [False, False], meta=[None])
    assert [w.length for w in vw.writers] == [0, 0]
    vw.add_steps(np.ones((2, 2), np.float32), [0, 1], [1.0, 1.0], [True, True], [False, False],
                 meta=lambda i: {"success": i == 1})  # fmt: skip
    assert [e.meta["success"] for e in ds.episodes()] == [False, True]


META_FIELDS = {
    "count": el.FieldSpec("count", (), "int64", role="meta"),
    "small": el.FieldSpec("small", (), "uint8", role="meta"),
    "score": el.FieldSpec("score", (), "float32", role="meta"),
    "pose": el.FieldSpec("pose", (3,), "float64", role="meta"),
    "flag": el.FieldSpec("flag", (), "bool", role="meta"),
    "label": el.FieldSpec("label", (), "str", role="meta"),
}
VALUES = {
    "count": st.integers(-(2**63), 2**63 - 1),
    "small": st.integers(0, 255),
    "score": st.floats(width=32, allow_nan=False),
    "pose": st.lists(st.floats(allow_nan=False), min_size=3, max_size=3),
    "flag": st.booleans(),
    "label": st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
}
# How a value reaches the writer: at new_episode, with a step, set_meta, item assignment, finish.
HOW = st.sampled_from(["new_episode", "add_step", "set_meta", "item", "finish"])
EPISODE_META = st.fixed_dictionaries(
    {}, optional={k: st.tuples(st.one_of(st.none(), v), HOW) for k, v in VALUES.items()}
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EPISODE_META, min_size=1, max_size=4))
def test_meta_round_trip(episodes):
    ds = el.Dataset.create(schema(required=False, **META_FIELDS))
    for plan in episodes:
        at = {
            how: {k: v for k, (v, h) in plan.items() if h == how}
            for how in ("new_episode", "add_step", "set_meta", "item", "finish")
        }
        w = ds.new_episode(np.zeros(2, np.float32), **at["new_episode"])
        w.set_meta(**at["set_meta"])
        for k, v in at["item"].items():
            w.meta[k] = v
        w.add_step(step(0), meta=at["add_step"])
        w.finish(**at["finish"])
    assert len(ds) == len(episodes)  # reads commit first
    for i, plan in enumerate(episodes):
        got = ds.episode(i).meta
        want = {k: None for k in ["task", "success", *META_FIELDS]}
        want.update({k: v for k, (v, _) in plan.items()})
        assert set(got) == set(want)
        for k, v in want.items():
            if v is None or k == "label":
                assert got[k] == v, k
            else:
                np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(v, META_FIELDS[k].np_dtype), err_msg=k)
