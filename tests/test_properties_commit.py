"""A table version never exists before its tensors are durable; a forked child commits only its own episodes.

docs/architecture.md and ``CommitSink.commit``: "The table commit happens only
after every write completed." Checked at the seam where the table commit is
issued (``Store.append``, wrapped by the test, the real commit underneath): at
that moment a fresh TensorStore handle, sharing no cache with the writer,
must read every tensor row the new table rows reference, equal to what was
written. On S3 every request goes through a proxy holding it back 0.3 s, so a
write still in flight there cannot have landed yet.

README "Commit at exit" and ``commit.py``: a forked child never commits its
parent's episodes. Checked in a real process that forks: the child exits
normally (through the interpreter's exit hooks) with status 0, and the
dataset on disk holds the parent's episodes exactly once and the child's own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts

import episodelake as el
from episodelake.storage.arrays import array_parts, split_ref
from episodelake.storage.location import resolve
from episodelake.storage.store import Store
from episodelake.storage.tensors import TensorArray

from .latency_proxy import LatencyProxy
from .workers.common import assert_all_match, crash_schema, episode

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = el.DatasetSchema(
    [
        el.FieldSpec("state", (3,), "float32"),
        el.FieldSpec("camera", (3, 32, 32), "uint8", layout="CHW", storage="tensor"),
        el.FieldSpec("action", (), "int64", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
        el.FieldSpec("k", (), "int64", role="meta"),
    ]
)


def camera_rows(k: int, length: int) -> np.ndarray:
    return np.random.default_rng(k).integers(0, 256, (length + 1, 3, 32, 32), dtype=np.uint8)


def episode_dict(k: int) -> dict:
    length = 5 + 7 * k % 11
    rng = np.random.default_rng(100 + k)
    return {
        "observations": {
            "state": rng.standard_normal((length + 1, 3)).astype(np.float32),
            "camera": camera_rows(k, length),
        },
        "actions": rng.integers(0, 4, length),
        "rewards": rng.standard_normal(length).astype(np.float32),
        "terminated": True,
        "meta": {"k": k},
    }


def record_tensors_at_table_commit(monkeypatch, url: str, options: dict | None) -> list[int]:
    """Wrap ``Store.append``: before the table commit, read the referenced camera rows through a fresh handle."""
    checked: list[int] = []
    field = SCHEMA["observation/camera"]
    loc = resolve(url, options)
    real_append = Store.append

    def append(self: Store, rows, *args, **kwargs):
        cols = rows.to_pydict()
        for writer, ref, length, k in zip(
            cols["writer"], cols["ref/observation/camera"], cols["length"], cols["k"], strict=True
        ):
            commit, first = split_ref(int(ref))
            spec = {"driver": "zarr3", "kvstore": loc.kvstore(*array_parts(writer, field, commit))}
            arr = ts.open(spec, open=True, context=ts.Context()).result()  # no cache shared with the writer
            on_storage = arr[first : first + length + 1].read().result()
            np.testing.assert_array_equal(on_storage, camera_rows(k, length), f"episode k={k} not durable yet")
            checked.append(k)
        return real_append(self, rows, *args, **kwargs)

    monkeypatch.setattr(Store, "append", append)
    return checked


def write_and_check(ds: el.Dataset, checked: list[int]) -> None:
    ds.append_episodes(episode_dict(k) for k in range(3))  # the bulk path
    for k in range(3, 5):  # the step path, committed by flush()
        d = episode_dict(k)
        obs = d["observations"]
        w = ds.new_episode({"state": obs["state"][0], "camera": obs["camera"][0]}, k=k)
        for t in range(len(d["actions"])):
            last = t == len(d["actions"]) - 1
            step = {"obs": {"state": obs["state"][t + 1], "camera": obs["camera"][t + 1]}}
            w.add_step({**step, "action": d["actions"][t], "reward": d["rewards"][t], "terminated": last})
    ds.flush()
    assert sorted(checked) == list(range(5))


class _WrittenWhenAwaited:
    """A tensor write that happens only when its caller awaits it: a commit that skips the wait sees no rows."""

    def __init__(self, write):
        self._write, self._done = write, None

    def result(self):
        if self._done is None:
            self._done = self._write().result()
        return self._done


def test_no_table_version_before_its_tensors_are_durable_local(tmp_path, monkeypatch):
    url = str(tmp_path / "ds")
    ds = el.Dataset.create(SCHEMA, url)
    real_write = TensorArray.write
    # local writes finish fast, so a missing wait would pass by luck: defer each write to its await instead
    monkeypatch.setattr(
        TensorArray, "write", lambda self, start, values: _WrittenWhenAwaited(lambda: real_write(self, start, values))
    )
    write_and_check(ds, record_tensors_at_table_commit(monkeypatch, url, None))


@pytest.mark.slow
def test_no_table_version_before_its_tensors_are_durable_on_s3(s3_server, s3_url, monkeypatch):
    with LatencyProxy(s3_server.endpoint, delay_s=0.3) as proxy:
        ds = el.Dataset.create(SCHEMA, s3_url, storage_options=proxy.storage_options(s3_server.storage_options))
        # the check reads the server directly, around the proxy: what is stored, not what is on its way
        write_and_check(ds, record_tensors_at_table_commit(monkeypatch, s3_url, s3_server.storage_options))


FORK = """
import os, sys
sys.path.insert(0, sys.argv[2])
import episodelake as el
from tests.workers.common import crash_schema, episode, write_stepwise

ds = el.Dataset.create(crash_schema(), sys.argv[1])
for i in range(3):
    write_stepwise(ds, episode(5, i))  # finished, pending: 64 episodes would commit
pid = os.fork()
if pid == 0:
    if sys.argv[3] == "writes":
        write_stepwise(ds, episode(6, 0))  # the child's own episode, under its own writer
    sys.exit(0)  # a normal exit: the interpreter's exit hooks run in the child
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), "table", len(el.Dataset.open(sys.argv[1])), flush=True)
# the parent exits normally too: its exit commits its 3 episodes
"""


def run_fork(path: str, child: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", FORK, path, str(ROOT), child], capture_output=True, text=True, timeout=600
    )


def test_a_forked_child_never_commits_its_parents_episodes(tmp_path):
    path = str(tmp_path / "ds")
    proc = run_fork(path, "quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["child", "0", "table", "0"]  # after the child's exit: nothing committed
    assert "episodelake" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr  # a clean exit, twice
    assert_all_match(el.Dataset.open(path), [episode(5, i) for i in range(3)])  # the parent's, exactly once


def test_a_forked_child_that_records_exits_cleanly_without_its_parents_episodes(tmp_path):
    path = str(tmp_path / "ds")
    proc = run_fork(path, "writes")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "panicked" not in proc.stderr, proc.stderr
    # writing in a forked child is unsupported: its exit commit fails, said once in one line naming its episode
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("episodelake: not committed at exit: 1 finished episode(s)"), lines
    assert "'seed': 6, 'index': 0}" in lines[0]
    parents = [ep for ep in el.Dataset.open(path).episodes() if ep.meta["seed"] == 5]
    assert sorted(int(ep.meta["index"]) for ep in parents) == [0, 1, 2]


def test_add_step_returns_its_writer_so_steps_chain(tmp_path):
    """``EpisodeWriter.add_step(...) -> EpisodeWriter``: chained steps record the same episode as separate calls."""
    ds = el.Dataset.create(crash_schema(), str(tmp_path / "ds"))
    raw = episode(9, 0)
    w = ds.new_episode({k: v[0] for k, v in raw.obs.items()}, **raw.meta)
    for t in range(raw.length):
        step = {
            "obs": {k: v[t + 1] for k, v in raw.obs.items()},
            "action": raw.action["action"][t],
            "reward": raw.reward[t],
            "terminated": raw.terminated and t == raw.length - 1,
            "truncated": raw.truncated and t == raw.length - 1,
        }
        w = w.add_step(step)
    if not (raw.terminated or raw.truncated):
        w.finish()
    ds.flush()
    assert_all_match(el.Dataset.open(str(tmp_path / "ds")), [raw])
