"""Exact resume with loader workers, across processes (issue 42, items 3 and 4).

``tests/scripts/trainer_resume.py`` runs each loader of its ``CASES`` uninterrupted for ``K + N`` batches,
then again for ``K`` batches, saves the loader's state and exits; a new process builds the loader again,
loads the state and takes ``N`` batches. Those equal batches ``K .. K+N-1`` of the uninterrupted run,
buffer for buffer. Cases: ``segments()`` under ``torchdata.StatefulDataLoader`` (the loader's shuffle),
``segment_stream`` through :class:`~episodelake.integrations.stateful.StreamDataset` (with replacement,
a finite pass, ``el.Weighted``, DDP rank 1 of 2, an ``el.concat`` mix), each with ``num_workers=2``,
and :class:`~episodelake.integrations.grain.GrainSource` under ``grain.DataLoader`` with 2 workers. Every
item is also checked against the raw episodes (:mod:`tests.reference`), not only against episodelake.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torchdata")
pytest.importorskip("grain")

from .conftest import build_robot_dataset
from .reference import expected_all_obs, expected_segment
from .scripts import trainer_resume as script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "trainer_resume.py"
K, N = 3, 5
# the default suite runs these (about 20 s of CPU); the others run with the slow tests
FAST = ["segments", "stream", "mixed", "grain"]
SLOW = [case for case in script.CASES if case not in FAST]


def run(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


def batches(path: Path) -> list[dict[str, np.ndarray]]:
    out: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path) as f:
        for name in f.files:
            i, key = name.split("/", 1)
            out.setdefault(int(i), {})[key] = f[name]
    return [out[i] for i in sorted(out)]


def check_against_raw(batch: dict[str, np.ndarray], raws: dict[int, object]) -> None:
    """Each item equals the raw episode's transitions at its start (independent reference)."""
    for j, (eid, start) in enumerate(zip(batch["episode_id"].tolist(), batch["start"].tolist(), strict=True)):
        ep = raws[eid]
        L = batch["mask"].shape[1]
        want = expected_segment(ep, start, L)
        obs = expected_all_obs(ep, start, L)
        np.testing.assert_array_equal(
            batch["observation/state"][j][: int(want["mask"].sum()) + 1], obs["state"][: int(want["mask"].sum()) + 1]
        )
        np.testing.assert_array_equal(batch["action"][j], want["action/action"])
        np.testing.assert_array_equal(batch["reward"][j], want["reward"])
        np.testing.assert_array_equal(batch["terminated"][j], want["terminated"])
        np.testing.assert_array_equal(batch["truncated"][j], want["truncated"])
        np.testing.assert_array_equal(batch["mask"][j], want["mask"])


@pytest.fixture(scope="module", params=["fast", pytest.param("slow", marks=pytest.mark.slow)])
def resumed(request, tmp_path_factory):
    import episodelake as el

    cases = FAST if request.param == "fast" else SLOW
    root = tmp_path_factory.mktemp("trainer_resume")
    raws = {}
    for name, seed, episodes in (("a", 0, 24), ("b", 1, 10)):
        eps = build_robot_dataset(str(root / name), seed, episodes, 8, max_length=30)
        ids = sorted(ep.episode_id for ep in el.Dataset.open(str(root / name)).episodes())
        raws.update(zip(ids, eps, strict=True))  # one writer: ids grow in append order
    run("stop", str(root), str(K), str(N), ",".join(cases))
    run("resume", str(root), str(N), ",".join(cases))
    return root, raws, cases


def test_resume_in_a_new_process_yields_the_uninterrupted_batches(resumed):
    root, raws, cases = resumed
    for case in cases:
        check_case(root, raws, case)


def check_case(root: Path, raws: dict, case: str) -> None:
    full = batches(root / f"{case}.full.npz")
    again = batches(root / f"{case}.resumed.npz")
    assert len(full) == K + N and len(again) == N
    for want, got in zip(full[K:], again, strict=True):
        assert sorted(want) == sorted(got)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{case}: {key}")
    for batch in full:
        check_against_raw(batch, raws)
    # not a trivial sequence: the resumed batches are not the loader's first ones again
    assert any(
        not np.array_equal(a["start"], b["start"]) or not np.array_equal(a["episode_id"], b["episode_id"])
        for a, b in zip(full[:N], again, strict=False)
    )


def test_mixed_case_draws_both_sources(resumed):
    root, _, cases = resumed
    if "mixed" not in cases:
        pytest.skip("the mixed case runs with the fast cases")
    mixed = np.concatenate([b["source"] for b in batches(root / "mixed.full.npz")])
    assert set(mixed.tolist()) == {0, 1}
