"""A script that samples and then ends normally exits with status 0, for every storage kind.

Each scenario is a real script run with ``sys.executable``: it opens a dataset,
samples a default ``segment_stream`` (background prefetch on) and leaves the
stream unclosed, optionally iterates a torch ``DataLoader`` with 2 workers, then
returns. 0.1.0 aborted most such runs on compressed and S3 data ("terminate
called without an active exception", status 134): the prefetch thread was
inside a TensorStore read when TensorStore's static destructors ran. Each
scenario runs several times; every run must exit 0 with nothing alarming on
stderr and print what the test process reads itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

import numpy as np
import pytest

import episodelake as el

KINDS = ["raw", "zstd", "s3", "s3-cache"]
SCRIPT = r"""
import json, sys, zlib


def fingerprint(batch):
    crc = zlib.crc32(batch.episode_id.tobytes() + batch.start.tobytes())
    for key in sorted(batch.data):
        crc = zlib.crc32(batch.data[key].tobytes(), crc)
    return crc


if __name__ == "__main__":  # a typical script: everything global, so nothing is dropped before exit
    url, options, cache, loader = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
    import episodelake as el

    ds = el.Dataset.open(url, storage_options=options, cache_bytes=(64 << 20) if cache else 0)
    stream = ds.segment_stream(8, batch_size=16, seed=3)  # default prefetch, never closed
    print("stream", [fingerprint(stream.sample()) for _ in range(3)], flush=True)
    if loader != "none":
        import torch
        from torch.utils.data import DataLoader

        torch.set_num_threads(1)
        segs = ds.segments(8)
        dl = DataLoader(segs, batch_size=16, num_workers=2, collate_fn=segs.collate, multiprocessing_context=loader)
        print("loader", sum(len(b.episode_id) for b in dl), flush=True)
"""


def schema(compression: str | None) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("camera", (3, 32, 32), "uint8", storage="tensor", compression=compression, chunk_rows=8),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def write(url: str, compression: str | None, options: dict | None) -> el.Dataset:
    rng = np.random.default_rng(5)
    ds = el.Dataset.create(schema(compression), url, storage_options=options, commit_episodes=4)
    for _ in range(12):
        T = int(rng.integers(20, 60))
        ds.append_episodes(
            [
                {
                    "observations": rng.integers(0, 256, (T + 1, 3, 32, 32), dtype=np.uint8),
                    "actions": rng.integers(0, 9, T),
                    "rewards": rng.random(T, dtype=np.float32),
                    "terminated": True,
                }
            ]
        )
    ds.flush()
    return ds


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, s3_server):
    root = tmp_path_factory.mktemp("shutdown")
    opts = s3_server.storage_options
    out = {}
    for kind in KINDS:
        s3 = kind.startswith("s3")
        url = f"s3://episodes/shutdown-{kind}-{root.name}" if s3 else str(root / kind)
        write(url, None if kind == "raw" else "zstd", opts if s3 else None)
        out[kind] = (url, opts if s3 else {}, kind == "s3-cache")
    script = root / "sample_then_exit.py"
    script.write_text(SCRIPT)
    return out, str(script)


def expected_stream(url: str, options: dict) -> list[int]:
    """The three batches' fingerprints, read here without a prefetch thread."""
    stream = el.Dataset.open(url, storage_options=options).segment_stream(8, batch_size=16, seed=3, prefetch=0)
    out = []
    for _ in range(3):
        batch = stream.sample()
        crc = zlib.crc32(batch.episode_id.tobytes() + batch.start.tobytes())
        for key in sorted(batch.data):
            crc = zlib.crc32(batch.data[key].tobytes(), crc)
        out.append(crc)
    return out


def run_clean(datasets, kind: str, loader: str, runs: int) -> None:
    """Run the script ``runs`` times; every run exits 0, prints the expected batches, nothing aborts."""
    (url, options, cache), script = datasets[0][kind], datasets[1]
    want = f"stream {expected_stream(url, options)}"
    failures = []
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, script, url, json.dumps(options), "1" if cache else "0", loader],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0 or "terminate called" in proc.stderr or "Traceback" in proc.stderr:
            failures.append((proc.returncode, proc.stderr[-2000:]))
            continue
        lines = proc.stdout.splitlines()
        assert lines[0] == want
        if loader != "none":
            segs = el.Dataset.open(url, storage_options=options).segments(8)
            assert lines[1] == f"loader {len(segs)}"
    assert not failures, f"{len(failures)} of {runs} runs failed: {failures[0]}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_exit_is_clean_after_sampling(datasets, kind):
    run_clean(datasets, kind, "none", runs=2)


@pytest.mark.slow
def test_exit_is_clean_with_forked_dataloader_workers(datasets):
    run_clean(datasets, "zstd", "fork", runs=1)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_exit_is_clean_after_sampling_every_run(datasets, kind):
    run_clean(datasets, kind, "none", runs=5)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_exit_is_clean_with_dataloader_workers_every_run(datasets, kind, context):
    run_clean(datasets, kind, context, runs=5)
