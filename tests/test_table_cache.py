"""The table cache: entries written by the first stats() and where(), mapped by later processes, never trusted blindly.

Every result is compared with NumPy over the raw episodes (``reference_stats``)
or with the raw episodes' own fields, never with a run of the code under test. Process boundaries (a second process
mapping what the first wrote, two processes writing at once) run in real
subprocesses, checked by exit status, by what they computed and by what is on
disk afterwards.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

import episodelake as el
from episodelake.storage import layout, table_cache
from episodelake.storage.location import resolve

from .conftest import build_quarantining_dataset, build_robot_dataset
from .reference import random_episode
from .test_query import assert_stats_equal


def table_files(path: str) -> set[str]:
    """The live table files, relative to the table directory (as the log names them)."""
    root = os.path.join(path, layout.TABLE) + "/"
    return {uri[len(root) :] for uri in DeltaTable(root).file_uris()}


def entries(path: str) -> set[str]:
    """The cache entries on disk, as the table files they stand for."""
    root = os.path.join(path, *layout.stats_cache_parts())
    found = set()
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(layout.CACHE_SUFFIX):
                found.add(os.path.relpath(os.path.join(folder, name), root)[: -len(layout.CACHE_SUFFIX)])
    return found


def entry_path(path: str, file: str) -> str:
    return os.path.join(path, *layout.stats_cache_parts(file))


@pytest.fixture
def recorded(tmp_path):
    """A partitioned dataset over several table files, and its raw episodes."""
    path = str(tmp_path / "ds")
    raws = build_robot_dataset(path, seed=3, episodes=40, per_commit=10, max_length=12)
    return path, raws


def assert_selected(view, path: str, raws, chosen) -> None:
    """``view`` holds exactly the recorded episodes ``chosen`` holds for, in recording order.

    The reference order is read from the Delta table with deltalake and sorted with NumPy, and checked to be
    the recording order by the lengths.
    """
    t = DeltaTable(os.path.join(path, layout.TABLE)).to_pyarrow_table(columns=["created_at", "episode_id", "length"])
    ids = t.column("episode_id").to_numpy()
    order = np.lexsort((ids, t.column("created_at").cast("int64").to_numpy()))
    assert t.column("length").to_numpy()[order].tolist() == [r.length for r in raws]
    np.testing.assert_array_equal(view.episode_ids, ids[order][[bool(chosen(r)) for r in raws]])


def is_pick(r) -> bool:
    return r.meta["task"] == "pick"


CHILD = r"""
import os, pickle, sys
import episodelake as el
path, out = sys.argv[1], sys.argv[2]
result = {"pick_ids": el.Dataset.open(path).where("task = 'pick'").episode_ids}  # a first where(), unscanned
ds = el.Dataset.open(path)
result |= {"all": ds.stats(), "pick": ds.where("task = 'pick'").stats()}
with open("/proc/self/maps") as fh:
    result["mapped"] = sorted({line.split()[-1] for line in fh if line.rstrip().endswith(".arrow")})
with open(out, "wb") as fh:
    pickle.dump(result, fh)
"""


def run_children(path: str, outs: list[str]) -> list[dict]:
    """Processes computing stats() of ``path`` at once, one per output file; what each computed and mapped."""
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, path, out]) for out in outs]
    assert [p.wait(timeout=240) for p in procs] == [0] * len(outs)
    results = []
    for out in outs:
        with open(out, "rb") as fh:
            results.append(pickle.load(fh))
    return results


def test_the_first_stats_writes_an_entry_per_file_that_another_process_maps(recorded, tmp_path):
    path, raws = recorded
    assert entries(path) == set()  # writing episodes decodes nothing: no entry yet
    assert_stats_equal(el.Dataset.open(path).stats(), raws)
    assert_selected(el.Dataset.open(path).where("task = 'pick'"), path, raws, is_pick)
    table_cache.wait()  # entries are written on the cache's writer thread
    files = table_files(path)
    assert len(files) >= 4 and entries(path) == files
    stamps = {f: os.stat(entry_path(path, f)).st_mtime_ns for f in files}
    (child,) = run_children(path, [str(tmp_path / "child.pkl")])
    assert_stats_equal(child["all"], raws)
    assert_stats_equal(child["pick"], [r for r in raws if r.meta["task"] == "pick"])
    keys = os.path.join(path, *layout.keys_cache_parts(False))
    assert set(child["mapped"]) == {keys} | {entry_path(path, f) for f in files}  # read through maps, not decoded
    np.testing.assert_array_equal(child["pick_ids"], el.Dataset.open(path).where("task = 'pick'").episode_ids)
    assert {f: os.stat(entry_path(path, f)).st_mtime_ns for f in files} == stamps  # and not rewritten


def test_processes_writing_the_cache_at_once_all_get_numpys_statistics(recorded, tmp_path):
    path, raws = recorded
    results = run_children(path, [str(tmp_path / f"child{i}.pkl") for i in range(3)])
    for result in results:
        assert_stats_equal(result["all"], raws)
        assert_stats_equal(result["pick"], [r for r in raws if r.meta["task"] == "pick"])
        np.testing.assert_array_equal(result["pick_ids"], results[0]["pick_ids"])
    assert_selected(el.Dataset.open(path).where("task = 'pick'"), path, raws, is_pick)
    loc = resolve(path)
    assert entries(path) == table_files(path)
    assert all(table_cache.load(loc, table_cache.stats_entry(loc, f)) is not None for f in table_files(path))
    assert not [n for _, _, names in os.walk(os.path.join(path, "cache")) for n in names if n.endswith(".tmp")]


def _truncate(path: str, other: str) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) // 2)


def _scramble(path: str, other: str) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.seek(size // 3)
        fh.write(np.random.default_rng(0).integers(0, 256, size // 3, dtype=np.uint8).tobytes())


def _another_files(path: str, other: str) -> None:
    with open(other, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())


def _empty(path: str, other: str) -> None:
    open(path, "wb").close()


def _flip_a_bit(path: str, other: str) -> None:
    with open(path, "r+b") as fh:
        fh.seek(os.path.getsize(path) // 2)
        byte = fh.read(1)[0]
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte ^ 0x10]))


DAMAGES = [_truncate, _scramble, _another_files, _empty, _flip_a_bit]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_entry_is_decoded_again_never_served(recorded, damage):
    path, raws = recorded
    el.Dataset.open(path).stats()
    table_cache.wait()  # entries are written on the cache's writer thread
    files = sorted(table_files(path))
    damage(entry_path(path, files[0]), entry_path(path, files[1]))
    assert_stats_equal(el.Dataset.open(path).stats(), raws)
    table_cache.wait()  # entries are written on the cache's writer thread
    loc = resolve(path)
    assert table_cache.load(loc, table_cache.stats_entry(loc, files[0])) is not None  # rewritten whole


def test_a_rewritten_table_file_invalidates_its_entry(recorded):
    """An entry records its file's size: the same name holding other bytes is decoded again."""
    path, _ = recorded
    el.Dataset.open(path).stats()
    table_cache.wait()  # entries are written on the cache's writer thread
    loc = resolve(path)
    file = sorted(table_files(path))[0]
    before = table_cache.stats_entry(loc, file)
    assert table_cache.load(loc, before) is not None
    with open(table_cache.source_path(loc, file), "ab") as fh:
        fh.write(b"\0")
    assert table_cache.load(loc, table_cache.stats_entry(loc, file)) is None


def test_quarantined_episodes_stay_out_of_cached_statistics(tmp_path):
    path = str(tmp_path / "ds")
    ds, raws = build_quarantining_dataset(path, seed=11, episodes=36, per_commit=9)
    shown = [r for r in raws if r.reward.astype(np.float64).sum() > 0]
    held = [r for r in raws if r.reward.astype(np.float64).sum() <= 0]
    assert shown and held
    for _ in range(2):  # the first decodes and writes the entries, the second maps them
        fresh = el.Dataset.open(path)
        assert_stats_equal(fresh.stats(), shown)
        assert_stats_equal(fresh.quality.quarantine().stats(), held)
        assert_stats_equal(fresh.where("task = 'pick'").stats(), [r for r in shown if r.meta["task"] == "pick"])
        table_cache.wait()  # entries are written on the cache's writer thread
        assert entries(path) == table_files(path)
    ds.quality.release(el.Dataset.open(path).quality.quarantine().episode_ids.tolist())
    assert_stats_equal(el.Dataset.open(path).stats(), raws)


def test_vacuum_removes_the_entries_of_removed_files_and_stale_temporaries(recorded):
    path, raws = recorded
    ds = el.Dataset.open(path)
    ds.stats()
    table_cache.wait()  # entries are written on the cache's writer thread
    before = table_files(path)
    ds.maintenance.compact()
    assert_stats_equal(el.Dataset.open(path).stats(), raws)  # entries for the compacted files too
    table_cache.wait()  # entries are written on the cache's writer thread
    after = table_files(path)
    assert after != before and entries(path) == before | after
    cache = os.path.join(path, *layout.stats_cache_parts())
    stale, recent, foreign = (os.path.join(cache, n) for n in ("a.arrow.1.tmp", "b.arrow.2.tmp", "notes.txt"))
    for name in (stale, recent, foreign):
        open(name, "wb").close()
    hours_ago = time.time() - 2 * 3600
    os.utime(stale, (hours_ago, hours_ago))
    ds.maintenance.vacuum(retention_hours=0, break_old_versions=True)
    assert entries(path) == after == table_files(path)
    assert not os.path.exists(stale) and os.path.exists(recent) and os.path.exists(foreign)
    assert_stats_equal(el.Dataset.open(path).stats(), raws)


def test_a_dataset_that_cannot_hold_a_cache_still_gives_numpys_statistics(recorded):
    path, raws = recorded
    with open(os.path.join(path, *layout.CACHE), "wb"):  # a file where the cache directory would go
        pass
    for _ in range(2):
        assert_stats_equal(el.Dataset.open(path).stats(), raws)
        table_cache.wait()  # entries are written on the cache's writer thread
        assert_selected(el.Dataset.open(path).where("task = 'pick'"), path, raws, is_pick)
    assert entries(path) == set()


def test_the_cache_can_be_turned_off(recorded, monkeypatch):
    path, raws = recorded
    monkeypatch.setenv("EPISODELAKE_TABLE_CACHE", "0")
    assert_stats_equal(el.Dataset.open(path).stats(), raws)
    table_cache.wait()  # entries are written on the cache's writer thread
    assert_selected(el.Dataset.open(path).where("task = 'pick'"), path, raws, is_pick)
    assert not os.path.exists(os.path.join(path, *layout.CACHE))


@pytest.mark.parametrize("damage", [_truncate, _scramble, _empty, _flip_a_bit])
def test_damaged_order_keys_are_read_again_never_served(recorded, damage):
    path, raws = recorded
    assert_selected(el.Dataset.open(path).where("task = 'pick'"), path, raws, is_pick)
    table_cache.wait()
    keys = os.path.join(path, *layout.keys_cache_parts(False))
    damage(keys, keys)
    assert_selected(el.Dataset.open(path).where("task = 'pick'"), path, raws, is_pick)
    assert_selected(el.Dataset.open(path).where("success"), path, raws, lambda r: r.meta["success"])


def test_order_keys_follow_the_version(recorded):
    """A commit makes a new version: its first where() reads the keys again (the new episodes among them),
    and a dataset opened at the older version still places its episodes by that version's keys."""
    path, raws = recorded
    old = el.Dataset.open(path)
    version = old.version
    assert_selected(old.where("task = 'pick'"), path, raws, is_pick)
    rng = np.random.default_rng(99)
    more = [random_episode(rng, int(rng.integers(2, 12))) for _ in range(7)]
    writer = el.Dataset.open(path)
    writer.append_episodes(r.as_dict(unwrap_action=True) for r in more)
    writer.flush()
    assert_selected(el.Dataset.open(path).where("task = 'pick'"), path, raws + more, is_pick)
    table_cache.wait()
    loc = resolve(path)
    files = [f for f in table_files(path)]
    assert table_cache.load(loc, table_cache.keys_entry(el.Dataset.open(path).version, files, False)) is not None
    pinned = el.Dataset.open(path, version=version).where("task = 'pick'")
    assert len(pinned) == sum(map(is_pick, raws))
    np.testing.assert_array_equal(
        pinned.episode_ids, el.Dataset.open(path).where("task = 'pick'").episode_ids[: len(pinned)]
    )


def test_quarantined_and_visible_snapshots_place_their_own_episodes(tmp_path):
    path = str(tmp_path / "ds")
    _, raws = build_quarantining_dataset(path, seed=12, episodes=30, per_commit=10)
    positive = {id(r) for r in raws if r.reward.astype(np.float64).sum() > 0}
    assert 0 < len(positive) < len(raws)
    for _ in range(2):  # the first reads and writes each snapshot's keys, the second maps them
        assert_selected(
            el.Dataset.open(path).where("task = 'pick'"), path, raws, lambda r: is_pick(r) and id(r) in positive
        )
        held = el.Dataset.open(path).quality.quarantine().where("task = 'pick'")
        assert_selected(held, path, raws, lambda r: is_pick(r) and id(r) not in positive)
    table_cache.wait()
    assert os.path.exists(os.path.join(path, *layout.keys_cache_parts(False)))


def _change_a_value(path: str, other: str) -> None:
    """The last value of the last list column (near the end of the data) plus 1000: structure intact."""
    data = pa.memory_map(path).read_buffer()
    table = pa.ipc.open_file(pa.BufferReader(data.slice(0, data.size - 16))).read_all()
    lists = [c for c in table.column_names if pa.types.is_list(table.schema.field(c).type)]
    values = table.column(lists[-1]).chunk(0).values
    at = values.buffers()[1].address - data.address + 8 * (values.offset + len(values) - 1)
    old = float(np.frombuffer(data, dtype="<f8", count=1, offset=at)[0])
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(np.array([old + 1000.0], dtype="<f8").tobytes())


def test_a_value_changed_in_an_entry_is_caught_by_its_checksum(tmp_path):
    """Files of 300 episodes: their entries' data, not their footers, reach the last bytes the checksum covers."""
    path = str(tmp_path / "ds")
    raws = build_robot_dataset(path, seed=4, episodes=600, per_commit=300, max_length=4)
    el.Dataset.open(path).stats()
    table_cache.wait()
    for file in sorted(table_files(path)):
        _change_a_value(entry_path(path, file), "")
    assert_stats_equal(el.Dataset.open(path).stats(), raws)


def test_a_table_file_gone_is_corruption_even_with_its_entry_there(recorded):
    path, _ = recorded
    el.Dataset.open(path).stats()
    table_cache.wait()
    view = el.Dataset.open(path).where("task = 'pick'")
    view.snapshot().scan()
    gone = sorted(f for f in table_files(path) if f.startswith("task=pick"))[0]
    assert os.path.exists(entry_path(path, gone))
    os.remove(os.path.join(path, layout.TABLE, gone))
    with pytest.raises(el.CorruptionError, match=re.escape(gone.rsplit("/", 1)[-1])):
        view.stats()


FORKED = r"""
import os, sys
import episodelake as el
first, second = sys.argv[1:]
el.Dataset.open(first).stats()  # this process's cache writer starts
ds = el.Dataset.open(second)
ds.snapshot().scan()  # opened before the fork: deltalake cannot open a table in a forked child
pid = os.fork()
if pid == 0:
    ds.stats()  # the child's entries: written by its own writer, waited for at its exit
else:
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_childs_entries_are_written_by_its_own_writer_before_it_exits(tmp_path):
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    build_robot_dataset(first, seed=1, episodes=12, per_commit=4, max_length=8)
    raws = build_robot_dataset(second, seed=2, episodes=12, per_commit=4, max_length=8)
    done = subprocess.run([sys.executable, "-c", FORKED, first, second], timeout=240)
    assert done.returncode == 0
    assert entries(first) == table_files(first)
    assert entries(second) == table_files(second)
    loc = resolve(second)
    assert all(table_cache.load(loc, table_cache.stats_entry(loc, f)) is not None for f in table_files(second))
    assert_stats_equal(el.Dataset.open(second).stats(), raws)


BROKEN = r"""
import sys
import pyarrow as pa
from episodelake.storage import table_cache
from episodelake.storage.location import resolve
loc = resolve(sys.argv[1])
table = pa.table({"x": [1, 2, 3]})
table_cache.store_later(loc, table_cache.Entry(("cache", "bad.arrow"), {b"tag": 1}), table)  # raises: not bytes
table_cache.store_later(loc, table_cache.Entry(("cache", "good.arrow"), {b"tag": b"1"}), table)
"""


def test_an_entry_that_raises_leaves_the_writer_running_and_the_exit_waits_for_the_rest(tmp_path):
    done = subprocess.run([sys.executable, "-c", BROKEN, str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "table cache entry cache/bad.arrow not written" in done.stderr
    got = table_cache.load(resolve(str(tmp_path)), table_cache.Entry(("cache", "good.arrow"), {b"tag": b"1"}))
    assert got is not None and got.column("x").to_pylist() == [1, 2, 3]
    assert not os.path.exists(tmp_path / "cache" / "bad.arrow")
