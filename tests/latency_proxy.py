"""A TCP proxy that adds a fixed delay to every HTTP request and counts requests and bytes.

Put it in front of the local S3 server (``LatencyProxy(server.endpoint, delay_s=0.03)``)
to read at cloud-like first-byte latency, or with no delay to count what a
client downloads. It runs an asyncio loop on a background thread and listens on
a free port of 127.0.0.1.

Each client connection gets its own upstream connection. The proxy parses
request heads (``METHOD path HTTP/1.1`` up to the blank line, plus a
``Content-Length`` or chunked body), holds each request back ``delay_s`` before passing
it on (the delay of a request sent on a keep-alive connection counts from when
it arrived), counts requests, GETs and response bytes sent back, and logs
each request line with its ``Range`` header. :meth:`LatencyProxy.on_request`
is the hook ``fault_proxy.FaultProxy`` uses to answer, drop or lose requests.
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
        self._conns: set[asyncio.StreamWriter] = set()  # client connections open now
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

    def on_request(self, request_line: bytes, head: bytes) -> str | None:
        """What to do with a request: None forwards it. Subclasses (``FaultProxy``) may answer ``"503"`` (a
        ``503 SlowDown`` reply, nothing forwarded), ``"drop"`` (close the connection, nothing forwarded) or
        ``"lose"`` (forward it, then close the connection instead of passing the reply on)."""
        return None

    async def lost_then_down(self) -> None:
        """A ``"lose-down"`` request's reply was lost: subclasses (``FaultProxy``) stop the endpoint here."""

    async def _read_body(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> bytes:
        """The request body: ``Content-Length`` bytes, or a ``Transfer-Encoding: chunked`` body as sent.

        A client that asked ``Expect: 100-continue`` sends its body only after a ``100 Continue``: the proxy
        answers that itself (and forwards the head without the header, see :func:`without_expect`).
        """
        headers = {n.strip().lower(): v.strip() for n, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])}
        if headers.get(b"expect", b"").lower() == b"100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = b""
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0].strip(), 16)
                body += size_line
                if size == 0:  # trailers up to the blank line
                    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                        body += line
                    return body + line
                body += await reader.readexactly(size + 2)
        length = headers.get(b"content-length")
        return await reader.readexactly(int(length)) if length else b""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        state = {"lose": False, "down": False}
        self._conns.add(writer)
        down = asyncio.ensure_future(self._pipe_down(up_reader, writer, state))
        try:
            while True:
                head = await reader.readuntil(HEAD_END)
                arrived = self._loop.time()
                body = await self._read_body(reader, writer, head)
                head = without_expect(head)
                first, _, rest = head.partition(b"\r\n")
                ranges = [
                    v.strip() for n, _, v in (h.partition(b":") for h in rest.split(b"\r\n")) if n.lower() == b"range"
                ]
                with self._lock:
                    self.requests += 1
                    self.gets += head.startswith(b"GET ")
                    self.log.append((first.decode(errors="replace"), ranges[0].decode() if ranges else ""))
                action = self.on_request(first, head)
                if action == "503":
                    writer.write(slow_down(head.startswith(b"HEAD ")))
                    await writer.drain()
                    continue
                if action == "drop":
                    break
                state["lose"] = action in ("lose", "lose-down")
                state["down"] = action == "lose-down"
                wait = arrived + self.delay_s - self._loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                up_writer.write(head + body)
                await up_writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(writer)
            up_writer.close()
            down.cancel()
            writer.close()

    async def _pipe_down(
        self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: dict[str, bool]
    ) -> None:
        try:
            while data := await up_reader.read(1 << 16):
                if state["lose"]:  # the upstream answered; the client never sees it
                    if state["down"]:
                        await self.lost_then_down()
                    break
                with self._lock:
                    self.bytes_down += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def without_expect(head: bytes) -> bytes:
    """A request head without its ``Expect`` header (the proxy already answered it)."""
    lines = head[: -len(HEAD_END)].split(b"\r\n")
    return b"\r\n".join(line for line in lines if not line.lower().startswith(b"expect:")) + HEAD_END


SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


def slow_down(head_only: bool) -> bytes:
    """An S3 ``503 SlowDown`` reply (no body for a HEAD request)."""
    body = b"" if head_only else SLOW_DOWN_BODY
    return (
        b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
