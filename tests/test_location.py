"""location.resolve: paths/URLs + storage options -> fsspec, deltalake and TensorStore specs (no server)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.storage.location import resolve

S3_OPTS = {"key": "AKIA-one", "secret": "s3cr3t", "endpoint_url": "http://127.0.0.1:9000"}


def test_local_paths_and_file_urls(tmp_path):
    for url in (str(tmp_path / "a"), f"file://{tmp_path}/a", tmp_path / "a"):
        loc = resolve(url)
        assert (loc.protocol, loc.path, loc.is_local) == ("file", str(tmp_path / "a"), True)
        assert loc.delta_options() is None
        assert loc.kvstore("tensors", "w", "camera") == {"driver": "file", "path": f"{tmp_path}/a/tensors/w/camera/"}


def test_memory_is_ram_backed_and_shared_by_name():
    loc = resolve("memory://shared-name")
    assert loc.ephemeral and loc.is_local
    assert resolve("memory://shared-name") is loc  # the same private directory while it lives
    assert resolve(None).path != resolve(None).path  # anonymous in-memory roots never collide
    if Path("/dev/shm").is_dir():
        assert loc.path.startswith("/dev/shm/")


# the default StorageTimeouts as deltalake (object_store) options, spelled out independently
DEFAULT_DELTA_TIMEOUTS = {
    "connect_timeout": "5.0s",
    "timeout": "30.0s",
    "retry_timeout": "60.0s",
    "backoff_config.init_backoff": "0.025s",
    "backoff_config.max_backoff": "5.0s",
    "backoff_config.base": "2",
}


def test_timeouts_reach_every_engine():
    """One policy in storage_options["timeouts"] becomes TensorStore retries, deltalake options and botocore
    config; it is not passed on as an fsspec option."""
    policy = {
        "connect_timeout": 1,
        "read_timeout": 7,
        "max_retries": 3,
        "initial_delay": 0.01,
        "max_delay": 0.5,
        "deadline": 9,
    }
    loc = resolve("s3://bucket/root", {**S3_OPTS, "timeouts": policy})
    assert "timeouts" not in loc.storage_options
    spec = loc.kvstore("tensors")
    assert spec["context"] == {"s3_request_retries": {"max_retries": 3, "initial_delay": "0.01s", "max_delay": "0.5s"}}
    delta = loc.delta_options()
    assert {k: delta[k] for k in ("connect_timeout", "timeout", "retry_timeout")} == {
        "connect_timeout": "1s",
        "timeout": "7s",
        "retry_timeout": "9s",
    }
    assert "max_retries" not in delta  # Polars takes that key as its own int option
    assert (delta["backoff_config.init_backoff"], delta["backoff_config.max_backoff"]) == ("0.01s", "0.5s")
    config = loc.fs.config_kwargs
    # botocore waits up to 1, 2, 4 s before its retries: 3 retries fit in 9 s, and max_retries allows 3
    assert config == {"connect_timeout": 1, "read_timeout": 7, "retries": {"max_attempts": 4, "mode": "standard"}}
    mine = resolve("s3://bucket/root", {**S3_OPTS, "config_kwargs": {"read_timeout": 99}}).fs.config_kwargs
    assert mine["read_timeout"] == 99 and mine["connect_timeout"] == 5.0  # the caller's own settings win


def test_s3_delta_options_from_fsspec_options():
    loc = resolve("s3://bucket/some/root/", {**S3_OPTS, "token": "tok", "client_kwargs": {"region_name": "eu-west-3"}})
    assert (loc.url, loc.path) == ("s3://bucket/some/root", "bucket/some/root")
    assert loc.delta_uri() == "s3://bucket/some/root/episodes"
    assert loc.delta_options() == {
        "AWS_ACCESS_KEY_ID": "AKIA-one",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "AWS_SESSION_TOKEN": "tok",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-3",
        "aws_conditional_put": "etag",
        **DEFAULT_DELTA_TIMEOUTS,
    }
    anon = resolve("s3://bucket/x", {"anon": True, "client_kwargs": {"endpoint_url": "https://s3.example"}})
    opts = anon.delta_options()
    assert opts["AWS_SKIP_SIGNATURE"] == "true" and opts["AWS_ENDPOINT_URL"] == "https://s3.example"
    assert "AWS_ALLOW_HTTP" not in opts and "AWS_ACCESS_KEY_ID" not in opts


def test_s3_kvstore_keys_go_to_a_private_profile_not_the_environment():
    before = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    spec = resolve("s3://bucket/root", S3_OPTS).kvstore("tensors", "w1", "observation", "camera")
    assert {k: spec[k] for k in ("driver", "bucket", "path", "endpoint", "aws_region")} == {
        "driver": "s3",
        "bucket": "bucket",
        "path": "root/tensors/w1/observation/camera/",
        "endpoint": "http://127.0.0.1:9000",
        "aws_region": "us-east-1",
    }
    cred = spec["aws_credentials"]
    assert cred["type"] == "profile"
    text = Path(cred["credentials_file"]).read_text()
    assert f"[{cred['profile']}]" in text and "aws_access_key_id = AKIA-one" in text and "= s3cr3t" in text
    assert stat.S_IMODE(os.stat(cred["credentials_file"]).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(Path(cred["credentials_file"]).parent).st_mode) == 0o700
    other = resolve("s3://bucket/root", {**S3_OPTS, "key": "AKIA-two"}).kvstore("t")["aws_credentials"]
    assert other["profile"] != cred["profile"] and other["credentials_file"] == cred["credentials_file"]
    both = Path(cred["credentials_file"]).read_text()
    assert "AKIA-one" in both and "AKIA-two" in both  # two key sets coexist in one process
    assert {k: v for k, v in os.environ.items() if k.startswith("AWS_")} == before


def test_s3_kvstore_anonymous_profile_and_default_chain():
    assert resolve("s3://b/r", {"anon": True}).kvstore("x")["aws_credentials"] == {"type": "anonymous"}
    assert resolve("s3://b/r", {"profile": "prod"}).kvstore("x")["aws_credentials"] == {
        "type": "profile",
        "profile": "prod",
    }
    assert "aws_credentials" not in resolve("s3://b/r").kvstore("x")  # TensorStore's default chain


def test_gs_is_mapped():
    loc = resolve("gs://bucket/root", {"token": "/keys/sa.json"})
    retries = {"gcs_request_retries": {"max_retries": 10, "initial_delay": "0.025s", "max_delay": "5.0s"}}
    want = {"driver": "gcs", "bucket": "bucket", "path": "root/tensors/w/", "context": retries}
    assert loc.kvstore("tensors", "w") == want
    assert loc.delta_uri() == "gs://bucket/root/episodes"
    assert loc.delta_options() == {"google_service_account": "/keys/sa.json", **DEFAULT_DELTA_TIMEOUTS}
    assert resolve("gcs://bucket/root").url == "gs://bucket/root"


@pytest.mark.parametrize("url", ["ftp://host/x", "hdfs://nn/x", "az://container/x", "http://example.com/x"])
def test_unsupported_scheme_names_what_is_supported(url):
    with pytest.raises(el.LocationError, match=r"supported: .*s3://.*gs://"):
        resolve(url)


def test_s3_needs_a_bucket():
    with pytest.raises(el.LocationError, match="bucket"):
        resolve("s3://")


_part = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=8)


@settings(max_examples=50, deadline=None)
@given(bucket=_part, root=st.lists(_part, min_size=0, max_size=3), parts=st.lists(_part, min_size=1, max_size=4))
def test_kvstore_paths_join_root_and_parts(bucket, root, parts):
    url = "s3://" + "/".join([bucket, *root])
    spec = resolve(url, {"anon": True}).kvstore(*parts)
    assert spec["bucket"] == bucket
    assert spec["path"] == "/".join([*root, *parts]) + "/"
    assert resolve(url).child_url(*parts) == "s3://" + "/".join([bucket, *root, *parts])
