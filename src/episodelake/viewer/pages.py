"""The viewer's HTML pages, built from :class:`~episodelake.viewer.server.Viewer` answers.

Every value from the dataset is escaped (``html.escape``) and every link's
query string encoded (``urlencode``), so meta strings and filters cannot
inject markup. The episode page carries its plot data as JSON in a
``<script type="application/json">`` block (``<``, ``>`` and ``&`` escaped as
``\u003c``...) that ``static/viewer.js`` draws. Pages hold no inline script,
style or event handler, so the server's Content-Security-Policy allows the
package's own assets only.

Episodes are shown by their place in the list as it is sorted and filtered
(``#12``), the episode id second; list pages count from 1 in the URL
(``?page=1``) as on the page; an episode's previous/next follow the list's
order and keep its filter and sort in their links.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from html import escape
from http import HTTPStatus
from typing import Any
from urllib.parse import quote, urlencode

import numpy as np

FLAGS = ("terminated", "truncated")


def _link(path: str, **query: Any) -> str:
    """``path`` with the query items that are set (None and "" left out)."""
    items = {k: v for k, v in query.items() if v not in (None, "")}
    return escape(path + ("?" + urlencode(items) if items else ""))


def _cell(value: Any) -> str:
    if value is None:
        return '<span class="null">NULL</span>'
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        shown = ", ".join(_cell(v) for v in value[:8])
        return f"[{shown}{', …' if len(value) > 8 else ''}]"
    return escape(str(value))


def _flags(terminated: Any, truncated: Any) -> str:
    return "".join(
        f'<span class="flag {name}">{name}</span>'
        for name, on in zip(FLAGS, (terminated, truncated), strict=True)
        if on
    )


def layout(title: str, body: str, where: str, here: str = "/") -> str:
    """A page: the navigation, the filter box (``GET here?where=``) and ``body``."""
    nav = f'<a href="{_link("/", where=where)}">Episodes</a> <a href="{_link("/dataset", where=where)}">Dataset</a>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)} · episodelake</title>
<link rel="stylesheet" href="/static/viewer.css"></head>
<body><header><strong>episodelake</strong> <nav>{nav}</nav>
<form id="filter" method="get" action="{escape(here)}"><input id="where" name="where" value="{escape(where)}"
 placeholder="SQL filter over episodes, e.g. task = 'pick' AND return > 0" size="60">
<button type="submit">Filter</button></form></header>
<main>{body}</main><script src="/static/viewer.js"></script></body></html>
"""


def error_page(status: int, message: str, where: str) -> str:
    """A page with one message (a bad predicate shows DuckDB's words), never a traceback."""
    phrase = HTTPStatus(status).phrase
    return layout(
        phrase, f'<h1>{int(status)} {escape(phrase)}</h1><p id="error" class="error">{escape(message)}</p>', where
    )


def list_page(data: dict[str, Any], where: str, sort: str, desc: bool) -> str:
    """The episode list: sortable column headers, one row per episode linking to its page, page links."""
    columns = data["columns"]
    head = []
    for c in columns:
        flip = "1" if c == sort and not desc else None
        arrow = (" ▼" if desc else " ▲") if c == sort else ""
        head.append(f'<th><a href="{_link("/", where=where, sort=c, desc=flip)}">{escape(c)}{arrow}</a></th>')
    rows = []
    at = {c: i for i, c in enumerate(columns)}
    desc_q = "1" if desc else None
    for n, r in enumerate(data["rows"], data["offset"] + 1):
        eid = int(r[at["episode_id"]])
        href = _link(f"/episode/{eid}", where=where, sort=None if sort == "episode_id" else sort, desc=desc_q)
        cells = [f'<td class="place"><a class="episode" href="{href}">#{n}</a></td>'] + [
            f'<td class="id">{eid}</td>'
            if c == "episode_id"
            else f"<td>{_flags(r[i] and c == 'terminated', r[i] and c == 'truncated')}</td>"
            if c in FLAGS
            else f"<td>{_cell(r[i])}</td>"
            for i, c in enumerate(columns)
        ]
        rows.append(f'<tr data-episode="{eid}">{"".join(cells)}</tr>')
    page, pages = data["page"], data["pages"]
    first = data["offset"] + 1
    shown = f"{first}–{data['offset'] + len(data['rows'])}" if data["rows"] else "none"
    matching = f" matching <code>{escape(where)}</code>" if where.strip() else ""
    links = []
    if page > 1:
        links.append(
            f'<a id="prev-page" href="{_link("/", where=where, sort=sort, desc=desc_q, page=page - 1)}">← previous</a>'
        )
    links.append(f"page {page} of {pages}")
    if page < pages:
        links.append(
            f'<a id="next-page" href="{_link("/", where=where, sort=sort, desc=desc_q, page=page + 1)}">next →</a>'
        )
    body = f"""<h1>Episodes</h1>
<p id="count" data-count="{data["count"]}">{data["count"]} of {data["total"]} episodes{matching}; showing {shown}</p>
<table id="episodes"><thead><tr><th>#</th>{"".join(head)}</tr></thead><tbody>{"".join(rows)}</tbody></table>
<p class="pages">{" · ".join(links)}</p>"""
    return layout("Episodes", body, where)


def _table(header: list[str], rows: list[list[Any]], ident: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table id="{ident}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element: no ``</script>`` can close it early."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def episode_page(data: dict[str, Any], where: str, sort: str = "episode_id", desc: bool = False) -> str:
    """One episode: its place in the list (``#n of count``, its id second), videos with one scrubber and frame
    counter, per-step plots with a cursor, its columns; previous/next in the list's order (``where``, ``sort``)."""
    eid = data["episode_id"]
    keep = {"where": where, "sort": None if sort == "episode_id" else sort, "desc": "1" if desc else None}
    videos = "".join(
        f'<figure><video class="camera" data-key="{escape(k)}" src="/video/{eid}/{quote(k)}.webm" muted playsinline'
        f' preload="auto" width="{shape[1] if data["layouts"][k] == "HWC" else shape[2]}"></video>'
        f"<figcaption>{escape(k)}</figcaption></figure>"
        for k, shape in data["cameras"].items()
    )
    neighbours = []
    for name, target in (("prev", data["prev"]), ("next", data["next"])):
        label = "← previous" if name == "prev" else "next →"
        if target is None:
            neighbours.append(f'<span class="disabled">{label}</span>')
        else:
            neighbours.append(f'<a id="{name}-episode" href="{_link(f"/episode/{target}", **keep)}">{label}</a>')
    columns = [[k, v] for k, v in data["row"].items()]
    plot_data = {"frames": data["frames"], "fps": data["fps"], "plots": data["plots"]}
    place = data["index"] + 1
    back = _link(
        "/", where=where, sort=keep["sort"], desc=keep["desc"], page=data["page"] if data["page"] > 1 else None
    )
    body = f"""<h1 id="place" data-index="{place}">Episode #{place} <small>of {data["count"]}</small></h1>
<p class="id">episode id <code id="episode-id">{eid}</code></p>
<p class="neighbours">{neighbours[0]} · #{place} of {data["count"]} · {neighbours[1]}
 · <a id="list" href="{back}">list</a></p>
<p>length {data["length"]} {_flags(data["terminated"], data["truncated"])}</p>
<section id="player"><div class="videos">{videos or "<p>no camera fields</p>"}</div>
<div class="controls"><button id="play" type="button">play</button>
<input id="scrubber" type="range" min="0" max="{data["frames"] - 1}" value="0" step="1">
<span id="frame-counter">frame 1 / {data["frames"]}</span></div></section>
<section id="plots"></section>
<h2>Columns</h2>{_table(["column", "value"], columns, "columns")}
<script id="episode-data" type="application/json">{_script_json(plot_data)}</script>"""
    return layout(f"Episode #{place}", body, where)


def _when(ms: Any) -> str:
    return datetime.fromtimestamp(ms / 1e3, UTC).isoformat(timespec="seconds") if isinstance(ms, int | float) else ""


def dataset_page(data: dict[str, Any], where: str) -> str:
    """Schema, history, sizes, statistics per field and the return/length histograms of the filter."""
    schema = [
        [
            f["key"],
            f["role"],
            f["dtype"],
            str(tuple(f["shape"])),
            f.get("layout"),
            f.get("codec") or f.get("compression"),
        ]
        for f in data["schema"]
    ]
    history = [
        [
            h["version"],
            _when(h.get("timestamp")),
            h.get("operation"),
            h.get("episodes_added"),
            h.get("episodes_removed"),
        ]
        for h in data["history"]
    ]
    stats = []
    for key, entry in data["stats"].items():
        if key == "episodes":
            continue
        stats.append(
            [key, entry.get("count"), *(np.asarray(entry[m]).round(6).tolist() for m in ("mean", "std", "min", "max"))]
        )
    matching = f" matching <code>{escape(where)}</code>" if where.strip() else ""
    body = f"""<h1>Dataset</h1>
<p id="summary"><code>{escape(data["url"])}</code>, version {data["version"]}: {data["episodes"]} episodes{matching},
{data["steps"]} steps; tensors {data["tensor_bytes"] / 1e6:.2f} MB</p>
<h2>Schema</h2>{_table(["key", "role", "dtype", "shape", "layout", "codec"], schema, "schema")}
<h2>Histograms</h2>
<img id="histograms" alt="return and length histograms" src="{_link("/histograms.png", where=where)}">
<h2>Statistics</h2>{_table(["field", "count", "mean", "std", "min", "max"], stats, "stats")}
<h2>History</h2>{_table(["version", "time (UTC)", "operation", "added", "removed"], history, "history")}"""
    return layout("Dataset", body, where, "/dataset")
