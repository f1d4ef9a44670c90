"""The viewer's data and its HTTP server: a read-only web app over one dataset or view.

:class:`Viewer` answers the pages through the façade's public read API only
(``where()``, sandboxed ``sql()``, ``episode(id=).read()``, ``stats()``,
``history()``, ``schema``); :class:`ViewerServer` (the standard library's
``ThreadingHTTPServer``) serves them. Security rules (docs/viewer.md), held by
tests/test_viewer.py and tests/test_viewer_security.py:

- bound to ``127.0.0.1`` unless told otherwise;
- only requests whose ``Host`` header names the address served (``127.0.0.1``,
  ``localhost``, ``[::1]``, the host it was started on, each with its port)
  are answered, so a web page that rebinds its own name to this machine
  (DNS rebinding) gets 403, never the dataset;
- every response forbids framing (``X-Frame-Options: DENY``, CSP
  ``frame-ancestors 'none'``), loads nothing but the server's own assets
  (``Content-Security-Policy``: no inline script or style), and sends
  ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer`` and
  ``Cross-Origin-Resource-Policy: same-origin``; no CORS header is ever sent;
- what costs work (a ``where`` query, a video, the histograms) is refused
  (403) to requests another site started: ``Sec-Fetch-Site`` ``cross-site``
  or ``same-site``, or an ``Origin`` that is not the served one;
- GET and HEAD only: nothing the server does writes to the dataset (it is
  opened ``read_only=True`` by the command line);
- files served are the static assets listed at start and the videos it
  encoded itself, by name: no path from a request reaches the file system;
- the filter is ``where()``'s predicate (one SQL expression, run sandboxed:
  it reads nothing but the dataset's views); each request's queries have a
  time limit (``query_timeout``, default :data:`QUERY_TIMEOUT_S`) and are
  cancelled when its client disconnects; sort columns are checked against
  the episode columns, page numbers and ids are integers in range (else 400/404);
- a bad request gets a page with one message, never a traceback.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import re
import select
import socket
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from html import escape
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

import numpy as np

from ..core.errors import ArgumentError, EpisodeLakeError
from ..dataset import Dataset
from ..exporters.lerobot import is_camera
from ..exporters.rrd import episode_columns, episode_row, is_series, quoted
from ..storage.sql import QueryLimits, query_limits
from . import pages
from .video import MIME, VideoCache, hwc_frames

if TYPE_CHECKING:
    from ..core.segments import Segment
    from ..dataset import DatasetView

PAGE_SIZE = 50
DEFAULT_FPS = 10.0
QUERY_TIMEOUT_S = 5.0  # each sandboxed query of a request (the filter, a page): a few seconds, then it is cancelled
INT64 = (-(2**63), 2**63 - 1)
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; media-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class BadRequest(EpisodeLakeError):
    """A request the viewer cannot answer: its message is shown on the page, with ``status``."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def _plain(value: Any) -> Any:
    """A table value as JSON-able Python: finite floats, lists, strings for the rest."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


class Viewer:
    """What the pages show, for ``collection`` (a Dataset or a view) and a filter predicate per request.

    ``where`` (optional) is the filter a page opens with. Filtered views,
    read episodes and videos are kept (a few of each, least recently used out),
    so paging through a filter runs ``where()`` once and a video is encoded
    once per episode and field. ``fps`` (default: the dataset's
    ``info["fps"]``, else 10) sets the videos' frame rate. ``query_timeout``:
    the time limit, in seconds, of each sandboxed query a request runs (0 or
    None: none); a bad value is an ArgumentError.
    """

    def __init__(
        self,
        collection: Dataset | DatasetView,
        where: str | None = None,
        fps: float | None = None,
        query_timeout: float | None = QUERY_TIMEOUT_S,
    ) -> None:
        with query_limits(query_timeout):  # checks the value
            pass
        self.query_timeout = query_timeout
        self.collection = collection
        self.dataset = collection if isinstance(collection, Dataset) else collection.dataset
        self.default_where = where or ""
        info_fps = self.dataset.info.get("fps")
        self.fps = float(fps or (info_fps if isinstance(info_fps, int | float) and info_fps > 0 else DEFAULT_FPS))
        schema = collection.schema
        self.cameras = [f.key for f in schema.step_fields if is_camera(f)]
        self.plotted = [f.key for f in schema.step_fields if is_series(f)]
        self.columns = episode_columns(collection)
        self.videos = VideoCache(self.fps)
        self._views: OrderedDict[str, Dataset | DatasetView] = OrderedDict()
        self._segments: OrderedDict[int, Segment] = OrderedDict()
        self._histograms: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()
        if where:
            with self.limits():
                self.filtered(where)  # a bad start filter fails here, before anything is served

    def limits(self) -> contextlib.AbstractContextManager[QueryLimits]:
        """The time limit of the sandboxed queries run in this block (this thread): ``query_timeout``."""
        return query_limits(self.query_timeout, "the viewer's query time limit, --query-timeout")

    @staticmethod
    def _kept(cache: OrderedDict, key: Any, make: Callable[[], Any], lock: threading.Lock, size: int = 8) -> Any:
        with lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        value = make()
        with lock:
            cache[key] = value
            while len(cache) > size:
                cache.popitem(last=False)
        return value

    def filtered(self, where: str) -> Dataset | DatasetView:
        """The episodes matching ``where`` (all of them for an empty one); a bad predicate is a QueryError."""
        if not where.strip():
            return self.collection
        return self._kept(self._views, where, lambda: self.collection.where(where), self._lock)

    # ---- the episode list
    def _order(self, sort: str, desc: bool) -> str:
        """The list's ``ORDER BY`` terms: ``sort`` (checked against the columns), ties by episode id."""
        if sort not in self.columns:
            raise BadRequest(f"cannot sort by {sort!r}: the columns are {self.columns}")
        order = f"{quoted([sort])} {'DESC' if desc else 'ASC'} NULLS LAST"
        return order if sort == "episode_id" else order + ", episode_id"

    def list_page(self, where: str, sort: str, desc: bool, page: int) -> dict[str, Any]:
        """One page of the episode list: ``columns``, ``rows`` (lists), ``count``, ``page``, ``pages``, ``offset``.

        ``page`` counts from 1, as the page shows it; one outside ``1..pages`` is a 404.
        """
        order = self._order(sort, desc)
        view = self.filtered(where)
        count = len(view)
        pages_ = max(1, math.ceil(count / PAGE_SIZE))
        if page < 1 or page > pages_:
            raise BadRequest(f"page {page} is outside 1..{pages_}", HTTPStatus.NOT_FOUND)
        offset = (page - 1) * PAGE_SIZE
        query = f"SELECT {quoted(self.columns)} FROM episodes ORDER BY {order} LIMIT {PAGE_SIZE} OFFSET {offset}"
        result = view.sql(query, sandbox=True)
        rows = result.fetchall() if result is not None else []
        return {
            "columns": self.columns,
            "rows": [[_plain(v) for v in r] for r in rows],
            "count": count,
            "total": len(self.collection),
            "page": page,
            "pages": pages_,
            "offset": offset,
        }

    # ---- one episode
    def _segment(self, view: Dataset | DatasetView, episode_id: int) -> Segment:
        return self._kept(self._segments, episode_id, lambda: view.episode(id=episode_id).read(), self._lock, 4)

    def neighbours(self, view: Dataset | DatasetView, episode_id: int, sort: str, desc: bool) -> dict[str, Any]:
        """Where episode ``episode_id`` stands in the list of ``view`` sorted by ``sort``: ``index`` (from 0),
        ``prev`` and ``next`` (episode ids, None at either end), as the list pages order it."""
        query = (
            f"WITH ordered AS (SELECT episode_id, row_number() OVER (ORDER BY {self._order(sort, desc)}) AS n "
            "FROM episodes), here AS (SELECT n FROM ordered WHERE episode_id = $id) "
            "SELECT ordered.episode_id, ordered.n FROM ordered, here "
            "WHERE ordered.n BETWEEN here.n - 1 AND here.n + 1 ORDER BY ordered.n"
        )
        result = view.sql(query, {"id": episode_id}, sandbox=True)
        rows = result.fetchall() if result is not None else []
        at = next(int(n) for eid, n in rows if eid == episode_id)
        around = {int(n): int(eid) for eid, n in rows}
        return {"index": at - 1, "prev": around.get(at - 1), "next": around.get(at + 1)}

    def episode_page(self, where: str, episode_id: int, sort: str = "episode_id", desc: bool = False) -> dict[str, Any]:
        """An episode's columns, plots (per-step values), cameras, and its place in the list of ``where`` sorted
        by ``sort`` (``index`` from 0, ``count``, the ``prev``/``next`` episode ids in that order)."""
        self._order(sort, desc)  # a bad sort column is a 400 before anything is read
        view = self.filtered(where)
        if not INT64[0] <= episode_id <= INT64[1]:
            raise BadRequest(f"no episode with id {episode_id}", HTTPStatus.NOT_FOUND)
        try:
            ep = view.episode(id=episode_id)
        except KeyError:
            within = f" matching {where!r}" if where.strip() else ""
            raise BadRequest(f"no episode with id {episode_id}{within}", HTTPStatus.NOT_FOUND) from None
        seg = self._segment(view, episode_id)
        place = self.neighbours(view, episode_id, sort, desc)
        plots = {}
        for key in self.plotted:
            values = np.asarray(seg.data[key], dtype=np.float64).reshape(len(seg.data[key]), -1)
            plots[key] = _plain(values.T)  # channels, then steps
        # observations have length + 1 rows (the last one after the last step): the frames the player steps through
        frames = max([len(seg.data[k]) for k in (*self.cameras, *self.plotted)] or [ep.length])
        return {
            "episode_id": episode_id,
            "length": ep.length,
            "terminated": ep.terminated,
            "truncated": ep.truncated,
            "row": {k: _plain(v) for k, v in episode_row(view, self.columns, episode_id).items()},
            "plots": plots,
            "frames": frames,
            "fps": self.fps,
            "cameras": {k: list(seg.data[k].shape[1:]) for k in self.cameras},
            "layouts": {f.key: f.layout for f in view.schema.step_fields if f.key in self.cameras},
            "count": len(view),
            "page": place["index"] // PAGE_SIZE + 1,  # the list page that shows it (from 1)
            **place,
        }

    def video(self, episode_id: int, key: str) -> str:
        """The file of the WebM video of camera field ``key`` of an episode (encoded on first request)."""
        if key not in self.cameras:
            raise BadRequest(f"{key!r} is not a camera field; cameras: {self.cameras}", HTTPStatus.NOT_FOUND)
        layout = next(f.layout for f in self.collection.schema.step_fields if f.key == key)
        if not INT64[0] <= episode_id <= INT64[1]:
            raise BadRequest(f"no episode with id {episode_id}", HTTPStatus.NOT_FOUND)
        try:
            self.collection.episode(id=episode_id)
        except KeyError:
            raise BadRequest(f"no episode with id {episode_id}", HTTPStatus.NOT_FOUND) from None
        return self.videos.get(
            (episode_id, key), lambda: hwc_frames(self._segment(self.collection, episode_id).data[key], layout or "HWC")
        )

    # ---- the dataset
    def dataset_page(self, where: str) -> dict[str, Any]:
        """Schema, history, sizes and statistics (of the episodes matching ``where``)."""
        from ..storage.arrays import tensors_size

        view = self.filtered(where)
        stats = view.stats() if len(view) else {}
        return {
            "url": self.dataset.location.url,
            "version": self.dataset.version,
            "schema": [{**f.to_json(), "key": f.key} for f in view.schema],
            "history": self.dataset.history(),
            "episodes": len(view),
            "steps": view.num_steps,
            "tensor_bytes": tensors_size(self.dataset.location),
            "stats": {k: {m: _plain(np.asarray(v)) for m, v in entry.items()} for k, entry in stats.items()},
        }

    def histograms(self, where: str) -> bytes:
        """Return and length histograms (PNG) of the episodes matching ``where``."""
        from ..integrations.plots import episode_histograms

        view = self.filtered(where)

        def draw() -> bytes:
            with tempfile.TemporaryDirectory(prefix="episodelake-viewer-") as tmp:
                out = os.path.join(tmp, "histograms.png")
                episode_histograms(view, out)
                with open(out, "rb") as f:
                    return f.read()

        return self._kept(self._histograms, where, draw, self._lock)

    def close(self) -> None:
        self.videos.close()


def _static_assets() -> dict[str, tuple[bytes, str]]:
    """The package's static files by name, read once: the only files the server serves besides its videos."""
    root = resources.files(__package__).joinpath("static")
    return {
        item.name: (item.read_bytes(), STATIC_TYPES[os.path.splitext(item.name)[1]])
        for item in root.iterdir()
        if os.path.splitext(item.name)[1] in STATIC_TYPES
    }


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


class ViewerServer(ThreadingHTTPServer):
    """A threaded HTTP server of one :class:`Viewer`; ``url`` is where it listens.

    ``hosts`` are the ``Host`` header names it answers (with its port):
    ``127.0.0.1``, ``localhost``, ``[::1]`` and the ``host`` it listens on;
    listening on every interface (``0.0.0.0``, ``::``), any IP address and
    this machine's name too. A name a request's page chose (DNS rebinding)
    is never among them.
    """

    daemon_threads = True

    def __init__(self, viewer: Viewer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.viewer = viewer
        self.static = _static_assets()
        if ":" in host.strip("[]"):
            self.address_family = socket.AF_INET6
        super().__init__((host.strip("[]"), port), _Handler)
        bare = host.strip("[]").lower()
        self.everywhere = bare in ("", "0.0.0.0", "::")
        self.hosts = {"127.0.0.1", "localhost", "[::1]", f"[{bare}]" if ":" in bare else bare}
        if self.everywhere:
            self.hosts.add(socket.gethostname().lower())
        self.cancelled = 0  # requests whose queries were cancelled because their client disconnected
        self._cancelled_changed = threading.Condition()

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request's ``Host`` header names this server (one of ``hosts``, or an IP address when
        listening everywhere) with its port (the port may be left out only when it is 80)."""
        if not header:
            return False
        port = self.server_address[1]
        name, _, given = header.strip().lower().rpartition(":")
        if not name or name.endswith(":") or (given and not given.isdigit()) or "]" in given:
            name, given = header.strip().lower(), ""  # no port: "localhost", "[::1]"
        if (given or "80") != str(port):
            return False
        return name in self.hosts or (self.everywhere and _is_ip(name))

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/"

    def count_cancelled(self) -> None:
        """Count a request whose queries were cancelled because its client disconnected."""
        with self._cancelled_changed:
            self.cancelled += 1
            self._cancelled_changed.notify_all()

    def wait_cancelled(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` requests were cancelled by their clients leaving (at most ``timeout`` s): whether so."""
        with self._cancelled_changed:
            return self._cancelled_changed.wait_for(lambda: self.cancelled >= count, timeout)

    def origin_allowed(self, origin: str, host: str) -> bool:
        """Whether an ``Origin`` header is this server as the request's (already checked) ``Host`` names it."""
        return origin.strip().lower() == f"http://{host.strip().lower()}"

    def server_close(self) -> None:
        super().server_close()
        self.viewer.close()


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the terminal shows the URL and errors only
        pass

    def do_HEAD(self) -> None:
        self.do_GET(body=False)

    def end_headers(self) -> None:
        """Every response, errors included (``send_error``), carries the security headers."""
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        super().end_headers()

    def _refusal(self, parts: SplitResult, query: dict[str, str]) -> str | None:
        """Why this request is refused before anything runs (a foreign Host; another site's costly request)."""
        host = self.headers.get("Host")
        if not self.server.host_allowed(host):
            return f"this viewer answers requests to {self.server.url} only, not to Host {host!r}"
        path = unquote(parts.path)
        costly = bool(query.get("where", "").strip()) or path.startswith("/video/") or path == "/histograms.png"
        if not costly:
            return None
        site = self.headers.get("Sec-Fetch-Site", "").strip().lower()
        origin = self.headers.get("Origin")
        if site in ("cross-site", "same-site") or (
            origin is not None and not self.server.origin_allowed(origin, host or "")
        ):
            return (
                "a request another site started (a filter, a video, the histograms) is refused: "
                "open the viewer's own URL in the address bar"
            )
        return None

    def do_GET(self, body: bool = True) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        viewer = self.server.viewer
        refused = self._refusal(parts, query)
        if refused is not None:
            where = query.get("where", "") if self.server.host_allowed(self.headers.get("Host")) else ""
            self._html(pages.error_page(HTTPStatus.FORBIDDEN, refused, where), HTTPStatus.FORBIDDEN, body)
            return
        where = query.get("where", viewer.default_where)
        path = unquote(parts.path)
        limits: QueryLimits | None = None
        try:
            if path.startswith("/static/"):  # no query runs: no limits, no watch
                self._route(path, query, where, body)
            else:
                with viewer.limits() as limits, self._watching(limits):
                    self._route(path, query, where, body)
        except EpisodeLakeError as exc:  # a bad predicate, id, page or field: its message, no traceback
            if limits is not None and limits.cancelled is not None:
                self.server.count_cancelled()
                return  # nobody to answer
            status = exc.status if isinstance(exc, BadRequest) else HTTPStatus.BAD_REQUEST
            self._html(pages.error_page(status, str(exc), where), status, body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away (a video seek closes its earlier request)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            print(f"episodelake view: error on {parts.path}: {message}", file=sys.stderr)
            self._html(pages.error_page(HTTPStatus.INTERNAL_SERVER_ERROR, message, where), 500, body)

    @contextlib.contextmanager
    def _watching(self, limits: QueryLimits) -> Iterator[None]:
        """Cancel the block's queries (``limits``) when the client closes its connection meanwhile.

        A thread polls the socket: readable with nothing to read is the
        client gone; readable with data (a pipelined request) ends the watch.
        """
        finished = threading.Event()

        def watch() -> None:
            sock = self.connection
            while not finished.is_set():
                try:
                    readable, _, _ = select.select([sock], [], [], 0.2)
                    if not readable:
                        continue
                    gone = sock.recv(1, socket.MSG_PEEK) == b""
                except (BlockingIOError, InterruptedError):
                    continue
                except (OSError, ValueError):  # reset, or closed: gone as well
                    gone = True
                if gone and not finished.is_set():
                    limits.cancel("its client disconnected")
                return

        watcher = threading.Thread(target=watch, name="episodelake-viewer-client", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            finished.set()

    def _route(self, path: str, query: dict[str, str], where: str, body: bool) -> None:
        viewer = self.server.viewer
        segments = [s for s in path.split("/") if s]
        sort, desc = query.get("sort", "episode_id"), query.get("desc") == "1"
        if not segments:
            data = viewer.list_page(where, sort, desc, _integer(query.get("page", "1"), "page"))
            self._html(pages.list_page(data, where, sort, desc), HTTPStatus.OK, body)
        elif segments[0] == "episode" and len(segments) == 2:
            data = viewer.episode_page(where, _integer(segments[1], "episode id"), sort, desc)
            self._html(pages.episode_page(data, where, sort, desc), HTTPStatus.OK, body)
        elif segments == ["dataset"]:
            self._html(pages.dataset_page(viewer.dataset_page(where), where), HTTPStatus.OK, body)
        elif segments == ["histograms.png"]:
            self._send(viewer.histograms(where), "image/png", HTTPStatus.OK, body)
        elif segments[0] == "video" and len(segments) >= 3 and path.endswith(".webm"):
            key = "/".join(segments[2:])[: -len(".webm")]
            self._file(viewer.video(_integer(segments[1], "episode id"), key), body)
        elif segments[0] == "static" and len(segments) == 2 and segments[1] in self.server.static:
            asset, kind = self.server.static[segments[1]]
            self._send(asset, kind, HTTPStatus.OK, body)
        else:
            raise BadRequest(f"nothing at {path}", HTTPStatus.NOT_FOUND)

    def _html(self, text: str, status: int, body: bool) -> None:
        self._send(text.encode(), "text/html; charset=utf-8", status, body)

    def _send(self, data: bytes, kind: str, status: int, body: bool, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _file(self, path: str, body: bool) -> None:
        """A video file, whole or the byte range asked for (browsers seek videos with Range requests)."""
        with open(path, "rb") as f:
            data = f.read()
        ranged = _RANGE.match(self.headers.get("Range", "").strip())
        if ranged is None or not any(ranged.groups()):
            self._send(data, MIME, HTTPStatus.OK, body, {"Accept-Ranges": "bytes"})
            return
        first, last = ranged.groups()
        start = int(first) if first else max(0, len(data) - int(last))
        stop = min(len(data), int(last) + 1) if first and last else len(data)
        if start >= stop:
            self._send(b"", MIME, HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, body, {"Content-Range": f"*/{len(data)}"})
            return
        span = {"Accept-Ranges": "bytes", "Content-Range": f"bytes {start}-{stop - 1}/{len(data)}"}
        self._send(data[start:stop], MIME, HTTPStatus.PARTIAL_CONTENT, body, span)


def _integer(text: str, what: str) -> int:
    """``text`` as an int (decimal digits, an optional sign); else BadRequest (400). Range checks are the caller's."""
    if not re.fullmatch(r"[+-]?[0-9]{1,40}", text.strip()):
        raise BadRequest(f"{what} must be an integer, got {text[:60]!r}")
    return int(text)


def start(
    collection: Dataset | DatasetView,
    where: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    background: bool = False,
    query_timeout: float | None = QUERY_TIMEOUT_S,
) -> ViewerServer:
    """A :class:`ViewerServer` of ``collection`` listening on ``host:port`` (0: a free port).

    ``background=True`` serves from a daemon thread (``server.url``,
    ``server.shutdown()``); otherwise call ``serve_forever()``.
    ``query_timeout``: seconds each sandboxed query of a request may run
    (default :data:`QUERY_TIMEOUT_S`; 0 or None: no limit). A bad ``where``
    raises QueryError and a bad ``host``/``port``/``query_timeout``
    ArgumentError before anything listens.
    """
    if not isinstance(host, str) or not host:
        raise ArgumentError(f"host must be an address string such as '127.0.0.1', got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ArgumentError(f"port must be an int in 0..65535 (0: any free port), got {port!r}")
    server = ViewerServer(Viewer(collection, where, query_timeout=query_timeout), host, port)
    if background:
        threading.Thread(target=server.serve_forever, name="episodelake-viewer", daemon=True).start()
    return server


class ViewerLink(str):
    """The URL of a viewer serving in the background; a notebook shows it as a link that opens a new tab.

    Not a frame: the viewer refuses to be framed by any page (``frame-ancestors
    'none'``, docs/viewer.md "Security rules"). ``stop()`` ends the server (it
    also ends with the process).
    """

    server: ViewerServer

    def _repr_html_(self) -> str:
        url = escape(self)
        return f'<p>episodelake viewer: <a href="{url}" target="_blank" rel="noopener noreferrer">{url}</a></p>'

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def view(
    collection: Dataset | DatasetView,
    where: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    query_timeout: float | None = QUERY_TIMEOUT_S,
) -> ViewerLink:
    """Serve the viewer of ``collection`` (a Dataset or a view) from a background thread; return its URL.

    For notebooks and scripts: ``el.view(ds.where("task = 'pick'"))`` returns
    a ``str`` URL (a :class:`ViewerLink`: shown as a link in a notebook
    cell, ``stop()`` ends it). ``where`` is the filter the list opens with;
    ``port=0`` takes a free port; ``query_timeout`` as for :func:`start`.
    Bad arguments raise as :func:`start` does.
    """
    server = start(collection, where, host, port, background=True, query_timeout=query_timeout)
    link = ViewerLink(server.url)
    link.server = server
    return link
