"""Resolve a dataset root (path or URL + fsspec-style storage options) for each engine.

One :class:`Location` answers three questions: which fsspec filesystem reaches
small files (descriptor, listing, copying, deleting), which URI and options
deltalake needs for the episode table, and which TensorStore kvstore spec
reaches a tensor array.

``None`` or ``memory://name`` means an in-memory dataset. deltalake's
``memory://`` store is private to one table object and TensorStore's ``memory``
kvstore to one process, so neither survives a reopen nor reaches DataLoader
workers; an in-memory dataset therefore lives in a private directory on the
RAM-backed tmpfs (``/dev/shm`` where present), removed when the last
:class:`Location` for it is garbage-collected.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from .errors import LocationError

SUPPORTED = ("local paths", "file://", "memory://", "s3://", "gs://")


def _ram_dir() -> str:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


@dataclass
class Location:
    """A resolved dataset root. Build with :func:`resolve`."""

    url: str
    protocol: str
    path: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    ephemeral: bool = False

    @property
    def is_local(self) -> bool:
        return self.protocol == "file"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self.is_local:
            return fsspec.filesystem("file")
        return fsspec.filesystem(self.protocol, **self.storage_options)

    def child(self, *parts: str) -> str:
        """Path (filesystem form, no scheme) of a file under the root."""
        return "/".join([self.path.rstrip("/"), *parts])

    def child_url(self, *parts: str) -> str:
        if self.is_local:
            return self.child(*parts)
        return f"{self.protocol}://" + self.child(*parts)

    def delta_uri(self) -> str:
        return self.child_url("episodes")

    def delta_options(self) -> dict[str, str] | None:
        if self.is_local:
            return None
        if self.protocol == "s3":
            return _s3_delta_options(self.storage_options)
        if self.protocol == "gs":
            return {k: str(v) for k, v in self.storage_options.items()}
        raise LocationError(f"no Delta mapping for {self.protocol}://")

    def kvstore(self, *parts: str) -> dict[str, Any]:
        """TensorStore kvstore spec for a directory under the root."""
        sub = self.child(*parts).rstrip("/") + "/"
        if self.is_local:
            return {"driver": "file", "path": sub}
        bucket, _, key = sub.partition("/")
        if self.protocol == "s3":
            return _s3_kvstore(bucket, key, self.storage_options)
        if self.protocol == "gs":
            return {"driver": "gcs", "bucket": bucket, "path": key}
        raise LocationError(f"no TensorStore mapping for {self.protocol}://")

    def exists(self, *parts: str) -> bool:
        return self.fs.exists(self.child(*parts))

    def read_text(self, *parts: str) -> str:
        with self.fs.open(self.child(*parts), "r") as fh:
            return fh.read()

    def write_text_atomic(self, text: str, *parts: str) -> None:
        """Write a small file so readers see the old or the new content, never half."""
        target = self.child(*parts)
        if self.is_local:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            tmp = f"{target}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        else:  # object stores replace whole objects atomically
            with self.fs.open(target, "w") as fh:
                fh.write(text)


def _s3_delta_options(opts: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    if "key" in opts:
        out["AWS_ACCESS_KEY_ID"] = str(opts["key"])
    if "secret" in opts:
        out["AWS_SECRET_ACCESS_KEY"] = str(opts["secret"])
    if "token" in opts:
        out["AWS_SESSION_TOKEN"] = str(opts["token"])
    endpoint = opts.get("endpoint_url") or opts.get("client_kwargs", {}).get("endpoint_url")
    if endpoint:
        out["AWS_ENDPOINT_URL"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    region = opts.get("client_kwargs", {}).get("region_name") or opts.get("region")
    out["AWS_REGION"] = str(region or "us-east-1")
    if opts.get("anon"):
        out["AWS_SKIP_SIGNATURE"] = "true"
    # Delta on S3 commits with conditional PUT (If-None-Match): no lock service.
    out["aws_conditional_put"] = "etag"
    out.setdefault("AWS_S3_ALLOW_UNSAFE_RENAME", "false")
    return out


def _s3_kvstore(bucket: str, key: str, opts: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": "s3", "bucket": bucket, "path": key}
    endpoint = opts.get("endpoint_url") or opts.get("client_kwargs", {}).get("endpoint_url")
    if endpoint:
        spec["endpoint"] = str(endpoint)
    region = opts.get("client_kwargs", {}).get("region_name") or opts.get("region")
    spec["aws_region"] = str(region or "us-east-1")
    if opts.get("anon"):
        spec["aws_credentials"] = {"type": "anonymous"}
    elif "key" in opts:
        # TensorStore reads explicit keys from the environment credential provider.
        os.environ.setdefault("AWS_ACCESS_KEY_ID", str(opts["key"]))
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", str(opts.get("secret", "")))
        if "token" in opts:
            os.environ.setdefault("AWS_SESSION_TOKEN", str(opts["token"]))
        spec["aws_credentials"] = {"type": "environment"}
    return spec


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


_EPHEMERAL: weakref.WeakValueDictionary[str, Location] = weakref.WeakValueDictionary()


def resolve(url: str | os.PathLike[str] | None, storage_options: dict[str, Any] | None = None) -> Location:
    """Resolve ``url`` (+ fsspec-style ``storage_options``) into a :class:`Location`.

    Supported: local paths, ``file://``, ``memory://[name]`` (or None), ``s3://``
    and ``gs://``. Anything else raises :class:`LocationError` naming them.
    """
    opts = dict(storage_options or {})
    if url is None or str(url) == "memory://":
        url = f"memory://{uuid.uuid4().hex}"
    url = os.fspath(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return Location(url=str(Path(url).absolute()), protocol="file", path=str(Path(url).absolute()))
    scheme = scheme.lower()
    if scheme == "file":
        path = str(Path(rest).absolute())
        return Location(url=path, protocol="file", path=path)
    if scheme == "memory":
        name = rest.strip("/") or uuid.uuid4().hex
        existing = _EPHEMERAL.get(name)
        if existing is not None:
            return existing
        path = os.path.join(_ram_dir(), f"episodelake-{os.getpid()}-{name}")
        loc = Location(url=f"memory://{name}", protocol="file", path=path, ephemeral=True)
        weakref.finalize(loc, _remove_tree, path)
        _EPHEMERAL[name] = loc
        return loc
    if scheme in ("s3", "s3a"):
        if not rest.strip("/"):
            raise LocationError(f"{url!r}: an s3:// URL needs a bucket")
        return Location(url=f"s3://{rest.rstrip('/')}", protocol="s3", path=rest.rstrip("/"), storage_options=opts)
    if scheme in ("gs", "gcs"):
        return Location(url=f"gs://{rest.rstrip('/')}", protocol="gs", path=rest.rstrip("/"), storage_options=opts)
    raise LocationError(f"unsupported location {url!r}; supported: {', '.join(SUPPORTED)}")
