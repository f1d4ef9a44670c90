"""Shared fixtures. Datasets live under pytest's tmp_path or in memory."""

from __future__ import annotations

import numpy as np
import pytest

import episodelake as el

from .reference import random_episode


def robot_schema(image: bool = True) -> el.DatasetSchema:
    """The schema of reference.random_episode (camera is a tensor field, the rest table)."""
    fields = [el.FieldSpec("state", (5,), "float32")]
    if image:
        fields.append(el.FieldSpec("camera", (3, 8, 8), "uint8", layout="CHW", storage="tensor", chunk_rows=16))
    fields += [
        el.FieldSpec("action", (), "int64", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
        el.FieldSpec("task", (), "str", role="meta"),
        el.FieldSpec("success", (), "bool", role="meta"),
    ]
    return el.DatasetSchema(fields)


def build_robot_dataset(
    path: str, seed: int, episodes: int, per_commit: int, max_length: int, min_length: int = 2, checks: tuple = ()
) -> list:
    """A partitioned on-disk dataset of reference episodes, committed ``per_commit`` at a time."""
    rng = np.random.default_rng(seed)
    raws = [random_episode(rng, int(rng.integers(min_length, max_length))) for _ in range(episodes)]
    ds = el.Dataset.create(robot_schema(), path, partition_by=["task"], checks=list(checks))
    for i in range(0, episodes, per_commit):
        ds.append_episodes(r.as_dict(unwrap_action=True) for r in raws[i : i + per_commit])
        ds.flush()
    return raws


def build_quarantining_dataset(path: str, seed: int, episodes: int, per_commit: int) -> tuple[el.Dataset, list]:
    """Like :func:`build_robot_dataset`, with a check quarantining every episode without a positive return;
    the dataset and its raw episodes."""
    check = el.Check("positive", '"return" > 0', on_fail="quarantine")
    raws = build_robot_dataset(path, seed, episodes, per_commit, max_length=12, min_length=1, checks=(check,))
    return el.Dataset.open(path), raws


@pytest.fixture
def raw_episodes():
    rng = np.random.default_rng(1234)
    return [random_episode(rng, int(rng.integers(1, 40))) for _ in range(12)]


@pytest.fixture(params=["memory", "disk"])
def backend_path(request, tmp_path):
    return None if request.param == "memory" else str(tmp_path / "ds")


@pytest.fixture
def robot_dataset(raw_episodes, backend_path):
    ds = el.Dataset.create(robot_schema(), backend_path, partition_by=["task"])
    ds.append_episodes(e.as_dict(unwrap_action=True) for e in raw_episodes)
    ds.flush()
    return ds


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server (SeaweedFS ``weed mini``) on 127.0.0.1 with the bucket ``episodes``."""
    from .s3server import S3Server

    with S3Server(tmp_path_factory.mktemp("s3data")) as server:
        server.create_bucket("episodes")
        yield server


@pytest.fixture
def s3_url(s3_server, request):
    """A fresh ``s3://`` dataset root per test (``s3_server.storage_options`` reaches it)."""
    import re
    import uuid

    return f"s3://episodes/{re.sub(r'[^A-Za-z0-9_-]', '-', request.node.name)}-{uuid.uuid4().hex[:8]}"
