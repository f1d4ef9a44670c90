"""Credentials never appear in a state, a repr, a log line, a warning, an error message or CLI output."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import traceback
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
from hypothesis import example, given
from hypothesis import strategies as st

import episodelake as el
from episodelake.lineage import describe
from episodelake.storage.arrays import array_parts, tensor_writers
from episodelake.storage.location import REDACTED, redact, resolve
from episodelake.storage.table import EpisodeTable

from .conftest import robot_schema
from .reference import random_episode
from .s3server import SECRET_KEY

ROOT = Path(__file__).resolve().parents[1]
# a wrong secret only this test knows: any output holding it echoed the options it was given
WRONG = f"wr0ng-S3CRET-{uuid.uuid4().hex}"


def test_location_repr_redacts_credentials():
    opts = {
        "key": "AKIAEXAMPLE",
        "secret": "s3cr3t-value",
        "token": "session-tok",
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1", "aws_secret_access_key": "nested-s3cr3t"},
    }
    loc = resolve("s3://bucket/data", opts)
    text = repr(loc) + str(loc)
    for secret in ("AKIAEXAMPLE", "s3cr3t-value", "session-tok", "nested-s3cr3t"):
        assert secret not in text
    assert "http://127.0.0.1:9000" in text and "eu-west-1" in text and "s3://bucket/data" in text
    assert loc.storage_options["secret"] == "s3cr3t-value"  # redaction is for display only
    gs = resolve("gs://bucket/data", {"token": {"private_key": "-----BEGIN PRIVATE KEY-----abc"}, "project": "p"})
    assert "PRIVATE" not in repr(gs) and "'project': 'p'" in repr(gs)


names = st.text(min_size=1, max_size=12)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=10,
)


@given(st.dictionaries(names, values, max_size=5))
@example({"0": {"SAS": True}})  # hypothesis found it in a CI-like run: "sas" was missing from the reference
def test_redact_hides_every_value_under_a_credential_name(options):
    def walk(original, shown):
        if isinstance(original, dict):
            assert set(shown) == set(original)
            for k, v in original.items():
                words = ("key", "secret", "token", "password", "credential", "sas", "auth")  # adlfs: sas_token
                secret = any(w in k.lower() for w in words)
                if secret and v not in (None, "", False):
                    assert shown[k] == REDACTED
                else:
                    walk(v, shown[k])
        elif isinstance(original, list):
            for a, b in zip(original, shown, strict=True):
                walk(a, b)
        else:
            assert shown == original

    walk(options, redact(options))


def _failure(fn) -> str:
    """The full traceback text (chained causes included) of ``fn()``, which must raise."""
    try:
        fn()
    except Exception as exc:  # every failure's text is what is checked
        return "".join(traceback.format_exception(exc)) + repr(exc)
    raise AssertionError(f"{fn} did not fail")


def _cli(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "episodelake.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )
    return f"{done.returncode}\n{done.stdout}\n{done.stderr}"


@pytest.mark.slow
def test_no_output_holds_a_secret_on_s3(s3_server, s3_url, tmp_path, caplog):
    opts = s3_server.storage_options
    assert opts["secret"] == SECRET_KEY
    wrong = {**opts, "secret": WRONG}
    outputs: dict[str, str] = {}
    caplog.set_level(logging.DEBUG)  # botocore, s3fs, fsspec and our own loggers at their chattiest
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = el.Dataset.create(robot_schema(), s3_url, storage_options=opts, partition_by=["task"])
        rng = np.random.default_rng(0)
        ds.append_episodes(random_episode(rng, 6).as_dict(unwrap_action=True) for _ in range(4))
        ds.flush()
        view = ds.where("length > ?", [2])
        stream = view.segment_stream(2, batch_size=2, seed=1)
        next(stream)
        state_file = tmp_path / "state.json"
        el.save_state(stream.state_dict(), state_file)
        resumed = el.stream_from_state(state_file, storage_options=opts)
        assert resumed.state_dict()["lineage"] == stream.state_dict()["lineage"]
        outputs["reprs"] = " ".join(map(repr, (ds.location, ds, view, stream, resumed, ds.changes(0))))
        outputs["state file"] = state_file.read_text()
        outputs["lineage"] = describe(el.load_state(state_file))
        outputs["history"] = json.dumps(ds.history(), default=str)

        # deliberately failing calls: a wrong secret, a wrong key, a wrong bucket, each engine
        writer = tensor_writers(ds.location)[0]
        camera = ds.schema["observation/camera"]
        bad = resolve(s3_url, wrong)
        outputs["fsspec wrong secret"] = _failure(lambda: el.Dataset.open(s3_url, storage_options=wrong))
        outputs["fsspec wrong key"] = _failure(
            lambda: el.Dataset.open(s3_url, storage_options={**wrong, "key": "nobody"})
        )
        outputs["wrong bucket"] = _failure(lambda: el.Dataset.open("s3://no-such-bucket/x", storage_options=opts))
        outputs["create wrong secret"] = _failure(
            lambda: el.Dataset.create(robot_schema(), s3_url + "-2", storage_options=wrong)
        )
        outputs["deltalake wrong secret"] = _failure(lambda: EpisodeTable.open(bad))
        outputs["deltalake wrong bucket"] = _failure(lambda: EpisodeTable.open(resolve("s3://no-such-bucket/x", wrong)))
        kvstore = bad.kvstore(*array_parts(writer, camera, 1))
        outputs["tensorstore wrong secret"] = _failure(
            lambda: ts.open({"driver": "zarr3", "kvstore": kvstore}, read=True).result()
        )
        outputs["tensorstore spec"] = json.dumps(kvstore)
        outputs["resume wrong secret"] = _failure(lambda: el.stream_from_state(state_file, storage_options=wrong))
    outputs["warnings"] = "\n".join(str(w.message) for w in caught)
    outputs["logs"] = caplog.text
    assert caplog.records, "nothing was logged: the log check would prove nothing"
    outputs["cli lineage"] = _cli("lineage", str(state_file))
    outputs["cli lineage json"] = _cli("lineage", str(state_file), "--json")
    outputs["cli info"] = _cli("info", s3_url, "--options", json.dumps(opts))
    outputs["cli info wrong secret"] = _cli("info", s3_url, "--options", json.dumps(wrong))
    outputs["cli sql debug"] = _cli("--debug", "sql", s3_url, "SELECT 1", "--options", json.dumps(wrong))
    assert outputs["cli info"].startswith("0\n") and s3_url in outputs["cli info"]
    assert outputs["cli info wrong secret"].startswith("1\n")
    for what, text in outputs.items():
        assert SECRET_KEY not in text, f"the secret appears in {what}"
        assert WRONG not in text, f"the given (wrong) secret appears in {what}"


@pytest.mark.parametrize("url", ["s3://bucket/ds", "gs://bucket/ds", "/tmp/local-ds"])
def test_lineage_url_never_carries_credentials(url):
    from episodelake.storage.location import public_url

    assert public_url(url) == url
    assert public_url("s3://user:pa55word@bucket/ds") == "s3://bucket/ds"
