"""SQL that comes from configs, command lines or a web page reads nothing but the dataset.

``where()``, ``select_episodes()``, ``el.Weighted``/``el.Prioritized`` SQL, ``delete(where=)``
and ``sql(..., sandbox=True)`` run in a DuckDB database without external access
(docs/query.md, "Sandboxed SQL"): each attempt to read a file, a glob, a Python
variable, or to write, attach, install, load or reconfigure must be refused as
``QueryError`` — and leave no file behind — while legitimate predicates give
the same episodes as a NumPy reference over the recorded episodes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import episodelake as el

from .conftest import build_robot_dataset

SECRET = "top-secret-hostname"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, list]:
    """A dataset of reference episodes (in episode order) and a private folder holding a secret file."""
    root = tmp_path_factory.mktemp("sandbox")
    raws = build_robot_dataset(str(root / "ds"), seed=11, episodes=24, per_commit=6, max_length=15)
    private = root / "private"
    private.mkdir()
    (private / "hostname").write_text(SECRET + "\n")
    (private / "table.csv").write_text("episode_id,weight\n1,1.0\n")
    return root, raws


@pytest.fixture
def ds(recorded):
    root, raws = recorded
    ds = el.Dataset.open(str(root / "ds"), read_only=True)
    # episode order is commit order for one writer: the reference episodes line up with positions
    lengths = ds.sql("SELECT length FROM episodes ORDER BY created_at, episode_id").fetchnumpy()["length"]
    assert lengths.tolist() == [r.length for r in raws]
    return ds


def _reads(root: Path, ds: el.Dataset) -> dict[str, str]:
    """SQL table expressions that read something other than the dataset's views."""
    private = root / "private"
    table_file = next((root / "ds" / "episodes").rglob("*.parquet"))  # even the dataset's own file, by path
    return {
        "read_text": f"read_text('{private / 'hostname'}')",
        "read_csv": f"read_csv('{private / 'table.csv'}')",
        "read_parquet": f"read_parquet('{table_file}')",
        "path as table": f"'{table_file}'",
        "glob": f"glob('{private}/*')",
        "read_json": f"read_json_auto('{private / 'table.csv'}')",
        "python variable": "secret_rows",  # DuckDB's replacement scan would read a caller's local Arrow table
    }


READ_KINDS = ["read_text", "read_csv", "read_parquet", "path as table", "glob", "read_json", "python variable"]


def _first(ds: el.Dataset, sampler: object, seed: int | None = None) -> object:
    """The first batch of a small stream drawn by ``sampler`` (``el.Weighted``, ``el.Prioritized``)."""
    return next(iter(ds.segment_stream(2, batch_size=4, sampler=sampler, seed=seed)))


def _refused(call) -> el.QueryError:
    with pytest.raises(el.QueryError) as info:
        call()
    return info.value


@pytest.mark.parametrize("kind", READ_KINDS)
def test_where_reads_nothing_but_the_dataset(recorded, ds, kind):
    root, _ = recorded
    secret_rows = pa.table({"x": [SECRET]})  # noqa: F841 -- what the replacement scan would find in this frame
    source = _reads(root, ds)[kind]
    err = _refused(lambda: ds.where(f"(SELECT count(*) FROM {source}) > 0"))
    assert SECRET not in str(err)
    # on a view, and as the fallback over the episodes view (a per-step column forces it)
    view = ds.where("length > 0")
    _refused(lambda: view.where(f"list_max(reward) > -100 AND (SELECT count(*) FROM {source}) > 0"))


@pytest.mark.parametrize("kind", READ_KINDS)
def test_select_episodes_weights_priority_and_sandboxed_sql_read_nothing_else(recorded, ds, kind):
    root, _ = recorded
    secret_rows = pa.table({"episode_id": [1], "weight": [1.0]})  # noqa: F841
    source = _reads(root, ds)[kind]
    sub = f"(SELECT count(*) FROM {source})"
    calls = {
        "select_episodes": lambda: ds.select_episodes(f"SELECT episode_id FROM episodes WHERE {sub} > 0"),
        "weights expression": lambda: _first(ds, el.Weighted(f"1 + {sub}")),
        "weights query": lambda: _first(ds, el.Weighted(f"SELECT episode_id, {sub} AS weight FROM episodes")),
        "priority": lambda: _first(ds, el.Prioritized(f"1 + {sub}")),
        "transition priority": lambda: ds.sample_transitions(4, sampler=el.Prioritized(f"1 + {sub}")),
        "sql sandbox": lambda: ds.sql(f"SELECT * FROM {source}", sandbox=True).fetchall(),
        "sql to_arrow_table sandbox": lambda: ds.sql(f"SELECT {sub} AS n", sandbox=True).to_arrow_table(),
    }
    for name, call in calls.items():
        err = _refused(call)
        assert SECRET not in str(err), name


def test_delete_where_reads_nothing_but_the_dataset(recorded, tmp_path):
    root, raws = recorded
    import shutil

    shutil.copytree(root / "ds", tmp_path / "ds")
    ds = el.Dataset.open(str(tmp_path / "ds"))
    version = ds.version
    _refused(lambda: ds.delete(where=f"(SELECT count(*) FROM read_text('{root / 'private' / 'hostname'}')) > 0"))
    assert el.Dataset.open(str(tmp_path / "ds")).version == version  # nothing committed
    assert len(el.Dataset.open(str(tmp_path / "ds"))) == len(raws)


def test_sandboxed_sql_writes_attaches_installs_and_reconfigures_nothing(recorded, ds, tmp_path):
    out = tmp_path / "out"
    statements = {
        "copy": f"COPY (SELECT * FROM episodes) TO '{out}.csv'",
        "copy after select": f"SELECT 1; COPY (SELECT 1) TO '{out}.csv'",
        "export": f"EXPORT DATABASE '{out}'",
        "attach file": f"ATTACH '{out}.duckdb' AS other",
        "attach memory": "ATTACH ':memory:' AS other",
        "install": "INSTALL httpfs",
        "load": "LOAD httpfs",
        "set": "SET enable_external_access = true",
        "reset": "RESET enable_external_access",
        "pragma": "PRAGMA enable_profiling",
        "create": "CREATE TABLE kept AS SELECT * FROM episodes",
        "call": "CALL pragma_version()",
        "secret": "CREATE SECRET (TYPE s3, KEY_ID 'a', SECRET 'b')",
    }
    for name, text in statements.items():
        err = _refused(lambda text=text: ds.sql(text, sandbox=True))
        assert "sandboxed" in str(err), name
    # the same statements inside a predicate are not one expression
    for text in statements.values():
        _refused(lambda text=text: ds.where(f"1 = 1); {text}; SELECT (1"))
    assert list(tmp_path.iterdir()) == []  # nothing was written
    # and the sandbox is not reconfigured by anything above: a file read is still refused
    _refused(lambda: ds.where(f"(SELECT count(*) FROM read_text('{Path(__file__)}')) > 0"))


def test_full_sql_keeps_duckdb_power(ds, tmp_path):
    """Without sandbox=, sql() is the caller's own DuckDB: it may write a file (docs say so)."""
    out = tmp_path / "episodes.csv"
    assert ds.sql(f"COPY (SELECT episode_id FROM episodes) TO '{out}' (HEADER)") is None
    assert len(out.read_text().splitlines()) == len(ds) + 1


PREDICATES = {
    "task = 'pick'": lambda r: r.meta["task"] == "pick",
    "success AND length > 5": lambda r: r.meta["success"] and r.length > 5,
    "NOT success OR terminated": lambda r: (not r.meta["success"]) or bool(r.terminated),
    "return > 0": lambda r: float(np.sum(r.reward, dtype=np.float64)) > 0,
    "length BETWEEN 4 AND 9 AND task <> 'place'": lambda r: 4 <= r.length <= 9 and r.meta["task"] != "place",
    # per-step columns: the fallback over the episodes view
    "list_max(reward) > 1.0": lambda r: float(r.reward.max()) > 1.0,
    "(SELECT count(*) FROM steps s WHERE s.episode_id = episodes.episode_id AND s.action = 3) >= 2": (
        lambda r: int((r.action["action"] == 3).sum()) >= 2
    ),
}


@pytest.mark.parametrize("predicate", list(PREDICATES))
def test_legitimate_predicates_select_what_numpy_selects(recorded, ds, predicate):
    _, raws = recorded
    want = np.flatnonzero([PREDICATES[predicate](r) for r in raws])
    assert 0 < len(want) < len(raws), "the predicate must split the episodes to prove anything"
    view = ds.where(predicate)
    assert view.positions.tolist() == want.tolist()
    ids = ds.episode_ids[want]
    same = ds.select_episodes(f"SELECT episode_id FROM episodes WHERE {predicate}")
    assert same.episode_ids.tolist() == ids.tolist()
    got = ds.sql(f"SELECT episode_id FROM episodes WHERE {predicate}", sandbox=True).fetchnumpy()["episode_id"]
    assert sorted(got.tolist()) == sorted(ids.tolist())


def test_sandboxed_weights_and_priority_still_weigh(recorded, ds):
    _, raws = recorded
    picks = {int(ds.episode_ids[i]) for i, r in enumerate(raws) if r.meta["task"] == "pick"}
    assert 0 < len(picks) < len(raws)
    weighted = _first(ds, el.Weighted("CASE WHEN task = 'pick' THEN 1 ELSE 0 END"), seed=3)
    assert set(weighted.episode_id.tolist()) <= picks
    query = "SELECT episode_id, CAST(task = 'pick' AS DOUBLE) AS weight FROM episodes"
    prioritized = _first(ds, el.Prioritized(query), seed=3)
    assert set(prioritized.episode_id.tolist()) <= picks


def test_concat_where_reads_nothing_but_its_sources(recorded, ds):
    root, raws = recorded
    both = el.concat([ds, ds.where("task = 'pick'")])
    _refused(lambda: both.where(f"(SELECT count(*) FROM read_text('{root / 'private' / 'hostname'}')) > 0"))
    picks = sum(r.meta["task"] == "pick" for r in raws)
    assert len(both.where("task = 'pick'")) == 2 * picks


@pytest.mark.slow
def test_cli_where_is_sandboxed(recorded):
    """``episodelake sql|stats --where`` runs the predicate sandboxed: one error line, status 1, no secret shown."""
    root, raws = recorded
    cli = Path(sys.executable).with_name("episodelake")
    predicate = f"(SELECT count(*) FROM read_text('{root / 'private' / 'hostname'}')) > 0"
    for argv in (["sql", str(root / "ds"), "SELECT count(*) AS n FROM episodes"], ["stats", str(root / "ds")]):
        run = subprocess.run([str(cli), *argv, "--where", predicate], capture_output=True, text=True, timeout=120)
        assert run.returncode == 1, run.stdout + run.stderr
        assert run.stderr.startswith("episodelake: error: ") and "sandboxed" in run.stderr
        assert SECRET not in run.stdout + run.stderr
    ok = subprocess.run(
        [str(cli), "sql", str(root / "ds"), "SELECT count(*) AS n FROM episodes", "--where", "success", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == [{"n": sum(r.meta["success"] for r in raws)}]


# ---- questions about the machine, the process and the database are refused (issue 39)

INTROSPECTION = {
    "(SELECT value FROM duckdb_settings() WHERE name = 'secret_directory') LIKE '/%'": "duckdb_settings",
    "(SELECT count(*) FROM duckdb_databases()) > 0": "duckdb_databases",
    "(SELECT count(*) FROM duckdb_functions()) > 0": "duckdb_functions",
    "(SELECT count(*) FROM duckdb_tables) >= 0": "duckdb_tables",
    "(SELECT count(*) FROM information_schema.tables) >= 0": "information_schema.tables",
    "(SELECT count(*) FROM pg_catalog.pg_class) >= 0": "pg_catalog.pg_class",
    "(SELECT count(*) FROM sqlite_master) >= 0": "sqlite_master",
    "(SELECT library_version FROM pragma_version()) <> ''": "pragma_version",
    "(SELECT count(*) FROM pragma_database_size()) >= 0": "pragma_database_size",
    "(SELECT count(*) FROM query_table('episodes')) > 0": "query_table",
    "(SELECT count(*) FROM query('SELECT 1')) > 0": "query",
    "current_setting('threads') > 0": "current_setting",
    "current_setting('memory_limit') LIKE '%GiB'": "current_setting",
    "version() <> ''": "version",
    "current_database() <> ''": "current_database",
    "(SELECT count(*) FROM range(3)) = 3": "range",
    "(SELECT count(*) FROM (DESCRIBE episodes)) > 0": "DESCRIBE",
    "(WITH e AS (SELECT 1) SELECT count(*) FROM duckdb_views()) >= 0": "duckdb_views",
    "length > 0 AND (SELECT max(x.length) FROM episodes x, duckdb_settings() s) > 0": "duckdb_settings",
}


@pytest.mark.parametrize("predicate", list(INTROSPECTION))
def test_predicates_cannot_ask_about_the_machine_or_the_database(ds, predicate):
    """Only the dataset's views and plain functions: each refusal is a QueryError naming what was refused."""
    err = _refused(lambda: ds.where(predicate))
    assert "refused" in str(err) and INTROSPECTION[predicate] in str(err), str(err)
    _refused(lambda: ds.where("length > 0").where(f"list_max(reward) > -100 AND {predicate}"))
    _refused(lambda: ds.sql(f"SELECT episode_id FROM episodes WHERE {predicate}", sandbox=True))
    _refused(lambda: ds.select_episodes(f"SELECT episode_id FROM episodes WHERE {predicate}"))
    _refused(lambda: _first(ds, el.Weighted(f"CASE WHEN {predicate} THEN 1 ELSE 2 END")))
    _refused(lambda: el.Anchors(f"t >= 0 AND {predicate}"))


def test_stored_checks_that_ask_about_the_machine_are_refused(tmp_path):
    check = el.Check("leak", "(SELECT count(*) FROM duckdb_settings()) > 0")
    with pytest.raises(el.QueryError, match="duckdb_settings"):
        build_robot_dataset(str(tmp_path / "ds"), seed=1, episodes=2, per_commit=2, max_length=5, checks=(check,))


LEGITIMATE = [
    "(WITH m AS (SELECT episode_id, max(reward) AS top FROM steps GROUP BY episode_id) "
    "SELECT top FROM m WHERE m.episode_id = episodes.episode_id) > 1.0",
    "episode_id IN (SELECT episode_id FROM (SELECT episode_id, row_number() OVER (ORDER BY length DESC, episode_id) "
    "AS n FROM episodes) WHERE n <= 5)",
    "list_sum([r * 2 for r in reward if r > 0]) > 1 AND coalesce(task, '') LIKE 'p%' AND length::DOUBLE > 1",
    "(SELECT count(*) FROM steps s JOIN episodes e USING (episode_id) WHERE e.episode_id = episodes.episode_id) > 3",
]


@pytest.mark.parametrize("predicate", LEGITIMATE)
def test_ordinary_predicates_with_subqueries_ctes_and_windows_still_run(ds, predicate):
    """The allow-list keeps what filters need: subqueries, CTEs and window functions over the views."""
    want = ds.sql(f"SELECT episode_id FROM episodes WHERE {predicate}").fetchnumpy()["episode_id"]  # unsandboxed
    assert 0 < len(want) < len(ds)
    assert sorted(ds.where(predicate).episode_ids.tolist()) == sorted(want.tolist())


RUNAWAY = (
    "(SELECT sum(a.reward * b.reward * c.reward * d.reward * e.reward * f.reward) "
    "FROM steps a, steps b, steps c, steps d, steps e, steps f) > 0"
)  # ~200 steps: 6e13 rows, days of a core: it ends only by its time limit


@pytest.mark.xfail(
    strict=False,
    reason="open: after other tests have queried this dataset, a fresh process's first where() of the runaway "
    "predicate (_where_unscanned) kept running through DuckDB interrupts in full-suite runs (the watcher was "
    "interrupting every 50 ms); alone, and in-process (test_query_limits_bound_where_weights_and_sandboxed_sql), "
    "the limit holds",
)
def test_a_runaway_where_hits_the_time_limit_of_the_environment(recorded):
    """``EPISODELAKE_QUERY_TIMEOUT_S`` limits every sandboxed query of a process (a subprocess: a failure here
    must not leave a query running)."""
    root, _ = recorded
    script = (
        "import episodelake as el, sys\n"
        f"ds = el.Dataset.open({str(root / 'ds')!r}, read_only=True)\n"
        "try:\n"
        f"    ds.where({RUNAWAY!r})\n"
        "except el.QueryError as exc:\n"
        "    print(exc)\n"
    )
    env = {**__import__("os").environ, "EPISODELAKE_QUERY_TIMEOUT_S": "0.5"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    assert "time limit of 0.5 s" in run.stdout and "EPISODELAKE_QUERY_TIMEOUT_S" in run.stdout, run.stdout


def test_query_limits_bound_where_weights_and_sandboxed_sql(ds):
    from episodelake.storage.sql import query_limits

    with query_limits(0.5):
        for call in (
            lambda: ds.where(RUNAWAY),
            lambda: ds.sql(f"SELECT episode_id FROM episodes WHERE {RUNAWAY}", sandbox=True).fetchall(),
            lambda: _first(ds, el.Weighted(f"CASE WHEN {RUNAWAY} THEN 1 ELSE 2 END")),
        ):
            err = _refused(call)
            assert "time limit of 0.5 s" in str(err), str(err)
    assert len(ds.where("length > 0")) == len(ds)  # the next query runs as usual
