"""DataLoader workers hand batches over in shared memory (``sampling/loader_slots``), equal to single-process ones.

Real ``DataLoader``s with real worker processes (fork and spawn): every batch
equals the ``num_workers=0`` batch for the same sampler seed, held batches are
never overwritten, the large buffers arrive as views of a shared mapping (not
pickled bytes), workers read the page cache instead of building resident
copies of their own, and a script that runs loaders, stops one early and
exits with another still open exits with status 0, leaving no worker process,
no mapping and nothing in ``/dev/shm`` behind.
"""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import episodelake as el
from episodelake.read import batching
from episodelake.sampling.batch import SegmentBatch, collate
from episodelake.sampling.loader_slots import SlotBatch, SlotPool, slot_bytes

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, RandomSampler  # noqa: E402

CAMERA = (3, 32, 32)  # 16 segments x 9 rows x 3 KiB: large enough for a slot
LENGTHS = [3, 5, 8, 12, 20, 31, 40, 7, 26]  # several shorter than the window: padding
L, BATCH = 8, 16


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (64,), "float32"),
            el.FieldSpec("camera", CAMERA, "uint8", layout="CHW", storage="tensor", chunk_rows=16),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("task", (), "str", role="meta"),
            el.FieldSpec("score", (), "float64", role="meta"),
        ]
    )


def episode(rng: np.random.Generator, n: int, i: int) -> dict:
    return {
        "initial_observation": {
            "state": rng.standard_normal(64).astype(np.float32),
            "camera": rng.integers(0, 255, CAMERA, dtype=np.uint8),
        },
        "observations": {
            "state": rng.standard_normal((n, 64)).astype(np.float32),
            "camera": rng.integers(0, 255, (n, *CAMERA), dtype=np.uint8),
        },
        "actions": rng.standard_normal((n, 2)).astype(np.float32),
        "rewards": rng.standard_normal(n).astype(np.float32),
        "terminated": i % 2 == 0,
        "truncated": i % 2 == 1,
        "meta": {"task": f"task{i % 3}", "score": None if i % 4 == 0 else float(i)},
    }


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("slots") / "ds")
    ds = el.Dataset.create(schema(), path)
    rng = np.random.default_rng(11)
    ds.append_episodes(episode(rng, n, i) for i, n in enumerate(LENGTHS))
    ds.flush()
    return path


def loader(segs, workers: int, context: str | None = None, seed: int = 3, collate=None) -> DataLoader:
    draws = RandomSampler(
        segs, replacement=True, num_samples=BATCH * 9 + 5, generator=torch.Generator().manual_seed(seed)
    )
    return DataLoader(
        segs,
        batch_size=BATCH,
        sampler=draws,
        num_workers=workers,
        collate_fn=collate or segs.collate,
        multiprocessing_context=context if workers else None,
    )


def buffers(batch) -> dict[str, np.ndarray]:
    """Every array of a batch by name (fields, flags, mask, ids, starts, meta and its mask)."""
    out = {f"data/{k}": v for k, v in batch.data.items()}
    out.update(terminated=batch.terminated, truncated=batch.truncated, mask=batch.mask)
    out.update(episode_id=batch.episode_id, start=batch.start)
    out.update({f"meta/{k}": v for k, v in batch.meta.flat().items()})
    out.update({f"meta_mask/{k}": v for k, v in batch.meta_mask.flat().items()})
    return out


def assert_same_batches(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert type(g) is SegmentBatch and type(w) is SegmentBatch
        gb, wb = buffers(g), buffers(w)
        assert list(gb) == list(wb)
        for key in wb:
            assert gb[key].dtype == wb[key].dtype, key
            np.testing.assert_array_equal(gb[key], wb[key], err_msg=key)


def in_slot(arr: np.ndarray) -> bool:
    """Whether ``arr`` is a view of a shared mapping (a slot), not an array unpickled from bytes."""
    owner = arr.base.base if isinstance(arr.base, np.ndarray) else None
    return isinstance(owner.obj if isinstance(owner, memoryview) else owner, mmap.mmap)


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_worker_batches_equal_single_process_batches(lake, context):
    if context not in torch.multiprocessing.get_all_start_methods():
        pytest.skip(f"no {context} start method here")
    segs = el.Dataset.open(lake, read_only=True).segments(el.Window(L, pad="suffix"))
    want = list(loader(segs, 0))
    got = list(loader(segs, 2, context))  # every batch held: none may be overwritten by a later one
    assert_same_batches(got, want)
    assert len(got[-1].episode_id) == 5  # the last, smaller batch too
    for b in got:
        assert in_slot(b.data["observation/camera"])
        assert not in_slot(b.data["observation/state"])  # small buffers (under 64 KiB) are pickled


def _collate(items):
    """A worker's batch with its process id and the bytes of resident copies it holds."""
    return collate(items), os.getpid(), batching.resident.nbytes


def test_workers_read_the_page_cache_not_resident_copies(lake):
    segs = el.Dataset.open(lake, read_only=True).segments(el.Window(L, pad="suffix"))
    inherited = batching.resident.nbytes  # copies forked workers share with this process (shared mappings)
    seen = list(loader(segs, 2, "fork", collate=_collate))
    pids = {pid for _, pid, _ in seen}
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(resident == inherited for _, _, resident in seen)  # no worker made a copy of its own
    assert_same_batches([b for b, _, _ in seen], list(loader(segs, 0)))


def test_a_slot_is_reused_once_every_view_of_it_is_gone(lake):
    """In one process: pickling takes a ticket, the unpickled batch's last view clears it, then the slot is reused."""
    segs = el.Dataset.open(lake, read_only=True).segments(el.Window(L, pad="suffix"))
    ids = list(range(0, 2 * BATCH, 2))
    want = segs.__getitems__(ids)
    pool = SlotPool()
    size = slot_bytes(segs.reader.pooled(len(ids), L))

    def slot_batch():
        arena = pool.arena(size)
        return SlotBatch.of(segs._read(ids, arena), arena.slot)

    sent = pickle.dumps(slot_batch())
    assert len(sent) < 64 * 1024  # the large buffers are not in the bytes
    (slot,) = pool.slots
    assert not slot.free()  # a ticket is out
    got = pickle.loads(sent)
    assert_same_batches([got], [want])
    camera = got.obs.camera
    del got
    gc.collect()
    assert not slot.free()  # a view of the consumer's mapping is alive
    np.testing.assert_array_equal(camera, want.obs.camera)
    del camera
    gc.collect()
    assert slot.free()
    again = slot_batch()
    assert again.slot is slot and len(pool.slots) == 1
    del again  # never pickled: freed when dropped
    assert slot.free()
    held = [pickle.loads(pickle.dumps(slot_batch())) for _ in range(3)]  # held batches each keep their slot
    assert len(pool.slots) == 3
    assert_same_batches(held, [want] * 3)


SCRIPT = """
import gc, os, sys
import torch
from torch.utils.data import DataLoader, RandomSampler
import episodelake as el

def mine():
    with open("/proc/self/maps") as fh:
        maps = sum("episodelake-batch" in line for line in fh)
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds += "episodelake-batch" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return maps, fds

def main():
    segs = el.Dataset.open(sys.argv[1], read_only=True).segments(8)
    for context in ("fork", "spawn"):
        draws = RandomSampler(segs, replacement=True, num_samples=16 * 20)
        loader = DataLoader(segs, batch_size=16, sampler=draws, num_workers=2, collate_fn=segs.collate,
                            multiprocessing_context=context)
        if context == "fork":
            for n, batch in enumerate(loader):  # stopped early: batches in flight are never read
                if n == 3:
                    break
            del batch
        held = list(loader)  # a whole pass, every batch held after the workers exited
        assert all(b.obs.camera.shape[0] == 16 for b in held)
        del held, loader
    gc.collect()
    print("left", *mine())
    draws = RandomSampler(segs, replacement=True, num_samples=16 * 20)
    it = iter(DataLoader(segs, batch_size=16, sampler=draws, num_workers=2, collate_fn=segs.collate))
    print("workers", *(w.pid for w in it._workers), flush=True)
    return it, next(it)  # exits with this loader open and its workers busy

if __name__ == "__main__":
    kept = main()
"""


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_a_script_with_loaders_exits_cleanly_and_leaves_nothing(lake, tmp_path):
    before = shm_entries()
    script = tmp_path / "loaders.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = subprocess.run([sys.executable, str(script), lake], capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "killed by signal" not in out.stderr, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["left"] == "0 0"  # no slot mapped or open in the main process once its batches are gone
    for pid in map(int, lines["workers"].split()):
        assert not os.path.exists(f"/proc/{pid}")
    new = shm_entries() - before
    assert not [n for n in new if n.startswith(("torch_", "psm_", "episodelake-batch"))]
