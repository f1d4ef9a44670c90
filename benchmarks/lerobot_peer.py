"""LeRobot's own loader as a peer: run inside the lerobot virtualenv (tests/lerobot_env.py) by bench_lerobot.py.

    python lerobot_peer.py ROOT CAMERA_KEY B L SECONDS OUT.json

Samples batches of ``B`` random segments of ``L`` frames the way a LeRobot
training loop does: ``LeRobotDataset(delta_timestamps={camera: [0, 1/fps, ...]})``
and ``__getitem__`` per segment (torchcodec decodes the ``L`` frames of the
episode's mp4). Reports segments/s of the first batch (cold: fresh decoders)
and of the batches after it (warm), and every frame of a few segments (uint8)
for the PSNR the driver computes.
"""

import json
import sys
import time

import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

torch.set_num_threads(1)
root, key, B, L, seconds, out = (
    sys.argv[1],
    sys.argv[2],
    int(sys.argv[3]),
    int(sys.argv[4]),
    float(sys.argv[5]),
    sys.argv[6],
)
probe = LeRobotDataset("local/bench", root=root)
ds = LeRobotDataset("local/bench", root=root, delta_timestamps={key: [i / probe.fps for i in range(L)]})
rng = np.random.default_rng(0)


def batch() -> list:
    return [ds[int(i)][key] for i in rng.integers(0, len(ds), B)]


start = time.perf_counter()
batch()
cold = B / (time.perf_counter() - start)
segments, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    batch()
    segments += B
warm = segments / (time.perf_counter() - start)
# every frame in order, one item at a time, for the PSNR against the rendered frames
frames = [np.round(probe[i][key].numpy() * 255).astype(np.uint8) for i in range(len(probe))]
np.save(out + ".frames.npy", np.stack(frames))
with open(out, "w") as f:
    json.dump({"cold": cold, "warm": warm, "frames": len(probe)}, f)
