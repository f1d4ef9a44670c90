"""Camera frames: size, quality, write and sampling speed of every codec, with peers, same frames, same run.

Frames: rendered by a real Gymnasium MuJoCo env (``HalfCheetah-v5``,
``render_mode="rgb_array"``, headless EGL; shadows and reflections off so
software rendering keeps up), episodes of ``--steps`` random-action steps,
at 96x96 and 224x224 (``--sizes``). Rendered once and kept as ``.npy`` in
``--dir``.

Per storage (raw, each lossless compression, each image codec/quality, each
video codec/quality/GOP length) and
size: bytes per frame on disk, PSNR against the raw frames (mean and worst
frame), write frames/s (``append_episodes`` + ``flush``, encoding included),
and random segment sampling, B=32 segments of L=16 transitions (17 frames),
``segment_stream(prefetch=0)``, in segments/s: warm (files in the page cache,
after a warm-up) and cold (the dataset reopened after every file was dropped
from the page cache with ``posix_fadvise(POSIX_FADV_DONTNEED)``). Peer:
memmap-replay-buffer storing the raw frames (its ``dataloader`` over
``ReplayDatasetTimeWindow`` of 17 steps, ``torch.set_num_threads(1)``,
episodes drawn with replacement: see :func:`bench_sampling.memmap_sampler`).
Bound: the copy limit, the same random windows gathered by NumPy from the
frames in process memory on one thread; every warm rate is printed with the
frame bytes per second it returns and its ratio to that limit, and every
rate counts the segments its batches actually hold.

Before 0.4.x (issue 25.6) the peer's loader ran ``shuffle=True`` over its
window dataset, which holds one window per *episode*: with ``--quick``'s 6
episodes each "batch" of 32 held 6 windows, so its rate was counted 5.3x
too high (56–77 GB/s of frames, above the machine's memory bandwidth).
Every sampling measurement runs in a fresh interpreter, in ``--rounds``
rounds over all stores (best of the rounds kept per store, so a burst of
other load on a shared machine hits a round, not a store).

Prints a table with ratios to the raw episodelake copy and to
memmap-replay-buffer, writes ``camera_points.json`` to ``--dir`` and the
size-speed plot to ``--plot`` (default ``docs/camera_front.png``). Other
systems' points (e.g. LeRobot's own loader) join the plot through
:func:`plot_front`'s ``extra`` argument or ``--extra points.json`` (a list of
``{"system", "label", "size", "bytes_per_frame", "segments_per_s", "psnr"}``).

Run: ``MUJOCO_GL=egl .venv/bin/python benchmarks/bench_camera.py [--quick] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench_sampling import drop_page_cache, memmap_sampler, rate, segments_in  # benchmarks/ is on sys.path

B, L = 32, 16
STORAGES: dict[str, dict[str, Any]] = {
    "raw": {},
    "zstd": {"compression": "zstd"},
    "blosc-lz4": {"compression": "blosc-lz4"},
    "blosc-lz4-bitshuffle": {"compression": "blosc-lz4-bitshuffle"},
    "blosc-zstd": {"compression": "blosc-zstd"},
    "jpeg-90": {"codec": "jpeg", "quality": 90},
    "jpeg-75": {"codec": "jpeg", "quality": 75},
    "webp-90": {"codec": "webp", "quality": 90},
    "avif-80": {"codec": "avif", "quality": 80},
    "h264-80": {"codec": "video:h264", "quality": 80},  # GOPs of 16 frames (the default)
    "h264-80-gop32": {"codec": "video:h264", "quality": 80, "chunk_rows": 32},
    "av1-70": {"codec": "video:av1", "quality": 70},
    "av1-70-gop32": {"codec": "video:av1", "quality": 70, "chunk_rows": 32},
    "h264-76-gop32": {"codec": "video:h264", "quality": 76, "chunk_rows": 32},
    "av1-66-gop32": {"codec": "video:av1", "quality": 66, "chunk_rows": 32},
}


# ---- frames


def render(size: int, episodes: int, steps: int, out: str) -> None:
    """Render ``episodes`` x (``steps`` + 1) frames of HalfCheetah-v5 at ``size`` and save them to ``out`` (.npy)."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    import gymnasium as gym
    import mujoco

    env = gym.make("HalfCheetah-v5", render_mode="rgb_array", width=size, height=size)
    frames = np.empty((episodes, steps + 1, size, size, 3), np.uint8)
    actions = np.empty((episodes, steps, 6), np.float32)
    for e in range(episodes):
        env.reset(seed=e)
        env.action_space.seed(e)
        if e == 0:
            env.render()
            scene = env.unwrapped.mujoco_renderer._get_viewer("rgb_array").scn
            scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        frames[e, 0] = env.render()
        for t in range(steps):
            actions[e, t] = env.action_space.sample()
            env.step(actions[e, t])
            frames[e, t + 1] = env.render()
    np.save(out, frames)
    np.save(out.replace(".npy", "-actions.npy"), actions)


def load_frames(root: str, size: int, episodes: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    path = os.path.join(root, f"frames-{size}-{episodes}x{steps}.npy")
    if not os.path.exists(path):
        t = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--render", str(size), str(episodes), str(steps), path], check=True)
        print(f"rendered {episodes * (steps + 1)} frames at {size}x{size} in {time.perf_counter() - t:.0f} s")
    return np.load(path, mmap_mode="r"), np.load(path.replace(".npy", "-actions.npy"))


# ---- page cache


def du(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)


# ---- systems


def build_lake(root: str, frames: np.ndarray, actions: np.ndarray, storage: str) -> dict[str, float]:
    import episodelake as el
    from episodelake.core.codecs import psnr
    from episodelake.storage.arrays import tensors_size

    size = frames.shape[2]
    schema = el.DatasetSchema(
        [
            el.FieldSpec("camera", (size, size, 3), "uint8", layout="HWC", storage="tensor", **STORAGES[storage]),
            el.FieldSpec("action", (6,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )
    eps = [
        {"observations": np.asarray(f), "actions": a, "rewards": np.zeros(len(a), np.float32), "terminated": False}
        for f, a in zip(frames, actions, strict=True)
    ]
    t = time.perf_counter()
    ds = el.Dataset.create(schema, root, overwrite=True)
    ds.append_episodes(eps)
    ds.flush()
    seconds = time.perf_counter() - t
    n = frames.shape[0] * frames.shape[1]
    ds = el.Dataset.open(root)
    scores = [
        psnr(e["observations"][t], g[t])
        for i, e in enumerate(eps)
        for g in [ds.episode(i).read().all_obs]
        for t in range(len(g))
    ]
    finite = [s for s in scores if np.isfinite(s)]
    return {
        "bytes_per_frame": tensors_size(ds.location) / n,
        "write_fps": n / seconds,
        "psnr": float(np.mean(finite)) if finite else float("inf"),
        "psnr_min": float(min(finite)) if finite else float("inf"),
    }


def lake_sampler(root: str) -> Callable[[], object]:
    import episodelake as el

    stream = el.Dataset.open(root, read_only=True).segment_stream(L, batch_size=B, seed=0, prefetch=0)
    return stream.sample


def build_memmap(root: str, frames: np.ndarray, actions: np.ndarray) -> dict[str, float]:
    from memmap_replay_buffer import ReplayBuffer

    size = frames.shape[2]
    t = time.perf_counter()
    buf = ReplayBuffer(
        root,
        max_episodes=frames.shape[0],
        max_timesteps=frames.shape[1],
        fields={"camera": ("uint8", (size, size, 3)), "action": ("float", (6,)), "reward": "float"},
        overwrite=True,
        flush_every_store_step=0,
    )
    for f, a in zip(frames, actions, strict=True):
        pad = np.concatenate([a, np.zeros((1, 6), np.float32)])
        buf.store_episode(camera=np.asarray(f), action=pad, reward=np.zeros(len(f), np.float32))
    buf.flush()
    del buf
    n = frames.shape[0] * frames.shape[1]
    return {
        "bytes_per_frame": du(root) / n,
        "write_fps": n / (time.perf_counter() - t),
        "psnr": float("inf"),
        "psnr_min": float("inf"),
    }


def copy_limit_sampler(frames_path: str) -> Callable[[], object]:
    """The copy limit: ``B`` random windows gathered from the frames and actions in process memory, one thread."""
    frames = np.load(frames_path)  # [episodes, steps + 1, H, W, 3], read into memory
    actions = np.load(frames_path.replace(".npy", "-actions.npy"))
    episodes, steps = actions.shape[:2]
    flat_frames, flat_actions = frames.reshape(-1, *frames.shape[2:]), actions.reshape(-1, actions.shape[2])
    rewards = np.zeros(len(flat_actions), np.float32)
    rng = np.random.default_rng(0)

    def sample() -> object:
        e, s = rng.integers(0, episodes, B), rng.integers(0, steps - L + 1, B)
        rows = (e * (steps + 1) + s)[:, None] + np.arange(L + 1)
        step_rows = (e * steps + s)[:, None] + np.arange(L)
        return flat_frames[rows], flat_actions[step_rows], rewards[step_rows]

    return sample


def measure(kind: str, root: str, seconds: float, cold_batches: int) -> dict[str, float]:
    """Warm and cold segments/s of one store (in this fresh interpreter).

    Cold: the first ``cold_batches`` batches after dropping the store's files
    from the page cache and opening it. Warm: the best of five windows of
    ``seconds / 5`` each (the best resists other processes' bursts on a shared machine).
    Every batch must hold ``B`` segments (see :func:`bench_sampling.rate`).
    """
    openers = {"memmap": partial(memmap_sampler, batch=B, length=L), "lake": lake_sampler, "limit": copy_limit_sampler}
    drop_page_cache(root)
    t = time.perf_counter()
    sample = openers[kind](root)
    for _ in range(cold_batches):
        if segments_in(sample()) != B:
            raise AssertionError(f"{kind} {root}: a batch does not hold {B} segments")
    cold = cold_batches * B / (time.perf_counter() - t)
    for _ in range(3):
        sample()
    return {"warm": max(rate(sample, seconds / 5, 1, B) for _ in range(5)), "cold": cold}


def built(where: str, build: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``build()``'s figures, kept next to the store so a rerun on the same ``--dir`` reuses the store."""
    path = where + ".json"
    if os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    out = build()
    with open(path, "w") as fh:
        json.dump(out, fh)
    return out


# ---- report


def plot_front(points: Sequence[dict[str, Any]], out: str, extra: Sequence[dict[str, Any]] = ()) -> None:
    """Save the size-speed plot: bytes/frame (log x) against warm segments/s, one marker per system.

    ``extra``: more points in the same form (``system``, ``label``, ``size``,
    ``bytes_per_frame``, ``segments_per_s``), e.g. LeRobot's own loader.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = [*points, *extra]
    sizes = sorted({p["size"] for p in every})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 5), squeeze=False)
    markers = {"episodelake": "o", "memmap-replay-buffer": "s"}
    for ax, size in zip(axes[0], sizes, strict=True):
        for system in dict.fromkeys(p["system"] for p in every):
            mine = [p for p in every if p["size"] == size and p["system"] == system]
            if not mine:
                continue
            ax.scatter(
                [p["bytes_per_frame"] for p in mine],
                [p["segments_per_s"] for p in mine],
                label=system,
                marker=markers.get(system, "^"),
                s=40,
            )
            for p in mine:
                ax.annotate(
                    p["label"],
                    (p["bytes_per_frame"], p["segments_per_s"]),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        ax.set_xscale("log")
        ax.set_xlabel("bytes per frame on disk (log)")
        ax.set_ylabel(f"random segments/s (B={B}, L={L}, page cache)")
        ax.set_title(f"{size}x{size} rendered frames")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=None, help="work directory (default: a fresh temporary one)")
    p.add_argument("--quick", action="store_true", help="fewer frames and shorter timings")
    p.add_argument("--sizes", default="96,224")
    p.add_argument("--storages", default=",".join(STORAGES))
    p.add_argument("--plot", default=str(Path(__file__).resolve().parents[1] / "docs" / "camera_front.png"))
    p.add_argument("--extra", default=None, help="JSON file of more points for the plot (see plot_front)")
    p.add_argument("--rounds", type=int, default=3, help="measurement rounds over every store (best kept)")
    p.add_argument("--render", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--measure", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.render:
        size, episodes, steps, out = args.render
        render(int(size), int(episodes), int(steps), out)
        return
    if args.measure:
        kind, root, seconds, cold = args.measure
        print(json.dumps(measure(kind, root, float(seconds), int(cold))))
        return
    root = args.dir or tempfile.mkdtemp(prefix="bench-camera-")
    os.makedirs(root, exist_ok=True)
    episodes, steps = (6, 100) if args.quick else (30, 100)
    seconds, cold = (1.5, 4) if args.quick else (2.5, 10)
    points: list[dict[str, Any]] = []
    for size in [int(s) for s in args.sizes.split(",")]:
        frames, actions = load_frames(root, size, episodes, steps)
        stores = [("memmap", "memmap-replay-buffer", "raw")] + [
            ("lake", "episodelake", s) for s in args.storages.split(",")
        ]
        frames_path = os.path.join(root, f"frames-{size}-{episodes}x{steps}.npy")
        limit = {"bytes_per_frame": float(np.prod(frames.shape[2:])), "write_fps": float("nan")}
        mine = [
            {
                "system": LIMIT,
                "label": "in memory",
                "size": size,
                **limit,
                "psnr": float("inf"),
                "psnr_min": float("inf"),
                "kind": "limit",
                "where": frames_path,
            }
        ]
        for kind, system, storage in stores:
            where = os.path.join(root, f"{kind}-{storage}-{size}")
            if kind == "memmap":
                figures = built(where, partial(build_memmap, where, frames, actions))
            else:
                figures = built(where, partial(build_lake, where, frames, actions, storage))
            mine.append({"system": system, "label": storage, "size": size, **figures, "kind": kind, "where": where})
        for _ in range(args.rounds):  # rounds over every store: a burst of other load hits one round, not one store
            for p in mine:
                out = subprocess.run(
                    [sys.executable, __file__, "--measure", p["kind"], p["where"], str(seconds), str(cold)],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                speed = json.loads(out.stdout.strip().splitlines()[-1])
                p["segments_per_s"] = max(p.get("segments_per_s", 0.0), speed["warm"])
                p["cold_segments_per_s"] = max(p.get("cold_segments_per_s", 0.0), speed["cold"])
        for p in mine:
            del p["kind"], p["where"]
            print(f"  {p}", file=sys.stderr)
        points += mine
    with open(os.path.join(root, "camera_points.json"), "w") as fh:
        json.dump(points, fh, indent=1)
    report(points)
    extra = []
    if args.extra:
        with open(args.extra) as fh:
            extra = json.load(fh)
    plot_front(points, args.plot, extra)
    print(f"\nplot: {args.plot}; points: {os.path.join(root, 'camera_points.json')}")


LIMIT = "copy limit"  # B random windows gathered by NumPy from the frames in process memory, one thread


def report(points: Sequence[dict[str, Any]]) -> None:
    print(
        f"\nrandom segments B={B} L={L} ({L + 1} frames each); ratios: x raw episodelake copy / x memmap-replay-buffer"
        " / x the copy limit (NumPy gather of the same windows from memory, one thread, same run); GB/s: the frame"
        " bytes a warm rate returns"
    )
    head = (
        f"{'size':>4} {'system':<21} {'storage':<21} {'B/frame':>9} {'smaller':>8} {'PSNR':>6} {'min':>6} "
        f"{'write f/s':>9} {'warm seg/s':>10} {'GB/s':>5} {'x limit':>7} {'x raw':>6} {'x mmrb':>6} "
        f"{'cold seg/s':>10} {'x mmrb':>6}"
    )
    print(head)
    for size in dict.fromkeys(p["size"] for p in points):
        mine = [p for p in points if p["size"] == size]
        raw = next(p for p in mine if p["system"] == "episodelake" and p["label"] == "raw")
        mm = next(p for p in mine if p["system"] == "memmap-replay-buffer")
        limit = next(p for p in mine if p["system"] == LIMIT)
        for p in mine:
            smaller = raw["bytes_per_frame"] / p["bytes_per_frame"]
            warm, cold = p["segments_per_s"], p["cold_segments_per_s"]
            gbs = warm * (L + 1) * size * size * 3 / 1e9
            cold_cells = f"{cold:>10.0f} {cold / mm['cold_segments_per_s']:>6.2f}" if p is not limit else ""
            print(
                f"{size:>4} {p['system']:<21} {p['label']:<21} {p['bytes_per_frame']:>9.0f} {smaller:>7.1f}x "
                f"{p['psnr']:>6.1f} {p['psnr_min']:>6.1f} {p['write_fps']:>9.0f} {warm:>10.0f} {gbs:>5.1f} "
                f"{warm / limit['segments_per_s']:>7.2f} {warm / raw['segments_per_s']:>6.2f} "
                f"{warm / mm['segments_per_s']:>6.2f} {cold_cells}"
            )


if __name__ == "__main__":
    main()
