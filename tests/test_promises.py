"""Promises of the README and docs that no other test held to account, each checked against a reference.

Multi-piece commits (realistic camera sizes), commit triggers, writer lifecycles, checkpoints, validate()
and verify, sampler options, the torch helpers, copies between storages and in-memory datasets read by
DataLoader workers.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import zlib

import numpy as np
import pytest

import episodelake as el
from episodelake.cli.main import main
from episodelake.storage.table import join_compactions

from .conftest import robot_schema
from .reference import RawEpisode, random_episode
from .test_corruption import flip

# ---------------------------------------------------------------- realistic camera sizes

CAM = (3, 64, 64)  # 12 KiB a row: a 100+ step episode spans several 256 KiB commit pieces and chunks


def camera_schema(compression: str | None = None) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (5,), "float32"),
            el.FieldSpec("camera", CAM, "uint8", layout="CHW", storage="tensor", compression=compression),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("task", (), "str", role="meta"),
            el.FieldSpec("success", (), "bool", role="meta"),
        ]
    )


def camera_episode(rng: np.random.Generator, length: int) -> RawEpisode:
    raw = random_episode(rng, length, image=False)
    # a per-channel offset makes channel statistics differ, so a channel mix-up cannot pass
    cam = rng.integers(10, 150, (length + 1, *CAM), dtype=np.uint8)
    cam += np.array([0, 20, 55], np.uint8)[None, :, None, None]
    for c in range(3):  # each extreme sits in one row only, so one commit piece holds it
        cam[rng.integers(0, length + 1), c, rng.integers(0, 64), rng.integers(0, 64)] = (
            220 + 10 * c + rng.integers(0, 6)
        )
        cam[rng.integers(0, length + 1), c, rng.integers(0, 64), rng.integers(0, 64)] = c + rng.integers(0, 3)
    raw.obs["camera"] = cam
    return raw


@pytest.fixture(scope="module")
def camera_data(tmp_path_factory):
    """8 episodes of 100-180 steps at 3x64x64, committed 4 per commit (two commits)."""
    rng = np.random.default_rng(42)
    raws = [camera_episode(rng, int(rng.integers(100, 181))) for _ in range(8)]
    path = str(tmp_path_factory.mktemp("camera") / "ds")
    ds = el.Dataset.create(camera_schema(), path, commit_episodes=4)
    for r in raws:
        ds.append_episodes([r.as_dict(unwrap_action=True)])
    assert ds.flush() is None and len(ds) == 8  # the fourth and eighth episodes committed on their own
    return path, raws


def test_multi_piece_statistics_match_numpy(camera_data):
    path, raws = camera_data
    ds = el.Dataset.open(path)
    stats = ds.stats()
    cam = np.concatenate([r.obs["camera"] for r in raws]).astype(np.float64)  # [rows, C, H, W]
    per_channel = np.moveaxis(cam, 1, 0).reshape(3, -1)
    assert stats["observation/camera"]["count"] == per_channel.shape[1]
    np.testing.assert_array_equal(stats["observation/camera"]["sum"], per_channel.sum(axis=1))
    np.testing.assert_allclose(stats["observation/camera"]["mean"], per_channel.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(stats["observation/camera"]["std"], per_channel.std(axis=1), rtol=1e-9)
    np.testing.assert_array_equal(stats["observation/camera"]["min"], per_channel.min(axis=1))
    np.testing.assert_array_equal(stats["observation/camera"]["max"], per_channel.max(axis=1))
    state = np.concatenate([r.obs["state"] for r in raws]).astype(np.float64)
    np.testing.assert_allclose(stats["observation/state"]["mean"], state.mean(axis=0), rtol=1e-9)
    rewards = np.concatenate([r.reward for r in raws]).astype(np.float64)
    np.testing.assert_allclose(stats["reward"]["sum"], rewards.sum(), rtol=1e-9)
    # a view: the statistics of exactly its episodes
    view = ds.where("task = 'pick'")
    picked = [r for r in raws if r.meta["task"] == "pick"]
    sub = np.moveaxis(np.concatenate([r.obs["camera"] for r in picked]).astype(np.float64), 1, 0).reshape(3, -1)
    np.testing.assert_array_equal(view.stats(["observation/camera"])["observation/camera"]["sum"], sub.sum(axis=1))


def test_multi_piece_checksums_match_zlib(camera_data):
    path, raws = camera_data
    ds = el.Dataset.open(path)
    by_index = {tuple(r.obs["state"][0].tolist()): r for r in raws}
    crcs = ds.sql('SELECT "crc/observation/camera" AS crc FROM episodes ORDER BY created_at, episode_id').fetchnumpy()
    for pos in range(len(ds)):
        raw = by_index[tuple(ds.episode(pos).read().obs.state[0].tolist())]
        assert int(crcs["crc"][pos]) == zlib.crc32(np.ascontiguousarray(raw.obs["camera"]).data)
    assert ds.maintenance.validate().ok


def tensor_chunk_files(path: str) -> list[str]:
    return sorted(
        f
        for f in glob.glob(f"{path}/tensors/**/observation/camera/**", recursive=True)
        if os.path.isfile(f) and not f.endswith("zarr.json")
    )


def episodes_differing(ds: el.Dataset, raws: list[RawEpisode]) -> set[int]:
    """Ids of episodes whose camera rows (read without verification) differ from the truth."""
    truth = {tuple(r.obs["state"][0].tolist()): r.obs["camera"] for r in raws}
    out = set()
    for ref in ds.episodes():
        seg = ref.read()
        if not np.array_equal(seg.all_obs.camera, truth[tuple(seg.obs.state[0].tolist())]):
            out.add(ref.episode_id)
    return out


def test_flipped_byte_in_one_chunk_names_its_episode(camera_data, tmp_path):
    src, raws = camera_data
    path = str(tmp_path / "ds")
    shutil.copytree(src, path)
    chunks = tensor_chunk_files(path)
    assert len(chunks) >= 8  # several chunks per commit
    target = chunks[len(chunks) // 2]
    flip(target, os.path.getsize(target) // 2, 3)
    ds = el.Dataset.open(path)
    owners = episodes_differing(ds, raws)  # the truth: whose data the flip changed
    assert len(owners) == 1
    problems = ds.maintenance.validate().problems
    assert [(p.kind, p.episode_id) for p in problems] == [("checksum", next(iter(owners)))]
    assert "observation/camera" in problems[0].message
    # tensors=False reads no tensor rows: it cannot see a flip
    assert not ds.maintenance.validate(tensors=False).problems
    verified = el.Dataset.open(path, verify=True)
    for ref in verified.episodes():
        if ref.episode_id in owners:
            with pytest.raises(el.CorruptionError, match=rf"episode {ref.episode_id}: .*CRC-32"):
                ref.read()
        else:
            ref.read(0, 1)  # every other episode verifies and reads


def test_verify_reads_big_episodes_identically(camera_data):
    path, raws = camera_data
    ds = el.Dataset.open(path, verify=True)
    truth = {tuple(r.obs["state"][0].tolist()): r for r in raws}
    for ref in ds.episodes():
        seg = ref.read()
        raw = truth[tuple(seg.obs.state[0].tolist())]
        np.testing.assert_array_equal(seg.all_obs.camera, raw.obs["camera"])
        part = ref.read(5, 60)  # a partial read of a verified episode
        np.testing.assert_array_equal(part.all_obs.camera, raw.obs["camera"][5:61])


def test_verify_is_once_per_snapshot(camera_data, tmp_path):
    """The first read of an episode checks its CRC-32; later reads of the snapshot do not re-check it."""
    src, _ = camera_data
    path = str(tmp_path / "ds")
    shutil.copytree(src, path)
    ds = el.Dataset.open(path, verify=True)
    ds.episode(0).read(0, 1)  # verified here
    target = tensor_chunk_files(path)[0]  # the first chunk of the first commit: episode 0's rows
    flip(target, 100)
    ds.episode(0).read(0, 1)  # same snapshot: not checked again
    with pytest.raises(el.CorruptionError, match="CRC-32"):
        el.Dataset.open(path, verify=True).episode(0).read(0, 1)  # a new snapshot checks again


def test_sampling_with_verify_checks_each_episode(camera_data, tmp_path):
    """docs/reliability.md: sampling with verify=True costs one extra pass over each episode it visits."""
    src, _ = camera_data
    path = str(tmp_path / "ds")
    shutil.copytree(src, path)
    target = tensor_chunk_files(path)[0]
    flip(target, 100)
    segments = el.Dataset.open(path, verify=True).segments(4)
    with pytest.raises(el.CorruptionError, match="CRC-32"):
        segments.__getitems__(list(range(len(segments))))


# ---------------------------------------------------------------- commit triggers


def small_episode(seed: int, length: int = 3) -> dict:
    return random_episode(np.random.default_rng(seed), length).as_dict(unwrap_action=True)


def committed(path: str) -> int:
    return len(el.Dataset.open(path))


def test_close_commits(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(robot_schema(), path)
    ds.append_episodes([small_episode(0), small_episode(1)])
    assert committed(path) == 0
    ds.close()
    assert committed(path) == 2


def test_with_block_commits_on_exit(tmp_path):
    path = str(tmp_path / "ds")
    with el.Dataset.create(robot_schema(), path) as ds:
        ds.append_episodes([small_episode(0)])
        assert committed(path) == 0
    assert committed(path) == 1


def test_commit_episodes_trigger(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(robot_schema(), path, commit_episodes=3)
    for i in range(7):
        ds.append_episodes([small_episode(i)])
        assert committed(path) == 3 * ((i + 1) // 3)
    ds.flush(discard=True)


def test_commit_bytes_trigger(tmp_path):
    """Episodes commit as soon as the pending payload reaches commit_bytes."""
    path = str(tmp_path / "ds")
    raw = random_episode(np.random.default_rng(0), 10)
    size = sum(v.nbytes for v in (*raw.obs.values(), raw.action["action"], raw.reward))  # every episode's payload
    ds = el.Dataset.create(robot_schema(), path, commit_bytes=2 * size + 1)
    history = []
    for i in range(6):
        ds.append_episodes([small_episode(i, 10)])
        history.append(committed(path))
    assert history == [0, 0, 3, 3, 3, 6]
    ds.flush(discard=True)


def test_commit_seconds_trigger(tmp_path):
    """commit_seconds is checked when an episode finishes: with 0 s the second finish commits both."""
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(robot_schema(), path, commit_seconds=0)
    history = []
    for i in range(2):
        raw = random_episode(np.random.default_rng(i), 4)
        w = ds.new_episode({k: v[0] for k, v in raw.obs.items()}, **raw.meta)
        for t in range(4):
            w.add_step({"observations": {k: v[t + 1] for k, v in raw.obs.items()}, "actions": raw.action["action"][t],
                        "rewards": raw.reward[t]})  # fmt: skip
        w.finish()
        history.append(committed(path))
    assert history[-1] == 2 and history == sorted(history)
    slow = el.Dataset.create(robot_schema(), str(tmp_path / "slow"), commit_seconds=3600)
    slow.append_episodes([small_episode(0), small_episode(1)])
    assert committed(str(tmp_path / "slow")) == 0
    slow.flush(discard=True)


# ---------------------------------------------------------------- writer lifecycles


def first_obs(raw: RawEpisode) -> dict:
    return {k: v[0] for k, v in raw.obs.items()}


def step_of(raw: RawEpisode, t: int, **keys) -> dict:
    out = {"observations": {k: v[t + 1] for k, v in raw.obs.items()}, "actions": raw.action["action"][t],
           "rewards": raw.reward[t]}  # fmt: skip
    out.update(keys)
    return out


def test_discard_stores_nothing(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(robot_schema(), path)
    raw = random_episode(np.random.default_rng(0), 5)
    w = ds.new_episode(first_obs(raw), **raw.meta)
    w.add_step(step_of(raw, 0))
    w.discard()
    with pytest.raises(el.EpisodeStateError):
        w.add_step(step_of(raw, 1))
    keep = random_episode(np.random.default_rng(1), 3)
    ds.append_episodes([keep.as_dict(unwrap_action=True)])
    ds.close()
    again = el.Dataset.open(path)
    assert len(again) == 1 and again.num_steps == 3
    np.testing.assert_array_equal(again.episode(0).read().reward, keep.reward)


def test_with_new_episode_finishes_or_discards(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(robot_schema(), path)
    raw = random_episode(np.random.default_rng(0), 4)
    with ds.new_episode(first_obs(raw), **raw.meta) as w:
        for t in range(4):
            w.add_step(step_of(raw, t))
    assert w.done
    with pytest.raises(RuntimeError, match="boom"), ds.new_episode(first_obs(raw), **raw.meta) as w2:
        w2.add_step(step_of(raw, 0))
        raise RuntimeError("boom")
    ds.close()
    again = el.Dataset.open(path)
    assert len(again) == 1
    ref = again.episode(0)
    assert ref.length == 4 and not ref.terminated and not ref.truncated  # a clean exit finishes without flags
    np.testing.assert_array_equal(ref.read().all_obs.camera, raw.obs["camera"])


def test_singular_step_keys_and_extras(tmp_path):
    """add_step takes observation/action/reward (and obs), extras and infos; extras are stored per step."""
    schema = el.DatasetSchema([*robot_schema().fields, el.FieldSpec("value", (), "float32", role="extra")])
    ds = el.Dataset.create(schema, str(tmp_path / "ds"))
    raw = random_episode(np.random.default_rng(0), 4)
    values = np.arange(4, dtype=np.float32) / 3
    w = ds.new_episode(first_obs(raw), **raw.meta)
    for t in range(4):
        s = step_of(raw, t)
        singular = {"obs" if t % 2 else "observation": s["observations"], "action": s["actions"],
                    "reward": s["rewards"]}  # fmt: skip
        w.add_step({**singular, ("extra" if t % 2 else "extras"): {"value": values[t]}, "terminated": t == 3})
    ds.close()
    seg = el.Dataset.open(str(tmp_path / "ds")).episode(0).read()
    np.testing.assert_array_equal(seg.all_obs.state, raw.obs["state"])
    np.testing.assert_array_equal(seg.action, raw.action["action"])
    np.testing.assert_array_equal(seg.data["extra/value"] if "extra/value" in seg.data else seg.data["value"], values)
    assert seg.terminated[-1]


def test_vector_close_finish_open(tmp_path):
    """close() discards running episodes; close(finish_open=True) finishes them without flags."""
    rng = np.random.default_rng(0)
    raws = [random_episode(rng, 6) for _ in range(2)]

    def run(finish_open: bool) -> el.Dataset:
        path = str(tmp_path / f"ds-{finish_open}")
        ds = el.Dataset.create(robot_schema(), path)
        obs0 = {k: np.stack([r.obs[k][0] for r in raws]) for k in raws[0].obs}
        vw = ds.vector_writer(obs0, 2, meta=lambda i: raws[i].meta)
        for t in range(3):
            vw.add_steps({k: np.stack([r.obs[k][t + 1] for r in raws]) for k in raws[0].obs},
                         np.array([r.action["action"][t] for r in raws]), np.array([r.reward[t] for r in raws]),
                         [False, False], [False, False])  # fmt: skip
        vw.close(finish_open=finish_open)
        ds.close()
        return el.Dataset.open(path)

    assert len(run(False)) == 0
    kept = run(True)
    assert len(kept) == 2
    for ref in kept.episodes():
        raw = raws[[r.meta == ref.meta for r in raws].index(True)] if raws[0].meta != raws[1].meta else None
        assert ref.length == 3 and not ref.terminated and not ref.truncated
        if raw is not None:
            np.testing.assert_array_equal(ref.read().all_obs.camera, raw.obs["camera"][:4])


def test_durable_writes_fsync_and_round_trip(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(robot_schema(), path, durable=True)
    assert ds._store.context.spec.to_json().get("file_io_sync") is True
    assert (
        el.Dataset.create(robot_schema(), str(tmp_path / "plain"))._store.context.spec.to_json()["file_io_sync"]
        is False
    )
    raw = random_episode(np.random.default_rng(0), 7)
    ds.append_episodes([raw.as_dict(unwrap_action=True)])
    ds.close()
    np.testing.assert_array_equal(el.Dataset.open(path).episode(0).read().all_obs.camera, raw.obs["camera"])


def test_automatic_checkpoint_every_64_commits(tmp_path):
    path = str(tmp_path / "ds")
    ds = el.Dataset.create(robot_schema(), path, commit_episodes=1)
    log = os.path.join(path, "episodes", "_delta_log")
    for i in range(63):
        ds.append_episodes([small_episode(i, 1)])
    assert not glob.glob(f"{log}/*.checkpoint*.parquet")
    ds.append_episodes([small_episode(63, 1)])
    join_compactions()  # the 64th commit compacted and checkpointed on a background thread
    assert glob.glob(f"{log}/*.checkpoint*.parquet")
    with open(os.path.join(log, "_last_checkpoint")) as fh:
        assert json.load(fh)["version"] >= 64
    again = el.Dataset.open(path)
    assert len(again) == 64 and again.maintenance.validate().ok


# ---------------------------------------------------------------- samplers


@pytest.fixture
def small_ds(tmp_path):
    rng = np.random.default_rng(3)
    raws = [random_episode(rng, int(rng.integers(3, 12))) for _ in range(10)]
    ds = el.Dataset.create(robot_schema(), str(tmp_path / "ds"))
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    return ds, raws


def test_weights_as_a_sql_query(small_ds):
    ds, _ = small_ds
    ids = ds.episode_ids
    chosen = {int(ids[2]), int(ids[7])}
    query = f"SELECT episode_id, 1.0 AS weight FROM episodes WHERE episode_id IN ({', '.join(map(str, chosen))})"
    stream = ds.segment_stream(2, batch_size=64, seed=0, sampler=el.Weighted(query), prefetch=0)
    seen = np.concatenate([stream.sample().episode_id for _ in range(5)])
    assert set(seen.tolist()) == chosen  # episodes the query omits get weight 0


class EmptySampler:
    def sample(self, index, batch_size):
        return np.zeros(0, np.int64)


def test_sampler_returning_nothing_ends_the_stream(small_ds):
    ds, _ = small_ds
    stream = ds.segment_stream(2, batch_size=4, sampler=EmptySampler(), prefetch=0)
    assert list(stream) == []
    with pytest.raises(el.ValidationError, match="no segments to sample"):
        ds.where("length > 1000").segment_stream(2)


def test_prefetch_queue_is_bounded(small_ds):
    """With prefetch=2 (local reads) the background thread keeps exactly 2 batches ahead, planning no further."""
    ds, _ = small_ds
    calls = []

    class Counting:
        def sample(self, index, batch_size):
            calls.append(1)
            return np.arange(batch_size) % len(index)

    stream = ds.segment_stream(2, batch_size=4, sampler=Counting(), prefetch=2)
    for taken in (1, 2):
        stream.sample()
        ahead = stream._prefetcher
        # the thread appends each planned batch under this condition; 600 s only guards a hang
        with ahead._cond:
            assert ahead._cond.wait_for(lambda a=ahead: len(a._items) >= 2, timeout=600)
        # one sampler call per batch: those taken plus the 2 kept ahead, and none beyond until one is taken
        assert len(calls) == taken + 2 and len(ahead._items) == 2 and ahead.target == 2
    assert ahead._thread.is_alive()  # waiting for room, not ended
    stream.close()


def test_to_torch_pin_memory_on_cpu(small_ds):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from episodelake.integrations.torch import to_torch

    ds, _ = small_ds
    batch = ds.segment_stream(3, batch_size=4, seed=0, prefetch=0).sample()
    tb = to_torch(batch, pin_memory=False)
    np.testing.assert_array_equal(tb.obs.camera.numpy(), batch.obs.camera)
    assert tb.reward.data_ptr() == torch.from_numpy(batch.reward).data_ptr()  # shares memory
    if torch.cuda.is_available():
        assert to_torch(batch, pin_memory=True).obs.camera.is_pinned()
    else:  # pinning needs an accelerator: torch says so rather than silently not pinning
        with pytest.raises(RuntimeError):
            to_torch(batch, pin_memory=True)


# ---------------------------------------------------------------- copies and object storage


def test_copy_to_field_mappings_and_disk_to_s3(small_ds, s3_server, s3_url):
    import s3fs

    ds, raws = small_ds
    opts = s3_server.storage_options
    copy = ds.copy_to(s3_url, opts, chunk_rows={"observation/camera": 5}, compression={"observation/camera": "zstd"})
    again = el.Dataset.open(s3_url, storage_options=opts)
    f = again.schema["observation/camera"]
    assert (f.chunk_rows, f.compression) == (5, "zstd")
    assert again.episode_ids.tolist() == ds.episode_ids.tolist() and len(copy) == len(raws)
    for ref, raw in zip(again.episodes(), raws, strict=True):
        np.testing.assert_array_equal(ref.read().all_obs.camera, raw.obs["camera"])
        assert ref.meta == raw.meta
    fs = s3fs.S3FileSystem(**opts)
    arrays = [p for p in fs.find(f"{s3_url[5:]}/tensors") if "observation/camera" in p and p.endswith("zarr.json")]
    codecs = [json.loads(fs.cat_file(p)).get("codecs") for p in arrays]
    assert arrays and all("zstd" in json.dumps(c) for c in codecs if c)
    report = again.maintenance.validate()
    assert report.ok and report.episodes == len(raws) and report.tensor_rows == sum(r.length + 1 for r in raws)


def test_validate_on_s3_finds_a_missing_object(small_ds, s3_server, s3_url):
    import s3fs

    ds, _ = small_ds
    opts = s3_server.storage_options
    ds.copy_to(s3_url, opts)
    fs = s3fs.S3FileSystem(**opts)
    parquet = [p for p in fs.find(s3_url[5:] + "/episodes") if p.endswith(".parquet") and "_delta_log" not in p]
    fs.rm(parquet[0])
    problems = el.Dataset.open(s3_url, storage_options=opts).maintenance.validate().problems
    assert any(p.kind == "table-file" and "missing" in p.message and parquet[0] in p.file for p in problems)


def test_cli_copy_where_compression_src_options(small_ds, s3_server, s3_url, tmp_path, capsys):
    ds, raws = small_ds
    opts = s3_server.storage_options
    ds.copy_to(s3_url, opts)
    dst = str(tmp_path / "picked")
    argv = ["copy", s3_url, dst, "--src-options", json.dumps(opts), "--where", "task = 'pick'",
            "--compression", "zstd", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    picked = [r for r in raws if r.meta["task"] == "pick"]
    assert f"copied {len(picked)} episodes" in capsys.readouterr().out
    copy = el.Dataset.open(dst)
    assert copy.schema["observation/camera"].compression == "zstd"
    for ref, raw in zip(copy.episodes(), picked, strict=True):
        np.testing.assert_array_equal(ref.read().all_obs.camera, raw.obs["camera"])
    assert main(["copy", s3_url, str(tmp_path / "nope"), "--quiet"]) == 1  # without --src-options: unreachable
    assert not os.path.exists(tmp_path / "nope")


# ---------------------------------------------------------------- in-memory datasets and DataLoader workers


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.slow
def test_in_memory_dataset_in_dataloader_workers(context):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from torch.utils.data import DataLoader

    rng = np.random.default_rng(5)
    raws = [random_episode(rng, int(rng.integers(3, 15))) for _ in range(6)]
    ds = el.Dataset.create(robot_schema())  # in memory
    ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws)
    ds.flush()
    segments = ds.segments(3)
    loader = DataLoader(segments, batch_size=4, num_workers=2, collate_fn=segments.collate,
                        multiprocessing_context=context)  # fmt: skip
    got = list(loader)
    assert sum(len(b.reward) for b in got) == len(segments)
    for k, batch in enumerate(got):
        ids = list(range(4 * k, min(4 * k + 4, len(segments))))
        for j, i in enumerate(ids):  # against the raw episodes, not the library's own read
            e, s = next((e, s) for n, (e, s) in enumerate(starts(raws, 3)) if n == i)
            np.testing.assert_array_equal(batch.obs.camera[j], raws[e].obs["camera"][s : s + 3])
            np.testing.assert_array_equal(batch.reward[j], raws[e].reward[s : s + 3])


def starts(raws: list[RawEpisode], length: int) -> list[tuple[int, int]]:
    from .reference import segment_starts

    return segment_starts([r.length for r in raws], length)
