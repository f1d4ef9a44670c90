"""A fault-injecting HTTP proxy for the S3 tests: a :class:`~tests.latency_proxy.LatencyProxy` that misbehaves.

``FaultProxy(server.endpoint, slow_down=0.1)`` answers 10% of requests with
S3's ``503 SlowDown`` (nothing forwarded); ``drop`` closes the connection
instead of forwarding; ``lose`` forwards the request and then closes the
connection instead of passing the reply on (the server did the work, the
client never hears of it). ``match`` limits faults to requests whose request
line contains it (e.g. ``"_delta_log"``). :meth:`FaultProxy.set_down` stops
listening and cuts every open connection (a client then gets "connection
refused", as from a dead server); ``set_down(False)`` listens on the same
port again. :meth:`FaultProxy.fail_next` injects one fault into the next
request whose request line holds every given piece (e.g. ``"PUT"`` and
``"_delta_log/0"``: a commit's log entry). Choices come from a seeded RNG;
:attr:`FaultProxy.injected` counts the faults injected, by kind.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter

from .latency_proxy import LatencyProxy


class FaultProxy(LatencyProxy):
    """Forwards to ``upstream``, injecting the configured fraction of each fault (see the module docstring)."""

    def __init__(
        self,
        upstream: str,
        *,
        slow_down: float = 0.0,
        drop: float = 0.0,
        lose: float = 0.0,
        match: str = "",
        seed: int = 0,
    ) -> None:
        super().__init__(upstream)
        self.slow_down, self.drop, self.lose, self.match = slow_down, drop, lose, match.encode()
        self.injected: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._next: list[tuple[str, tuple[bytes, ...]]] = []
        self.went_down = threading.Event()

    async def lost_then_down(self) -> None:
        await self._set_down(True)
        self.went_down.set()

    def fail_next(self, kind: str, *pieces: str) -> None:
        """Inject ``kind`` into the next request whose line holds every piece: ``"503"``, ``"drop"``, ``"lose"``,
        or ``"lose-down"`` (forwarded, its reply lost, and the endpoint goes down as the reply arrives: the
        request's effect happened, the client hears nothing, and its retries are refused; :attr:`went_down`
        is set then)."""
        with self._lock:
            self._next.append((kind, tuple(p.encode() for p in pieces)))

    def on_request(self, request_line: bytes, head: bytes) -> str | None:
        with self._lock:
            for i, (kind, pieces) in enumerate(self._next):
                if all(p in request_line for p in pieces):
                    del self._next[i]
                    self.injected[kind] += 1
                    return kind
        if self.match and self.match not in request_line:
            return None
        with self._lock:
            x = self._rng.random()
            for kind, p in (("503", self.slow_down), ("drop", self.drop), ("lose", self.lose)):
                if x < p:
                    self.injected[kind] += 1
                    return kind
                x -= p
        return None

    def set_faults(self, *, slow_down: float = 0.0, drop: float = 0.0, lose: float = 0.0) -> None:
        """Change the fault fractions (all of them: unnamed ones become 0)."""
        with self._lock:
            self.slow_down, self.drop, self.lose = slow_down, drop, lose

    def set_down(self, down: bool) -> None:
        """``True``: stop listening and cut every open connection; ``False``: listen on the same port again."""
        asyncio.run_coroutine_threadsafe(self._set_down(down), self._loop).result()

    async def _set_down(self, down: bool) -> None:
        assert self._server is not None
        if down:
            self._server.close()  # new connections are refused from now on
            for writer in list(self._conns):
                writer.transport.abort()  # a reset, not a polite close: the server "died"
            return
        if not self._server.is_serving():
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
