"""Other engines read what episodelake wrote, with no episodelake code (docs/interop.md).

The episode table is a Delta table (Polars, DuckDB through deltalake/Arrow);
the tensors are Zarr v3 arrays found through ``ref/<key>`` = ``commit << 32 | row``
(zarr-python), on local disk and on the local S3 server. Every value is
compared with the arrays recorded when the episodes were generated. Ray's path
is in tests/test_ray.py (a local cluster; slow).
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pytest
import zarr
from deltalake import DeltaTable

import episodelake as el

from .conftest import robot_schema
from .reference import RawEpisode, random_episode

CAMERA = "observation/camera"


def write(url: str, storage_options: dict | None = None) -> tuple[el.Dataset, list[RawEpisode]]:
    rng = np.random.default_rng(17)
    raws = [random_episode(rng, int(rng.integers(1, 30))) for _ in range(9)]
    ds = el.Dataset.create(robot_schema(), url, storage_options=storage_options, partition_by=["task"])
    for i in (0, 4):  # two commits: on object stores two arrays per writer
        ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws[i : i + (4 if i == 0 else 5)])
        ds.flush()
    return ds, raws


@pytest.fixture
def local(tmp_path):
    return write(str(tmp_path / "robot"))


def by_id(ds: el.Dataset, raws: list[RawEpisode]) -> dict[int, RawEpisode]:
    """The recorded episodes by the ids the dataset gave them (episode order is append order)."""
    return dict(zip(ds.episode_ids.tolist(), raws, strict=True))


def check_rows(rows: list[dict], truth: dict[int, RawEpisode]) -> None:
    assert sorted(r["episode_id"] for r in rows) == sorted(truth)
    for r in rows:
        raw = truth[r["episode_id"]]
        assert r["length"] == raw.length
        assert r["task"] == raw.meta["task"] and r["success"] == raw.meta["success"]
        assert (r["terminated"], r["truncated"]) == (raw.terminated, raw.truncated)
        np.testing.assert_array_equal(np.asarray(r["reward"], np.float32), raw.reward)
        np.testing.assert_array_equal(np.asarray(r["observation/state"], np.float32), raw.obs["state"])
        assert r["return"] == pytest.approx(float(raw.reward.astype(np.float64).sum()), rel=1e-6)


def test_polars_reads_the_episode_table(local):
    ds, raws = local
    frame = pl.read_delta(ds.location.delta_uri(), version=ds.version)
    check_rows(frame.to_dicts(), by_id(ds, raws))
    picked = frame.filter(pl.col("task") == "pick").select("episode_id").to_series().to_list()
    assert sorted(picked) == sorted(i for i, r in by_id(ds, raws).items() if r.meta["task"] == "pick")


def test_duckdb_reads_the_episode_table_through_deltalake(local):
    ds, raws = local
    episodes = DeltaTable(ds.location.delta_uri(), version=ds.version).to_pyarrow_dataset()
    rows = duckdb.sql('SELECT * FROM episodes ORDER BY "episode_id"').arrow().read_all().to_pylist()
    check_rows(rows, by_id(ds, raws))
    ((total,),) = duckdb.sql("SELECT sum(length) FROM episodes WHERE task = 'place'").fetchall()
    assert total == sum(r.length for r in raws if r.meta["task"] == "place")
    del episodes


def zarr_rows(root: str, row: dict, storage_options: dict | None = None) -> np.ndarray:
    """An episode's camera rows read with zarr-python alone, from its table row."""
    ref = row[f"ref/{CAMERA}"]
    commit, first = ref >> 32, ref & 0xFFFFFFFF
    parts = [root, "tensors", row["writer"]] + ([str(commit)] if commit else []) + [CAMERA]
    array = zarr.open_array("/".join(parts), mode="r", storage_options=storage_options)
    return array[first : first + row["length"] + 1]


def test_zarr_python_reads_the_tensors_on_disk(local):
    ds, raws = local
    truth = by_id(ds, raws)
    rows = pl.read_delta(ds.location.delta_uri()).to_dicts()
    assert {r[f"ref/{CAMERA}"] >> 32 for r in rows} == {0}  # local disk: one array per writer
    for r in rows:
        np.testing.assert_array_equal(zarr_rows(ds.location.path, r), truth[r["episode_id"]].obs["camera"])


def test_zarr_python_and_polars_read_a_dataset_on_s3(s3_server, s3_url):
    opts = s3_server.storage_options
    ds, raws = write(s3_url, opts)
    truth = by_id(ds, raws)
    frame = pl.read_delta(ds.location.delta_uri(), storage_options=ds.location.delta_options())
    rows = frame.to_dicts()
    check_rows(rows, truth)
    assert {r[f"ref/{CAMERA}"] >> 32 for r in rows} == {1, 2}  # object stores: one array per commit
    for r in rows:
        np.testing.assert_array_equal(zarr_rows(s3_url, r, opts), truth[r["episode_id"]].obs["camera"])
