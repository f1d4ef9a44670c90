"""SIGKILL trials per edit: a process killed in the middle of a trim, split or set_meta leaves old or new, never a mix.

Each trial copies a partitioned on-disk dataset, starts a real process that
opens it, prints ``ready`` and runs one edit, and SIGKILLs it at a random
moment of that edit (the delay drawn over the duration of an unkilled run).
Afterwards the reopened dataset must be exactly the old version (every
episode equal to the raw NumPy episodes) or exactly the edited one (equal to
the NumPy slices of :func:`tests.test_edit.cut`), and ``validate()`` green.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import episodelake as el

from .test_edit import assert_dataset, build, cut, raw_set

ROOT = Path(__file__).resolve().parents[1]

WORKER = """
import sys, episodelake as el
ds = el.Dataset.open(sys.argv[1])
ids = ds.episode_ids.tolist()
ds.snapshot()
print("ready", flush=True)
verb = sys.argv[2]
if verb == "trim":
    ds.edit.trim({ids[0]: (1, 3), ids[2]: (0, 2), ids[4]: (2, ds.episode(4).length)})
elif verb == "split":
    ds.edit.split(ids[1], 2)
else:
    ds.edit.set_meta({"task": "relabeled", "success": True}, where="task = 'pick'")
print("done", flush=True)
"""


def edited(verb: str, ids: list[int], raws: list, new_ids: list[int]) -> dict[int, object]:
    """The reference of each episode after the worker's edit ``verb`` (by id)."""
    want = dict(zip(ids, raws, strict=True))
    if verb == "trim":
        want[ids[0]], want[ids[2]] = cut(raws[0], 1, 3), cut(raws[2], 0, 2)
        want[ids[4]] = cut(raws[4], 2, raws[4].length)
    elif verb == "split":
        del want[ids[1]]
        want[new_ids[0]], want[new_ids[1]] = cut(raws[1], 0, 2), cut(raws[1], 2, raws[1].length)
    else:
        for i, r in zip(ids, raws, strict=True):
            if r.meta["task"] == "pick":
                want[i] = type(r)(
                    r.obs, r.action, r.reward, r.terminated, r.truncated, {"task": "relabeled", "success": True}
                )
    return want


def run_worker(path: str, verb: str, kill_after: float | None) -> tuple[int, float]:
    """Run the editing process; SIGKILL it ``kill_after`` s after ``ready`` (None: let it finish). (status, s)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", WORKER, path, verb], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    start = time.monotonic()
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)  # the random moment of the kill, not a wait for anything
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    status = proc.wait(timeout=120)
    proc.stdout.close()
    return status, time.monotonic() - start


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["trim", "split", "set_meta"])
def test_sigkill_during_an_edit_leaves_old_or_new(tmp_path, verb):
    raws = raw_set(21, 6, max_length=12, min_length=4)
    for i, r in enumerate(raws):
        r.meta = {"task": "pick" if i % 2 else "place", "success": False}
    template = str(tmp_path / "template")
    ds = build(raws[:3], template, partition_by=["task"])
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws[3:])
    ds.flush()
    ids = ds.episode_ids.tolist()
    version = ds.version
    ds.close()
    probe = str(tmp_path / "probe")
    shutil.copytree(template, probe)
    status, took = run_worker(probe, verb, None)
    assert status == 0
    rng = np.random.default_rng(hash(verb) % 2**32)
    outcomes = {"old": 0, "new": 0}
    for trial in range(12):
        path = str(tmp_path / f"trial{trial}")
        shutil.copytree(template, path)
        run_worker(path, verb, float(rng.uniform(0, took * 1.2)))
        after = el.Dataset.open(path)
        assert after.version in (version, version + 1)
        if after.version == version:
            want = dict(zip(ids, raws, strict=True))
            outcomes["old"] += 1
        else:
            new_ids = [i for i in after.episode_ids.tolist() if i not in ids]
            want = edited(verb, ids, raws, new_ids)
            outcomes["new"] += 1
        assert_dataset(after, [want[i] for i in after.episode_ids.tolist()])  # validate() green included
    print(verb, outcomes)  # how the kills fell (timing decides; both kinds are checked the same way)
    assert sum(outcomes.values()) == 12
