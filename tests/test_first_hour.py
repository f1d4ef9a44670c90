"""Issue 20, the seams a new user meets in the first hour: one test per item, named after it.

* item 1: the Gymnasium recorder records into the user's own dataset (a real recorder script in a subprocess,
  reopened in a fresh process, compared with CartPole run directly);
* item 2: meta handed to Python code is Python scalars (``env.reset(seed=meta["seed"])`` works);
* item 6: a float that overflows its field's dtype is a ValidationError naming field, step and value, on every
  write path (NumPy's own cast is the reference for "overflows");
* item 9: fields are reached by key on every batch, segment and transition batch, whatever the schema.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import episodelake as el

PYTHON_SCALARS = (int, float, bool, str, type(None))

# The user's script (issue 20 item 1), run once on a schema built from the spaces alone and once on one that
# also declares seed and env_id.
RECORDER = """
import sys
import gymnasium as gym
import episodelake as el
from episodelake.integrations.gymnasium import RecordEpisodes

for path, declares in ((sys.argv[1], False), (sys.argv[2], True)):
    env = gym.make("CartPole-v1")
    meta = [el.FieldSpec("seed", (), "uint64", role="meta"), el.FieldSpec("env_id", (), "str", role="meta")]
    schema = el.schema_from_gym_spaces(env.observation_space, env.action_space, meta=meta if declares else ())
    env = RecordEpisodes(env, el.Dataset.create(schema, path))
    for seed in (0, 1, 2):
        obs, info = env.reset(seed=seed)
        t, done = 0, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(t % 2)
            t, done = t + 1, terminated or truncated
    env.close()
"""

READER = """
import json, sys
import episodelake as el

out = {}
for path in sys.argv[2:]:
    out[path] = []
    for ep in el.Dataset.open(path).episodes():
        seg = ep.read()
        out[path].append({
            "meta": ep.meta,  # json.dump fails on NumPy scalars
            "all_obs": seg.all_obs.tolist(), "action": seg.action.tolist(), "reward": seg.reward.tolist(),
            "terminated": ep.terminated, "truncated": ep.truncated,
        })
json.dump(out, open(sys.argv[1], "w"))
"""


def _cartpole(seed: int) -> dict:
    """Ground truth: CartPole run directly (no recorder) with the recorder script's seed and actions."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    rows, actions, rewards = [obs], [], []
    t, terminated, truncated = 0, False, False
    while not (terminated or truncated):
        obs, reward, terminated, truncated, _ = env.step(t % 2)
        rows.append(obs)
        actions.append(t % 2)
        rewards.append(reward)
        t += 1
    return {"all_obs": np.array(rows), "action": actions, "reward": rewards, "terminated": terminated}


def test_recorder_records_into_the_users_own_dataset(tmp_path):
    """Item 1: RecordEpisodes(env, Dataset.create(schema_from_gym_spaces(...))) records (a real recorder process,
    the datasets reopened by a fresh one), equal to CartPole run directly; seed/env_id recorded when declared."""
    plain, declared, dump = str(tmp_path / "plain"), str(tmp_path / "declared"), tmp_path / "episodes.json"
    rec = subprocess.run([sys.executable, "-c", RECORDER, plain, declared], capture_output=True, text=True)
    assert rec.returncode == 0, rec.stderr
    read = subprocess.run([sys.executable, "-c", READER, str(dump), plain, declared], capture_output=True, text=True)
    assert read.returncode == 0, read.stderr
    found = json.loads(dump.read_text())
    for path, declares in ((plain, False), (declared, True)):
        episodes = found[path]
        assert len(episodes) == 3
        for seed, ep in enumerate(episodes):
            want = _cartpole(seed)
            np.testing.assert_array_equal(np.array(ep["all_obs"], np.float32), want["all_obs"])
            assert ep["action"] == want["action"] and ep["reward"] == want["reward"]
            assert (ep["terminated"], ep["truncated"]) == (want["terminated"], not want["terminated"])
            assert ep["meta"] == ({"seed": seed, "env_id": "CartPole-v1"} if declares else {})


META_SCHEMA = el.DatasetSchema(
    [
        el.FieldSpec("observation", (4,), "float32"),
        el.FieldSpec("action", (), "int64", role="action"),
        el.FieldSpec("reward", (), "float64", role="reward"),
        el.FieldSpec("seed", (), "uint64", role="meta"),
        el.FieldSpec("small", (), "int8", role="meta"),
        el.FieldSpec("count", (), "uint32", role="meta"),
        el.FieldSpec("half", (), "float16", role="meta"),
        el.FieldSpec("score", (), "float32", role="meta"),
        el.FieldSpec("ok", (), "bool", role="meta"),
        el.FieldSpec("task", (), "str", role="meta"),
    ]
)
# What each episode is written with; the reference of what reads return is the value in the field's dtype.
META_WRITTEN = [
    {"seed": 0, "small": -128, "count": 2**32 - 1, "half": 0.1, "score": 0.1, "ok": True, "task": "pick"},
    {"seed": 2**64 - 1, "small": 127, "count": 0, "half": -65504.0, "score": 3.0e38, "ok": False, "task": ""},
    {"seed": 7, "small": None, "count": None, "half": None, "score": None, "ok": None, "task": None},
]


def _expected_meta(written: dict) -> dict:
    dtypes = {f.name: f.np_dtype for f in META_SCHEMA.meta_fields}
    return {k: v if v is None or isinstance(v, str) else np.asarray(v, dtypes[k]).item() for k, v in written.items()}


def _walk(value, path=""):
    """Every leaf of nested dicts/lists that is not a Python scalar (NumPy arrays of state excepted)."""
    if isinstance(value, dict):
        return [bad for k, v in value.items() for bad in _walk(v, f"{path}/{k}")]
    if isinstance(value, list | tuple):
        return [bad for i, v in enumerate(value) for bad in _walk(v, f"{path}[{i}]")]
    return [] if isinstance(value, (*PYTHON_SCALARS, np.ndarray)) else [(path, type(value).__name__)]


def test_meta_values_are_python_scalars(tmp_path):
    """Item 2: every public path handing meta to Python code gives int/float/bool/str/None, equal to what was
    written (in the field's dtype); gymnasium takes a stored seed; batches keep typed arrays."""
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(META_SCHEMA, path)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=META_WRITTEN[0]["seed"])
    w = ds.new_episode(obs, **{k: v for k, v in META_WRITTEN[0].items() if v is not None})
    w.add_step({"obs": obs, "action": 0, "reward": 1.0, "terminated": True})
    ds.flush()
    bulk = {"observations": np.zeros((6, 4), np.float32), "actions": np.zeros(4, np.int64), "rewards": np.zeros(4)}
    ds.append_episodes({**bulk, "meta": {k: [e[k] for e in META_WRITTEN[1:]] for k in META_WRITTEN[0]}}, lengths=[2, 2])
    ds.flush()
    expected = [_expected_meta(m) for m in META_WRITTEN]
    assert expected[0]["score"] == float(np.float32(0.1)) and expected[1]["seed"] == 2**64 - 1  # the reference

    # while writing: the writer's meta mapping
    held = ds.new_episode(obs, seed=5, score=0.25, ok=True)
    assert [type(held.meta[k]) for k in ("seed", "score", "ok")] == [int, float, bool]
    held.discard()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy conversion warnings on the way either
        for d in (ds, el.Dataset.open(path)):
            seen = []
            paths = {
                "episode(i).meta": [d.episode(i).meta for i in range(len(d))],
                "episodes()": [e.meta for e in d.episodes()],
                "episode(id=).meta": [d.episode(id=int(i)).meta for i in d.episode_ids],
                "where().episodes()": [e.meta for e in d.where("length > 0").episodes()],
                "read().meta": [dict(d.episode(i).read().meta) for i in range(len(d))],
                # (a segment item holds the fill value, not None, where unset: only episodes with every value)
                "segments()[i].meta": [dict(d.segments(el.Window(1, pad=None))[i].meta) for i in (0, 1)],
                "filter= argument": [],
            }
            d.sample_transitions(4, seed=0, filter=lambda ep, seen=seen: seen.append(ep.meta) or True)
            paths["filter= argument"] = sorted(seen, key=lambda m: m["seed"])
            for name, metas in paths.items():
                for got in metas:
                    bad = {k: type(v).__name__ for k, v in got.items() if type(v) not in PYTHON_SCALARS}
                    assert not bad, (name, bad)
                want = sorted(expected, key=lambda m: m["seed"]) if name == "filter= argument" else expected
                assert metas == want[: len(metas)], name
            # unset values read None; a float32 meta equals the float32 of what was written, exactly
            assert d.episode(2).meta["score"] is None and d.episode(1).meta["score"] == float(np.float32(3.0e38))
            # gymnasium refuses NumPy seeds ("Seed must be a python integer"): a stored seed must work
            again, _ = env.reset(seed=d.episode(0).meta["seed"])
            np.testing.assert_array_equal(again, obs)

    # batches keep typed arrays
    batch = ds.segment_stream(1, batch_size=4, seed=0).sample()
    assert batch.meta["seed"].dtype == np.uint64 and batch.meta["score"].dtype == np.float32
    # history and stream lineage hand Python values (and NumPy arrays of stream state) only
    assert _walk(ds.history()) == []
    stream = ds.where("seed >= ?", [0]).segment_stream(1, batch_size=2, seed=3)
    next(iter(stream))
    assert _walk(stream.state_dict()["lineage"]) == []


# ---------------------------------------------------------------- item 6

FLOAT_TARGETS = ("float16", "float32", "complex64")


def _fits(value: complex, dtype: str) -> bool:
    """Reference: NumPy's own cast keeps a finite value finite (a non-finite value is what it is)."""
    if not np.isfinite(value):
        return True
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.asarray(value).astype(dtype)))


def _float_schema(dtype: str) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("x", (2,), dtype),
            el.FieldSpec("action", (), dtype, role="action"),
            el.FieldSpec("reward", (), "float32", role="reward", finite=True),
            el.FieldSpec("m", (), dtype, role="meta"),
        ]
    )


def _refused(call, *wording) -> bool:
    """True if ``call`` raised ValidationError whose message holds every string of ``wording``; False if it passed."""
    try:
        call()
    except el.ValidationError as exc:
        for w in wording:
            assert w in str(exc), (w, str(exc))
        return True
    return False


F32_MAX = float(np.finfo(np.float32).max)
F32_EDGE = F32_MAX + 2.0**103  # max + half an ulp: rounds (ties to even) to inf
BOUNDARIES = [
    F32_MAX,
    float(np.nextafter(F32_MAX, np.inf)),  # above max, still rounds to max: a conversion that only rounds
    float(np.nextafter(F32_EDGE, 0)),
    F32_EDGE,
    -F32_EDGE,
    65504.0,
    65519.99,
    65520.0,
    1e40,
    -1e300,
    float("inf"),
    float("nan"),
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(allow_nan=True, allow_infinity=True, width=64), st.sampled_from(FLOAT_TARGETS))
@example(1e40, "float32")
@example(float("inf"), "float32")
def test_floats_that_do_not_fit_the_field_are_refused(value, dtype):
    """Item 6: a finite float64 that would become inf in the field's dtype is a ValidationError naming the field,
    the step (or episode and row) and the value, on add_step, the vector writer, bulk writes and meta; one that
    only rounds, and inf/NaN given as such, are stored as NumPy casts them. A finite=True field says "does not
    fit" for a finite input, and NaN/infinity only for a non-finite one."""
    for v in [value, *BOUNDARIES] if value == 1e40 else [value]:  # the boundaries once, with the first example
        _check_one_float(v, dtype)


def _check_one_float(v: float, dtype: str) -> None:
    given = complex(0.5, v) if dtype == "complex64" else v  # complex: the value is the imaginary part
    fits = _fits(given, dtype)
    shown = repr(given)
    ds = el.Dataset.create(_float_schema(dtype))
    zeros = np.zeros(2, dtype)
    stored = 0

    w = ds.new_episode(zeros)
    w.add_step({"obs": zeros, "action": 0, "reward": 0.0})

    def step(obs=zeros, action=0, reward=0.0):
        return lambda: w.add_step({"obs": obs, "action": action, "reward": reward})

    # per step (the step named is the one offered: w.length), as a float64 array row and as a Python scalar
    # on the one-field action role; and as meta
    assert _refused(step(obs=np.array([0.0, given])), f"step {w.length}", "'observation/x'", shown) != fits
    assert _refused(step(action=given), f"step {w.length}", "'action'", shown) != fits
    assert _refused(lambda: w.set_meta(m=given), f"step {w.length}", "'m'", shown) != fits
    if dtype != "complex64":
        # a finite=True field: overflow is "does not fit", only a non-finite input is "NaN or infinity"
        wording = (shown, "does not fit") if np.isfinite(v) else ("NaN or infinity",)
        refused = _refused(step(reward=v), f"step {w.length}", "'reward'", *wording)
        assert refused == (not np.isfinite(v) or not _fits(v, "float32"))
    w.add_step({"obs": zeros, "action": 0, "reward": 0.0, "terminated": True})
    stored += 1

    # the vector writer: env 1's row
    vw = ds.vector_writer(np.zeros((2, 2), dtype), 2)
    vrow = np.array([[0.0, 0.0], [given, 0.0]])
    call = lambda: vw.add_steps(vrow, np.zeros(2), np.zeros(2), [True, True], [False, False])  # noqa: E731
    if not _refused(call, "env 1", "step 0", "'observation/x'", shown):
        assert fits
        stored += 2
    else:
        assert not fits

    vw.close()

    # bulk: episode 1's observation row 0 (episode 0 holds rows 0..2: T + 1 observations)
    obs = np.zeros((6, 2), np.complex128 if dtype == "complex64" else np.float64)
    obs[3, 1] = given
    bulk = {"observations": obs, "actions": np.zeros(4), "rewards": np.zeros(4), "meta": {"m": [0.0, given]}}
    if not _refused(lambda: ds.append_episodes(bulk, lengths=[2, 2]), "episode 1", "'observation/x'", shown, "row 0"):
        assert fits
        stored += 2
    else:
        assert not fits
    # bulk, dict-form episodes: the second one's meta
    zero = {"observations": np.zeros((3, 2)), "actions": np.zeros(2), "rewards": np.zeros(2)}
    dicts = [{**zero, "meta": {"m": m}} for m in (0.0, given)]
    if not _refused(lambda: ds.append_episodes(dicts), "episode 1", "'m'", shown):
        assert fits
        stored += 2
    else:
        assert not fits
    ds.flush()
    assert len(ds) == stored  # a refused write stored nothing
    if fits:
        want = np.asarray(given).astype(dtype)
        np.testing.assert_array_equal(ds.episode(2).read().all_obs[1, 0], want)  # vector env 1
        np.testing.assert_array_equal(ds.episode(4).read().all_obs[0, 1], want)  # bulk episode 1, row 0
        for i in (4, 6):  # bulk columns, bulk dicts
            np.testing.assert_array_equal(np.asarray(ds.episode(i).meta["m"], dtype), want)


# ---------------------------------------------------------------- item 9


def _keyed_dataset(two: bool) -> tuple[el.Dataset, list[dict]]:
    fields = [el.FieldSpec("state", (3,), "float32")]
    if two:
        fields.append(el.FieldSpec("camera", (2, 2), "uint8", storage="tensor"))
    fields += [
        el.FieldSpec("action", (), "int64", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
        el.FieldSpec("task", (), "str", role="meta"),
    ]
    rng = np.random.default_rng(9)
    episodes = []
    for i, T in enumerate((6, 9, 4)):
        obs = {"state": rng.standard_normal((T + 1, 3), dtype=np.float32)}
        if two:
            obs["camera"] = rng.integers(0, 255, (T + 1, 2, 2), dtype=np.uint8)
        episodes.append(
            {
                "observations": obs,
                "actions": rng.integers(0, 9, T),
                "rewards": rng.standard_normal(T, dtype=np.float32),
                "meta": {"task": f"t{i}"},
            }
        )
    return el.Dataset.from_episodes(episodes, schema=el.DatasetSchema(fields)), episodes


def _wrong_keys(container, fields: list[str]) -> None:
    """A wrong key is a FieldKeyError (KeyError and EpisodeLakeError) naming the fields there are."""
    for call in (lambda: container.obs["nope"], lambda: container["observation/nope"]):
        with pytest.raises(el.FieldKeyError) as info:
            call()
        assert isinstance(info.value, KeyError) and isinstance(info.value, el.EpisodeLakeError)
        assert "'nope'" in str(info.value) and str(sorted(fields)) in str(info.value)
    with pytest.raises(el.FieldKeyError, match="observation/state"):
        container["nope"]


@pytest.mark.parametrize("two", [False, True], ids=["one-observation-field", "two-observation-fields"])
def test_fields_reachable_by_key_whatever_the_schema(two):
    """Item 9: seg["observation/state"], seg["observation"], seg.obs["state"] work on SegmentBatch, Segment,
    Transitions and trajectory batches for one- and two-field schemas, equal to the episodes written; one field
    still reads as an ndarray."""
    ds, episodes = _keyed_dataset(two)
    by_task = {ep["meta"]["task"]: ep for ep in episodes}
    fields = ["state", "camera"] if two else ["state"]

    def check_rows(got, ids, rows, key="state"):
        for b, (eid, r) in enumerate(zip(ids, rows, strict=True)):
            ep = by_task[ds.episode(id=int(eid)).meta["task"]]
            np.testing.assert_array_equal(got[b], ep["observations"][key][r])

    batch = ds.segment_stream(el.Window(3, pad=None), batch_size=5, seed=1).sample()
    single = ds.episode(1).read()
    item = ds.segments(el.Window(3, pad=None))[4]
    trajectories = next(iter(ds.trajectories(2, seed=0)))
    transitions = ds.sample_transitions(6, seed=2)
    for c in (batch, single, item, trajectories, transitions):
        if two:
            assert isinstance(c.obs, el.RoleView) and isinstance(c["observation"], el.RoleView)
        else:
            assert isinstance(c.obs, np.ndarray) and isinstance(c["observation"], np.ndarray)  # unchanged
            np.testing.assert_array_equal(c["observation"], c.obs)
        for view in ("obs", "next_obs"):
            np.testing.assert_array_equal(c[f"{view}/state"], getattr(c, view)["state"])
        np.testing.assert_array_equal(c["observation/state"], c.obs["state"])
        assert type(c.obs["state"]) is np.ndarray
        np.testing.assert_array_equal(c["action"], c.action)
        np.testing.assert_array_equal(c["meta/task"], np.asarray(c.meta["task"]))
        _wrong_keys(c, fields)

    # against the episodes written: slot t of item b is transition start[b] + t
    starts = batch.start[:, None] + np.arange(3)
    for t in range(3):
        check_rows(batch["observation/state"][:, t], batch.episode_id, starts[:, t])
        check_rows(batch["next_observation/state"][:, t], batch.episode_id, starts[:, t] + 1)
    check_rows(single["all_obs/state"], [single.episode_id] * (len(single) + 1), range(len(single) + 1))
    check_rows(item["obs/state"], [item.episode_id] * 3, item.start + np.arange(3))
    check_rows(transitions["observation/state"], transitions.episode_id, transitions.start)
    check_rows(transitions["next_obs/state"], transitions.episode_id, transitions.start + 1)
    if two:
        check_rows(transitions["observation/camera"], transitions.episode_id, transitions.start, "camera")
        assert batch["observation"]["camera"].shape == (5, 3, 2, 2)
    for b, eid in enumerate(trajectories.episode_id):
        T = int(trajectories.lengths[b])
        check_rows(trajectories["all_obs/state"][b, : T + 1], [eid] * (T + 1), range(T + 1))

    # a plain array type after map (torch): the key path still reaches the one field
    torch = pytest.importorskip("torch")
    from episodelake.integrations.torch import to_torch

    tb = to_torch(batch)
    assert isinstance(tb["observation/state"], torch.Tensor)
    np.testing.assert_array_equal(tb["observation/state"].numpy(), batch.obs["state"])
