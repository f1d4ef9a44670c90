"""The viewer's data and its HTTP server: a read-only web app over one dataset or view.

:class:`Viewer` answers the pages through the façade's public read API only
(``where()``, sandboxed ``sql()``, ``episode(id=).read()``, ``stats()``,
``history()``, ``schema``); :class:`ViewerServer` (the standard library's
``ThreadingHTTPServer``) serves them. Security rules, held by
tests/test_viewer.py:

- bound to ``127.0.0.1`` unless told otherwise;
- GET and HEAD only: nothing the server does writes to the dataset (it is
  opened ``read_only=True`` by the command line);
- files served are the static assets listed at start and the videos it
  encoded itself, by name: no path from a request reaches the file system;
- the filter is ``where()``'s predicate (one SQL expression, run sandboxed:
  it reads nothing but the dataset); sort columns are checked against the
  episode columns, page numbers are integers;
- a bad request gets a page with one message, never a traceback.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from html import escape
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np

from ..core.errors import ArgumentError, EpisodeLakeError
from ..dataset import Dataset
from ..exporters.lerobot import is_camera
from ..exporters.rrd import episode_columns, episode_row, is_series, quoted
from . import pages
from .video import MIME, VideoCache, hwc_frames

if TYPE_CHECKING:
    from ..core.segments import Segment
    from ..dataset import DatasetView

PAGE_SIZE = 50
DEFAULT_FPS = 10.0
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
    ``info["fps"]``, else 10) sets the videos' frame rate.
    """

    def __init__(self, collection: Dataset | DatasetView, where: str | None = None, fps: float | None = None) -> None:
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
            self.filtered(where)  # a bad start filter fails here, before anything is served

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
    def list_page(self, where: str, sort: str, desc: bool, page: int) -> dict[str, Any]:
        """One page of the episode list: ``columns``, ``rows`` (lists), ``count``, ``page``, ``pages``, ``offset``."""
        if sort not in self.columns:
            raise BadRequest(f"cannot sort by {sort!r}: the columns are {self.columns}")
        view = self.filtered(where)
        count = len(view)
        pages_ = max(1, math.ceil(count / PAGE_SIZE))
        if page < 0 or page >= pages_:
            raise BadRequest(f"page {page} is outside 0..{pages_ - 1}", HTTPStatus.NOT_FOUND)
        order = f"{quoted([sort])} {'DESC' if desc else 'ASC'} NULLS LAST"
        if sort != "episode_id":
            order += ", episode_id"
        query = (
            f"SELECT {quoted(self.columns)} FROM episodes ORDER BY {order} LIMIT {PAGE_SIZE} OFFSET {page * PAGE_SIZE}"
        )
        result = view.sql(query, sandbox=True)
        rows = result.fetchall() if result is not None else []
        return {
            "columns": self.columns,
            "rows": [[_plain(v) for v in r] for r in rows],
            "count": count,
            "total": len(self.collection),
            "page": page,
            "pages": pages_,
            "offset": page * PAGE_SIZE,
        }

    # ---- one episode
    def _segment(self, view: Dataset | DatasetView, episode_id: int) -> Segment:
        return self._kept(self._segments, episode_id, lambda: view.episode(id=episode_id).read(), self._lock, 4)

    def episode_page(self, where: str, episode_id: int) -> dict[str, Any]:
        """An episode's columns, plots (per-step values), cameras and its neighbours within ``where``."""
        view = self.filtered(where)
        try:
            ep = view.episode(id=episode_id)
        except KeyError:
            within = f" matching {where!r}" if where.strip() else ""
            raise BadRequest(f"no episode with id {episode_id}{within}", HTTPStatus.NOT_FOUND) from None
        seg = self._segment(view, episode_id)
        ids = view.episode_ids
        at = int(np.flatnonzero(ids == episode_id)[0])
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
            "index": at,
            "count": len(ids),
            "prev": int(ids[at - 1]) if at > 0 else None,
            "next": int(ids[at + 1]) if at + 1 < len(ids) else None,
        }

    def video(self, episode_id: int, key: str) -> str:
        """The file of the WebM video of camera field ``key`` of an episode (encoded on first request)."""
        if key not in self.cameras:
            raise BadRequest(f"{key!r} is not a camera field; cameras: {self.cameras}", HTTPStatus.NOT_FOUND)
        layout = next(f.layout for f in self.collection.schema.step_fields if f.key == key)
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


class ViewerServer(ThreadingHTTPServer):
    """A threaded HTTP server of one :class:`Viewer`; ``url`` is where it listens."""

    daemon_threads = True

    def __init__(self, viewer: Viewer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.viewer = viewer
        self.static = _static_assets()
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/"

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

    def do_GET(self, body: bool = True) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        viewer = self.server.viewer
        where = query.get("where", viewer.default_where)
        try:
            self._route(unquote(parts.path), query, where, body)
        except EpisodeLakeError as exc:  # a bad predicate, id, page or field: its message, no traceback
            status = exc.status if isinstance(exc, BadRequest) else HTTPStatus.BAD_REQUEST
            self._html(pages.error_page(status, str(exc), where), status, body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away (a video seek closes its earlier request)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            print(f"episodelake view: error on {parts.path}: {message}", file=sys.stderr)
            self._html(pages.error_page(HTTPStatus.INTERNAL_SERVER_ERROR, message, where), 500, body)

    def _route(self, path: str, query: dict[str, str], where: str, body: bool) -> None:
        viewer = self.server.viewer
        segments = [s for s in path.split("/") if s]
        if not segments:
            sort = query.get("sort", "episode_id")
            data = viewer.list_page(where, sort, query.get("desc") == "1", _integer(query.get("page", "0"), "page"))
            self._html(pages.list_page(data, where, sort, query.get("desc") == "1"), HTTPStatus.OK, body)
        elif segments[0] == "episode" and len(segments) == 2:
            data = viewer.episode_page(where, _integer(segments[1], "episode id"))
            self._html(pages.episode_page(data, where), HTTPStatus.OK, body)
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
    try:
        return int(text)
    except ValueError:
        raise BadRequest(f"{what} must be an integer, got {text!r}") from None


def start(
    collection: Dataset | DatasetView,
    where: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    background: bool = False,
) -> ViewerServer:
    """A :class:`ViewerServer` of ``collection`` listening on ``host:port`` (0: a free port).

    ``background=True`` serves from a daemon thread (``server.url``,
    ``server.shutdown()``); otherwise call ``serve_forever()``. A bad
    ``where`` raises QueryError and a bad ``host``/``port`` ArgumentError
    before anything listens.
    """
    if not isinstance(host, str) or not host:
        raise ArgumentError(f"host must be an address string such as '127.0.0.1', got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ArgumentError(f"port must be an int in 0..65535 (0: any free port), got {port!r}")
    server = ViewerServer(Viewer(collection, where), host, port)
    if background:
        threading.Thread(target=server.serve_forever, name="episodelake-viewer", daemon=True).start()
    return server


class ViewerLink(str):
    """The URL of a viewer serving in the background; a notebook shows it as the viewer in a frame.

    ``stop()`` ends the server (it also ends with the process).
    """

    server: ViewerServer

    def _repr_html_(self) -> str:
        url = escape(self)
        frame = f'<iframe src="{url}" width="100%" height="720" style="border:0"></iframe>'
        return f'{frame}<p><a href="{url}">{url}</a></p>'

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def view(
    collection: Dataset | DatasetView, where: str | None = None, host: str = "127.0.0.1", port: int = 0
) -> ViewerLink:
    """Serve the viewer of ``collection`` (a Dataset or a view) from a background thread; return its URL.

    For notebooks and scripts: ``el.view(ds.where("task = 'pick'"))`` returns
    a ``str`` URL (a :class:`ViewerLink`: shown as the viewer in a notebook
    cell, ``stop()`` ends it). ``where`` is the filter the list opens with;
    ``port=0`` takes a free port. Bad arguments raise as :func:`start` does.
    """
    server = start(collection, where, host, port, background=True)
    link = ViewerLink(server.url)
    link.server = server
    return link
