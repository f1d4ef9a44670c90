# ruff: noqa: E501  (one table row per line reads best)
"""The bad-input matrix: every rejected input to the public write and read calls.

Each row is (name, call, exception type, message pattern). The call must raise
exactly that type with a message naming the field/step/index, and the dataset
directory must be byte-for-byte unchanged afterwards, also after a flush (so
nothing half-validated was left pending either).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el

from .reference import random_episode

T = 4  # steps of the episodes the rows below offer


def strict_schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (5,), "float32", finite=True),
            el.FieldSpec("camera", (3, 8, 8), "uint8", layout="CHW", storage="tensor", chunk_rows=16),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward", finite=True),
            el.FieldSpec("task", (), "str", role="meta"),
            el.FieldSpec("success", (), "bool", role="meta"),
        ]
    )


def tree_digest(root: str) -> dict[str, tuple[int, int, str]]:
    """Every file and directory under ``root``: (size, mtime_ns, sha256)."""
    out = {}
    for base, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(base, d), root) + "/"] = (0, 0, "")
        for f in files:
            full = os.path.join(base, f)
            st_ = os.stat(full)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, root)] = (st_.st_size, st_.st_mtime_ns, hashlib.sha256(fh.read()).hexdigest())
    return out


def ep(**changes) -> dict:
    """A valid dict-form episode with ``changes`` applied."""
    raw = random_episode(np.random.default_rng(3), T)
    d = raw.as_dict(unwrap_action=True)
    d["terminated"], d["truncated"] = True, False
    d.update(changes)
    return d


def init_obs(**changes) -> dict:
    obs = {"state": np.zeros(5, np.float32), "camera": np.zeros((3, 8, 8), np.uint8)}
    obs.update(changes)
    return {k: v for k, v in obs.items() if v is not None}


def step(**changes) -> dict:
    s = {"observations": init_obs(), "actions": 1, "rewards": 0.5, "terminated": False, "truncated": False}
    for k, v in changes.items():
        if k == "obs":
            s["observations"] = v
        elif v is None:
            s.pop(k)
        else:
            s[k] = v
    return s


def stepped(n: int, last: dict | None = None) -> Callable[[el.Dataset], object]:
    """A writer that takes ``n`` good steps, then ``last``."""

    def run(ds: el.Dataset):
        w = ds.new_episode(init_obs(), task="pick")
        for _ in range(n):
            w.add_step(step())
        return w.add_step(last) if last is not None else w.finish()

    return run


@dataclass
class Staged:
    """A case whose ``setup`` (valid writes, committed before the digest) precedes the rejected ``call``."""

    setup: Callable[[el.Dataset], object]
    call: Callable[[el.Dataset, object], object]


def ended_episode(ds: el.Dataset) -> el.EpisodeWriter:
    w = ds.new_episode(init_obs(), task="pick")
    w.add_step(step(terminated=True))
    ds.flush()
    return w


ended_then_step = Staged(ended_episode, lambda ds, state: state.add_step(step()))
ended_then_finish = Staged(ended_episode, lambda ds, state: state.finish())


NAN = np.float32("nan")
BAD_STATE = np.array([0, 0, np.inf, 0, 0], np.float32)

CASES: list[tuple[str, Callable[[el.Dataset], object], type[Exception], str]] = [
    # new_episode: the reset observation and meta
    ("init missing field", lambda ds: ds.new_episode(init_obs(camera=None)), el.ValidationError, r"missing observation.*camera"),
    ("init unknown field", lambda ds: ds.new_episode(init_obs(depth=np.zeros(3))), el.ValidationError, r"unknown observation.*depth"),
    ("init wrong shape", lambda ds: ds.new_episode(init_obs(state=np.zeros(4))), el.ValidationError, r"'observation/state' has shape \(4,\)"),
    ("init wrong dtype", lambda ds: ds.new_episode(init_obs(camera=np.zeros((3, 8, 8)))), el.ValidationError, r"'observation/camera' has dtype float64"),
    ("init out of range", lambda ds: ds.new_episode(init_obs(camera=np.full((3, 8, 8), 300))), el.ValidationError, r"'observation/camera' values .* do not fit uint8"),
    ("init infinity", lambda ds: ds.new_episode(init_obs(state=BAD_STATE)), el.ValidationError, r"'observation/state' has NaN or infinity"),
    ("init not a dict", lambda ds: ds.new_episode(np.zeros(5)), el.ValidationError, r"observation must be a dict"),
    ("meta unknown", lambda ds: ds.new_episode(init_obs(), operator="bob"), el.ValidationError, r"unknown meta field\(s\) \['operator'\]"),
    ("meta wrong type", lambda ds: ds.new_episode(init_obs(), task=5), el.ValidationError, r"meta field 'task' must be str"),
    ("meta oversize string", lambda ds: ds.new_episode(init_obs(), task="x" * 5000), el.ValidationError, r"meta field 'task' is longer than 4096"),
    ("meta bool from str", lambda ds: ds.new_episode(init_obs(), success="yes"), el.ValidationError, r"'success' has dtype"),
    # add_step
    ("step missing action", stepped(0, step(actions=None)), el.ValidationError, r"step 0: missing action"),
    ("step unknown key", stepped(1, {**step(), "foo": 1}), el.ValidationError, r"step 1: unknown key 'foo'"),
    ("step role twice", stepped(0, {**step(), "obs": init_obs()}), el.ValidationError, r"step 0: observation given twice"),
    ("step action shape", stepped(2, step(actions=[1, 2])), el.ValidationError, r"step 2: field 'action' has shape \(2,\)"),
    ("step action dtype", stepped(0, step(actions=1.5)), el.ValidationError, r"step 0: field 'action' has dtype float64"),
    ("step reward NaN", stepped(1, step(rewards=NAN)), el.ValidationError, r"step 1: field 'reward' has NaN"),
    ("step reward inf", stepped(0, step(rewards=np.inf)), el.ValidationError, r"step 0: field 'reward' has NaN or infinity"),
    ("step obs inf", stepped(3, step(obs=init_obs(state=BAD_STATE))), el.ValidationError, r"step 3: field 'observation/state' has NaN"),
    ("step obs missing", stepped(0, step(obs=init_obs(state=None))), el.ValidationError, r"step 0: missing observation field\(s\) \['state'\]"),
    ("step both flags", stepped(1, step(terminated=True, truncated=True)), el.ValidationError, r"step 1: terminated and truncated are both set"),
    ("step flag not bool", stepped(0, step(terminated=2)), el.ValidationError, r"step 0: terminated must be a bool"),
    ("step flag array", stepped(0, step(truncated=[True])), el.ValidationError, r"step 0: truncated must be a scalar bool"),
    ("step after the end", ended_then_step, el.EpisodeStateError, r"step 1: the episode already ended"),
    ("finish after the end", ended_then_finish, el.EpisodeStateError, r"the episode already ended"),
    ("empty episode", stepped(0), el.ValidationError, r"at least one step"),
    # append_episodes (dict form)
    ("episode no steps", lambda ds: ds.append_episodes([ep(actions=np.zeros(0, np.int64))]), el.ValidationError, r"episode 0: an episode needs at least one step"),
    ("episode missing rewards", lambda ds: ds.append_episodes([{k: v for k, v in ep().items() if k != "rewards"}]), el.ValidationError, r"episode 0: missing rewards"),
    ("episode unknown key", lambda ds: ds.append_episodes([ep(infos={})]), el.ValidationError, r"episode 0: unknown key\(s\) \['infos'\]"),
    ("episode rewards length", lambda ds: ds.append_episodes([ep(rewards=np.zeros(T + 1, np.float32))]), el.ValidationError, r"episode 0 rewards: field 'reward' has shape \(5,\), expected \(4,\)"),
    ("episode obs length", lambda ds: ds.append_episodes([ep(observations=init_obs())]), el.ValidationError, r"episode 0 observations: field 'observation/\w+' has shape"),
    ("episode early flag", lambda ds: ds.append_episodes([ep(terminated=np.array([0, 1, 0, 0], bool))]), el.ValidationError, r"episode 0: terminated is set at step 1 before the last step"),
    ("episode both flags", lambda ds: ds.append_episodes([ep(truncated=True)]), el.ValidationError, r"episode 0: terminated and truncated are both set"),
    ("episode NaN reward", lambda ds: ds.append_episodes([ep(rewards=np.array([0, NAN, 0, 0], np.float32))]), el.ValidationError, r"episode 0 rewards: field 'reward' has NaN or infinity \(first at row 1\)"),
    ("episode meta unknown", lambda ds: ds.append_episodes([ep(meta={"who": "x"})]), el.ValidationError, r"episode 0: unknown meta field"),
    ("batch good then bad", lambda ds: ds.append_episodes([ep(), ep(), ep(truncated=True)]), el.ValidationError, r"episode 2: terminated and truncated"),
    ("validate_episode", lambda ds: ds.validate_episode(ep(actions=np.zeros((T, 2), np.int64))), el.ValidationError, r"field 'action' has shape \(4, 2\)"),
    # vector writer
    ("vector bad mode", lambda ds: ds.vector_writer(init_obs(), 2, autoreset_mode="sometimes"), el.ValidationError, r"autoreset_mode must be"),
    ("vector bad env row", lambda ds: ds.vector_writer({"state": np.zeros((2, 5), np.float32), "camera": np.zeros((2, 3, 8, 8), np.uint8)}, 2).add_steps(
        {"state": np.zeros((2, 5), np.float32), "camera": np.zeros((2, 3, 8, 8), np.uint8)}, np.array([[1], [1]]), np.zeros(2), [False, False], [False, False]),
     el.ValidationError, r"env 0, step 0: field 'action' has shape \(1,\)"),
    # schemas and field names
    ("field name ..", lambda ds: el.FieldSpec(".."), el.SchemaError, r"invalid field name '\.\.'"),
    ("field name escapes", lambda ds: el.FieldSpec("a/../b"), el.SchemaError, r"invalid field name 'a/\.\./b'"),
    ("field name absolute", lambda ds: el.FieldSpec("/etc/passwd"), el.SchemaError, r"invalid field name '/etc/passwd'"),
    ("field name backslash", lambda ds: el.FieldSpec("a\\b"), el.SchemaError, r"invalid field name"),
    ("field name empty", lambda ds: el.FieldSpec(""), el.SchemaError, r"non-empty string"),
    ("field shape negative", lambda ds: el.FieldSpec("x", (-1,)), el.SchemaError, r"field 'x': shape \(-1,\) must be positive"),
    ("field str per step", lambda ds: el.FieldSpec("x", (), "str"), el.SchemaError, r"field 'x': str dtype"),
    ("field object dtype", lambda ds: el.FieldSpec("x", (), object), el.SchemaError, r"unsupported dtype"),
    ("meta reserved name", lambda ds: el.DatasetSchema([*strict_schema().fields, el.FieldSpec("length", (), "int64", role="meta")]), el.SchemaError, r"'length' is reserved"),
    ("create over existing", lambda ds: el.Dataset.create(strict_schema(), ds.location.url), FileExistsError, r"already exists"),
    ("create partition by step field", lambda ds: el.Dataset.create(strict_schema(), ds.location.url + "-2", partition_by=["reward"]), el.SchemaError, r"partition_by 'reward'"),
    ("create with a non-schema", lambda ds: el.Dataset.create({"a": 1}, ds.location.url), el.SchemaError, r"must be a DatasetSchema"),
    # reads: indices, ranges, ids, versions, locations
    ("episode index too large", lambda ds: ds.episode(2), IndexError, r"episode index 2 out of range for 2"),
    ("episode index too negative", lambda ds: ds.episode(-3), IndexError, r"episode index -3 out of range"),
    ("episode index float", lambda ds: ds.episode(1.0), TypeError, r"must be an int, got float"),
    ("episode index bool", lambda ds: ds.episode(True), TypeError, r"must be an int, got bool"),
    ("read negative start", lambda ds: ds.episode(0).read(-1), IndexError, r"range \[-1, \d+\)"),
    ("read past the end", lambda ds: ds.episode(0).read(0, 99), IndexError, r"range \[0, 99\) outside"),
    ("read empty range", lambda ds: ds.episode(0).read(2, 2), IndexError, r"range \[2, 2\)"),
    ("unknown episode id", lambda ds: ds.episode_by_id(12345), KeyError, r"no episode with id 12345"),
    ("unknown version", lambda ds: el.Dataset.open(ds.location.url, version=99), el.ValidationError, r"version 99 does not exist"),
    ("negative version", lambda ds: el.Dataset.open(ds.location.url, version=-1), el.ValidationError, r"non-negative int, got -1"),
    ("version as str", lambda ds: el.Dataset.open(ds.location.url, version="1"), el.ValidationError, r"non-negative int, got '1'"),
    ("open missing dataset", lambda ds: el.Dataset.open(ds.location.url + "-missing"), el.DatasetNotFoundError, r"no episodelake dataset at .*-missing"),
    ("open unknown option", lambda ds: el.Dataset.open(ds.location.url, commit_every=3), el.ValidationError, r"unknown option\(s\) \['commit_every'\]"),
    ("open unsupported URL", lambda ds: el.Dataset.open("ftp://host/x"), el.LocationError, r"unsupported location 'ftp://host/x'"),
    # writes through read-only handles, maintenance arguments
    ("write read-only", lambda ds: el.Dataset.open(ds.location.url, read_only=True).new_episode(init_obs()), el.ReadOnlyError, r"read-only"),
    ("write past version", lambda ds: el.Dataset.open(ds.location.url, version=1).append_episodes([ep()]), el.ReadOnlyError, r"read-only"),
    ("compact read-only", lambda ds: el.Dataset.open(ds.location.url, read_only=True).compact(), el.ReadOnlyError, r"read-only"),
    ("vacuum read-only", lambda ds: el.Dataset.open(ds.location.url, read_only=True).vacuum(), el.ReadOnlyError, r"read-only"),
    ("vacuum negative retention", lambda ds: ds.vacuum(retention_hours=-1), el.ValidationError, r"retention_hours must be >= 0"),
]  # fmt: skip


@pytest.fixture
def populated(tmp_path):
    ds = el.Dataset.create(strict_schema(), str(tmp_path / "ds"), partition_by=["task"])
    ds.append_episodes([ep(), ep()])
    ds.flush()
    return ds


@pytest.mark.parametrize(("name", "call", "exc", "pattern"), CASES, ids=[c[0] for c in CASES])
def test_rejected_input_changes_nothing(populated, name, call, exc, pattern):
    root = populated.location.path
    if isinstance(call, Staged):
        state = call.setup(populated)
        call = partial(call.call, state=state)
    count = len(el.Dataset.open(root))
    before = tree_digest(root)
    with pytest.raises(exc, match=pattern) as info:
        call(populated)
    assert type(info.value) is exc or exc in (IndexError, KeyError, TypeError, FileExistsError)
    populated.flush()  # nothing of the rejected call may be pending either
    assert tree_digest(root) == before
    assert len(el.Dataset.open(root)) == count


def test_matrix_covers_every_public_call():
    assert len(CASES) >= 65


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shape=st.lists(st.integers(1, 6), max_size=3).map(tuple).filter(lambda s: s != (5,)),
    good_steps=st.integers(0, 3),
    dtype=st.sampled_from(["float32", "float64", "int16", "uint8"]),
)
def test_random_wrong_state_shapes(populated, shape, good_steps, dtype):
    """Any state shape but (5,) is rejected at the step it arrives, naming field and step."""
    root = populated.location.path
    before = tree_digest(root)
    bad = step(obs=init_obs(state=np.zeros(shape, dtype)))
    with pytest.raises(el.ValidationError, match=rf"step {good_steps}: field 'observation/state' has shape"):
        stepped(good_steps, bad)(populated)
    populated.flush()
    assert tree_digest(root) == before
