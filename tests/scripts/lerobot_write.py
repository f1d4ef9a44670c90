"""Write a LeRobot v3 dataset with LeRobot's own LeRobotDataset.create / add_frame / save_episode.

Run in the separate lerobot virtualenv (tests/lerobot_env.py): python lerobot_write.py ROOT IN.npz VCODEC
IN.npz holds per-frame arrays (``camera/<name>`` HWC uint8, ``state``, ``action``, ``reward``, ``done``,
``episode``) and ``tasks`` (one string per frame); ``fps`` as a 0-d array.
"""

import sys

import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

torch.set_num_threads(1)
root, source, vcodec = sys.argv[1], sys.argv[2], sys.argv[3]
z = np.load(source)
cameras = [k for k in z.files if k.startswith("camera/")]
features = {
    f"observation.images.{k.split('/', 1)[1]}": {
        "dtype": "video",
        "shape": z[k].shape[1:],
        "names": ["height", "width", "channels"],
    }
    for k in cameras
}
features["observation.state"] = {"dtype": "float32", "shape": z["state"].shape[1:], "names": None}
features["action"] = {"dtype": "float32", "shape": z["action"].shape[1:], "names": None}
features["next.reward"] = {"dtype": "float32", "shape": (1,), "names": None}
features["next.done"] = {"dtype": "bool", "shape": (1,), "names": None}
ds = LeRobotDataset.create("local/episodelake-test", int(z["fps"]), features, root=root, vcodec=vcodec)
episode = z["episode"]
for i in range(len(episode)):
    frame = {f"observation.images.{k.split('/', 1)[1]}": z[k][i] for k in cameras}
    frame["observation.state"] = z["state"][i]
    frame["action"] = z["action"][i]
    frame["next.reward"] = z["reward"][i : i + 1]
    frame["next.done"] = z["done"][i : i + 1]
    frame["task"] = str(z["tasks"][i])
    ds.add_frame(frame)
    if i + 1 == len(episode) or episode[i + 1] != episode[i]:
        ds.save_episode()
ds.finalize()
