"""Round trips of random schemas and episodes, versions, reopen, nested fields, gym schemas."""

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

DTYPES = ["bool", "int8", "uint8", "int32", "uint16", "float16", "float32", "float64", "int64"]


@st.composite
def schemas_and_episodes(draw):
    """A random schema (nested keys, table and tensor storage) and episodes drawn for it."""
    n_obs = draw(st.integers(1, 3))
    fields = []
    for i in range(n_obs):
        name = draw(st.sampled_from([f"o{i}", f"group/o{i}", f"a/b/o{i}"]))
        shape = tuple(draw(st.lists(st.integers(1, 4), max_size=3)))
        fields.append(
            el.FieldSpec(name, shape, draw(st.sampled_from(DTYPES)), storage=draw(st.sampled_from(["table", "tensor"])))
        )
    act_nested = draw(st.booleans())
    act_name = "move" if act_nested else "action"
    fields.append(el.FieldSpec(act_name, (draw(st.integers(1, 3)),), draw(st.sampled_from(DTYPES)), role="action"))
    if act_nested:
        fields.append(el.FieldSpec("keyboard/jump", (), "bool", role="action"))
    fields.append(el.FieldSpec("reward", (), "float32", role="reward"))
    fields.append(el.FieldSpec("task", (), "str", role="meta"))
    schema = el.DatasetSchema(fields)
    seed = draw(st.integers(0, 2**31))
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=5))
    return schema, seed, lengths


def make_values(f: el.FieldSpec, rows: int, rng: np.random.Generator) -> np.ndarray:
    shape = (rows, *f.shape)
    if f.np_dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if f.np_dtype.kind in "iu":
        info = np.iinfo(f.np_dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True).astype(f.np_dtype)
    return rng.standard_normal(shape).astype(f.np_dtype)


def nest(flat: dict) -> dict:
    out: dict = {}
    for k, v in flat.items():
        parts = k.split("/")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = v
    return out


def role_input(schema, role, rows, rng, truth):
    fields = schema.role_fields(role)
    flat = {}
    for f in fields:
        v = make_values(f, rows, rng)
        truth[f.key] = v
        flat[f.name] = v
    return flat[fields[0].name] if schema.unwrapped(role) else nest(flat)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=schemas_and_episodes(), on_disk=st.booleans())
def test_random_round_trip(case, on_disk, tmp_path_factory):
    schema, seed, lengths = case
    rng = np.random.default_rng(seed)
    path = str(tmp_path_factory.mktemp("rt") / "ds") if on_disk else None
    truths, episodes = [], []
    for T in lengths:
        truth: dict = {}
        obs = role_input(schema, "observation", T + 1, rng, truth)
        act = role_input(schema, "action", T, rng, truth)
        rew = role_input(schema, "reward", T, rng, truth)
        flag = int(rng.integers(0, 3))
        ep = {"observations": obs, "actions": act, "rewards": rew, "terminated": flag == 1, "truncated": flag == 2}
        ep["meta"] = {"task": f"t{int(rng.integers(0, 3))}"}
        truth.update(ep["meta"], terminated=flag == 1, truncated=flag == 2)
        truths.append(truth)
        episodes.append(ep)
    ds = el.Dataset.from_episodes(episodes, path=path, schema=schema)
    readers = [ds] + ([el.Dataset.open(path)] if path else [])
    for d in readers:
        assert len(d) == len(lengths) and d.num_steps == sum(lengths)
        for i, truth in enumerate(truths):
            ref = d.episode(i)
            seg = ref.read()
            for f in schema.step_fields:
                got = seg.data[f.key]
                assert got.dtype == f.np_dtype
                np.testing.assert_array_equal(got, truth[f.key])
            assert ref.meta["task"] == truth["task"]
            assert (ref.terminated, ref.truncated) == (truth["terminated"], truth["truncated"])
            assert_flags(seg, ref.length, truth, reaches_end=True)
            # partial reads are slices of the same truth (observations carry one extra row); a read
            # that stops before the end carries no flag, one that reaches it carries the episode's
            for start, stop in ((1, ref.length - 1), (ref.length - 2, ref.length)):
                if not 0 <= start < stop:
                    continue
                part = ref.read(start, stop)
                for f in schema.step_fields:
                    end = stop + (f.role == "observation")
                    np.testing.assert_array_equal(part.data[f.key], truth[f.key][start:end])
                assert_flags(part, stop - start, truth, reaches_end=stop == ref.length)


def assert_flags(seg: el.Segment, rows: int, truth: dict, reaches_end: bool) -> None:
    """terminated/truncated are set only on the final transition, and only when the read reaches it."""
    want_term = np.zeros(rows, bool)
    want_trunc = np.zeros(rows, bool)
    if reaches_end:
        want_term[-1], want_trunc[-1] = truth["terminated"], truth["truncated"]
    np.testing.assert_array_equal(seg.terminated, want_term)
    np.testing.assert_array_equal(seg.truncated, want_trunc)
    np.testing.assert_array_equal(seg.mask, np.ones(rows, bool))


def test_nested_role_access():
    rng = np.random.default_rng(0)
    T = 5
    ep = {
        "initial_observation": {"camera": rng.integers(0, 255, (3, 4, 4), dtype=np.uint8), "state": np.zeros(2)},
        "observations": {"camera": rng.integers(0, 255, (T, 3, 4, 4), dtype=np.uint8), "state": np.ones((T, 2))},
        "actions": {"move": rng.standard_normal((T, 2)).astype(np.float32), "keyboard": {"jump": np.ones(T, bool)}},
        "rewards": np.arange(T, dtype=np.float32),
    }
    ds = el.Dataset.from_episodes([ep])
    seg = ds.episode(0).read()
    np.testing.assert_array_equal(
        seg.obs.camera, np.concatenate([ep["initial_observation"]["camera"][None], ep["observations"]["camera"][:-1]])
    )
    np.testing.assert_array_equal(seg.next_obs["camera"], ep["observations"]["camera"])
    np.testing.assert_array_equal(seg.action["keyboard/jump"], np.ones(T, bool))
    np.testing.assert_array_equal(seg.action.keyboard.jump, np.ones(T, bool))
    np.testing.assert_array_equal(seg.action.move, ep["actions"]["move"])
    assert sorted(seg.action) == ["keyboard", "move"]
    np.testing.assert_array_equal(seg.reward, ep["rewards"])


def test_time_travel_and_reopen(tmp_path):
    path = str(tmp_path / "tt")
    schema = el.DatasetSchema(
        [el.FieldSpec("observation", (2,)), el.FieldSpec("action", (), "int64", role="action"),
         el.FieldSpec("reward", (), role="reward")]
    )  # fmt: skip
    ds = el.Dataset.create(schema, path)
    versions = [ds.version]
    for k in range(3):
        ds.append_episodes([{"observations": np.full((k + 3, 2), k, np.float32), "actions": np.zeros(k + 2, int),
                             "rewards": np.zeros(k + 2)}])  # fmt: skip
        versions.append(ds.flush())
    assert versions == sorted(versions) and len(set(versions)) == 4
    for k, v in enumerate(versions):
        old = el.Dataset.open(path, version=v)
        assert len(old) == k
        assert old.maintenance.read_only
        if k:
            assert old.episode(k - 1).read().all_obs[0, 0] == k - 1
        with pytest.raises(el.ReadOnlyError):
            old.new_episode(np.zeros(2, np.float32))
    latest = el.Dataset.open(path)
    assert len(latest) == 3 and latest.num_steps == 2 + 3 + 4
    with pytest.raises(el.ValidationError, match="version 99"):
        el.Dataset.open(path, version=99)


def test_refresh_sees_other_writers(tmp_path):
    path = str(tmp_path / "r")
    schema = el.DatasetSchema(
        [
            el.FieldSpec("observation", ()),
            el.FieldSpec("action", (), role="action"),
            el.FieldSpec("reward", (), role="reward"),
        ]
    )
    writer = el.Dataset.create(schema, path)
    reader = el.Dataset.open(path)
    writer.append_episodes([{"observations": np.zeros(3), "actions": np.zeros(2), "rewards": np.zeros(2)}])
    writer.flush()
    assert len(reader) == 0  # pinned to the version it opened
    assert len(reader.refresh()) == 1


@pytest.mark.parametrize(
    "space_factory, expected",
    [
        (lambda: gym.spaces.Box(-1, 1, (3,), np.float32), {"observation": ((3,), "float32")}),
        (lambda: gym.spaces.Discrete(4), {"observation": ((), "int64")}),
        (lambda: gym.spaces.MultiDiscrete([3, 4]), {"observation": ((2,), "int64")}),
        (lambda: gym.spaces.MultiBinary(5), {"observation": ((5,), "int8")}),
        (
            lambda: gym.spaces.Dict(
                {"image": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
                 "arm": gym.spaces.Dict({"joints": gym.spaces.Box(-1, 1, (7,), np.float64)})}
            ),
            {"observation/image": ((8, 8, 3), "uint8"), "observation/arm/joints": ((7,), "float64")},
        ),
    ],
)  # fmt: skip
def test_schema_from_gym_spaces(space_factory, expected):
    schema = el.schema_from_gym_spaces(space_factory(), gym.spaces.Discrete(2))
    got = {f.key: (f.shape, f.dtype) for f in schema.role_fields("observation")}
    assert got == expected
    assert schema["action"].dtype == "int64" and schema["reward"].dtype == "float32"


def test_dict_space_env_round_trip():
    """A Dict-observation env recorded step by step reads back exactly."""
    space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "flag": gym.spaces.MultiBinary(3)})
    space.seed(3)
    schema = el.schema_from_gym_spaces(space, gym.spaces.Box(-1, 1, (2,), np.float32))
    ds = el.Dataset.create(schema)
    first = space.sample()
    truth = [first]
    w = ds.new_episode(first)
    for t in range(6):
        o = space.sample()
        truth.append(o)
        w.add_step({"observations": o, "actions": np.zeros(2, np.float32), "rewards": 0.5, "truncated": t == 5})
    ds.flush()
    seg = ds.episode(0).read()
    np.testing.assert_array_equal(seg.all_obs.pos, np.stack([o["pos"] for o in truth]))
    np.testing.assert_array_equal(seg.all_obs.flag, np.stack([o["flag"] for o in truth]))
    assert seg.truncated[-1] and not seg.terminated.any()


def test_cartpole_collection_matches_manual_record():
    env = gym.make("CartPole-v1")
    schema = el.schema_from_gym_spaces(env.observation_space, env.action_space)
    ds = el.Dataset.create(schema)
    expected = []
    for ep in range(3):
        obs, _ = env.reset(seed=ep)
        rec = {"obs": [obs], "act": [], "rew": []}
        writer = ds.new_episode(obs)
        done = False
        while not done:
            a = env.action_space.sample()
            obs, r, term, trunc, _ = env.step(a)
            rec["obs"].append(obs)
            rec["act"].append(a)
            rec["rew"].append(r)
            writer.add_step({"observations": obs, "actions": a, "rewards": r, "terminated": term, "truncated": trunc})
            done = term or trunc
        assert writer.done
        expected.append(rec)
    ds.flush()
    assert len(ds) == 3
    for i, rec in enumerate(expected):
        seg = ds.episode(i).read()
        np.testing.assert_array_equal(seg.all_obs, np.array(rec["obs"]))
        np.testing.assert_array_equal(seg.action, np.array(rec["act"]))
        np.testing.assert_array_equal(seg.reward, np.array(rec["rew"], np.float32))
