"""Ray Data on a local cluster: the episode table and the training stream's batches through Ray.

Checked against independent references: DuckDB's rows of the same SQL, the
arrays recorded when the episodes were generated (reference.expected_segment),
and the local sampler's batches on the same plan. One cluster for the module
(``ray.init(num_cpus=2)``), shut down at the end.
"""

from __future__ import annotations

import numpy as np
import pytest

import episodelake as el

from .conftest import build_robot_dataset, robot_schema
from .reference import expected_segment, random_episode

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

L, B, SEED = 4, 3, 11


def make_episodes(seed: int, n: int) -> list:
    rng = np.random.default_rng(seed)
    return [random_episode(rng, int(rng.integers(2, 12))) for _ in range(n)]


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def robot(tmp_path_factory):
    """A partitioned dataset of reference episodes in three commits, and the episodes by id."""
    path = str(tmp_path_factory.mktemp("ray") / "ds")
    raws = build_robot_dataset(path, seed=3, episodes=14, per_commit=5, max_length=12)
    ds = el.Dataset.open(path)
    return ds, dict(zip(ds.episode_ids.tolist(), raws, strict=True))


def by_id(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["episode_id"])


def rows_of(dataset, tensors=("observation/camera",)) -> list[dict]:
    """Every row, through Arrow (exact types), tensor columns as NumPy arrays."""
    rows: list[dict] = []
    for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
        tensors = {
            n: [x for chunk in batch.column(n).chunks for x in chunk.to_numpy(zero_copy_only=False)] for n in tensors
        }
        plain = batch.drop_columns(list(tensors)).to_pylist()
        rows += [dict(r, **{n: t[i] for n, t in tensors.items()}) for i, r in enumerate(plain)]
    return rows


@pytest.mark.parametrize("where", [None, "success", "task = 'pick' AND length > 5"])
def test_to_ray_rows_equal_duckdb_and_tensors_equal_recorded(robot, where, capsys):
    ds, raws = robot
    rays = ds.to_ray(where=where, tensors=["observation/camera"])
    capsys.readouterr()
    rays.explain()
    plan = capsys.readouterr().out
    assert ("Filter[" in plan) == (where is not None)  # the predicate is in the plan Ray was given ...
    optimized = plan.split("Logical Plan (Optimized)")[1].split("Physical Plan")[0]
    assert "Filter[" not in optimized  # ... and Ray's optimizer pushed it into the Parquet read
    got = by_id(rows_of(rays))
    sql = "SELECT * FROM episodes" + ("" if where is None else f" WHERE {where}")
    want = by_id(ds.sql(sql).arrow().read_all().to_pylist())
    assert [r["episode_id"] for r in got] == [r["episode_id"] for r in want]
    assert len(want) == (len(raws) if where is None else len(ds.where(where)))
    assert want, "the predicate must keep some episodes for the comparison to mean something"
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w) | {"observation/camera"}
        for name, value in w.items():
            assert g[name] == value, name
        np.testing.assert_array_equal(g["observation/camera"], raws[g["episode_id"]].obs["camera"])


def test_to_ray_columns_and_pinned_version(robot, tmp_path):
    ds, raws = robot
    rows = ds.to_ray(columns=["length", "task"], tensors=["observation/camera"]).take_all()
    assert [sorted(r) for r in rows] == [["length", "observation/camera", "task"]] * len(raws)
    assert sorted((r["length"], r["task"]) for r in rows) == sorted((w.length, w.meta["task"]) for w in raws.values())
    assert all(r["observation/camera"].shape == (r["length"] + 1, 3, 8, 8) for r in rows)
    # a copy that grows by one commit still reads the older version's rows at version=
    grown = ds.copy_to(str(tmp_path / "grown"))
    old_version = grown.version
    extra = make_episodes(99, 3)
    grown.append_episodes(e.as_dict(unwrap_action=True) for e in extra)
    grown.flush()
    assert grown.version > old_version
    assert len(grown.to_ray(columns=["episode_id"]).take_all()) == len(raws) + 3
    old = grown.to_ray(columns=["episode_id"], version=old_version).take_all()
    assert sorted(r["episode_id"] for r in old) == sorted(raws)


def ray_batches(ds: el.Dataset, rank: int, world: int, policy: str = "wrap", **options) -> list[dict[str, np.ndarray]]:
    out = ds.segments_to_ray(L, batch_size=B, seed=SEED, shard=el.Shard(rank, world, policy=policy), **options)
    return list(out.iter_batches(batch_size=B, batch_format="numpy"))


def local_batches(ds: el.Dataset, rank: int, world: int, epochs: int = 1, policy: str = "wrap") -> list[el.Batch]:
    shard = el.Shard(rank, world, policy=policy)
    stream = ds.segment_stream(L, batch_size=B, seed=SEED, sampler=el.Uniform(replacement=False), shard=shard)
    out: list[el.Batch] = []
    for _ in range(epochs):
        out += list(stream)
    return out


def assert_same(got: dict[str, np.ndarray], want: el.Batch) -> None:
    expected = dict(want.buffers(), episode_id=want.episode_id, start=want.start)
    assert set(got) == set(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
        assert got[key].dtype == np.asarray(value).dtype or value.dtype == object, key


def test_segments_to_ray_equal_local_sampler_ranks_disjoint_and_equal(robot):
    ds, raws = robot
    world = 2
    seen: list[tuple[int, int]] = []
    counts = []
    for rank in range(world):
        got, want = (
            ray_batches(ds, rank, world, policy="drop"),
            local_batches(ds, rank, world, policy="drop"),
        )
        assert len(got) == len(want) > 2
        counts.append(sum(len(b["episode_id"]) for b in got))
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
            for i, (eid, start) in enumerate(zip(g["episode_id"].tolist(), g["start"].tolist(), strict=True)):
                seen.append((eid, start))
                ref = expected_segment(raws[eid], start, L)
                real = ref["mask"]  # padded slots hold no recorded value: compare the real transitions
                np.testing.assert_array_equal(g["mask"][i], real)
                np.testing.assert_array_equal(g["observation/camera"][i, :L][real], ref["obs/camera"][real])
                np.testing.assert_array_equal(g["reward"][i][real], ref["reward"][real])
    assert counts[0] == counts[1]
    assert len(set(seen)) == len(seen), "ranks overlap"
    # every segment of every episode (starts 0 .. T - L, one padded segment when T < L), less what "drop" leaves
    everything = {(eid, s) for eid, raw in raws.items() for s in range(max(raw.length - L, 0) + 1)}
    assert set(seen) <= everything and len(everything) - len(seen) < world


def test_segments_to_ray_resume_and_next_epoch(robot):
    ds, _ = robot
    full = ray_batches(ds, 1, 3)
    resumed = ray_batches(ds, 1, 3, start_batch=2)
    assert len(resumed) == len(full) - 2
    for g, w in zip(resumed, full[2:], strict=True):
        for key in w:
            np.testing.assert_array_equal(g[key], w[key], err_msg=key)
    local = local_batches(ds, 1, 3, epochs=2)
    second = ray_batches(ds, 1, 3, epoch=1)
    assert len(second) == len(full) and len(local) == 2 * len(full)
    for g, w in zip(full + second, local, strict=True):
        assert_same(g, w)
    assert not np.array_equal(full[0]["episode_id"], second[0]["episode_id"]) or not np.array_equal(
        full[0]["start"], second[0]["start"]
    )


def test_to_ray_and_segments_to_ray_on_s3(s3_server, s3_url):
    raws = make_episodes(5, 8)
    ds = el.Dataset.create(robot_schema(), s3_url, storage_options=s3_server.storage_options, partition_by=["task"])
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    ds = el.Dataset.open(s3_url, storage_options=s3_server.storage_options)
    truth = dict(zip(ds.episode_ids.tolist(), raws, strict=True))
    rows = ds.to_ray(where="task = 'place'", columns=["episode_id", "return"], tensors=["observation/camera"])
    got = by_id(rows.take_all())
    want = by_id(ds.sql("SELECT episode_id, return FROM episodes WHERE task = 'place'").arrow().read_all().to_pylist())
    assert [(r["episode_id"], r["return"]) for r in got] == [(r["episode_id"], r["return"]) for r in want]
    for r in got:
        np.testing.assert_array_equal(r["observation/camera"], truth[r["episode_id"]].obs["camera"])
    for g, w in zip(ray_batches(ds, 0, 2), local_batches(ds, 0, 2), strict=True):
        assert_same(g, w)


def test_interop_ray_snippets_run(tmp_path):
    """docs/interop.md's ``python ray`` snippets (Ray Data, TorchTrainer) run after the page's other snippets,
    in a fresh interpreter, and print what their comments say (tests/test_docs.py runs the others alone)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    blocks = re.findall(r"```python( ray)?\n(.*?)```", (root / "docs" / "interop.md").read_text(), re.S)
    assert sum(1 for ray_block, _ in blocks if ray_block) == 2
    code = "\n".join(body for _, body in blocks)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout.splitlines()
    assert printed[-3:] == ["[3, 5]", "same batches", "None"], printed
