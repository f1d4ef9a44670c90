"""The on-disk cache of immutable byte ranges: round trips, damage detection, the LRU bound, many processes.

Reference: a plain dict of what was stored. Damage is made by hand in the
entry files; processes are real subprocesses sharing one directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from episodelake.storage.diskcache import TRAILER, DiskCache, MemoryCache, entry_name

ROOT = Path(__file__).resolve().parents[1]


def files(cache: DiskCache) -> list[Path]:
    return [p for p in Path(cache.directory).glob("*/*") if p.is_file()]


def on_disk(cache: DiskCache) -> int:
    return sum(p.stat().st_size for p in files(cache))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.text(min_size=1, max_size=20), st.binary(max_size=3000), max_size=12))
def test_what_is_stored_reads_back_in_this_and_a_fresh_cache(tmp_path_factory, items):
    root = tmp_path_factory.mktemp("rt")
    cache = DiskCache(str(root), 1 << 30)
    for key, value in items.items():
        cache.put(key, value)
    for reader in (cache, DiskCache(str(root), 1 << 30)):  # this process's mappings, and files read anew
        for key, value in items.items():
            got = reader.get(key)
            assert got is not None and got.tobytes() == value
        assert reader.get("never stored") is None


def test_flipped_bytes_and_truncation_are_detected_and_the_entry_deleted(tmp_path):
    values = {f"k{i}": np.random.default_rng(i).integers(0, 256, 5000, np.uint8).tobytes() for i in range(3)}
    writer = DiskCache(str(tmp_path), 1 << 30)
    for key, value in values.items():
        writer.put(key, value)
    flipped = tmp_path / entry_name("k0")
    blob = bytearray(flipped.read_bytes())
    blob[1234] ^= 0x01
    flipped.write_bytes(bytes(blob))
    truncated = tmp_path / entry_name("k1")
    truncated.write_bytes(truncated.read_bytes()[:-7])
    reader = DiskCache(str(tmp_path), 1 << 30)
    assert reader.get("k0") is None and reader.get("k1") is None  # never served
    assert not flipped.exists() and not truncated.exists() and reader.corrupt == 2
    assert reader.get("k2").tobytes() == values["k2"]
    reader.put("k0", values["k0"])  # refetched and stored again
    assert DiskCache(str(tmp_path), 1 << 30).get("k0").tobytes() == values["k0"]


def test_the_bound_holds_after_every_put_and_recently_used_entries_stay(tmp_path):
    size, bound = 10_000, 100_000
    cache = DiskCache(str(tmp_path), bound)
    cache.put("hot", b"h" * size)
    base = time.time() - 1000  # file times tick coarsely: give each entry its own second of last use
    for i in range(60):
        cache.put(f"cold{i}", bytes([i]) * size)
        assert on_disk(cache) <= bound
        if (tmp_path / entry_name(f"cold{i}")).exists():
            os.utime(tmp_path / entry_name(f"cold{i}"), (base + i, base + i))
        # "hot" is read all the time, by a fresh reader (as another process would): reading marks it used now
        assert DiskCache(str(tmp_path), bound).get("hot").tobytes() == b"h" * size
    survivors = {p.name for p in files(cache)}
    assert Path(entry_name("hot")).name in survivors
    newest = [Path(entry_name(f"cold{i}")).name for i in range(55, 60)]
    oldest = [Path(entry_name(f"cold{i}")).name for i in range(5)]
    assert set(newest) <= survivors and not set(oldest) & survivors


def test_memory_cache_is_an_lru_bounded_in_bytes():
    cache = MemoryCache(3000)
    arrays = {k: np.full(1000, i, np.uint8) for i, k in enumerate("abcd")}
    for k in "abc":
        cache.put(k, arrays[k])
    assert cache.get("a") is arrays["a"]  # "a" is now the most recent
    cache.put("d", arrays["d"])
    assert cache.get("b") is None and all(cache.get(k) is arrays[k] for k in "acd")
    cache.put("big", np.zeros(4000, np.uint8))  # larger than the bound: not kept, nothing evicted
    assert cache.get("big") is None and cache.get("a") is arrays["a"]


WRITER = """
import sys, numpy as np
from episodelake.storage.diskcache import DiskCache
cache = DiskCache(sys.argv[1], int(sys.argv[2]))
for i in range(int(sys.argv[3])):
    key = f"k{i}"
    value = np.random.default_rng(i).integers(0, 256, 2000 + i, np.uint8).tobytes()
    got = cache.get(key)
    if got is not None and got.tobytes() != value:
        sys.exit(f"{key}: served bytes differ")
    cache.put(key, value)
"""


@pytest.mark.slow
def test_processes_filling_one_cache_leave_only_whole_verified_entries(tmp_path):
    n, bound = 150, 200_000  # more than the bound: eviction runs while others write
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(bound), str(n)], env=env) for _ in range(4)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0, 0]
    cache = DiskCache(str(tmp_path), bound)
    present = files(cache)
    assert present and not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    for path in present:
        blob = path.read_bytes()
        crc, length = TRAILER.unpack_from(blob, len(blob) - TRAILER.size)
        assert length == len(blob) - TRAILER.size and zlib.crc32(blob[:length]) == crc
    for i in range(n):
        got = cache.get(f"k{i}")
        assert got is None or got.tobytes() == np.random.default_rng(i).integers(0, 256, 2000 + i, np.uint8).tobytes()
    # each process may pass the bound by an eighth of it until its next scan
    assert on_disk(cache) <= bound + 4 * (bound // 8 + 2000 + n + TRAILER.size)
