"""What a new user meets in the first hour with the ``episodelake`` command, in real subprocesses.

``info --version`` names the table's real latest version; ``copy --compression`` on a dataset with a jpeg
camera; an ``s3://`` command without credentials says how to give them; ``demo`` never writes over a
folder it did not make (unless ``--overwrite``, and then only over a dataset); the reserved meta names.
Each case checks the exit status, stderr and what is on disk afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import episodelake as el
from episodelake.core.errors import ArgumentError, SchemaError

CLI = [sys.executable, "-m", "episodelake.cli"]


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=300, env=env)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one ``episodelake: error: ...`` line of a failed command (exit status 1, no traceback)."""
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("episodelake: error: "), proc.stderr
    return lines[0]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` by relative path, with the SHA-256 of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def episode(t: int, rng: np.random.Generator) -> dict:
    return {
        "observations": {
            "camera": rng.integers(0, 256, (t + 1, 16, 16, 3), dtype=np.uint8),
            "depth": rng.standard_normal((t + 1, 24, 24)).astype(np.float32),
        },
        "actions": rng.standard_normal((t, 2)).astype(np.float32),
        "rewards": rng.standard_normal(t).astype(np.float32),
        "truncated": True,
    }


SCHEMA = el.DatasetSchema(
    [
        el.FieldSpec("camera", (16, 16, 3), "uint8", layout="HWC", codec="jpeg"),
        el.FieldSpec("depth", (24, 24), "float32", storage="tensor"),
        el.FieldSpec("action", (2,), "float32", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
    ]
)


@pytest.mark.slow
def test_info_at_a_past_version_names_the_latest(tmp_path):
    path = tmp_path / "ds"
    rng = np.random.default_rng(0)
    ds = el.Dataset.create(SCHEMA, str(path))
    for _ in range(2):
        ds.append_episodes([episode(5, rng)])
        ds.flush()
    # the reference: the table's log entries on disk, not the library
    versions = sorted(int(p.stem) for p in (path / "episodes" / "_delta_log").glob("*.json"))
    assert len(versions) >= 3
    latest = versions[-1]
    proc = run_cli("info", str(path), "--version", "1")
    assert proc.returncode == 0, proc.stderr
    assert f"version 1 (latest {latest})" in proc.stdout.splitlines()[0]
    proc = run_cli("info", str(path), "--version", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert (json.loads(proc.stdout)["version"], json.loads(proc.stdout)["latest_version"]) == (1, latest)
    proc = run_cli("info", str(path))
    assert f"version {latest} (latest {latest})" in proc.stdout.splitlines()[0]


@pytest.mark.slow
def test_copy_compression_applies_to_lossless_fields_and_keeps_the_camera_codec(tmp_path):
    rng = np.random.default_rng(1)
    raws = [episode(6, rng), episode(4, rng)]
    src = el.Dataset.from_episodes(raws, str(tmp_path / "src"), schema=SCHEMA)
    proc = run_cli("copy", str(tmp_path / "src"), str(tmp_path / "dst"), "--compression", "zstd", "--quiet")
    assert proc.returncode == 0, proc.stderr
    dst = el.Dataset.open(str(tmp_path / "dst"))
    camera, depth = dst.schema["observation/camera"], dst.schema["observation/depth"]
    assert (camera.codec, camera.compression) == ("jpeg", None)
    assert depth.compression == "zstd"
    for mine, theirs, raw in zip(dst.episodes(), src.episodes(), raws, strict=True):
        got, want = mine.read(), theirs.read()
        np.testing.assert_array_equal(got.all_obs["depth"], raw["observations"]["depth"])
        assert psnr(got.all_obs["camera"], want.all_obs["camera"]) > 40  # jpeg again, at the same quality
    # naming the jpeg field in a per-field mapping is refused, saying how to make it apply
    with pytest.raises(ArgumentError, match=r"keeps the lossy codec 'jpeg'.*codecs=\{'observation/camera': None\}"):
        src.copy_to(str(tmp_path / "dst2"), compression={"observation/camera": "zstd"})
    assert not (tmp_path / "dst2").exists()
    lossless = src.copy_to(None, compression="zstd", codecs={"observation/camera": None})
    assert (lossless.schema["observation/camera"].codec, lossless.schema["observation/camera"].compression) == (
        None,
        "zstd",
    )


def no_credentials_env(tmp_path: Path) -> dict[str, str]:
    """This environment without any AWS credentials, config or instance metadata lookup."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(tmp_path / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
        HOME=str(tmp_path),
    )
    return env


@pytest.mark.parametrize("command", ["info", "copy"])
@pytest.mark.slow
def test_s3_without_credentials_says_how_to_pass_them(tmp_path, command):
    env = no_credentials_env(tmp_path)
    if command == "info":
        proc, flag = run_cli("info", "s3://episodelake-test-bucket/ds", env=env), "--options"
    else:
        el.Dataset.from_episodes([episode(3, np.random.default_rng(2))], str(tmp_path / "src"), schema=SCHEMA)
        proc = run_cli("copy", str(tmp_path / "src"), "s3://episodelake-test-bucket/ds", "--quiet", env=env)
        flag = "--src-options / --dst-options"
    line = error_line(proc)
    assert "no credentials" in line and "NoCredentialsError" in line
    assert flag in line and "AWS_ACCESS_KEY_ID" in line and '"key"' in line and '"secret"' in line


@pytest.mark.slow
def test_demo_refuses_a_folder_that_holds_something(tmp_path):
    folder = tmp_path / "mine"
    (folder / "notes").mkdir(parents=True)
    (folder / "notes" / "todo.txt").write_text("my own file\n")
    before = tree(folder)
    for argv in (["demo", str(folder), "--episodes", "2"], ["demo", str(folder), "--episodes", "2", "--overwrite"]):
        line = error_line(run_cli(*argv))
        assert "not empty" in line and str(folder) in line
        assert tree(folder) == before  # nothing written, nothing removed


@pytest.mark.slow
def test_demo_replaces_an_earlier_demo_only_with_overwrite(tmp_path):
    folder = tmp_path / "demo"
    folder.mkdir()  # an empty folder is as good as a new one
    proc = run_cli("demo", str(folder), "--episodes", "4")
    assert proc.returncode == 0, proc.stderr
    before = tree(folder)
    line = error_line(run_cli("demo", str(folder), "--episodes", "2"))
    assert "already exists" in line and "--overwrite" in line
    assert tree(folder) == before
    proc = run_cli("demo", str(folder), "--episodes", "2", "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert len(el.Dataset.open(str(folder))) == 2


def test_reserved_meta_name_lists_the_reserved_names():
    reserved = [
        "action",
        "checks_failed",
        "created_at",
        "episode_id",
        "extra",
        "length",
        "observation",
        "quarantined",
        "return",
        "reward",
        "seq",
        "t",
        "terminated",
        "truncated",
        "writer",
    ]
    with pytest.raises(SchemaError) as info:
        el.DatasetSchema([*SCHEMA.fields, el.FieldSpec("writer", (), "str", role="meta")])
    message = str(info.value)
    assert "'writer' is reserved" in message
    assert message.endswith("reserved names: " + ", ".join(reserved))
