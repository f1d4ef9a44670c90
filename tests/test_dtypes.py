"""Every NumPy numeric dtype and bool round-trips exactly, in the table and in tensors."""

import numpy as np
import pytest

import episodelake as el

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]  # fmt: skip


def extreme_values(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random values that include the dtype's extremes (and NaN/inf for floats)."""
    n = int(np.prod(shape))
    if dtype == np.bool_:
        flat = rng.integers(0, 2, n).astype(bool)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        flat[: min(n, 2)] = [info.min, info.max][: min(n, 2)]
    else:
        real = np.dtype(dtype.char.lower()) if dtype.kind == "c" else dtype
        flat = rng.standard_normal(n).astype(real) * 1e3
        specials = np.array([np.inf, -np.inf, np.finfo(real).max, np.finfo(real).tiny], real)
        flat[: min(n, 4)] = specials[: min(n, 4)]
        if dtype.kind == "c":
            flat = flat + 1j * rng.standard_normal(n).astype(real)
        flat = flat.astype(dtype)
    return flat.reshape(shape)


@pytest.mark.parametrize("storage", ["table", "tensor"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtype_round_trip(dtype, storage, tmp_path):
    dt = np.dtype(dtype)
    rng = np.random.default_rng(7)
    schema = el.DatasetSchema(
        [
            el.FieldSpec("x", (2, 3), dt, storage=storage),
            el.FieldSpec("action", (2,), dt, role="action", storage=storage),
            el.FieldSpec("reward", (), dt, role="reward"),
            el.FieldSpec("m", (2,), dt, role="meta"),
        ]
    )
    T = 9
    obs = extreme_values(dt, (T + 1, 2, 3), rng)
    act = extreme_values(dt, (T, 2), rng)
    rew = extreme_values(dt, (T,), rng)
    meta = extreme_values(dt, (2,), rng)
    ds = el.Dataset.from_episodes(
        [{"observations": obs, "actions": act, "rewards": rew, "terminated": True, "meta": {"m": meta}}],
        path=str(tmp_path / "ds"),
        schema=schema,
    )
    for d in (ds, el.Dataset.open(str(tmp_path / "ds"))):
        seg = d.episode(0).read()
        assert seg.all_obs.dtype == dt and seg.action.dtype == dt and seg.reward.dtype == dt
        np.testing.assert_array_equal(seg.all_obs, obs)
        np.testing.assert_array_equal(seg.action, act)
        np.testing.assert_array_equal(seg.reward, rew)
        got = d.episode(0).meta["m"]
        assert got.dtype == dt
        np.testing.assert_array_equal(got, meta)


def test_uint8_is_widened_not_wrapped_in_table(tmp_path):
    """SQL-facing storage keeps true unsigned values (200 stays 200, not -56)."""
    import pyarrow.parquet as pq

    schema = el.DatasetSchema(
        [
            el.FieldSpec("x", (), "uint8"),
            el.FieldSpec("action", (), "uint8", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    ds = el.Dataset.from_episodes(
        [{"observations": np.array([200, 201], np.uint8), "actions": np.array([255], np.uint8), "rewards": [0.0]}],
        path=str(tmp_path / "u"),
        schema=schema,
    )
    files = ds._store.table.file_uris()
    values = pq.read_table(files[0]).column("observation/x").to_pylist()
    assert values == [[200, 201]]
