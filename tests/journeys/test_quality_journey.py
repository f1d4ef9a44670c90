"""Journey (issue 22): a subprocess records MuJoCo with a camera frozen by hand in some episodes and a ``success``
check, exits without flush(); the reopened dataset holds exactly the expected episodes, quarantine and audit.

The expectation comes from the script's own loop (TRUTH.json: lengths, returns, claimed success, which
cameras it froze), not from the recorder. Bounded by a hang guard only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import episodelake as el

from .pipeline import HANG_S

SCRIPT = Path(__file__).parent / "scripts" / "record_quality.py"


@pytest.mark.slow
def test_record_mujoco_through_quality_gates_exit_without_flush_then_reopen(tmp_path):
    argv = [sys.executable, str(SCRIPT), "ds", "truth.json", "--episodes", "12", "--commit-episodes", "4"]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr
    truth = {t["n"]: t for t in json.loads((tmp_path / "truth.json").read_text())}
    frozen = {n for n, t in truth.items() if t["frozen"]}
    assert frozen == {n for n, t in truth.items() if t["raised"]}  # exactly the frozen cameras were refused
    kept = {n: t for n, t in truth.items() if n not in frozen}
    held = {n for n, t in kept.items() if t["success"] and t["return"] < 15}
    assert frozen and held and set(kept) - held  # every outcome occurs

    ds = el.Dataset.open(str(tmp_path / "ds"))
    assert sorted(int(e.meta["n"]) for e in ds.episodes()) == sorted(set(kept) - held)
    quarantine = ds.quality.quarantine()
    assert sorted(int(e.meta["n"]) for e in quarantine.episodes()) == sorted(held)
    for view in (ds, quarantine):
        for e in view.episodes():
            t = kept[int(e.meta["n"])]
            assert (e.length, bool(e.meta["success"])) == (t["length"], t["success"])
            frames = e.read().all_obs["camera"]
            assert frames.shape == (t["length"] + 1, 32, 32, 3)
            repeats = np.all(frames[1:] == frames[:-1], axis=(1, 2, 3))
            assert not any(repeats[i : i + 3].all() for i in range(len(repeats) - 2))  # no 4 identical rows
    found = quarantine.sql("SELECT n, checks_failed, quarantined FROM episodes ORDER BY n").fetchall()
    assert found == [(n, ["success_pays"], True) for n in sorted(held)]
    assert ds.sql("SELECT count(*) FROM episodes WHERE quarantined").fetchone() == (0,)

    report = ds.quality.check()  # the audit covers the quarantine too: it finds exactly it
    assert sorted(report["success_pays"].episode_ids.tolist()) == sorted(quarantine.episode_ids.tolist())
    assert report.failed == ["success_pays"]
