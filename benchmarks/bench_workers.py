"""``segments()`` through a PyTorch ``DataLoader`` with worker processes, against memmap-replay-buffer's loader.

Workload (as ``bench_sampling.py``): batches of 64 random segments of 32
transitions (33 observation rows) of ``state`` float32[64] + ``camera``
uint8[3, 64, 64], ``action`` float32[4], ``reward`` float32; 100 episodes x
200 steps by default (``--episodes 400`` is issue 46's size). Both systems
store the same generated episodes on the same disk, and each loader draws
uniformly with replacement:

* episodelake: ``DataLoader(ds.segments(32), batch_size=64,
  sampler=RandomSampler(..., replacement=True), num_workers=N,
  collate_fn=segs.collate)``; the loader hands each worker a whole batch of
  indices (``__getitems__``: one planned read per batch);
* memmap-replay-buffer: its ``dataloader`` over ``ReplayDatasetTimeWindow``
  (33-step windows, episodes drawn with replacement, see
  :func:`bench_sampling.memmap_sampler`) with the same ``num_workers``.

Every (system, workers) measurement runs in a fresh interpreter with
``torch.set_num_threads(1)`` and the data in the page cache: it samples until
the rate has plateaued (:func:`bench_sampling.warm_up`, which also fills
resident copies), then for ``--seconds``. Printed per row: the rate
(segments/s), its ratio to memmap-replay-buffer with the same workers and to
episodelake with none, and the **peak summed PSS** of the process tree (the
loader's process and its workers, each ``/proc/<pid>/smaps_rollup`` sampled
every 50 ms): memory shared between processes (page cache mappings, shared
memory) counts once in the sum. The load average is printed before and after.

Run: ``.venv/bin/python benchmarks/bench_workers.py [--episodes 400] [--workers 0,2,4] [--seconds 3] [--dir DIR]``.
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
import threading
from collections.abc import Callable
from pathlib import Path

from bench_sampling import CAM, STATE, B, EpisodeLake, L, MemmapReplayBuffer, preload, rate, warm_up

SYSTEMS = ("episodelake segments()", "memmap-replay-buffer")


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from ``/proc/<pid>/task/<tid>/children``)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    kids = [int(c) for c in fh.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def pss(pid: int) -> int:
    """Proportional set size of ``pid`` in bytes (0 once it exited)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_pss(pid: int) -> int:
    """Summed PSS of ``pid`` and its descendants."""
    return sum(pss(p) for p in [pid, *children(pid)])


class PeakPss:
    """A thread sampling this process tree's summed PSS every ``period`` seconds; ``peak`` is the largest sum."""

    def __init__(self, period: float = 0.05) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def _run(self, period: float) -> None:
        me = os.getpid()
        while not self._stop.wait(period):
            self.peak = max(self.peak, tree_pss(me))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_pss(os.getpid()))
        return self.peak


def lake_loader(root: str, workers: int) -> Callable[[], object]:
    """episodelake's ``segments()`` through a DataLoader: random batches, drawn with replacement."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    import episodelake as el

    segs = el.Dataset.open(root, read_only=True).segments(L)
    draws = RandomSampler(segs, replacement=True, num_samples=1 << 40)  # type: ignore[arg-type]
    loader = DataLoader(
        segs,  # type: ignore[arg-type]
        batch_size=B,
        sampler=draws,
        num_workers=workers,
        collate_fn=segs.collate,
        generator=torch.Generator().manual_seed(0),
    )
    it = iter(loader)
    return lambda: next(it)


def mrb_loader(root: str, workers: int) -> Callable[[], object]:
    """memmap-replay-buffer's own loader (see :func:`bench_sampling.memmap_sampler`) with ``workers`` workers."""
    import torch
    from memmap_replay_buffer import ReplayBuffer, ReplayDatasetTimeWindow

    buf = ReplayBuffer.from_folder(root, read_only=True)
    windows = ReplayDatasetTimeWindow(buf, window_length=L + 1)
    draws = torch.utils.data.RandomSampler(windows, replacement=True, num_samples=1 << 40)
    it = iter(buf.dataloader(B, dataset=windows, sampler=draws, num_workers=workers))
    return lambda: next(it)


def measure(args: argparse.Namespace, system: str, workers: int) -> dict[str, float]:
    """One measurement in this fresh process: warm up until the rate plateaus, then time ``args.seconds``."""
    import torch

    torch.set_num_threads(1)
    peak = PeakPss()
    lake, mrb = paths(args.dir)
    sample = lake_loader(lake, workers) if system == SYSTEMS[0] else mrb_loader(mrb, workers)
    warm_up(sample, args.warm)
    got = rate(sample, args.seconds, 4)
    return {"rate": got, "pss": peak.stop()}


def paths(top: str) -> tuple[str, str]:
    return os.path.join(top, "episodelake"), os.path.join(top, "mrb")


def run_isolated(args: argparse.Namespace, system: str, workers: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--dir", args.dir, "--seconds", str(args.seconds), "--warm", str(args.warm)]
    out = subprocess.run([*cmd, "--worker", system, str(workers)], capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{system} with {workers} workers failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=100, help="episodes (issue 46: 400)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--workers", default="0,2,4", help="comma-separated num_workers values")
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measurement")
    ap.add_argument("--warm", type=float, default=2.0, help="least warm-up seconds per measurement")
    ap.add_argument("--rounds", type=int, default=1, help="rounds (the median rate is printed)")
    ap.add_argument("--dir", default=None, help="data directory (default: a temp dir, removed)")
    ap.add_argument("--worker", nargs=2, metavar=("SYSTEM", "WORKERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(measure(args, args.worker[0], int(args.worker[1]))))
        return
    cleanup = args.dir is None
    args.dir = args.dir or tempfile.mkdtemp(prefix="bench_workers_", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    try:
        run(args)
    finally:
        if cleanup:
            shutil.rmtree(args.dir, ignore_errors=True)


def run(args: argparse.Namespace) -> None:
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    lake, mrb = paths(args.dir)
    EpisodeLake(lake, "segments").build(0, args.episodes, args.steps)
    MemmapReplayBuffer(mrb).build(0, args.episodes, args.steps)
    gib = args.episodes * (args.steps + 1) * (int(CAM[0] * CAM[1] * CAM[2]) + 4 * STATE) / 2**30
    counts = [int(w) for w in args.workers.split(",")]
    print(f"data: {args.episodes} episodes x {args.steps} steps, {gib:.2f} GiB of observations per copy")
    print(f"batch: {B} segments x {L} transitions; {os.cpu_count()} CPUs; load average {os.getloadavg()}")
    for root in (lake, mrb):
        preload(root)
    rates: dict[tuple[str, int], list[float]] = {}
    peaks: dict[tuple[str, int], list[float]] = {}
    for rnd in range(args.rounds):
        for w in counts:
            for system in SYSTEMS if rnd % 2 == 0 else SYSTEMS[::-1]:
                got = run_isolated(args, system, w)
                rates.setdefault((system, w), []).append(got["rate"])
                peaks.setdefault((system, w), []).append(got["pss"])
    print(f"\n{'system':<26}{'workers':>8}{'segments/s':>12}{'vs mrb':>8}{'vs 0 workers':>14}{'peak PSS':>12}")
    for system in SYSTEMS:
        for w in counts:
            r = statistics.median(rates[system, w])
            mrb_r = statistics.median(rates[SYSTEMS[1], w])
            none = statistics.median(rates[system, counts[0]])
            p = max(peaks[system, w]) / 2**30
            print(f"{system:<26}{w:>8}{r:>12,.0f}{r / mrb_r:>7.2f}x{r / none:>13.2f}x{p:>8.2f} GiB")
    print(f"load average after: {os.getloadavg()}")
    print(
        f"(median of {args.rounds} round(s) of {args.seconds:.0f} s after a warm-up of {args.warm:.0f}+ s until the "
        f"rate plateaus; vs 0 workers: against the same system with num_workers={counts[0]}; peak PSS: the largest "
        "summed PSS of the loader process and its workers, sampled every 50 ms)"
    )


if __name__ == "__main__":
    main()
