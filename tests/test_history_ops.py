"""``history()`` and ``episodelake history`` name every commit for what it did (issue 20 item 8).

An append, an eviction (capacity), a delete, a clear, a derived-column
declaration and update, a compaction and a vacuum each appear under their
own name, with the episodes they added and removed counted from what the
test did, never read back from the library.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import episodelake as el

from .workers.replay import episode, schema

ROOT = Path(__file__).resolve().parents[1]


def write(ds: el.Dataset, numbers: range) -> None:
    ds.append_episodes(episode(n) for n in numbers)
    ds.flush()


def run_cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "episodelake.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_every_operation_is_named_in_history_and_the_cli(tmp_path):
    path = str(tmp_path / "ds")
    capacity = {"episodes": 5, "retention_hours": 0, "break_old_versions": True, "vacuum_every": 10**6}
    ds = el.Dataset.create(schema(), path, capacity=capacity, commit_episodes=10**6)
    write(ds, range(0, 4))  # APPEND 4
    write(ds, range(4, 7))  # EVICT: 3 added, the 2 oldest removed
    ds.delete(where="n = 3")  # DELETE 1
    write(ds, range(7, 8))  # APPEND 1: fits (4 live), and makes a second file for the compaction
    ds.columns.add(el.FieldSpec("score", (), "float32", role="meta"))  # ADD COLUMN
    ds.columns.update({"score": [1.0] * 5})  # UPDATE
    ds.maintenance.compact()  # COMPACT
    ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)  # VACUUM START / END: the compacted files go
    ds.delete(all=True)  # CLEAR 5
    want = [
        ("CREATE", None, None),
        ("APPEND", 4, 0),
        ("EVICT", 3, 2),
        ("DELETE", 0, 1),
        ("APPEND", 1, 0),
        ("ADD COLUMN", None, None),
        ("UPDATE", None, None),
        ("COMPACT", None, None),
        ("VACUUM START", None, None),
        ("VACUUM END", None, None),
        ("CLEAR", 0, 5),
    ]
    history = el.Dataset.open(path).history()
    assert [(h["operation"], h["episodes_added"], h["episodes_removed"]) for h in reversed(history)] == want
    assert all(h["version"] == i for i, h in enumerate(reversed(ds.history())))
    assert not any(h["operation"] == "WRITE" for h in ds.history())

    entries = json.loads(run_cli("history", path, "--json"))
    assert [(e["operation"], e["episodes_added"], e["episodes_removed"]) for e in reversed(entries)] == want
    lines = run_cli("history", path).splitlines()
    assert lines[0].split()[:3] == ["version", "time", "(UTC)"] and "episodes removed" in lines[0]
    rows = lines[2:]  # header, rule, then one line per version, newest first
    assert len(rows) == len(want)
    for line, (name, added, removed) in zip(rows, reversed(want), strict=True):
        assert f" {name} " in f" {line} ", line
        if added is not None:
            assert line.split()[-2:] == [str(added), str(removed)], line


def test_history_of_commits_without_episodelake_names_reads_delta_operations(tmp_path):
    """Commits of 0.2 carry no episodelake name: a predicate overwrite is a DELETE, an OPTIMIZE a COMPACT."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, commit_episodes=10**6)
    write(ds, range(0, 3))
    write(ds, range(3, 5))  # two files: the compaction has work
    table = DeltaTable(str(tmp_path / "ds" / "episodes"))
    empty = pa.schema(table.schema().to_arrow()).empty_table()  # as 0.2 deleted: no commit properties
    write_deltalake(table, empty, mode="overwrite", predicate="n = 1")
    table.optimize.compact()
    names = [h["operation"] for h in reversed(el.Dataset.open(path).history())]
    assert names == ["CREATE", "APPEND", "APPEND", "DELETE", "COMPACT"]
