"""Random segment sampling throughput: episodelake vs its peers, same data, same run.

Workload: batches of 64 random segments of 32 transitions (33 observation
rows); observations ``state`` float32[64] + ``camera`` uint8[3, 64, 64],
``action`` float32[4], ``reward`` float32; 1,000 episodes x 200 steps
(``--quick``: 100 episodes). Every system stores the same generated episodes
on the same disk and returns NumPy/torch arrays of the same shapes:

* episodelake: ``segment_stream`` (prefetch off, and the default background
  prefetch), ``segments()`` batched reads, and the TensorStore read path
  (the memory-mapped fast path disabled) for reference;
* memmap-replay-buffer: its ``dataloader`` over ``ReplayDatasetTimeWindow``
  (33-step windows, default ``num_workers=0``, ``torch.set_num_threads(1)``);
* episodata: ``segment_stream(...).sample()`` (zarr backend);
* Lance (pylance): one row per observation step (fixed-size list / binary
  columns), one random ``take`` of the 64 x 33 rows per batch;
* raw NumPy: one flat ``np.memmap`` per field, fancy-index gather;
* **the copy limit**: the same fancy-index gather from arrays in process
  memory, one thread: what copying the batch's bytes costs, nothing else.
  Every row prints its ratio to it and the bytes/s it copies, so no row can
  exceed the bound unnoticed.

Every rate counts the segments the batches actually hold (each must hold
64): memmap-replay-buffer's window dataset has one window per episode, so
its loader draws episodes with replacement (``shuffle=True`` would end each
pass after one window per episode, with a short last batch).

Every measurement runs in a fresh interpreter (one system's threads, e.g.
zarr's event loop, slow another's torch kernels several-fold when they share a
process on a small machine). Two regimes: data in the page cache (files read
once before timing, then sampling for 3 s or one timed pass, whichever is
longer, and on until the rate has plateaued — two 1 s windows in a row
within 5% of the best so far, at most 60 s — which also fills episodelake's
resident copies: each chunk read from its file once per process), and cold: before each
timed pass every file of the system is dropped from the page cache with
``posix_fadvise(DONTNEED)`` (after unmapping it), and the bytes the process
actually read from storage (``/proc/self/io``) are reported with the rate.

Run: ``.venv/bin/python benchmarks/bench_sampling.py [--quick] [--episodes 20,200,1000] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

B, L = 64, 32
CAM = (3, 64, 64)
STATE = 64
ACT = 4


# ---- data


def episode(seed: int, i: int, steps: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, i])
    n = steps + 1
    return {
        "state": rng.standard_normal((n, STATE), dtype=np.float32),
        "camera": np.frombuffer(rng.bytes(n * int(np.prod(CAM))), np.uint8).reshape(n, *CAM),
        "action": rng.standard_normal((steps, ACT), dtype=np.float32),
        "reward": rng.standard_normal(steps, dtype=np.float32),
    }


def episodes(seed: int, count: int, steps: int) -> Iterator[dict[str, np.ndarray]]:
    for i in range(count):
        yield episode(seed, i, steps)


def lake_dict(e: dict[str, np.ndarray]) -> dict:
    return {
        "initial_observation": {"state": e["state"][0], "camera": e["camera"][0]},
        "observations": {"state": e["state"][1:], "camera": e["camera"][1:]},
        "actions": e["action"],
        "rewards": e["reward"],
        "terminated": True,
        "meta": {},
    }


def memmap_sampler(root: str, batch: int, length: int) -> Callable[[], object]:
    """memmap-replay-buffer's own loader of random windows of ``length`` transitions (``length + 1`` frames)."""
    import torch
    from memmap_replay_buffer import ReplayBuffer, ReplayDatasetTimeWindow

    # its best setting here: with torch's default 2 intra-op threads its batch collation
    # (torch.stack) runs ~10x slower on a busy 2-core machine
    torch.set_num_threads(1)

    buf = ReplayBuffer.from_folder(root, read_only=True)
    windows = ReplayDatasetTimeWindow(buf, window_length=length + 1)
    # its dataset holds one random window per *episode*: ``shuffle=True`` would end each pass after
    # len(episodes) windows (a short last batch, or one batch of 6 windows for 6 episodes), so draw
    # ``batch`` episodes with replacement for every batch, like the other systems' uniform sampling
    draws = torch.utils.data.RandomSampler(windows, replacement=True, num_samples=1 << 40)
    it = iter(buf.dataloader(batch, dataset=windows, sampler=draws))

    def sample() -> object:
        return next(it)

    return sample


# ---- page cache control


def drop_page_cache(root: str) -> None:
    """Evict every file under ``root`` from the page cache (mapped pages must be unmapped first)."""
    os.sync()
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def preload(root: str) -> int:
    """Read every file under ``root`` once so it sits in the page cache; returns the bytes read."""
    buf = bytearray(8 << 20)
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb", buffering=0) as fh:
                while n := fh.readinto(buf):
                    total += n
    return total


def mem_available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def storage_read_bytes() -> int:
    with open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


# ---- systems: each builds its store once, then opens a fresh sampler on demand


class System:
    name = ""
    root = ""

    def build(self, seed: int, count: int, steps: int) -> float:
        raise NotImplementedError

    def open(self) -> Callable[[], object]:
        """A fresh reader (no mapped or cached data) returning one batch per call."""
        raise NotImplementedError


class EpisodeLake(System):
    def __init__(self, root: str, mode: str) -> None:
        self.root, self.mode = root, mode
        self.name = {
            "stream": "episodelake stream",
            "prefetch": "episodelake stream+prefetch",
            "segments": "episodelake segments()",
            "tensorstore": "episodelake TensorStore path",
        }[mode]

    def build(self, seed: int, count: int, steps: int) -> float:
        import episodelake as el

        if os.path.exists(os.path.join(self.root, "episodelake.json")):
            return 0.0
        schema = el.DatasetSchema(
            [
                el.FieldSpec("state", (STATE,), "float32"),
                el.FieldSpec("camera", CAM, "uint8", layout="CHW", storage="tensor"),
                el.FieldSpec("action", (ACT,), "float32", role="action"),
                el.FieldSpec("reward", (), "float32", role="reward"),
            ]
        )
        t = time.perf_counter()
        ds = el.Dataset.create(schema, self.root, overwrite=True)
        ds.append_episodes(lake_dict(e) for e in episodes(seed, count, steps))
        ds.flush()
        return time.perf_counter() - t

    def open(self) -> Callable[[], object]:
        import episodelake as el
        from episodelake.read import batching

        ds = el.Dataset.open(self.root, read_only=True)
        if self.mode == "tensorstore":
            # benchmark-only: disable the memory-mapped chunk path to time the TensorStore one
            probe = batching.ChunkFiles.probe
            batching.ChunkFiles.probe = classmethod(lambda cls, loc, writer, field: None)
            try:
                stream = ds.segment_stream(L, batch_size=B, seed=0, prefetch=0)
                camera = stream._build.reader._tensor["observation/camera"]
                camera.sources(np.arange(len(camera.arrays)), stream._build.reader.lengths + 1)
            finally:
                batching.ChunkFiles.probe = probe
            return stream.sample
        if self.mode == "segments":
            segs = ds.segments(L)
            rng = np.random.default_rng(0)
            return lambda: segs.__getitems__(rng.integers(0, len(segs), B))
        stream = ds.segment_stream(L, batch_size=B, seed=0, prefetch=2 if self.mode == "prefetch" else 0)
        return stream.sample


class MemmapReplayBuffer(System):
    name = "memmap-replay-buffer"

    def __init__(self, root: str) -> None:
        self.root = root

    def build(self, seed: int, count: int, steps: int) -> float:
        from memmap_replay_buffer import ReplayBuffer

        if os.path.exists(os.path.join(self.root, "metadata.pkl")):
            return 0.0
        t = time.perf_counter()
        buf = ReplayBuffer(
            self.root,
            max_episodes=count,
            max_timesteps=steps + 1,
            fields={
                "state": ("float", (STATE,)),
                "camera": ("uint8", CAM),
                "action": ("float", (ACT,)),
                "reward": "float",
            },
            overwrite=True,
            flush_every_store_step=0,
        )
        for e in episodes(seed, count, steps):
            # one time axis for all fields: T + 1 observations, actions/rewards padded by one row
            buf.store_episode(
                state=e["state"],
                camera=e["camera"],
                action=np.concatenate([e["action"], np.zeros((1, ACT), np.float32)]),
                reward=np.append(e["reward"], np.float32(0)),
            )
        buf.flush()
        del buf
        return time.perf_counter() - t

    def open(self) -> Callable[[], object]:
        return memmap_sampler(self.root, B, L)


class Episodata(System):
    name = "episodata"

    def __init__(self, root: str) -> None:
        self.root = root

    def build(self, seed: int, count: int, steps: int) -> float:
        import episodata

        if os.path.exists(os.path.join(self.root, "manifest.json")):
            return 0.0
        t = time.perf_counter()
        eps = ({k: v for k, v in lake_dict(e).items() if k != "meta"} for e in episodes(seed, count, steps))
        episodata.Dataset.from_episodes(eps, path=self.root)
        return time.perf_counter() - t

    def open(self) -> Callable[[], object]:
        import episodata

        return episodata.Dataset.open(self.root).segment_stream(sequence_length=L, batch_size=B, seed=0).sample


class Lance(System):
    name = "lance (take)"

    def __init__(self, root: str) -> None:
        self.root = root

    def build(self, seed: int, count: int, steps: int) -> float:
        import lance
        import pyarrow as pa

        if os.path.exists(self.root):
            return 0.0
        cam_bytes = int(np.prod(CAM))
        schema = pa.schema(
            [
                ("state", pa.list_(pa.float32(), STATE)),
                ("camera", pa.binary(cam_bytes)),
                ("action", pa.list_(pa.float32(), ACT)),
                ("reward", pa.float32()),
            ]
        )

        def batches():
            for e in episodes(seed, count, steps):
                n = steps + 1
                action = np.concatenate([e["action"], np.zeros((1, ACT), np.float32)])
                yield pa.record_batch(
                    [
                        pa.FixedSizeListArray.from_arrays(e["state"].ravel(), STATE),
                        pa.FixedSizeBinaryArray.from_buffers(
                            pa.binary(cam_bytes), n, [None, pa.py_buffer(np.ascontiguousarray(e["camera"]))]
                        ),
                        pa.FixedSizeListArray.from_arrays(action.ravel(), ACT),
                        pa.array(np.append(e["reward"], np.float32(0))),
                    ],
                    schema=schema,
                )

        t = time.perf_counter()
        lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), self.root)
        return time.perf_counter() - t

    def open(self) -> Callable[[], object]:
        import lance

        ds = lance.dataset(self.root)
        n_ep = ds.count_rows() // STEPS_PLUS_ONE[0]
        rng = np.random.default_rng(0)
        steps = STEPS_PLUS_ONE[0] - 1

        def sample():
            e = rng.integers(0, n_ep, B)
            s = rng.integers(0, steps - L + 1, B)
            rows = (e * (steps + 1) + s)[:, None] + np.arange(L + 1)
            tbl = ds.take(rows.ravel())
            cam = np.frombuffer(tbl.column("camera").combine_chunks().buffers()[1], np.uint8)
            state = tbl.column("state").combine_chunks().values.to_numpy()
            action = tbl.column("action").combine_chunks().values.to_numpy()
            return (
                cam[: B * (L + 1) * int(np.prod(CAM))].reshape(B, L + 1, *CAM),
                state.reshape(B, L + 1, STATE),
                action.reshape(B, L + 1, ACT)[:, :L],
                tbl.column("reward").to_numpy().reshape(B, L + 1)[:, :L],
            )

        return sample


STEPS_PLUS_ONE = [201]


FIELDS = {
    "camera": (np.uint8, CAM),
    "state": (np.float32, (STATE,)),
    "action": (np.float32, (ACT,)),
    "reward": (np.float32, ()),
}
SEGMENT_BYTES = (L + 1) * (int(np.prod(CAM)) + 4 * STATE) + L * 4 * (ACT + 1)  # what every system copies per segment


class RawMemmap(System):
    """One flat file per field (observations T + 1 rows, actions and rewards T rows per episode)."""

    name = "raw numpy memmap gather"

    def __init__(self, root: str) -> None:
        self.root = root

    def build(self, seed: int, count: int, steps: int) -> float:
        if os.path.exists(os.path.join(self.root, "reward")):
            return 0.0
        os.makedirs(self.root, exist_ok=True)
        t = time.perf_counter()
        files = {k: open(os.path.join(self.root, k), "wb") for k in FIELDS}  # noqa: SIM115  closed below
        try:
            for e in episodes(seed, count, steps):
                for k, fh in files.items():
                    fh.write(e[k].tobytes())
        finally:
            for fh in files.values():
                fh.close()
        return time.perf_counter() - t

    def arrays(self, in_memory: bool) -> dict[str, np.ndarray]:
        out = {}
        for k, (dtype, shape) in FIELDS.items():
            path = os.path.join(self.root, k)
            flat = np.fromfile(path, dtype) if in_memory else np.memmap(path, dtype, "r")
            out[k] = flat.reshape(-1, *shape)
        return out

    def open(self) -> Callable[[], object]:
        return window_gather(self.arrays(in_memory=False))


def window_gather(arrays: dict[str, np.ndarray]) -> Callable[[], object]:
    """One fancy-index gather per field of ``B`` random windows of ``L`` transitions, single thread."""
    steps = STEPS_PLUS_ONE[0] - 1
    n_ep = len(arrays["reward"]) // steps
    rng = np.random.default_rng(0)
    obs_rows, step_rows = np.arange(L + 1), np.arange(L)

    def sample():
        e = rng.integers(0, n_ep, B)
        s = rng.integers(0, steps - L + 1, B)
        rows = (e * (steps + 1) + s)[:, None] + obs_rows
        srows = (e * steps + s)[:, None] + step_rows
        return arrays["camera"][rows], arrays["state"][rows], arrays["action"][srows], arrays["reward"][srows]

    return sample


class CopyLimit(RawMemmap):
    """The copy limit: the same windows gathered from arrays in process memory (NumPy fancy indexing, one thread).

    The bound for a sampler that copies every byte it returns once: no file, no
    page table of a file mapping, no bookkeeping; only the copy.
    """

    name = "copy limit (in-memory NumPy gather, 1 thread)"

    def open(self) -> Callable[[], object]:
        return window_gather(self.arrays(in_memory=True))


# ---- timing


def segments_in(batch: object) -> int:
    """How many segments a system's batch holds (its first array's leading dimension)."""
    if hasattr(batch, "mask"):  # an episodelake or episodata batch: mask [B, L]
        batch = batch.mask
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    if isinstance(batch, tuple | list):
        batch = batch[0]
    return int(batch.shape[0]) if hasattr(batch, "shape") else len(batch)  # type: ignore[arg-type]


def rate(sample: Callable[[], object], seconds: float, min_batches: int, batch: int = B) -> float:
    """Segments/s of ``sample``, counting the segments each batch holds (all of them must hold ``batch``)."""
    n = 0
    t0 = time.perf_counter()
    while n < min_batches or time.perf_counter() - t0 < seconds:
        got = segments_in(sample())
        if got != batch:
            raise AssertionError(f"a batch holds {got} segments, not {batch}")
        n += 1
    return n * batch / (time.perf_counter() - t0)


def check_episodelake(root: str, seed: int, steps: int) -> None:
    """Every sampled segment equals the generated data (so the systems serve the same bytes)."""
    import episodelake as el

    batch = el.Dataset.open(root, read_only=True).segment_stream(L, batch_size=B, seed=1).sample()
    ds = el.Dataset.open(root, read_only=True)
    order = {ds.episode(i).episode_id: i for i in range(len(ds))}
    for b in range(B):
        e = episode(seed, order[int(batch.episode_id[b])], steps)
        s = int(batch.start[b])
        assert np.array_equal(batch.all_obs.camera[b], e["camera"][s : s + L + 1])
        assert np.array_equal(batch.obs.state[b], e["state"][s : s + L])
        assert np.array_equal(batch.action[b], e["action"][s : s + L])


def make_systems(root: str) -> list[System]:
    lake_root = os.path.join(root, "episodelake")
    return [
        EpisodeLake(lake_root, "stream"),
        EpisodeLake(lake_root, "prefetch"),
        EpisodeLake(lake_root, "segments"),
        EpisodeLake(lake_root, "tensorstore"),
        MemmapReplayBuffer(os.path.join(root, "mrb")),
        Episodata(os.path.join(root, "episodata")),
        Lance(os.path.join(root, "lance")),
        RawMemmap(os.path.join(root, "raw")),
        CopyLimit(os.path.join(root, "raw")),
    ]


def measure(system: System, phase: str, seconds: float, cold_batches: int, limit: System) -> dict[str, float]:
    """One measurement in this (fresh) process: warm (page cache) or cold (files evicted first).

    Warm, the copy limit is timed in the same process, in windows alternating
    with the system's, so ``vs_limit`` holds however the machine's load moves.
    """
    sample = system.open()
    if phase == "warm":
        preload(system.root)
        warm_up(sample, max(seconds, WARM_UP_S))  # fault in mappings, fill episodelake's resident copies
        if getattr(system, "mode", "") == "prefetch":  # its thread refills the queue while the bound is timed
            return {"rate": rate(sample, seconds, 5)}
        bound = limit.open()
        for _ in range(3):
            bound()
        mine, theirs = [], []
        for _ in range(WINDOWS):
            mine.append(rate(sample, seconds / WINDOWS, 2))
            theirs.append(rate(bound, seconds / WINDOWS, 2))
        return {"rate": statistics.median(mine), "vs_limit": statistics.median(np.divide(mine, theirs))}
    drop_page_cache(system.root)
    before = storage_read_bytes()
    r = rate(sample, 0.0, cold_batches)
    return {"rate": r, "mb": (storage_read_bytes() - before) / 1e6}


WINDOWS = 6  # alternating timing windows of a system and the copy limit per warm measurement
WARM_UP_S = 3.0  # least sampling before a warm measurement
WARM_UP_WINDOW_S = 1.0
WARM_UP_CAP_S = 60.0  # a 1,000-episode resident copy (2.5 GB) fills in ~11 s on this machine


def warm_up(sample: Callable[[], object], least: float) -> None:
    """Sample for at least ``least`` seconds, then until the rate has plateaued (capped at WARM_UP_CAP_S).

    The rate has settled once every mapping is faulted in and every resident
    copy is filled: two 1 s windows in a row within 5% of the best window so
    far. Not merely "no faster": while a large copy fills, the first windows
    run slower than the ones before them (each batch then reads new rows).
    """
    t0 = time.perf_counter()
    best, flat = 0.0, 0
    while True:
        now = rate(sample, WARM_UP_WINDOW_S, 2)
        if now > 1.05 * best:
            best, flat = now, 0
        elif now >= 0.95 * best:
            best, flat = max(best, now), flat + 1
        else:
            flat = 0
        spent = time.perf_counter() - t0
        if spent >= WARM_UP_CAP_S or (spent >= least and flat >= 2):
            return


def run_isolated(args: argparse.Namespace, name: str, phase: str, seconds: float, cold_batches: int) -> dict:
    """Measure in a fresh interpreter, so no system's threads or allocator state disturb another's."""
    cmd = [sys.executable, __file__, "--dir", args.dir, "--steps", str(args.steps), "--worker", name, phase]
    cmd += ["--seconds", str(seconds), "--cold-batches", str(cold_batches)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{name} {phase} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 episodes, shorter timings")
    ap.add_argument("--episodes", default=None, help="episodes, or a comma-separated list of sizes (20,200,1000)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--dir", default=None, help="data directory on the disk to test (default: a temp dir, removed)")
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per system per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cold-batches", type=int, default=None)
    ap.add_argument("--skip", default="", help="comma-separated name parts of systems to skip (episodata,lance,...)")
    ap.add_argument("--worker", nargs=2, metavar=("SYSTEM", "PHASE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    counts = [int(c) for c in (args.episodes or ("100" if args.quick else "1000")).split(",")]
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    cold_batches = args.cold_batches or (8 if args.quick else 24)
    STEPS_PLUS_ONE[0] = args.steps + 1
    if args.worker:
        every = {s.name: s for s in make_systems(args.dir)}
        print(json.dumps(measure(every[args.worker[0]], args.worker[1], seconds, cold_batches, every[LIMIT])))
        return
    cleanup = args.dir is None
    top = args.dir or tempfile.mkdtemp(prefix="bench_sampling_", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    try:
        for count in counts:
            args.dir = top if len(counts) == 1 else os.path.join(top, f"{count}-episodes")
            run_size(args, count, seconds, cold_batches)
    finally:
        if cleanup:
            shutil.rmtree(top, ignore_errors=True)


def run_size(args: argparse.Namespace, count: int, seconds: float, cold_batches: int) -> None:
    """Build every system's store of ``count`` episodes under ``args.dir`` and print the table of rates."""
    seed = 0
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    systems = [s for s in make_systems(args.dir) if not any(k in s.name for k in skip)]
    gb = count * (args.steps + 1) * (np.prod(CAM) + 4 * STATE) / 1e9
    print(f"\ndata: {count} episodes x {args.steps} steps, {gb:.2f} GB of observations per copy, under {args.dir}")
    print(f"batch: {B} segments x {L} transitions; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
    every = {s.name: s for s in make_systems(args.dir)}
    for s in dict.fromkeys([*systems, every[LIMIT]]):  # the copy limit is timed beside every system
        took = s.build(seed, count, args.steps)
        if took:
            print(f"  wrote {s.name:<24} {took:7.1f} s")
    check_episodelake(systems[0].root, seed, args.steps)
    print(f"{mem_available() / 1e9:.1f} GB of memory available; each measurement runs in a fresh process")
    warm: dict[str, list[float]] = {s.name: [] for s in systems}
    vs_limit: dict[str, list[float]] = {s.name: [] for s in systems}
    for rnd in range(args.rounds):
        for s in systems if rnd % 2 == 0 else systems[::-1]:
            got = run_isolated(args, s.name, "warm", seconds, cold_batches)
            warm[s.name].append(got["rate"])
            vs_limit[s.name].append(got.get("vs_limit", float("nan")))
    cold = {s.name: run_isolated(args, s.name, "cold", seconds, cold_batches) for s in systems if s.name != LIMIT}
    ref = "memmap-replay-buffer"
    ref_warm = statistics.median(warm[ref]) if ref in warm else float("nan")
    ref_cold = cold[ref]["rate"] if ref in cold else float("nan")
    print(f"\n{'system':<46}{'in page cache':>16}{'GB/s':>6}{'vs limit':>9}{'vs mrb':>8}", end="")
    print(f"{'cold':>12}{'vs mrb':>8}{'read from disk':>16}")
    for s in systems:
        w = statistics.median(warm[s.name])
        gbs, bound = w * SEGMENT_BYTES / 1e9, statistics.median(vs_limit[s.name])
        if np.isnan(bound):  # timed alone: against the copy limit's own processes
            bound = w / statistics.median(warm[LIMIT])
        print(f"{s.name:<46}{w:>12,.0f} seg/s{gbs:>6.1f}{bound:>8.2f}x{w / ref_warm:>7.2f}x", end="")
        if s.name in cold:
            c, mb = cold[s.name]["rate"], cold[s.name]["mb"]
            print(f"{c:>8,.0f} seg/s{c / ref_cold:>7.2f}x{mb:>12,.0f} MB", end="")
        print()
    print(
        f"(in page cache: median of {args.rounds} rounds of {seconds:.0f}+ s; cold: {cold_batches} batches "
        f"right after evicting the system's files from the page cache; GB/s: {SEGMENT_BYTES:,} bytes copied per "
        f"segment; vs limit: against the copy limit timed in the same process, in {WINDOWS} windows alternating "
        "with the system's (with prefetch, whose thread would run during the limit's windows: against the limit's "
        "own rate); no row should exceed it by much)"
    )


LIMIT = CopyLimit.name

if __name__ == "__main__":
    main()
