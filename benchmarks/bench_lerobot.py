"""LeRobot's own loader as the camera benchmark's peer row, beside episodelake on the same frames, same run.

Frames: a real MuJoCo env (Reacher-v5, random actions) rendered at ``--size``
(episodes of ``--episode-length`` frames, ``--frames`` in all). The real
``lerobot`` package (its own virtualenv, tests/lerobot_env.py) writes them as
a LeRobot v3 dataset (``LeRobotDataset.create`` + ``add_frame`` +
``save_episode``, its default AV1 or ``--vcodec h264``, crf 30, GOP 2). Then:

* LeRobot: ``LeRobotDataset(delta_timestamps={camera: L frames})``, batches of
  ``B`` random segments of ``L`` frames, one ``__getitem__`` each (torchcodec
  decodes), in its virtualenv (benchmarks/lerobot_peer.py): segments/s of the
  first batch (cold) and of ``--seconds`` of batches after it (warm);
* episodelake, raw: that dataset imported (``import_dataset("lerobot", ...)``,
  frames decoded once, stored raw), ``segment_stream(L, batch_size=B,
  prefetch=0).sample()``;
* episodelake, each ``--codec`` (e.g. ``jpeg`` or ``video:h264@76``): imported
  with ``camera_options={"codec": ..., "quality": ...}``, same sampling. Those
  frames were decoded from LeRobot's video, so they carry its loss and then
  their own: their PSNR cannot reach LeRobot's;
* episodelake, each ``--codec`` again, encoded from the rendered frames
  LeRobot's writer got (the imported episodes with the rendered frames in
  place of the decoded ones, written by ``Dataset.from_episodes``: the same
  schema, steps and meta), same sampling: the rows to compare with LeRobot's
  bytes and PSNR;
* LeRobot loader on ``to_lerobot``'s export of the imported dataset.

Printed per row: bytes per frame (camera storage only) and as a multiple of
LeRobot's, PSNR against the rendered frames, write/import frames/s,
segments/s, and the warm ratio to LeRobot; then the fastest rendered row that
keeps at least LeRobot's PSNR within 1.5x its bytes.

    python benchmarks/bench_lerobot.py --frames 3000 --size 96 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.lerobot_env import lerobot_python  # noqa: E402

import episodelake as el  # noqa: E402
from episodelake.exporters.lerobot import to_lerobot  # noqa: E402
from episodelake.importers import import_dataset  # noqa: E402

CAMERA = "observation.images.top"
FIELD = "observation/images/top"  # the imported field of CAMERA
BYTES_LIMIT = 1.5  # bytes per frame, as a multiple of LeRobot's, a codec row may store to stand beside it


def render(frames: int, size: int, episode_length: int) -> list[dict[str, np.ndarray]]:
    import gymnasium as gym

    env = gym.make("Reacher-v5", render_mode="rgb_array", width=size, height=size)
    episodes = []
    for e in range(-(-frames // episode_length)):
        n = min(episode_length, frames - e * episode_length)
        env.reset(seed=e)
        env.action_space.seed(e)
        images, states, actions = [], [], []
        for _ in range(n):
            images.append(env.render())
            states.append(env.unwrapped.data.qpos.astype(np.float32))
            actions.append(env.action_space.sample().astype(np.float32))
            env.step(actions[-1])
        episodes.append({"frames": np.stack(images), "state": np.stack(states), "action": np.stack(actions)})
    env.close()
    return episodes


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def lerobot_peer(python: Path, root: Path, args: argparse.Namespace, work: Path) -> tuple[dict, np.ndarray]:
    out = work / f"peer-{root.name}.json"
    cmd = [str(python), str(ROOT / "benchmarks/lerobot_peer.py"), str(root), CAMERA, str(args.B), str(args.L)]
    subprocess.run([*cmd, str(args.seconds), str(out)], check=True, capture_output=True)
    frames = np.load(str(out) + ".frames.npy").transpose(0, 2, 3, 1)
    return json.loads(out.read_text()), frames


def el_row(
    ds: el.Dataset, dst: Path, rendered: np.ndarray, args: argparse.Namespace
) -> tuple[int, float, float, float]:
    """Camera bytes, PSNR against the ``rendered`` frames, cold and warm segments/s of dataset ``ds`` at ``dst``."""
    cold, warm = el_rates(ds, args)
    tensors = sum(tree_bytes(p) for p in dst.glob("tensors/*/observation/images/top"))
    return tensors or tree_bytes(dst / "tensors"), psnr(el_frames(ds), rendered), cold, warm


def el_rates(ds: el.Dataset, args: argparse.Namespace) -> tuple[float, float]:
    """Segments/s of the first batch (cold: a freshly opened dataset) and of the batches after it (warm)."""
    stream = el.Dataset.open(ds.location.url, read_only=True).segment_stream(
        args.L, batch_size=args.B, seed=0, prefetch=0
    )
    start = time.perf_counter()
    stream.sample()
    cold = args.B / (time.perf_counter() - start)
    segments, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        stream.sample()
        segments += args.B
    return cold, segments / (time.perf_counter() - start)


def el_rendered(imported: el.Dataset, frames: list[np.ndarray], options: dict[str, object], dst: Path) -> el.Dataset:
    """``imported``'s episodes with each episode's rendered ``frames`` (by its ``source_episode``) in place of the
    frames decoded from LeRobot's video, written by episodelake's bulk writer with the camera field's ``options``."""
    schema = el.DatasetSchema(
        el.FieldSpec.from_json({**f.to_json(), **options}) if f.key == FIELD else f for f in imported.schema
    )
    episodes = []
    for ref in imported.episodes():
        seg = ref.read()
        observations = {f.name: seg.data[f.key] for f in schema.role_fields("observation")}
        observations[schema[FIELD].name] = frames[ref.meta["source_episode"]][: len(seg.data[FIELD])]
        episodes.append(
            {
                "observations": observations,
                "actions": seg.data["action"],
                "rewards": seg.data["reward"],
                "terminated": ref.terminated,
                "truncated": ref.truncated,
                "meta": ref.meta,
            }
        )
    return el.Dataset.from_episodes(episodes, str(dst), schema)


def el_frames(ds: el.Dataset) -> np.ndarray:
    """Every imported camera frame in episode order (observation rows of each LeRobot frame)."""
    rows = []
    for ep in ds.episodes():
        obs = ep.read().all_obs["images/top"]
        rows.append(obs[: ep.length + (0 if ep.terminated else 1)])
    return np.concatenate(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=3000)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--episode-length", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0, help="warm sampling time per system")
    parser.add_argument("--vcodec", choices=["libsvtav1", "h264"], default="libsvtav1")
    parser.add_argument(
        "--codec",
        action="append",
        default=[],
        help="also import with FieldSpec codec=, optionally @quality (e.g. jpeg, video:h264@76); repeatable",
    )
    parser.add_argument("--chunk-rows", type=int, default=0, help="chunk_rows (video: GOP length) of --codec fields")
    parser.add_argument("-B", type=int, default=32)
    parser.add_argument("-L", type=int, default=16)
    args = parser.parse_args()
    python = lerobot_python()
    work = Path(tempfile.mkdtemp(prefix="bench-lerobot-"))
    try:
        episodes = render(args.frames, args.size, args.episode_length)
        rendered = np.concatenate([ep["frames"] for ep in episodes])
        n = [len(ep["frames"]) for ep in episodes]
        source = work / "frames.npz"
        np.savez(
            source,
            **{"camera/top": rendered},
            state=np.concatenate([ep["state"] for ep in episodes]),
            action=np.concatenate([ep["action"] for ep in episodes]),
            reward=np.zeros(len(rendered), np.float32),
            done=np.zeros(len(rendered), bool),
            episode=np.repeat(np.arange(len(n)), n),
            tasks=np.array(["reach"] * len(rendered)),
            fps=np.array(50),
        )
        lr_root = work / "lerobot"
        start = time.perf_counter()
        subprocess.run(
            [str(python), str(ROOT / "tests/scripts/lerobot_write.py"), str(lr_root), str(source), args.vcodec],
            check=True,
            capture_output=True,
        )
        rows = []
        peer, peer_frames = lerobot_peer(python, lr_root, args, work)
        rows.append(
            (
                "LeRobot (its writer, its loader)",
                tree_bytes(lr_root / "videos"),
                psnr(peer_frames, rendered),
                peer["cold"],
                peer["warm"],
                len(rendered) / (time.perf_counter() - start),
            )
        )
        variants = [("episodelake raw (imported)", {})]
        for codec in args.codec:
            name, *quality = codec.rsplit("@", 1)
            options: dict[str, object] = {"codec": name}
            if quality:
                options["quality"] = int(quality[0])
            if args.chunk_rows:
                options["chunk_rows"] = args.chunk_rows
            variants.append((codec, options))
        imported = None
        for name, options in variants:
            dst = work / f"el-{len(rows)}"
            start = time.perf_counter()
            ds = import_dataset("lerobot", lr_root, str(dst), camera_options=options, progress=False)
            write = len(rendered) / (time.perf_counter() - start)
            rows.append(
                (f"episodelake {name} (imported)" if options else name, *el_row(ds, dst, rendered, args), write)
            )
            imported = imported or ds
        assert imported is not None
        frames = [ep["frames"] for ep in episodes]
        for name, options in variants[1:]:
            dst = work / f"el-{len(rows)}"
            start = time.perf_counter()
            ds = el_rendered(imported, frames, options, dst)
            write = len(rendered) / (time.perf_counter() - start)
            rows.append((f"episodelake {name} (rendered)", *el_row(ds, dst, rendered, args), write))
        export = to_lerobot(imported, work / "export", vcodec=args.vcodec)
        peer, peer_frames = lerobot_peer(python, export, args, work)
        rows.append(
            (
                "LeRobot loader on to_lerobot export",
                tree_bytes(export / "videos"),
                psnr(peer_frames, rendered),
                peer["cold"],
                peer["warm"],
                float("nan"),
            )
        )
        print(f"{len(rendered)} frames {args.size}x{args.size} (Reacher-v5), {args.vcodec}, B={args.B} L={args.L}")
        header = f"{'system':38s} {'bytes/frame':>11s} {'x bytes':>7s} {'PSNR dB':>8s} {'write f/s':>10s}"
        print(header + f" {'cold seg/s':>10s} {'warm seg/s':>10s} {'x LeRobot':>9s}")
        base_bytes, base_psnr, base = rows[0][1], rows[0][2], rows[0][4]
        for name, size, quality, cold, warm, write in rows:
            print(
                f"{name:38s} {size / len(rendered):11.0f} {size / base_bytes:7.2f} {quality:8.1f} {write:10.0f}"
                f" {cold:10.1f} {warm:10.1f} {warm / base:9.2f}"
            )
        fair = [
            r for r in rows if r[0].endswith("(rendered)") and r[2] >= base_psnr and r[1] <= BYTES_LIMIT * base_bytes
        ]
        if fair:
            best = max(fair, key=lambda r: r[4])
            print(
                f"fastest rendered row with >= LeRobot's PSNR ({base_psnr:.1f} dB) at <= {BYTES_LIMIT}x its bytes:"
                f" {best[0]}, {best[4] / base:.2f}x LeRobot's warm rate"
            )
        else:
            print(f"no rendered row keeps >= LeRobot's PSNR ({base_psnr:.1f} dB) at <= {BYTES_LIMIT}x its bytes")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
