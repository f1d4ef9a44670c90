"""Read a LeRobot dataset with LeRobot's own LeRobotDataset; save every frame's values to an .npz.

Run in the separate lerobot virtualenv (tests/lerobot_env.py): python lerobot_read.py ROOT OUT.npz
Camera frames come back as LeRobot returns them (float32 CHW in [0, 1]) and are saved as uint8 CHW.
"""

import json
import sys

import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

torch.set_num_threads(1)
root, out = sys.argv[1], sys.argv[2]
ds = LeRobotDataset("local/episodelake-test", root=root)
columns: dict[str, list] = {}
tasks = []
for i in range(len(ds)):
    item = ds[i]
    for key, value in item.items():
        if key == "task":
            tasks.append(value)
        elif key in ds.meta.video_keys:
            columns.setdefault(key, []).append(np.round(value.numpy() * 255).astype(np.uint8))
        elif isinstance(value, torch.Tensor):
            columns.setdefault(key, []).append(value.numpy())
arrays = {key: np.stack(values) for key, values in columns.items()}
meta = {"tasks": tasks, "video_keys": list(ds.meta.video_keys), "fps": ds.fps, "num_episodes": ds.num_episodes}
np.savez(out, __meta__=np.array(json.dumps(meta)), **arrays)
