"""episodata's spellings (issue 41): each accepted one is its option-object form, bit for bit; the rest are refused.

(a) A table maps every accepted episodata sampling spelling to the option
objects (``el.Window``, ``el.Sequential()``, ...); both calls, same seed,
give identical batches (every buffer, masks and flags) and identical
``state_dict()``s, on a Dataset, a DatasetView and an ``el.concat`` view.
(b) ``backend=`` maps to in-memory and on-disk datasets. (c) Every refused
spelling raises an EpisodeLakeError naming what to write instead. (d) The
data-model rules of the seed: action-in/action-out boundaries, infos paired
with ``initial_info``/``final_info`` and never synthesized.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core.spellings import REFUSED

LENGTHS = [3, 9, 14, 6, 20, 2, 11]
EPISODATA_ONLY = sorted(k.split(".", 1)[1] for k in REFUSED if k.startswith("episodelake."))


def raw(T: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "initial_observation": rng.standard_normal(3).astype(np.float32),
        "observations": rng.standard_normal((T, 3)).astype(np.float32),
        "actions": rng.integers(0, 4, T).astype(np.int64),
        "rewards": rng.standard_normal(T).astype(np.float32),
        "terminated": bool(T % 2),
        "truncated": not T % 2,
    }


@pytest.fixture(scope="module")
def ds() -> el.Dataset:
    return el.Dataset.from_episodes([raw(T, i) for i, T in enumerate(LENGTHS)])


class MySampler:
    """The seed README's custom sampler: flat indices into the segment index."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def sample(self, index: Any, batch_size: int) -> np.ndarray:
        return self.rng.integers(len(index), size=batch_size)


def terminated(episode: Any) -> bool:
    return bool(episode.terminated)


# episodata spelling -> (window, keywords) written with option objects; both keep `seed`, `batch_size`
STREAM = [
    ({"sequence_length": 5}, 5, {}),
    ({"sequence_length": 5}, el.Window(5), {}),
    ({"sequence_length": 5, "pad": "suffix"}, el.Window(5, pad="suffix"), {}),
    ({"sequence_length": 5, "pad": "prefix"}, el.Window(5, pad="prefix"), {}),
    ({"sequence_length": 5, "pad": None}, el.Window(5, pad=None), {}),
    ({"context_length": 2, "target_length": 4}, el.Window(context=2, target=4), {}),
    ({"context_length": 2, "target_length": 4, "pad": "prefix"}, el.Window(context=2, target=4, pad="prefix"), {}),
    ({"sequence_length": 5, "shuffle": True}, 5, {}),
    ({"sequence_length": 5, "shuffle": True}, 5, {"sampler": el.Uniform()}),
    ({"sequence_length": 5, "shuffle": False}, 5, {"sampler": el.Sequential()}),
    ({"sequence_length": 5, "fields": None, "read_chunk_size": 4096}, 5, {}),
    ({}, el.Window(1), {}),
    ({"pad": None}, el.Window(1, pad=None), {}),
    ({"sequence_length": 5, "filter": terminated}, 5, {"filter": terminated}),
]
SEGMENTS = [
    ({"sequence_length": 5}, 5),
    ({"sequence_length": 5, "pad": "prefix"}, el.Window(5, pad="prefix")),
    ({"sequence_length": 5, "pad": None, "fields": None}, el.Window(5, pad=None)),
    ({"context_length": 3, "target_length": 2}, el.Window(context=3, target=2)),
    ({}, el.Window(1)),
]


def buffers(batch: Any) -> dict[str, Any]:
    """Every underlying buffer of a segment batch (a method) or of transitions (a dict)."""
    return batch.buffers() if callable(batch.buffers) else batch.buffers


def assert_same_batch(a: Any, b: Any) -> None:
    """Every buffer (fields, flags, mask, meta), item ids and the context split identical."""
    bufs_a, bufs_b = buffers(a), buffers(b)
    assert sorted(bufs_a) == sorted(bufs_b)
    for key in bufs_a:
        assert np.array_equal(bufs_a[key], bufs_b[key]), key
        assert np.asarray(bufs_a[key]).dtype == np.asarray(bufs_b[key]).dtype, key
    for name in ("episode_id", "start", "context_length"):
        assert np.array_equal(getattr(a, name, None), getattr(b, name, None)), name


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert json.dumps(a, sort_keys=True, default=repr) == json.dumps(b, sort_keys=True, default=repr)


def stream_pair(collection: Any, spelled: dict, window: Any, options: dict, seed: int, batch_size: int = 4):
    spelled = dict(spelled)
    objects = dict(options)
    if "filter" in spelled:  # a keyword both APIs spell the same
        objects["filter"] = spelled["filter"]
    if spelled.pop("sampler_factory", None):
        spelled["sampler"], objects["sampler"] = MySampler(seed), MySampler(seed)
    a = collection.segment_stream(batch_size=batch_size, seed=seed, prefetch=0, **spelled)
    b = collection.segment_stream(window, batch_size=batch_size, seed=seed, prefetch=0, **objects)
    return a, b


def draw_both(a: Any, b: Any, n: int = 3) -> None:
    assert_same_state(a.state_dict(), b.state_dict())
    for _ in range(n):
        try:
            x = a.sample()
        except StopIteration:  # a finite pass ended: the other ends there too
            with pytest.raises(StopIteration):
                b.sample()
            break
        assert_same_batch(x, b.sample())
        assert_same_state(a.state_dict(), b.state_dict())


@pytest.mark.parametrize(("spelled", "window", "options"), STREAM)
def test_each_stream_spelling_is_its_option_objects(ds, spelled, window, options):
    a, b = stream_pair(ds, spelled, window, options, seed=3)
    draw_both(a, b)
    # a state of one loads into the other
    b.load_state_dict(a.state_dict())


def test_the_custom_sampler_spelling_passes_through(ds):
    a, b = stream_pair(ds, {"sequence_length": 5, "sampler_factory": True}, 5, {}, seed=5)
    draw_both(a, b)


def test_a_view_takes_the_spellings(ds):
    view = ds.where("length > 5")
    for spelled, window, options in STREAM[:7]:
        draw_both(*stream_pair(view, spelled, window, options, seed=1))


@pytest.mark.parametrize(
    ("spelled", "window"),
    [
        ({"sequence_length": 4}, 4),
        ({"context_length": 2, "target_length": 2, "pad": None}, el.Window(context=2, target=2, pad=None)),
    ],
)
def test_a_concat_view_takes_the_spellings(ds, spelled, window):
    both = el.concat([ds, ds.where("length > 8")], weights=[1, 2])
    a = both.segment_stream(batch_size=6, seed=4, **spelled)
    b = both.segment_stream(window, batch_size=6, seed=4)
    for _ in range(3):
        x, y = a.sample(), b.sample()
        assert_same_batch(x, y)
        assert np.array_equal(x.source, y.source)
        assert_same_state(a.state_dict(), b.state_dict())
    assert_same_batch(both.sample_transitions(16, seed=2, fields=None), both.sample_transitions(16, seed=2))


def test_a_finite_pass_spelled_shuffle_false_is_the_sequential_pass(ds):
    a = list(ds.segment_stream(sequence_length=5, batch_size=8, shuffle=False, prefetch=0))
    b = list(ds.segment_stream(5, batch_size=8, sampler=el.Sequential(), prefetch=0))
    assert len(a) == len(b) > 1
    for x, y in zip(a, b, strict=True):
        assert_same_batch(x, y)


@pytest.mark.parametrize(("spelled", "window"), SEGMENTS)
def test_each_segments_spelling_is_its_window(ds, spelled, window):
    a, b = ds.segments(**spelled), ds.segments(window)
    assert len(a) == len(b) > 0
    ids = list(range(len(a)))
    assert_same_batch(a.__getitems__(ids), b.__getitems__(ids))
    assert_same_batch(a[len(a) - 1], b[len(b) - 1])


def test_sample_transitions_takes_fields_none(ds):
    assert_same_batch(ds.sample_transitions(32, seed=9, fields=None), ds.sample_transitions(32, seed=9))
    view = ds.where("length > 5")
    assert np.array_equal(
        view.sample_transitions(8, seed=1, filter=terminated, fields=None).obs,
        view.sample_transitions(8, seed=1, filter=terminated).obs,
    )


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(1, 24),
    context=st.integers(0, 6),
    pad=st.sampled_from(["suffix", "prefix", None]),
    shuffle=st.booleans(),
    batch_size=st.integers(1, 9),
)
def test_any_spelling_draws_what_its_objects_draw(ds, seed, length, context, pad, shuffle, batch_size):
    if pad is None and length > max(LENGTHS):
        length = max(LENGTHS)  # some segment must exist
    if context and context < length:
        spelled: dict[str, Any] = {"context_length": context, "target_length": length - context, "pad": pad}
        window = el.Window(context=context, target=length - context, pad=pad)
    else:
        spelled, window = {"sequence_length": length, "pad": pad}, el.Window(length, pad=pad)
    options = {} if shuffle else {"sampler": el.Sequential()}
    a, b = stream_pair(ds, {**spelled, "shuffle": shuffle}, window, options, seed, batch_size)
    draw_both(a, b, n=2)


# ---- (b) backend=
def test_backend_memory_and_zarr(tmp_path, ds):
    schema = ds.schema
    assert el.Dataset.create(schema, backend="memory").location.url.startswith("memory://")
    named = el.Dataset.create(schema, "scratch", backend="memory")
    assert named.location.url == "memory://scratch"
    disk = el.Dataset.create(schema, str(tmp_path / "z"), backend="zarr")
    assert not disk.location.ephemeral and (tmp_path / "z" / "episodelake.json").is_file()
    assert len(el.Dataset.open(str(tmp_path / "z"), backend="zarr")) == 0
    copied = ds.copy_to(str(tmp_path / "c"), backend="zarr")
    assert len(copied) == len(ds) and (tmp_path / "c" / "episodelake.json").is_file()
    assert ds.copy_to("copy", backend="memory").location.url == "memory://copy"
    made = el.Dataset.from_episodes([raw(4)], schema, backend="memory")  # episodata's order: episodes, schema
    assert made.schema.fields == schema.fields and made.location.ephemeral
    on_disk = el.Dataset.from_episodes([raw(4)], path=str(tmp_path / "f"), backend="zarr")
    assert len(el.Dataset.open(str(tmp_path / "f"))) == 1 and not on_disk.location.ephemeral


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ds, tmp: el.Dataset.create(ds.schema, str(tmp / "n"), backend="npz_directory"), "'memory'.*'zarr'"),
        (lambda ds, tmp: el.Dataset.create(ds.schema, backend="zarr"), "give path="),
        (lambda ds, tmp: el.Dataset.open(str(tmp), backend="lmdb"), "backend='lmdb' is not available"),
        (lambda ds, tmp: ds.copy_to(None, backend="zarr"), "give path="),
        (lambda ds, tmp: ds.copy_to("memory://x", backend="zarr"), "needs a path on disk"),
        (lambda ds, tmp: el.Dataset.from_episodes([raw(3)], backend="npz_directory"), "importers.episodata.load"),
        (lambda ds, tmp: el.Dataset.create(ds.schema, str(tmp / "b"), chunk_bytes=1 << 20), r"FieldSpec\(chunk_rows="),
        (lambda ds, tmp: el.Dataset.from_episodes([raw(3)], shard_bytes=1 << 30), r"\['shard_bytes'\]"),
        (lambda ds, tmp: ds.copy_to(str(tmp / "c"), backend="zarr", chunk_bytes=1), r"copy_to\(chunk_rows=\)"),
    ],
)
def test_other_backends_are_refused_naming_the_accepted_ones(ds, tmp_path, call, message):
    with pytest.raises(el.ArgumentError, match=message):
        call(ds, tmp_path)


def test_an_episodata_dataset_is_named_with_its_import(tmp_path):
    episodata = pytest.importorskip("episodata")
    src = str(tmp_path / "old")
    episodata.Dataset.from_episodes([raw(5)], path=src)
    with pytest.raises(el.DatasetNotFoundError, match=r"episodata dataset .*importers\.episodata\.load"):
        el.Dataset.open(src)
    from episodelake.importers.episodata import load

    assert len(load(src, str(tmp_path / "new"), progress=False)) == 1


# ---- (c) refused spellings
@pytest.mark.parametrize(
    ("spelled", "message"),
    [
        ({"sequence_length": 5, "window": 5}, r"window is given twice"),
        ({"sequence_length": 5, "target_length": 3}, r"give sequence_length=N, or context_length=C"),
        ({"context_length": 2}, r"needs target_length="),
        ({"target_length": 3}, r"write sequence_length=3"),
        ({"context_length": 0, "target_length": 3}, r"write sequence_length=3"),
        ({"sequence_length": 5, "fields": ["observation"]}, r"drop fields="),
        ({"sequence_length": 5, "shuffle": False, "sampler": el.Uniform()}, r"sampler=el\.Sequential\(\) is shuffle"),
        ({"sequence_length": 5, "shuffle": "no"}, r"shuffle must be a bool"),
        ({"sequence_length": 5, "read_chunk_size": 0}, r"read_chunk_size must be a positive int"),
        ({"sequence_len": 5}, r"unexpected keyword.*'sequence_len'.*'sequence_length'"),
    ],
)
def test_stream_spellings_that_cannot_mean_the_same_are_refused(ds, spelled, message):
    spelled = dict(spelled)
    window = spelled.pop("window", None)
    with pytest.raises(el.ArgumentError, match=message):
        ds.segment_stream(window, batch_size=2, **spelled)


def test_other_methods_refuse_what_they_do_not_take(ds):
    with pytest.raises(el.ArgumentError, match=r"segments\(\) got unexpected keyword.*'shuffle'"):
        ds.segments(sequence_length=4, shuffle=False)
    with pytest.raises(el.ArgumentError, match=r"sample_transitions\(\) got unexpected.*'sequence_length'"):
        ds.sample_transitions(4, sequence_length=3)
    with pytest.raises(el.ArgumentError, match=r"drop fields="):
        ds.sample_transitions(4, fields=["action"])
    with pytest.raises(el.ArgumentError, match=r"it takes el\.Uniform\(\), el\.Weighted"):
        el.concat([ds, ds]).segment_stream(sequence_length=3, shuffle=False)


@pytest.mark.parametrize(
    ("call", "owner", "name"),
    [
        (lambda ds: ds.resume_episode(0), "Dataset", "resume_episode"),
        (lambda ds: ds.add_episode(raw(3)), "Dataset", "add_episode"),
        (lambda ds: ds.add_step(0, {}), "Dataset", "add_step"),
        (lambda ds: ds.add_steps(0, {}), "Dataset", "add_steps"),
        (lambda ds: ds.end_episode(0, truncated=True), "Dataset", "end_episode"),
        (lambda ds: ds.num_episodes, "Dataset", "num_episodes"),
        (lambda ds: ds.backend, "Dataset", "backend"),
        (lambda ds: ds.episode(0).id, "EpisodeRef", "id"),
        (lambda ds: ds.episode(0).segment(0, 2), "EpisodeRef", "segment"),
        (lambda ds: ds.episode(0).step(1), "EpisodeRef", "step"),
        (lambda ds: ds.episode(0).ongoing, "EpisodeRef", "ongoing"),
        (lambda ds: ds.episode(0).writer(), "EpisodeRef", "writer"),
        (lambda ds: ds.episode(0).read().info, "Segment", "info"),
        (lambda ds: ds.episode(0).read().next_infos, "Segment", "next_infos"),
        (lambda ds: ds.segment_stream(2, batch_size=2, seed=0).sample().all_infos, "Segment", "all_infos"),
        (lambda ds: ds.episode(0).read().select(["action"]), "Segment", "select"),
        (lambda ds: ds.schema.field("action"), "DatasetSchema", "field"),
        (lambda ds: ds.schema.field_keys("observation"), "DatasetSchema", "field_keys"),
        (lambda ds: ds.schema.resolve_fields(["action"]), "DatasetSchema", "resolve_fields"),
        (lambda ds: ds.schema.validate_fields({}), "DatasetSchema", "validate_fields"),
        (lambda ds: ds.schema.to_dict(), "DatasetSchema", "to_dict"),
        (lambda ds: el.DatasetSchema.from_dict({}), "DatasetSchema", "from_dict"),
        (lambda ds: ds.vector_writer(np.zeros((2, 3), np.float32), 2).reset(None), "VectorEpisodeWriter", "reset"),
        (lambda ds: ds.vector_writer(np.zeros((2, 3), np.float32), 2).step(None), "VectorEpisodeWriter", "step"),
        (lambda ds: ds.segment_stream(2, batch_size=2).sample_transitions(), "SegmentStream", "sample_transitions"),
        (lambda ds: ds.segment_stream(2, batch_size=2).segment_length, "SegmentStream", "segment_length"),
        (lambda ds: ds.segment_stream(2, batch_size=2).read_chunk_size, "SegmentStream", "read_chunk_size"),
        (lambda ds: ds.segments(2).fetch([0, 1]), "SegmentDataset", "fetch"),
        (lambda ds: ds.segments(2).refresh(), "SegmentDataset", "refresh"),
        (lambda ds: ds.segments(2).segment_length, "SegmentDataset", "segment_length"),
        *[(lambda ds, n=name: getattr(el, n), "episodelake", name) for name in EPISODATA_ONLY],
    ],
)
def test_episodata_names_without_a_counterpart_say_what_to_write(ds, call, owner, name):
    with pytest.raises(el.ArgumentError) as caught:
        call(ds)
    assert str(caught.value) == (
        f"{owner}.{name} is episodata's spelling, which episodelake does not take; write {REFUSED[f'{owner}.{name}']}"
    )


def test_from_episodata_import_names_what_to_write():
    with pytest.raises(el.ArgumentError, match=r"^episodelake\.ActionOutWriter is episodata's spelling"):
        from episodelake import ActionOutWriter  # noqa: F401
    from episodelake import utils

    assert utils.__name__ == "episodelake.utils"  # submodules still import through the module's __getattr__


@pytest.mark.parametrize(
    ("options", "instead"),
    [
        ({"key": "x"}, r"FieldSpec\(name, \.\.\.\)"),
        ({"low": 0.0}, r"min= \(a quality constraint"),
        ({"high": 1.0}, r"max= \(a quality constraint"),
        ({"optional": True}, r"default=value"),
    ],
)
def test_fieldspec_options_of_episodata_name_what_to_write(options, instead):
    name = () if "key" in options else ("x",)
    with pytest.raises(
        el.ArgumentError, match=rf"^FieldSpec\({next(iter(options))}=\.\.\.\) is episodata's.*{instead}"
    ):
        el.FieldSpec(*name, shape=(2,), dtype="float32", **options)


def test_fieldspec_role_info_names_extra_and_specs_still_copy():
    with pytest.raises(el.SchemaError, match=r"episodata's role 'info' is role='extra'"):
        el.FieldSpec("success", (), "float32", role="info")
    spec = el.FieldSpec("x", (2,), "float32", layout=None, min=0.0)
    import copy
    import dataclasses
    import pickle

    assert pickle.loads(pickle.dumps(spec)) == spec == copy.deepcopy(spec)
    assert dataclasses.replace(spec, name="y").name == "y"


def test_schema_infer_and_read_fields_none(ds):
    ep = action_out(5)
    assert (
        el.DatasetSchema.infer(ep).fields
        == el.infer_schema({k: v for k, v in raw(5).items() if k not in ("terminated", "truncated")}).fields
    )
    assert el.DatasetSchema.infer(raw(4), alignment="action_in").fields == ds.schema.fields
    assert np.array_equal(ds.episode(1).read(fields=None).obs, ds.episode(1).read().obs)
    with pytest.raises(el.ArgumentError, match=r"read: fields=\['action'\] is not taken"):
        ds.episode(1).read(fields=["action"])
    for call in (lambda: ds.vector_writer(), lambda: ds.vector_writer(num_envs=2)):
        with pytest.raises(el.ArgumentError, match=r"ds\.vector_writer\(obs, num_envs\)"):
            call()


def test_any_other_missing_attribute_is_still_an_attribute_error(ds):
    assert not hasattr(ds, "no_such_thing") and not hasattr(ds.episode(0), "no_such_thing")
    assert not hasattr(ds.episode(0).read(), "no_such_thing") and not hasattr(el, "no_such_thing")
    assert getattr(ds, "refresh_later", None) is None


def test_writer_spellings(ds):
    fresh = el.Dataset.create(ds.schema)
    obs = np.zeros(3, np.float32)
    writer = fresh.new_episode(observations=obs, infos={})  # episodata's keywords
    for name, call in [
        ("end", lambda: writer.end(truncated=True)),
        ("add_steps", lambda: writer.add_steps({})),
        ("episode_id", lambda: writer.episode_id),
    ]:
        with pytest.raises(el.ArgumentError, match=rf"^EpisodeWriter\.{name} is episodata's spelling"):
            call()
    writer.add_step({"observations": obs + 1, "actions": 1, "rewards": 0.5, "terminated": True})
    fresh.new_episode(obs, {"seed": 3}).add_step(  # a reset's info: taken, not stored
        {"observations": obs, "actions": 2, "rewards": 1.0, "truncated": True}
    )
    assert len(fresh) == 2 and fresh.episode(0).terminated and fresh.episode(1).truncated
    with pytest.raises(el.ArgumentError, match=r"new_episode needs the reset observation"):
        fresh.new_episode()
    with pytest.raises(el.ArgumentError, match=r"infos must be the reset's info dict"):
        fresh.new_episode(obs, [1, 2])


def test_segment_plural_names_and_len(ds):
    ep = ds.episode(2)
    seg = ep.read()
    assert len(ep) == ep.length == LENGTHS[2]
    assert np.array_equal(seg.observations, seg.obs) and np.array_equal(seg.next_observations, seg.next_obs)
    assert np.array_equal(seg.actions, seg.action) and np.array_equal(seg.rewards, seg.reward)


def test_utils_imports_no_heavy_engine_and_refuses_what_it_cannot_mean(ds):
    code = (
        "import sys, episodelake, episodelake.utils\n"
        "from episodelake.utils import batch_to_tensordict, schema_from_gym_spaces\n"
        "heavy = {'torch', 'tensordict', 'gymnasium'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    from episodelake.utils import batch_to_tensordict

    batch = ds.segment_stream(sequence_length=3, batch_size=2, seed=0).sample()
    with pytest.raises(el.ArgumentError, match=r"include_all_observations=True is not taken"):
        batch_to_tensordict(batch, include_all_observations=True)
    with pytest.raises(el.ArgumentError, match=r"alignment='action_in' is not taken"):
        batch_to_tensordict(batch, alignment="action_in")


# ---- (d) the seed's data-model rules
def action_out(T: int = 6) -> dict[str, Any]:
    rng = np.random.default_rng(T)
    return {
        "observations": rng.standard_normal((T, 3)).astype(np.float32),
        "actions": rng.integers(0, 4, T).astype(np.int64),
        "rewards": rng.standard_normal(T).astype(np.float32),
        "final_observation": rng.standard_normal(3).astype(np.float32),
        "terminated": True,
    }


def test_action_out_episodes_are_converted_once_when_written():
    ep = action_out()
    seg = el.Dataset.from_episodes([ep]).episode(0).read()
    assert np.array_equal(seg.obs, ep["observations"])  # where each action was taken
    assert np.array_equal(seg.next_obs, np.concatenate([ep["observations"][1:], ep["final_observation"][None]]))
    assert np.array_equal(seg.action, ep["actions"]) and np.array_equal(seg.reward, ep["rewards"])
    assert seg.terminated[-1] and len(seg) == 6
    same = el.Dataset.from_episodes([ep], alignment="action_out").episode(0).read()
    assert np.array_equal(same.all_obs, seg.all_obs)
    appended = el.Dataset.create(el.Dataset.from_episodes([ep]).schema)
    appended.append_episodes([ep])
    assert np.array_equal(appended.episode(0).read().all_obs, seg.all_obs)


def test_infos_pair_with_their_boundary_info_and_are_stored_per_step():
    infos = {"success": np.arange(6, dtype=np.float32)}
    action_in = {**raw(6), "infos": infos, "initial_info": {"success": np.float32(-1)}}
    seg = el.Dataset.from_episodes([action_in]).episode(0).read()
    assert np.array_equal(seg.extra, infos["success"])  # the info each step returned; the reset's is not stored
    out = {**action_out(), "infos": infos, "final_info": {"success": np.float32(9)}}
    seg = el.Dataset.from_episodes([out]).episode(0).read()
    assert np.array_equal(seg.extra, [1, 2, 3, 4, 5, 9])


@pytest.mark.parametrize(
    ("episode", "alignment", "message"),
    [
        ({**raw(4), "final_observation": np.zeros(3, np.float32)}, None, r"\(action-in\) and .* mutually exclusive"),
        ({**raw(4), "infos": {"s": np.zeros(4)}}, None, r"'infos' needs 'initial_info'.*never synthesized"),
        ({**raw(4), "initial_info": {"s": 0.0}}, None, r"'initial_info' needs 'infos'"),
        ({**action_out(4), "infos": {"s": np.zeros(4)}}, None, r"'infos' needs 'final_info'"),
        (
            {**raw(4), "infos": {"s": np.zeros(4)}, "initial_info": {"t": 0.0}},
            None,
            r"'infos' and 'initial_info' must hold the same fields",
        ),
        (
            {k: v for k, v in action_out(4).items() if k != "final_observation"}
            | {"infos": {"s": np.zeros(4)}, "final_info": {"s": 0.0}},
            None,
            r"'final_info' needs 'final_observation'",
        ),
        (raw(4), "action_out", r"holds 'initial_observation', but alignment='action_out'"),
        (
            {k: v for k, v in action_out(4).items() if k != "final_observation"},
            "action_out",
            r"alignment='action_out' needs final_observation",
        ),
        (
            {**raw(4), "infos": {"s": np.zeros(4)}, "initial_info": {"s": 0.0}, "extras": {"s": np.zeros(4)}},
            None,
            "not both",
        ),
    ],
)
def test_the_seed_data_model_rules_hold(episode, alignment, message):
    with pytest.raises(el.ValidationError, match=message):
        el.Dataset.from_episodes([episode], alignment=alignment)


def test_an_unknown_alignment_is_an_argument_error():
    with pytest.raises(el.ArgumentError, match=r"alignment must be None, 'action_in' or 'action_out'"):
        el.Dataset.from_episodes([raw(3)], alignment="action-in")
