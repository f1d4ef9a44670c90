"""``ds.sql()`` returns an :class:`~episodelake.read.query.SQLResult` that behaves the same on every supported DuckDB.

docs/query.md ("What sql() returns"): DuckDB 1.5 relations stream ``fetchone``,
DuckDB 2 relations have no ``fetchone`` and re-run on every fetch; the result
hides that. Every fetch is compared with the recorded reference episodes.
Run this file under each DuckDB of the range in ``pyproject.toml``.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import episodelake as el
from episodelake.read.query import SQLResult

from .conftest import build_robot_dataset

QUERY = "SELECT episode_id, length, task, success FROM episodes ORDER BY created_at, episode_id"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("sql-result") / "ds"
    raws = build_robot_dataset(str(path), seed=3, episodes=13, per_commit=5, max_length=10)
    return el.Dataset.open(str(path), read_only=True), raws


def _want(ds, raws) -> list[tuple]:
    ids = ds.sql("SELECT episode_id FROM episodes ORDER BY created_at, episode_id").fetchnumpy()["episode_id"]
    return [(int(i), r.length, r.meta["task"], r.meta["success"]) for i, r in zip(ids, raws, strict=True)]


def test_fetchall_fetchone_fetchmany(recorded):
    ds, raws = recorded
    want = _want(ds, raws)
    result = ds.sql(QUERY)
    assert isinstance(result, SQLResult)
    assert result.fetchall() == want
    assert all(type(v) is t for row in result.fetchall() for v, t in zip(row, (int, int, str, bool), strict=True))
    # fetchone reads on through one run, None past the end, then a new run starts
    assert [result.fetchone() for _ in range(len(want))] == want
    assert result.fetchone() is None
    assert result.fetchone() == want[0]
    assert result.fetchall() == want[1:]  # the rest of the open run
    chunks = [result.fetchmany(5) for _ in range(3)]
    assert [len(c) for c in chunks] == [5, 5, 3]
    assert [row for chunk in chunks for row in chunk] == want
    assert result.fetchmany(0) == []
    with pytest.raises(el.ArgumentError):
        result.fetchmany(-1)
    # a whole-result fetch in the middle of a run does not disturb it
    assert result.fetchone() == want[0]
    assert result.fetchall() == want[1:]


def test_columnar_fetches(recorded):
    ds, raws = recorded
    want = _want(ds, raws)
    lengths = [w[1] for w in want]
    result = ds.sql(QUERY)
    assert result.columns == ["episode_id", "length", "task", "success"]
    assert result.types[2] == "VARCHAR" and result.types[3] == "BOOLEAN"
    assert result.df()["length"].tolist() == lengths
    assert result.fetchdf()["task"].tolist() == [w[2] for w in want]
    np.testing.assert_array_equal(result.fetchnumpy()["length"], lengths)
    reader = result.arrow()
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.read_all().column("episode_id").to_pylist() == [w[0] for w in want]
    small = result.arrow(batch_size=4)
    assert sum(b.num_rows for b in small) == len(want)
    table = result.to_arrow_table()
    assert isinstance(table, pa.Table) and table.column("success").to_pylist() == [w[3] for w in want]
    assert result.fetch_arrow_table().equals(table)
    assert "length" in repr(result)
    assert isinstance(result.relation, duckdb.DuckDBPyRelation)
    pl = pytest.importorskip("polars")
    assert isinstance(result.pl(), pl.DataFrame) and result.pl()["length"].to_list() == lengths


def test_params_commands_and_statements(recorded, tmp_path):
    ds, raws = recorded
    long_picks = sum(r.length > 4 and r.meta["task"] == "pick" for r in raws)
    assert ds.sql("SELECT count(*) FROM episodes WHERE length > ? AND task = ?", [4, "pick"]).fetchone() == (
        long_picks,
    )
    named = ds.sql("SELECT count(*) FROM episodes WHERE length > $n AND task = $t", {"n": 4, "t": "pick"})
    assert named.fetchall() == [(long_picks,)]
    # a command runs once, at the call, and has no result
    out = tmp_path / "ids.csv"
    assert ds.sql(f"COPY (SELECT episode_id FROM episodes) TO '{out}' (HEADER)") is None
    assert len(out.read_text().splitlines()) == len(raws) + 1
    assert ds.sql("CREATE TEMP TABLE t AS SELECT * FROM episodes") is None
    assert ds.sql("EXPLAIN SELECT * FROM episodes").fetchall()  # EXPLAIN is a query
    with pytest.raises(el.QueryError, match="one SQL statement per call"):
        ds.sql("SELECT 1; SELECT 2")
    with pytest.raises(el.QueryError, match="not provided"):
        ds.sql("SELECT count(*) FROM episodes WHERE length > ?")
    # results stay valid however many queries follow
    first = ds.sql("SELECT max(length) FROM episodes")
    for _ in range(5):
        ds.sql("SELECT 1").fetchall()
    assert first.fetchall() == [(max(r.length for r in raws),)]
