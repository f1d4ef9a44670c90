"""A TCP proxy that adds a fixed delay to every HTTP request and counts requests and bytes.

Put it in front of the local S3 server (``LatencyProxy(server.endpoint, delay_s=0.03)``)
to read at cloud-like first-byte latency, or with no delay to count what a
client downloads. It runs an asyncio loop on a background thread and listens on
a free port of 127.0.0.1.

Each client connection gets its own upstream connection. The proxy parses
request heads (``METHOD path HTTP/1.1`` up to the blank line, plus a
``Content-Length`` body), holds each request back ``delay_s`` before passing
it on (the delay of a request sent on a keep-alive connection counts from when
it arrived), counts requests, GETs and response bytes sent back, and logs
each request line with its ``Range`` header.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

HEAD_END = b"\r\n\r\n"


class LatencyProxy:
    """``endpoint`` forwards to ``upstream`` (``http://host:port``), delaying each request by ``delay_s``."""

    def __init__(self, upstream: str, delay_s: float = 0.0) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port))
        self.delay_s = delay_s
        self.requests = 0
        self.gets = 0
        self.bytes_down = 0
        self.log: list[tuple[str, str]] = []  # (request line, Range header or "") of every request
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="latency-proxy")
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """``base`` (a server's storage options) pointed at this proxy."""
        return {**base, "endpoint_url": self.endpoint}

    def reset(self) -> None:
        with self._lock:
            self.requests = self.gets = self.bytes_down = 0
            self.log = []

    def __enter__(self) -> LatencyProxy:
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        down = asyncio.ensure_future(self._pipe_down(up_reader, writer))
        try:
            while True:
                head = await reader.readuntil(HEAD_END)
                arrived = self._loop.time()
                body = b""
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        body = await reader.readexactly(int(value.strip()))
                first, _, rest = head.partition(b"\r\n")
                ranges = [
                    v.strip() for n, _, v in (h.partition(b":") for h in rest.split(b"\r\n")) if n.lower() == b"range"
                ]
                with self._lock:
                    self.requests += 1
                    self.gets += head.startswith(b"GET ")
                    self.log.append((first.decode(errors="replace"), ranges[0].decode() if ranges else ""))
                wait = arrived + self.delay_s - self._loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                up_writer.write(head + body)
                await up_writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            up_writer.close()
            down.cancel()
            writer.close()

    async def _pipe_down(self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await up_reader.read(1 << 16):
                with self._lock:
                    self.bytes_down += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
