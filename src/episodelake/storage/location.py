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

import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.fs as pafs

from ..core import lifecycle
from ..core.errors import ArgumentError, LocationError
from ..core.mappings import from_mapping
from . import layout
from .diskcache import CacheConfig
from .engine import http_stall_timeout

SUPPORTED = ("local paths", "file://", "memory://", "s3://", "gs://")


def _ram_dir() -> str:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


@dataclass(frozen=True)
class StorageTimeouts:
    """How long object-store requests may wait and how they retry; one policy for TensorStore, deltalake and fsspec.

    Pass it as ``storage_options={"timeouts": StorageTimeouts(...)}`` (or a
    dict of these fields, e.g. from a JSON ``--options``). Times are seconds.

    * ``connect_timeout``: the longest wait for a connection (deltalake, fsspec).
    * ``read_timeout``: the longest a request may go without receiving a byte
      (deltalake's request timeout, fsspec's read timeout, TensorStore's
      low-speed limit: process-wide, set by the first object-store dataset).
    * ``max_retries``, ``initial_delay``, ``max_delay``: retries of a failed
      request (refused connection, reset, 5xx such as ``503 SlowDown``) wait
      ``initial_delay * 2**attempt`` capped at ``max_delay``, plus a random
      jitter (TensorStore: up to ``initial_delay``; deltalake and botocore
      draw the whole delay at random), so transient errors cost tens of
      milliseconds, not seconds.
    * ``deadline``: the longest one call waits for a request and its retries
      (deltalake's ``retry_timeout``; TensorStore operations are abandoned
      after it plus one second per MiB they transfer);
      then the call raises :class:`~episodelake.errors.StorageError`.

    With the defaults a dead endpoint fails a call after about 16 s of
    retries (TensorStore, deltalake) and at most :attr:`deadline` (60 s).
    """

    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    max_retries: int = 10
    initial_delay: float = 0.025
    max_delay: float = 5.0
    deadline: float = 60.0

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "read_timeout", "initial_delay", "max_delay", "deadline"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ArgumentError(f"StorageTimeouts.{name} must be a number of seconds > 0, got {value!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ArgumentError(f"StorageTimeouts.max_retries must be an int >= 0, got {self.max_retries!r}")
        if self.max_delay < self.initial_delay:
            raise ArgumentError(
                f"StorageTimeouts.max_delay ({self.max_delay}) must be >= initial_delay ({self.initial_delay})"
            )

    @classmethod
    def parse(cls, value: Any) -> StorageTimeouts:
        """``value`` (None: the defaults, a :class:`StorageTimeouts`, or a dict of its fields) as a policy."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return from_mapping(cls, value, "timeouts")
        raise ArgumentError(f"timeouts must be a StorageTimeouts or a dict of its fields, got {value!r}")

    def transfer_deadline(self, nbytes: int) -> float:
        """Seconds a TensorStore transfer of ``nbytes`` may take: :attr:`deadline` plus one second per MiB."""
        return self.deadline + nbytes / (1 << 20)

    def tensorstore_retries(self) -> dict[str, Any]:
        """TensorStore's ``s3_request_retries``/``gcs_request_retries`` context resource."""
        return {
            "max_retries": self.max_retries,
            "initial_delay": f"{self.initial_delay}s",
            "max_delay": f"{self.max_delay}s",
        }

    def delta_options(self) -> dict[str, str]:
        """deltalake (object_store) client and retry options.

        ``max_retries`` is left out: Polars reads the same ``storage_options`` and takes that key as its own
        (an int, refusing deltalake's string form), so object_store keeps its own count (10) and stops at
        ``retry_timeout`` (the deadline) first.
        """
        return {
            "connect_timeout": f"{self.connect_timeout}s",
            "timeout": f"{self.read_timeout}s",
            "retry_timeout": f"{self.deadline}s",
            "backoff_config.init_backoff": f"{self.initial_delay}s",
            "backoff_config.max_backoff": f"{self.max_delay}s",
            "backoff_config.base": "2",
        }

    def botocore_config(self) -> dict[str, Any]:
        """``config_kwargs`` for s3fs (botocore): timeouts and as many retries as fit in :attr:`deadline`.

        botocore's own backoff (random up to ``2**attempt`` s, at most 20 s) is
        not configurable, so the retry count is the largest whose longest total
        wait stays within the deadline (and within ``max_retries``).
        """
        retries, waited = 0, 0.0
        while retries < self.max_retries and waited + min(2.0**retries, 20.0) <= self.deadline:
            waited += min(2.0**retries, 20.0)
            retries += 1
        return {
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "retries": {"max_attempts": retries + 1, "mode": "standard"},
        }


@dataclass
class Location:
    """A resolved dataset root. Build with :func:`resolve`."""

    url: str
    protocol: str
    path: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    ephemeral: bool = False
    timeouts: StorageTimeouts = field(default_factory=StorageTimeouts)
    # where reads of this dataset's immutable objects are cached (object stores; set by Store.open)
    read_cache: CacheConfig | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        # storage_options hold credentials: a repr (logs, tracebacks, notebooks) shows them redacted
        return (
            f"Location(url={self.url!r}, protocol={self.protocol!r}, path={self.path!r}, "
            f"storage_options={redact(self.storage_options)!r}, ephemeral={self.ephemeral!r}, "
            f"timeouts={self.timeouts!r})"
        )

    @property
    def is_local(self) -> bool:
        return self.protocol == "file"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self.is_local:
            return fsspec.filesystem("file")
        # Other processes write the same root: a cached listing would hide their files.
        opts: dict[str, Any] = {"use_listings_cache": False, **self.storage_options}
        if self.protocol == "s3":  # bounded waits; the caller's own botocore settings win
            opts["config_kwargs"] = {**self.timeouts.botocore_config(), **opts.get("config_kwargs", {})}
        return fsspec.filesystem(self.protocol, **opts)

    def child(self, *parts: str) -> str:
        """Path (filesystem form, no scheme) of a file under the root."""
        return "/".join([self.path.rstrip("/"), *parts])

    def child_url(self, *parts: str) -> str:
        if self.is_local:
            return self.child(*parts)
        return f"{self.protocol}://" + self.child(*parts)

    @property
    def endpoint(self) -> str:
        """The object store's endpoint as given (``endpoint_url``), the provider's default named, "" on local disk."""
        if self.is_local:
            return ""
        return _endpoint(self.storage_options) or f"the default {self.protocol}:// endpoint"

    def delta_uri(self) -> str:
        return self.child_url(*layout.table_parts())

    def delta_options(self) -> dict[str, str] | None:
        if self.is_local:
            return None
        if self.protocol == "s3":
            return {**self.timeouts.delta_options(), **_s3_delta_options(self.storage_options)}
        if self.protocol == "gs":
            return {**self.timeouts.delta_options(), **_gs_delta_options(self.storage_options)}
        raise LocationError(f"no Delta mapping for {self.protocol}://")

    def arrow_filesystem(self, *parts: str) -> pafs.FileSystem:
        """A pyarrow filesystem rooted at a directory under the root.

        Handing this to deltalake's ``to_pyarrow_dataset`` keeps Parquet reads
        in pyarrow; deltalake's own Rust-backed handler can abort the
        interpreter at exit ("terminate called without an active exception").
        """
        if self.is_local:
            return pafs.SubTreeFileSystem(self.child(*parts), pafs.LocalFileSystem())
        return pafs.SubTreeFileSystem(self.child(*parts), pafs.PyFileSystem(pafs.FSSpecHandler(self.fs)))

    def kvstore(self, *parts: str) -> dict[str, Any]:
        """TensorStore kvstore spec for a directory under the root."""
        sub = self.child(*parts).rstrip("/") + "/"
        if self.is_local:
            return {"driver": "file", "path": sub}
        bucket, _, key = sub.partition("/")
        http_stall_timeout(self.timeouts.read_timeout)
        if self.protocol == "s3":
            spec = _s3_kvstore(bucket, key, self.storage_options)
            spec["context"] = {"s3_request_retries": self.timeouts.tensorstore_retries()}
            return spec
        if self.protocol == "gs":
            retries = {"gcs_request_retries": self.timeouts.tensorstore_retries()}
            return {"driver": "gcs", "bucket": bucket, "path": key, "context": retries}
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
            tmp = layout.temp_name(target)
            with open(tmp, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        else:  # object stores replace whole objects atomically
            with self.fs.open(target, "w") as fh:
                fh.write(text)


# storage option names whose values are credentials (s3fs, gcsfs, adlfs, botocore and deltalake spellings)
SECRET_WORDS = ("key", "secret", "token", "password", "credential", "sas", "auth")
REDACTED = "***"


def redact(options: Any) -> Any:
    """``options`` with every credential value replaced by ``"***"`` (nested mappings and lists too).

    A value is a credential when its option name contains one of
    :data:`SECRET_WORDS` (``key``, ``secret``, ``token``, ...), whatever its
    case; endpoints, regions and flags stay readable.
    """
    if isinstance(options, dict):
        return {
            k: REDACTED if _is_secret_name(k) and v not in (None, "", False) else redact(v) for k, v in options.items()
        }
    if isinstance(options, list | tuple):
        return type(options)(redact(v) for v in options)
    return options


def _is_secret_name(name: Any) -> bool:
    lowered = str(name).lower()
    return any(word in lowered for word in SECRET_WORDS)


def public_url(url: str) -> str:
    """``url`` without any ``user:password@`` part (what a state, log line or error may name)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{tail}"


def _endpoint(opts: dict[str, Any]) -> str | None:
    endpoint = opts.get("endpoint_url") or opts.get("client_kwargs", {}).get("endpoint_url")
    return str(endpoint) if endpoint else None


def _region(opts: dict[str, Any]) -> str:
    return str(opts.get("client_kwargs", {}).get("region_name") or "us-east-1")


def _s3_delta_options(opts: dict[str, Any]) -> dict[str, str]:
    """deltalake (object_store) options for s3fs-style ``storage_options``."""
    out: dict[str, str] = {"AWS_REGION": _region(opts)}
    for src, dst in (("key", "AWS_ACCESS_KEY_ID"), ("secret", "AWS_SECRET_ACCESS_KEY"), ("token", "AWS_SESSION_TOKEN")):
        if opts.get(src):
            out[dst] = str(opts[src])
    if opts.get("profile"):
        out["AWS_PROFILE"] = str(opts["profile"])
    endpoint = _endpoint(opts)
    if endpoint:
        out["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    if opts.get("anon"):
        out["AWS_SKIP_SIGNATURE"] = "true"
    # Commits create the next log entry with a conditional PUT (If-None-Match):
    # exactly one concurrent writer wins each version, no lock service needed.
    out["aws_conditional_put"] = "etag"
    return out


def _s3_kvstore(bucket: str, key: str, opts: dict[str, Any]) -> dict[str, Any]:
    """TensorStore ``s3`` kvstore spec for s3fs-style ``storage_options``."""
    spec: dict[str, Any] = {"driver": "s3", "bucket": bucket, "path": key, "aws_region": _region(opts)}
    endpoint = _endpoint(opts)
    if endpoint:
        spec["endpoint"] = endpoint
    if opts.get("anon"):
        spec["aws_credentials"] = {"type": "anonymous"}
    elif opts.get("key"):
        spec["aws_credentials"] = _CREDENTIALS.profile_spec(
            str(opts["key"]), str(opts.get("secret", "")), opts.get("token")
        )
    elif opts.get("profile"):
        spec["aws_credentials"] = {"type": "profile", "profile": str(opts["profile"])}
    return spec  # no credentials given: TensorStore's default chain (env, ~/.aws, instance metadata)


class _CredentialFiles:
    """Explicit S3 keys for TensorStore, which has no inline-key credential type.

    TensorStore's credential types are default/anonymous/environment/imds/
    profile/ecs. Rather than writing keys into ``os.environ`` (process-global:
    two datasets with different keys would clash), each distinct key set
    becomes a profile in a private credentials file (directory 0700, file
    0600) that only this process's specs reference. The directory is removed
    when the creating process exits (not by forked children).
    """

    def __init__(self) -> None:
        self._dir: str | None = None
        self._owner = 0
        self._profiles: dict[str, tuple[str, str, str | None]] = {}
        self._lock = threading.Lock()

    def profile_spec(self, key: str, secret: str, token: str | None) -> dict[str, Any]:
        name = "el-" + hashlib.sha256(f"{key}\0{secret}\0{token}".encode()).hexdigest()[:16]
        with self._lock:
            if self._dir is None or not os.path.isdir(self._dir):
                self._dir = tempfile.mkdtemp(prefix="episodelake-aws-", dir=_ram_dir())
                self._owner = os.getpid()
                self._profiles = {}
                lifecycle.on_exit("temp dirs", functools.partial(self._remove, self._dir, self._owner))
            if name not in self._profiles:
                self._profiles[name] = (key, secret, token)
                self._write()
            assert self._dir is not None
            return {
                "type": "profile",
                "profile": name,
                "credentials_file": os.path.join(self._dir, "credentials"),
                "config_file": os.path.join(self._dir, "config"),
            }

    def _write(self) -> None:
        assert self._dir is not None
        lines = []
        for name, (key, secret, token) in self._profiles.items():
            lines += [f"[{name}]", f"aws_access_key_id = {key}", f"aws_secret_access_key = {secret}"]
            if token:
                lines.append(f"aws_session_token = {token}")
        for fname, text in (("credentials", "\n".join(lines) + "\n"), ("config", "")):
            tmp = os.path.join(self._dir, f".{fname}.{uuid.uuid4().hex}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.replace(tmp, os.path.join(self._dir, fname))

    @staticmethod
    def _remove(path: str, owner: int) -> None:
        if os.getpid() == owner:
            shutil.rmtree(path, ignore_errors=True)


_CREDENTIALS = _CredentialFiles()


def _gs_delta_options(opts: dict[str, Any]) -> dict[str, str]:
    """deltalake options for gcsfs-style ``storage_options`` (``token``: key file path or dict)."""
    out: dict[str, str] = {}
    token = opts.get("token")
    if isinstance(token, dict):
        out["google_service_account_key"] = json.dumps(token)
    elif isinstance(token, str) and token not in ("google_default", "cloud", "anon"):
        out["google_service_account"] = token
    if token == "anon":
        out["google_skip_signature"] = "true"
    return out


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


_EPHEMERAL: weakref.WeakValueDictionary[str, Location] = weakref.WeakValueDictionary()


def resolve(url: str | os.PathLike[str] | None, storage_options: dict[str, Any] | None = None) -> Location:
    """Resolve ``url`` (+ fsspec-style ``storage_options``) into a :class:`Location`.

    Supported: local paths, ``file://``, ``memory://[name]`` (or None), ``s3://``
    and ``gs://``. Anything else raises :class:`LocationError` naming them.
    ``storage_options["timeouts"]`` (a :class:`StorageTimeouts` or a dict of
    its fields) bounds object-store waits; local datasets ignore it.
    """
    opts = dict(storage_options or {})
    timeouts = StorageTimeouts.parse(opts.pop("timeouts", None))
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
        path = rest.rstrip("/")
        return Location(url=f"s3://{path}", protocol="s3", path=path, storage_options=opts, timeouts=timeouts)
    if scheme in ("gs", "gcs"):
        path = rest.rstrip("/")
        return Location(url=f"gs://{path}", protocol="gs", path=path, storage_options=opts, timeouts=timeouts)
    raise LocationError(f"unsupported location {url!r}; supported: {', '.join(SUPPORTED)}")
