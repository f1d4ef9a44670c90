"""The viewer's security rules and its list/episode navigation (docs/viewer.md), over real HTTP.

A server in this process serves a small dataset (no cameras but one, so the
video endpoint exists); each request is a real HTTP request made with
``urllib`` or a raw socket. The rules: only the served address is answered
(DNS rebinding), every response carries the security headers, what costs work
is refused to other sites, a runaway filter hits the viewer's query time
limit and is cancelled when its client leaves, stored strings reach every page
escaped, absurd ids and pages are 404/400 (never 500), pages count from 1,
and previous/next follow the list's order with its filter and sort kept.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.viewer import pages, start
from episodelake.viewer import server as viewer_server

EPISODES = 9
RUNAWAY = (
    "(SELECT sum(a.reward * b.reward * c.reward * d.reward * e.reward * f.reward) "
    "FROM steps a, steps b, steps c, steps d, steps e, steps f) > 0"
)  # 100 steps: 10^12 rows, hours of one core: it ends only by its time limit or cancellation

SCHEMA = el.DatasetSchema(
    [
        el.FieldSpec("cam", (4, 6, 3), "uint8", layout="HWC"),
        el.FieldSpec("state", (2,), "float32"),
        el.FieldSpec("action", (), "float32", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
        el.FieldSpec("note", (), "string", role="meta"),
        el.FieldSpec("score", (), "int64", role="meta"),
    ]
)


def _episodes(notes: list[str], steps: int = 11) -> list[dict]:
    rng = np.random.default_rng(3)
    scores = rng.permutation(len(notes))  # a sort order unlike the ids'
    return [
        {
            "observations": {
                "cam": rng.integers(0, 255, (steps + 1, 4, 6, 3), dtype=np.uint8),
                "state": rng.random((steps + 1, 2), dtype=np.float32),
            },
            "actions": rng.random(steps, dtype=np.float32),
            "rewards": rng.random(steps, dtype=np.float32) + 0.5,
            "meta": {"note": note, "score": int(score)},
        }
        for note, score in zip(notes, scores, strict=True)
    ]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("viewer-security") / "ds")
    notes = [f"note {i}" for i in range(EPISODES - 1)] + ["<script>alert(1)</script> & \"'"]
    ds = el.Dataset.create(SCHEMA, path)
    ds.append_episodes(_episodes(notes))
    ds.flush()
    return el.Dataset.open(path, read_only=True)


@pytest.fixture(scope="module")
def server(dataset):
    srv = start(dataset, background=True, query_timeout=0.5)
    yield srv
    srv.shutdown()
    srv.server_close()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a GET (error statuses too)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=120) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def error_of(html: bytes) -> str:
    found = re.search(rb'<p id="error" class="error">(.*?)</p>', html, re.S)
    assert found, html[:500]
    return found.group(1).decode()


def port_of(server) -> int:
    return int(server.server_address[1])


def ids_of(dataset) -> list[int]:
    return [int(i) for i in dataset.episode_ids]


# ---- who may ask


def test_a_foreign_host_header_is_refused_and_the_served_names_are_answered(server, dataset):
    port = port_of(server)
    eid = ids_of(dataset)[0]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", f"localhost.evil:{port}", ""):
        for path in ("", "dataset", f"episode/{eid}", f"video/{eid}/observation/cam.webm", "static/viewer.js"):
            status, _, body = get(server.url + path, {"Host": host})
            assert status == 403, (host, path, status)
            assert b"note 1" not in body and b"<tr data-episode" not in body
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        status, _, body = get(server.url, {"Host": host})
        assert status == 200 and body.count(b"<tr data-episode") == EPISODES, host
    # the right name on the wrong port is another server's name
    assert get(server.url, {"Host": f"127.0.0.1:{port + 1}"})[0] == 403


def test_every_response_carries_the_security_headers_and_no_cors(server, dataset):
    eid = ids_of(dataset)[0]
    paths = ["", "?page=1", "dataset", f"episode/{eid}", f"video/{eid}/observation/cam.webm", "static/viewer.js"]
    paths += ["episode/abc", "nothing-here", "histograms.png"]
    for path in paths:
        _, headers, _ = get(server.url + path)
        assert headers.get("X-Frame-Options") == "DENY", path
        csp = headers.get("Content-Security-Policy", "")
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        assert headers.get("X-Content-Type-Options") == "nosniff"
        assert headers.get("Referrer-Policy") == "no-referrer"
        assert not any(name.lower().startswith("access-control-") for name in headers), path
    # refusals and methods the server does not answer carry them too
    assert get(server.url, {"Host": "evil.example"})[1].get("X-Frame-Options") == "DENY"
    request = urllib.request.Request(server.url, data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 501 and refused.value.headers.get("X-Frame-Options") == "DENY"


def test_pages_hold_no_inline_script_or_style(server, dataset):
    """What the CSP forbids is not on the pages: no inline script (JSON data blocks only), style or handler."""
    for path in ("", "dataset", f"episode/{ids_of(dataset)[0]}", "episode/1"):
        html = get(server.url + path)[2].decode()
        for attrs in re.findall(r"<script\b([^>]*)>", html):
            assert 'src="/static/' in attrs or 'type="application/json"' in attrs, attrs
        assert "<style" not in html and " style=" not in html
        assert not re.search(r"\son[a-z]+=", html)


def test_costly_requests_from_other_sites_are_refused(server, dataset):
    eid = ids_of(dataset)[0]
    port = port_of(server)
    costly = [
        "?where=" + urllib.parse.quote("score > 2"),
        f"episode/{eid}?where=" + urllib.parse.quote("score >= 0"),
        f"video/{eid}/observation/cam.webm",
        "histograms.png",
    ]
    for path in costly:
        for headers in (
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Origin": f"http://127.0.0.1:{port + 1}"},
        ):
            status, _, _ = get(server.url + path, headers)
            assert status == 403, (path, headers)
        # the viewer's own page asking, and a typed URL, are answered
        for headers in ({"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}, {}):
            assert get(server.url + path, headers)[0] == 200, (path, headers)
        assert get(server.url + path, {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"})[0] == 200


# ---- runaway queries


def test_a_runaway_filter_hits_the_viewers_time_limit(server):
    status, _, html = get(server.url + "?where=" + urllib.parse.quote(RUNAWAY))
    assert status == 400
    message = error_of(html)
    assert "time limit of 0.5 s" in message and "--query-timeout" in message
    assert get(server.url)[0] == 200  # the server goes on answering


def test_a_filter_is_cancelled_when_its_client_disconnects(dataset):
    srv = start(dataset, background=True, query_timeout=120)  # far beyond the wait below: only a cancel ends it
    try:
        request = f"GET /?where={urllib.parse.quote(RUNAWAY)} HTTP/1.1\r\nHost: 127.0.0.1:{port_of(srv)}\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port_of(srv)), timeout=60) as sock:
            sock.sendall(request.encode())
        assert srv.wait_cancelled(1, timeout=60), "the query went on after its client left"
        assert get(srv.url)[0] == 200
    finally:
        srv.shutdown()
        srv.server_close()


# ---- stored strings reach the page escaped


class _Cells(HTMLParser):
    """Text of each table cell (``<td>``) and of ``#error``, the filter box's value, and every tag seen."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.cells: list[str] = []
        self.error: str | None = None
        self.where: str | None = None
        self.tags: list[str] = []
        self._open: list[str] | None = None
        self._in_error = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "td":
            self._open = []
        if tag == "p" and a.get("id") == "error":
            self._in_error, self.error = True, ""
        if tag == "input" and a.get("id") == "where":
            self.where = a.get("value")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._open is not None:
            self.cells.append("".join(self._open))
            self._open = None
        if tag == "p":
            self._in_error = False

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open.append(data)
        if self._in_error:
            self.error = (self.error or "") + data


def parsed(html: bytes) -> _Cells:
    p = _Cells()
    p.feed(html.decode())
    return p


PIECES = [*"<>&\"' /=;:!-_x1\\\u2028", "script", "</", "&amp;", "<script>", "</td>", "<!--"]
NASTY = st.lists(st.sampled_from(PIECES), min_size=1, max_size=12).map("".join)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(notes=st.lists(NASTY.map(lambda s: s[:60]), min_size=2, max_size=4))
def test_stored_strings_reach_every_page_escaped(notes):
    """A meta string with markup shows as its own text in the list, the episode page and the error page."""
    ds = el.Dataset.from_episodes(_episodes(notes, steps=3), schema=SCHEMA)
    link = el.view(ds)
    try:
        page = parsed(get(link)[2])
        for note in notes:
            assert note in page.cells, (note, page.cells)
        assert page.tags.count("script") == 1  # viewer.js, nothing a value opened
        for i, eid in enumerate(int(e) for e in ds.episode_ids):
            episode = parsed(get(f"{link}episode/{eid}")[2])
            assert notes[i] in episode.cells and episode.tags.count("script") == 2  # the data block, viewer.js
        for note in notes[:2]:
            where = "note = '" + note.replace("'", "''") + "' AND"  # does not parse: the error page quotes it
            status, _, html = get(link + "?where=" + urllib.parse.quote(where))
            error = parsed(html)
            assert status == 400 and error.where == where and repr(where) in (error.error or "")
            assert error.tags.count("script") == 1
    finally:
        link.stop()


@given(key=NASTY | st.text(min_size=1, max_size=30), values=st.lists(NASTY | st.text(max_size=20), max_size=3))
def test_json_inside_the_script_block_cannot_close_it(key, values):
    """The episode page's data block: no ``<``, ``>`` or ``&`` inside, and it reads back as the data."""
    data = {
        "episode_id": 7,
        "length": 1,
        "terminated": False,
        "truncated": False,
        "row": {"note": key},
        "plots": {key: [values]},
        "frames": 2,
        "fps": 10.0,
        "cameras": {},
        "layouts": {},
        "index": 0,
        "count": 1,
        "page": 1,
        "prev": None,
        "next": None,
    }
    html = pages.episode_page(data, "")
    block = re.search(r'<script id="episode-data" type="application/json">(.*?)</script>', html, re.S)
    assert block is not None
    assert not set(block.group(1)) & set("<>&")
    assert json.loads(block.group(1))["plots"] == {key: [values]}


# ---- ids, pages, neighbours


def test_absurd_ids_and_pages_are_404_or_400_never_500(server, dataset):
    huge = "9" * 23
    for path in (f"episode/{huge}", f"episode/-{huge}", f"video/{huge}/observation/cam.webm", f"episode/{2**63}"):
        status, _, html = get(server.url + path)
        assert status == 404, (path, status)
        assert "no episode with id" in error_of(html)
    for path in ("episode/1e5", "episode/0x10", f"video/{'9' * 60}x/observation/cam.webm", "?page=abc", "?page=1.5"):
        assert get(server.url + path)[0] == 400, path
    for page in ("0", "-1", "2", huge):
        assert get(server.url + "?page=" + page)[0] == 404, page


def test_pages_count_from_one_as_the_page_says(server, dataset):
    status, _, html = get(server.url + "?page=1")
    assert status == 200 and b"page 1 of 1" in html and html.count(b"<tr data-episode") == EPISODES
    assert get(server.url)[2] == html


def _place(html: bytes) -> tuple[int, int | None, int | None]:
    """The episode page's ``#n`` and the ids its previous/next links go to (None: no link)."""
    n = int(re.search(rb'<h1 id="place" data-index="(\d+)"', html).group(1))
    prev = re.search(rb'id="prev-episode" href="/episode/(-?\d+)', html)
    nxt = re.search(rb'id="next-episode" href="/episode/(-?\d+)', html)
    return n, int(prev.group(1)) if prev else None, int(nxt.group(1)) if nxt else None


def test_previous_and_next_follow_the_lists_sort_and_filter(server, dataset):
    rows = dataset.sql("SELECT episode_id, score FROM episodes").fetchall()
    where = "score >= 2"
    order = [eid for eid, score in sorted(rows, key=lambda r: -r[1]) if score >= 2]  # score DESC: no ties
    assert order != sorted(order)  # the sort is not the id order, or this proves nothing
    query = urllib.parse.urlencode({"where": where, "sort": "score", "desc": "1"})
    listed = [int(i) for i in re.findall(rb'<tr data-episode="(-?\d+)"', get(f"{server.url}?{query}")[2])]
    assert listed == order
    walked = []
    eid: int | None = order[0]
    while eid is not None:
        status, _, html = get(f"{server.url}episode/{eid}?{query}")
        assert status == 200
        n, prev, nxt = _place(html)
        assert n == len(walked) + 1 and prev == (walked[-1] if walked else None)
        for link in re.findall(rb'id="(?:prev|next)-episode" href="([^"]+)"', html):
            kept = urllib.parse.parse_qs(urllib.parse.urlsplit(link.decode().replace("&amp;", "&")).query)
            assert kept == {"where": [where], "sort": ["score"], "desc": ["1"]}
        walked.append(eid)
        eid = nxt
    assert walked == order
    # the list shows each episode's place, the id second
    html = get(f"{server.url}?{query}")[2].decode()
    assert [int(n) for n in re.findall(r'class="episode" href="[^"]+">#(\d+)<', html)] == list(range(1, len(order) + 1))


def test_an_episode_page_says_its_place_in_the_list(server, dataset):
    ids = sorted(ids_of(dataset))
    html = get(f"{server.url}episode/{ids[4]}")[2]
    assert _place(html) == (5, ids[3], ids[5])
    assert f'<code id="episode-id">{ids[4]}</code>'.encode() in html and b"#5 of 9" in html


def test_page_links_walk_every_page_once_in_the_lists_order(server, dataset, monkeypatch):
    """With 2 rows a page, next-links from page 1 reach page N through every episode once, in the sort's order;
    page 1 has no previous link, the last page no next link, and previous-links walk back the same pages."""
    monkeypatch.setattr(viewer_server, "PAGE_SIZE", 2)
    rows = dataset.sql("SELECT episode_id, score FROM episodes").fetchall()
    order = [eid for eid, _ in sorted(rows, key=lambda r: -r[1])]
    pages = -(-len(order) // 2)
    query = {"sort": "score", "desc": "1"}
    url: str | None = f"{server.url}?{urllib.parse.urlencode(query)}"
    seen, visited = [], []
    while url is not None:
        status, _, html = get(url)
        assert status == 200
        text = html.decode()
        page = len(visited) + 1
        visited.append(url)
        assert f"page {page} of {pages}" in text
        seen += [int(i) for i in re.findall(r'<tr data-episode="(-?\d+)"', text)]
        assert ('id="prev-page"' in text) == (page > 1)
        nxt = re.search(r'id="next-page" href="([^"]+)"', text)
        assert (nxt is not None) == (page < pages)
        url = server.url.rstrip("/") + nxt.group(1).replace("&amp;", "&") if nxt else None
    assert seen == order and len(visited) == pages
    back = []
    url = visited[-1]
    while url is not None:
        html = get(url)[2].decode()
        back.append(int(re.search(r"page (\d+) of", html).group(1)))
        prev = re.search(r'id="prev-page" href="([^"]+)"', html)
        url = server.url.rstrip("/") + prev.group(1).replace("&amp;", "&") if prev else None
    assert back == list(range(pages, 0, -1))
