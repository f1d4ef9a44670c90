"""Meta values in batches: typed arrays plus ``meta_mask``, never object arrays, through every sampler and
integration. The reference is the meta each episode was written with (a missing key is stored as NULL)."""

from __future__ import annotations

import numpy as np
import pytest

import episodelake as el
from episodelake.core.segments import meta_fill

torch = pytest.importorskip("torch")

LENGTHS = [4, 9, 2, 7, 12, 5, 3, 8, 6, 10]
NUMERIC = ["success", "score", "count", "small", "vec", "always", "never"]


def meta_schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (2,), "float32"),
            el.FieldSpec("camera", (1, 4, 4), "uint8", layout="CHW", storage="tensor"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("success", (), "bool", role="meta"),
            el.FieldSpec("score", (), "float32", role="meta"),
            el.FieldSpec("count", (), "int32", role="meta"),
            el.FieldSpec("small", (), "uint16", role="meta"),
            el.FieldSpec("vec", (2,), "float64", role="meta"),
            el.FieldSpec("always", (), "int64", role="meta"),
            el.FieldSpec("never", (), "float32", role="meta"),
            el.FieldSpec("task", (), "str", role="meta"),
        ]
    )


def written_meta(i: int, rng: np.random.Generator) -> dict:
    full = {
        "success": bool(i % 2),
        "score": float(np.float32(i * 0.5 - 1)),
        "count": -3 * i,
        "small": 60000 + i,
        "vec": np.array([i, -i], dtype=np.float64),
        "always": 100 + i,
        "task": f"task{i}",
    }
    nullable = ["success", "score", "count", "small", "vec", "task"]
    missing = {k for k in nullable if rng.random() < 0.4} | {nullable[i % len(nullable)]}  # each field: some NULLs
    if i < 2:  # ... and some values
        missing = {"score"} if i == 0 else set()
    return {k: v for k, v in full.items() if k not in missing}


@pytest.fixture(scope="module")
def lake():
    rng = np.random.default_rng(11)
    written = [written_meta(i, rng) for i in range(len(LENGTHS))]
    eps = [
        {
            "observations": {
                "state": rng.standard_normal((T + 1, 2), dtype=np.float32),
                "camera": rng.integers(0, 255, (T + 1, 1, 4, 4), dtype=np.uint8),
            },
            "actions": np.arange(T, dtype=np.int64),
            "rewards": np.ones(T, dtype=np.float32),
            "meta": m,
        }
        for T, m in zip(LENGTHS, written, strict=True)
    ]
    ds = el.Dataset.from_episodes(eps, schema=meta_schema())
    by_id = {ds.episode(i).episode_id: written[i] for i in range(len(LENGTHS))}
    return ds, by_id


def as_numpy(x):
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def check_meta(meta, meta_mask, episode_ids, by_id, schema):
    """Every item's meta equals what its episode was written with; unset values are the fill value, mask False."""
    ids = as_numpy(episode_ids).tolist()
    assert set(meta) == set(meta_mask) == {f.name for f in schema.meta_fields}
    for f in schema.meta_fields:
        mask = as_numpy(meta_mask[f.name])
        assert mask.dtype == np.bool_ and mask.shape == (len(ids),)
        assert mask.tolist() == [f.name in by_id[e] for e in ids], f.name
        if f.np_dtype.kind == "U":
            got = list(meta[f.name])
            assert got == [by_id[e].get(f.name) for e in ids]
            continue
        arr = as_numpy(meta[f.name])
        assert arr.dtype == f.np_dtype and arr.shape == (len(ids), *f.shape), f.name
        for b, e in enumerate(ids):
            want = by_id[e].get(f.name)
            if want is None:
                fill = np.full(f.shape, meta_fill(f.np_dtype), f.np_dtype)
                np.testing.assert_array_equal(arr[b], fill, err_msg=f.name)  # NaN == NaN here
            else:
                np.testing.assert_array_equal(arr[b], np.asarray(want, f.np_dtype), err_msg=f.name)


def test_fill_values_are_documented_ones():
    assert meta_fill(np.dtype(bool)) is False and meta_fill(np.dtype("int32")) == 0
    assert np.isnan(meta_fill(np.dtype("float32"))) and np.isnan(meta_fill(np.dtype("complex64")))


def test_segment_stream_batches_carry_typed_meta_and_mask(lake):
    ds, by_id = lake
    batch = ds.segment_stream(2, batch_size=16, seed=0).sample()
    assert all(batch.meta[k].dtype != object for k in NUMERIC)
    check_meta(batch.meta.flat(), batch.meta_mask.flat(), batch.episode_id, by_id, ds.schema)
    seen = set()
    for b in ds.segment_stream(1, batch_size=7, sampler=el.Sequential()):  # every episode
        check_meta(b.meta.flat(), b.meta_mask.flat(), b.episode_id, by_id, ds.schema)
        seen |= set(b.episode_id.tolist())
    assert seen == set(by_id)
    split = ds.segment_stream(el.Window(context=1, target=1), batch_size=5, seed=1).sample()
    for part in (split.context, split.target):
        check_meta(part.meta.flat(), part.meta_mask.flat(), part.episode_id, by_id, ds.schema)


@pytest.mark.parametrize("workers", [0, 2])
def test_segments_in_a_dataloader_and_collated_items(lake, workers):
    from torch.utils.data import DataLoader

    ds, by_id = lake
    segs = ds.segments(3)
    loader = DataLoader(segs, batch_size=6, shuffle=False, num_workers=workers, collate_fn=segs.collate)
    n = 0
    for batch in loader:
        check_meta(batch.meta.flat(), batch.meta_mask.flat(), batch.episode_id, by_id, ds.schema)
        n += len(batch.episode_id)
    assert n == len(segs)
    if workers == 0:  # single segments (fill value + mask), collated by stacking
        items = [segs[i] for i in range(len(segs))]
        for it in items:
            assert it.meta_mask["score"] == ("score" in by_id[it.episode_id])
        batch = segs.collate(items)
        check_meta(batch.meta.flat(), batch.meta_mask.flat(), batch.episode_id, by_id, ds.schema)


def test_transitions_carry_typed_meta_and_mask(lake):
    ds, by_id = lake
    tr = ds.sample_transitions(64, n_step=2, seed=3)
    check_meta(tr.meta.flat(), tr.meta_mask.flat(), tr.episode_id, by_id, ds.schema)


def test_to_torch_converts_meta_and_mask(lake):
    from episodelake.integrations.torch import to_torch

    ds, by_id = lake
    for batch in (ds.segment_stream(2, batch_size=16, seed=2).sample(), ds.sample_transitions(32)):
        tb = to_torch(batch)
        for k in NUMERIC:
            assert isinstance(tb.meta[k], torch.Tensor) and isinstance(tb.meta_mask[k], torch.Tensor), k
        assert tb.meta["success"].dtype == torch.bool and tb.meta["vec"].dtype == torch.float64
        check_meta(tb.meta.flat(), tb.meta_mask.flat(), tb.episode_id, by_id, ds.schema)


def test_tensordict_keeps_every_meta_field(lake):
    pytest.importorskip("tensordict")
    from episodelake.integrations.tensordict import batch_to_tensordict

    ds, by_id = lake
    for batch in (ds.segment_stream(2, batch_size=16, seed=4).sample(), ds.sample_transitions(32)):
        td = batch_to_tensordict(batch)
        names = [f.name for f in ds.schema.meta_fields]
        meta = {k: td["meta", k] for k in names}
        meta_mask = {k: td["meta_mask", k] for k in names}
        meta["task"] = td.get(("meta", "task")).tolist()  # non-tensor data, one str/None per item
        check_meta(meta, meta_mask, td["episode_id"], by_id, ds.schema)
        one = td[3]  # indexing keeps the per-item string
        assert one["meta", "task"] == by_id[int(td["episode_id"][3])].get("task")


def test_to_jax_converts_meta_and_mask(lake):
    jax = pytest.importorskip("jax")
    from episodelake.integrations.jax import to_jax

    ds, by_id = lake
    jb = to_jax(ds.segment_stream(2, batch_size=16, seed=5).sample())
    meta = {k: np.asarray(v) if k != "task" else v for k, v in jb.meta.flat().items()}
    mask = {k: np.asarray(v) for k, v in jb.meta_mask.flat().items()}
    assert isinstance(jb.meta_mask["score"], jax.Array) and isinstance(jb.meta["score"], jax.Array)
    schema = ds.schema
    # JAX keeps 32-bit types by default: compare values, not dtypes, for the 64-bit fields
    for k in ("vec", "always"):
        meta[k] = meta[k].astype(schema[k].np_dtype)
    if not jax.config.jax_enable_x64:  # 64-bit ids stay NumPy rather than being truncated to 32 bits
        assert isinstance(jb.episode_id, np.ndarray)
    check_meta(meta, mask, jb.episode_id, by_id, schema)
