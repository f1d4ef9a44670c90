"""Vacuum cannot destroy committed data, whatever runs concurrently (docs/reliability.md, "Vacuum and compaction").

* A table file or tensor array a commit in flight has written (not yet in the
  log) survives any vacuum, at the shortest retention and with the override;
  the commit then lands and every episode reads back as written.
* Data no version references goes only once older than the floor (1 h).
* A retention below 1 h needs ``break_old_versions=True`` (vacuum, capacity, CLI).
* Deletes, evictions, compactions and vacuums raced in real processes, on
  disk and on S3, lose nothing (slow).

Expected episodes come from the episode numbers the test wrote
(:func:`tests.workers.replay.episode`, plain NumPy), never from the library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

import episodelake as el
from episodelake.storage import layout
from episodelake.storage.retention import Evictor

from .test_bad_input import tree_digest
from .workers.replay import Fifo, check_episode, episode, length_of, live_numbers, schema

ROOT = Path(__file__).resolve().parents[1]


def age_files(root: str, hours: float) -> None:
    """Move the modification time of everything under ``root`` back by ``hours``, as if written that long ago."""
    shift = hours * 3600.0
    for dirpath, dirs, files in os.walk(root):
        for name in [*files, *dirs]:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            os.utime(path, (st.st_atime - shift, st.st_mtime - shift))


def where(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict | None]:
    if kind == "s3":
        return request.getfixturevalue("s3_url"), request.getfixturevalue("s3_server").storage_options
    return str(tmp_path / "ds"), None


def write(ds: el.Dataset, numbers: range) -> None:
    ds.append_episodes(episode(n) for n in numbers)
    ds.flush()


@pytest.mark.parametrize("kind", ["disk", "s3"])
def test_a_delete_in_flight_keeps_its_new_table_file_through_vacuum(kind, tmp_path, request):
    """The race of issue 26: a delete's rewrite is on storage, not yet committed, when vacuum runs."""
    path, options = where(kind, tmp_path, request)
    ds = el.Dataset.create(schema(), path, storage_options=options, commit_episodes=10**6)
    write(ds, range(0, 4))
    write(ds, range(4, 8))
    loc = ds.location
    # What the delete of episode 5 writes before it commits: its file's rows without episode 5, as a new file.
    table = DeltaTable(loc.delta_uri(), storage_options=loc.delta_options())
    rels = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    numbers = {
        rel: pq.read_table(pa.BufferReader(loc.fs.cat_file(loc.child("episodes", rel))))["n"].to_pylist()
        for rel in rels
    }
    old = next(rel for rel, ns in numbers.items() if 5 in ns)
    kept = pq.read_table(pa.BufferReader(loc.fs.cat_file(loc.child("episodes", old))))
    kept = kept.filter(pa.compute.not_equal(kept["n"], 5))
    new = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    with loc.fs.open(loc.child("episodes", new), "wb") as fh:
        pq.write_table(kept, fh)
    in_flight = loc.child("episodes", new)

    for report in (
        el.Dataset.open(path, storage_options=options).maintenance.vacuum(retention_hours=0, break_old_versions=True),
        el.Dataset.open(path, storage_options=options).maintenance.vacuum(retention_hours=1),
    ):
        assert in_flight not in report.table_files and report.tensor_arrays == []
        assert loc.fs.exists(in_flight)

    # the delete commits: the file it wrote replaces the old one
    size = loc.fs.size(in_flight)
    stats = json.dumps({"numRecords": kept.num_rows})
    add = AddAction(new, size, {}, int(1000 * os.path.getmtime(in_flight)) if kind == "disk" else 0, True, stats)
    remove = RemoveAction(old, deletion_timestamp=0, data_change=True)
    table.create_write_transaction([remove, add], "append", kept.schema)

    fresh = el.Dataset.open(path, storage_options=options)
    assert live_numbers(fresh) == [n for n in range(8) if n != 5]
    for ref in fresh.episodes():
        check_episode(ref)
    assert fresh.maintenance.validate().ok


def test_a_commit_in_flight_keeps_its_tensor_arrays_through_vacuum(tmp_path, monkeypatch):
    """A capacity commit's tensors are written, its table commit is being planned, and vacuum runs meanwhile."""
    path = str(tmp_path / "ds")
    capacity = {"episodes": 4, "retention_hours": 0, "break_old_versions": True, "vacuum_every": 10**6}
    ds = el.Dataset.create(schema(), path, capacity=capacity, commit_episodes=10**6)
    model = Fifo(episodes=4)
    for first in (0, 3, 6):  # the first commit is wholly evicted by the third
        write(ds, range(first, first + 3))
        model.commit([(n, length_of(n)) for n in range(first, first + 3)])
    entered, release = threading.Event(), threading.Event()
    plan = Evictor.plan

    def held(self, table, rows):  # the commit's tensor rows are on disk; its table commit has not started
        entered.set()
        assert release.wait(timeout=120)
        return plan(self, table, rows)

    monkeypatch.setattr(Evictor, "plan", held)
    writer = threading.Thread(target=write, args=(ds, range(9, 12)))
    writer.start()
    try:
        assert entered.wait(timeout=120)
        writer_name = ds._sink.name if ds._sink is not None else None
        assert writer_name is not None
        newest = max(int(c) for c in os.listdir(tmp_path / "ds" / "tensors" / writer_name) if c.isdigit())
        arrays = tmp_path / "ds" / "tensors" / writer_name / str(newest)
        before = tree_digest(str(arrays))
        report = el.Dataset.open(path).maintenance.vacuum(retention_hours=0, break_old_versions=True)
        assert not any(p.startswith(str(arrays)) for p in report.tensor_arrays)
        assert report.tensor_arrays  # evicted commits did go: the vacuum was not a no-op
        assert tree_digest(str(arrays)) == before
    finally:
        release.set()
        writer.join()
    model.commit([(n, length_of(n)) for n in range(9, 12)])
    fresh = el.Dataset.open(path)
    assert live_numbers(fresh) == model.numbers
    for ref in fresh.episodes():
        check_episode(ref)
    assert fresh.maintenance.validate().ok


def test_unreferenced_data_goes_only_past_the_floor(tmp_path):
    """A stray table file and a writer's arrays no version references: kept under 1 h, removed past it."""
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, commit_episodes=10**6)
    write(ds, range(0, 3))
    stray = tmp_path / "ds" / "episodes" / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    live = next((tmp_path / "ds" / "episodes").glob("*.parquet"))
    stray.write_bytes(live.read_bytes())  # what a commit killed before its log entry leaves
    lone = tmp_path / "ds" / "tensors" / "0badc0de" / "observation" / "camera"
    lone.mkdir(parents=True)
    (lone / "zarr.json").write_text("{}")
    young = ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    assert (young.table_files, young.tensor_arrays) == ([], [])
    assert stray.exists() and lone.exists()
    age_files(str(tmp_path / "ds"), hours=1.5)
    old = ds.maintenance.vacuum(retention_hours=1)
    assert old.table_files == [str(stray)] and old.tensor_arrays == [str(tmp_path / "ds" / "tensors" / "0badc0de")]
    assert not stray.exists() and not lone.exists()
    assert live_numbers(el.Dataset.open(path)) == [0, 1, 2]


@pytest.mark.slow
def test_a_retention_below_one_hour_needs_the_override(tmp_path, monkeypatch):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, commit_episodes=10**6)
    write(ds, range(0, 4))
    ds.delete(where="n = 1")
    ds.maintenance.compact()
    before = tree_digest(path)
    for hours in (0, 0.5):
        with pytest.raises(el.ArgumentError, match=r"below the safe minimum of 1 h.*time travel.*break_old_versions"):
            ds.maintenance.vacuum(retention_hours=hours)
    assert tree_digest(path) == before
    # a dry run risks nothing: no override needed
    assert ds.maintenance.vacuum(dry_run=True, retention_hours=0).table_files
    assert tree_digest(path) == before
    # the minimum itself is allowed; nothing is 1 h old
    assert ds.maintenance.vacuum(retention_hours=1).table_files == []
    with pytest.raises(el.ArgumentError, match="break_old_versions"):
        el.Capacity(steps=10, retention_hours=0)
    assert el.Capacity(steps=10, retention_hours=0, break_old_versions=True).retention_hours == 0

    cli = [sys.executable, "-m", "episodelake.cli", "vacuum", path, "--retention-hours", "0"]
    refused = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert refused.returncode != 0 and "--break-old-versions" in refused.stderr + refused.stdout
    assert tree_digest(path) == before
    done = subprocess.run(
        [*cli, "--break-old-versions", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["table_files"]  # the files only the older versions held
    assert live_numbers(el.Dataset.open(path)) == [0, 2, 3]


def test_a_descriptor_from_before_the_override_keeps_its_short_retention(tmp_path):
    """A capacity dataset created by 0.2 with retention_hours=0 (no override field) still opens and vacuums."""
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, capacity={"episodes": 3, "retention_hours": 0, "break_old_versions": True})
    write(ds, range(0, 2))
    descriptor = json.loads((tmp_path / "ds" / layout.DESCRIPTOR).read_text())
    del descriptor["capacity"]["break_old_versions"]
    (tmp_path / "ds" / layout.DESCRIPTOR).write_text(json.dumps(descriptor))
    reopened = el.Dataset.open(path, commit_episodes=10**6)
    assert reopened._store.capacity is not None and reopened._store.capacity.break_old_versions
    write(reopened, range(2, 5))
    assert live_numbers(el.Dataset.open(path)) == [2, 3, 4]


def test_a_commit_whose_response_was_lost_is_not_committed_again(tmp_path):
    """A writer's commit landed but it did not hear so: its retry from the version before finds it and stops.

    The retried write of a lost response meets its own version (deltalake's
    412); before, deltalake re-committed the rows as a new version, so the
    episodes were there twice. Here another handle lands the very rows first,
    exactly as the lost attempt did.
    """
    from episodelake.storage.location import resolve
    from episodelake.storage.table import EpisodeTable

    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, commit_episodes=10**6)
    write(ds, range(0, 3))
    loc = resolve(path, {})
    stale = EpisodeTable.open(loc)  # the writer's handle, at the version before its commit
    write(ds, range(3, 6))  # the commit lands (the response the writer lost)
    landed = ds.version
    added = [a["path"] for a in ds._store.table.add_actions()]
    rows = next(
        t
        for t in (pq.read_table(os.path.join(path, "episodes", rel)) for rel in added)
        if sorted(t["n"].to_pylist()) == [3, 4, 5]
    )
    rows = rows.select(stale.dt.schema().to_arrow().names).cast(pa.schema(stale.dt.schema().to_arrow()))
    assert stale.append(rows) == landed  # the retry: found in the log, not repeated
    fresh = el.Dataset.open(path)
    assert fresh.version == landed and live_numbers(fresh) == list(range(6))
    assert [h["operation"] for h in fresh.history()].count("APPEND") == 2


def test_a_failed_background_compaction_warns_once_and_the_next_compact_raises_it(tmp_path, monkeypatch):
    from episodelake.storage import table as table_mod

    monkeypatch.setattr(table_mod, "COMPACT_EVERY", 3)
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(schema(), path, commit_episodes=10**6)
    write(ds, range(0, 1))
    write(ds, range(1, 2))
    damaged = next((tmp_path / "ds" / "episodes").glob("*.parquet"))
    damaged.write_bytes(b"\0" * damaged.stat().st_size)  # a table file garbled in place
    with pytest.warns(RuntimeWarning, match=r"background compaction of .* failed \(data unchanged\)") as caught:
        write(ds, range(2, 3))  # the third commit starts the background compaction
        table_mod.join_compactions()
    assert len([w for w in caught if "background compaction" in str(w.message)]) == 1
    assert all("Traceback" not in str(w.message) for w in caught)
    with pytest.raises(el.CorruptionError, match="cannot be read") as first:
        ds.maintenance.compact()
    assert "background compaction" in " ".join(getattr(first.value, "__notes__", []))
    assert first.value.__cause__ is not None  # chained to deltalake's error
    with pytest.raises(el.CorruptionError) as second:  # a compaction of its own, failing on the same file
        ds.maintenance.compact()
    assert not getattr(second.value, "__notes__", [])


# ---------------------------------------------------------------- the race in real processes (slow)
#
# ``python -m tests.test_vacuum_safety ROLE PLAIN CAPACITY OPTIONS_JSON TRUTH ITERATIONS``: ROLE ``deleter``
# appends to PLAIN and deletes from it, ``evictor`` appends to the capacity dataset CAPACITY, ``compactor``
# compacts both, ``vacuumer`` vacuums both at retention 0 (with the override) and 1 h; ``check`` reopens both
# and compares them with TRUTH. Writers append a line to TRUTH after each call returned: "w DS N..." (appended)
# and "d DS N" (deleted). Any exception ends the process with a nonzero status.

CAPACITY = 10  # episodes


def _worker(role: str, plain: str, capacity: str, options: dict | None, truth: str, iterations: int) -> None:
    import random

    def record(line: str) -> None:
        with open(truth, "a") as fh:
            fh.write(line + "\n")

    if role == "deleter":
        ds = el.Dataset.open(plain, storage_options=options, commit_episodes=10**6)
        rng, live = random.Random(0), []
        for i in range(iterations):
            numbers = range(3 * i, 3 * i + 3)
            write(ds, numbers)
            record("w plain " + " ".join(map(str, numbers)))
            live += numbers
            if i % 2:
                gone = live.pop(rng.randrange(len(live)))
                assert ds.delete(where=f"n = {gone}") == 1
                record(f"d plain {gone}")
    elif role == "evictor":
        ds = el.Dataset.open(capacity, storage_options=options, commit_episodes=10**6)
        for i in range(iterations):
            numbers = range(3 * i, 3 * i + 3)
            write(ds, numbers)
            record("w capacity " + " ".join(map(str, numbers)))
    elif role == "compactor":
        handles = [el.Dataset.open(p, storage_options=options) for p in (plain, capacity)]
        for _ in range(iterations):
            for ds in handles:
                ds.maintenance.compact()
    elif role == "vacuumer":
        handles = [el.Dataset.open(p, storage_options=options) for p in (plain, capacity)]
        for i in range(iterations):
            for ds in handles:
                if i % 3 == 2:
                    ds.maintenance.vacuum(retention_hours=1)
                else:
                    ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    elif role == "check":
        appended: dict[str, list[int]] = {"plain": [], "capacity": []}
        deleted: set[int] = set()
        model = Fifo(episodes=CAPACITY)
        with open(truth) as fh:
            for line in fh:
                kind, name, *ns = line.split()
                if kind == "w":
                    appended[name] += map(int, ns)
                    if name == "capacity":
                        model.commit([(int(n), length_of(int(n))) for n in ns])
                else:
                    deleted.add(int(ns[0]))
        for path, want in ((plain, [n for n in appended["plain"] if n not in deleted]), (capacity, model.numbers)):
            ds = el.Dataset.open(path, storage_options=options)
            assert live_numbers(ds) == want, (path, live_numbers(ds), want)
            for ref in ds.episodes():
                check_episode(ref)
            report = ds.maintenance.validate()
            assert report.ok, [str(p) for p in report.problems[:5]]
        print(f"checked {len(appended['plain'])} + {len(appended['capacity'])} episodes", flush=True)
    else:
        raise SystemExit(f"unknown role {role!r}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["disk", "s3"])
def test_deletes_evictions_compactions_and_vacuums_race_without_loss(kind, tmp_path, request):
    path, options = where(kind, tmp_path, request)
    plain, capacity = path, path + "-capacity"
    el.Dataset.create(schema(), plain, storage_options=options)
    cap = {"episodes": CAPACITY, "retention_hours": 0, "break_old_versions": True, "vacuum_every": 3}
    el.Dataset.create(schema(), capacity, storage_options=options, capacity=cap)  # local: auto-vacuums too
    truth = str(tmp_path / "truth.txt")
    iterations = 40 if kind == "disk" else 24
    args = [plain, capacity, json.dumps(options), truth, str(iterations)]
    procs = {
        role: subprocess.Popen(
            [sys.executable, "-m", "tests.test_vacuum_safety", role, *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for role in ("deleter", "evictor", "compactor", "vacuumer")
    }
    outcomes = {role: proc.communicate(timeout=600) for role, proc in procs.items()}
    for role, proc in procs.items():
        assert proc.returncode == 0, f"{role}: {outcomes[role][1][-3000:]}"
    checked = subprocess.run(
        [sys.executable, "-m", "tests.test_vacuum_safety", "check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert f"checked {3 * iterations} + {3 * iterations} episodes" in checked.stdout


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
