"""The viewer (docs/viewer.md): its HTTP endpoints, the ``episodelake view`` command, and a real browser.

The endpoint tests talk to a server in this process over HTTP; the command
tests run ``python -m episodelake.cli view`` in a subprocess and stop it with
SIGINT; the browser test drives Debian's headless Chromium with selenium
(skipped when it is not installed; ``.ci/run`` installs it). Which episodes a
filter keeps is checked against a NumPy reference of the written episodes.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import episodelake as el
from episodelake.viewer import start
from episodelake.viewer.server import PAGE_SIZE

EPISODES = 60  # more than one list page
TASKS = ("pick", "place", "push")
FRONT = (72, 96)  # height, width of the HWC camera
WRIST = (40, 56)  # of the CHW one
FPS = 12


def _scene(i: int, T: int, h: int, w: int) -> np.ndarray:
    """``T`` rendered-like frames: a ball crossing a shaded floor, its colour set by the episode."""
    y, x = np.mgrid[0:h, 0:w]
    floor = np.stack([40 + y * 100 // h, 60 + x * 80 // w, np.full_like(x, 90)], -1)
    out = np.empty((T, h, w, 3), np.uint8)
    for t in range(T):
        cx, cy = w * (0.1 + 0.8 * t / max(T - 1, 1)), h * (0.5 + 0.3 * np.sin(t / 3 + i))
        ball = (x - cx) ** 2 + (y - cy) ** 2 < (min(h, w) / 7) ** 2
        out[t] = np.where(ball[..., None], np.array([230, 80 + 40 * (i % 4), 40], np.uint8), floor)
    return out


def _episodes() -> list[dict]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(EPISODES):
        T = 12 + i % 9
        t = np.arange(T, dtype=np.float32)
        out.append(
            {
                "observations": {
                    "front": _scene(i, T + 1, *FRONT),
                    "wrist": np.ascontiguousarray(_scene(i + 1, T + 1, *WRIST).transpose(0, 3, 1, 2)),
                    "state": np.cumsum(rng.normal(size=(T + 1, 3)), 0).astype(np.float32),
                },
                "actions": np.stack([np.sin(t / 3 + i), np.cos(t / 4)], -1).astype(np.float32),
                "rewards": (rng.random(T) * (i % 5)).astype(np.float32),
                "terminated": i % 3 == 0,
                "truncated": i % 3 == 1,
                "meta": {"task": TASKS[i % 3], "seed": i},
            }
        )
    return out


SCHEMA = el.DatasetSchema(
    [
        el.FieldSpec("front", (*FRONT, 3), "uint8", layout="HWC", codec="jpeg", quality=90),
        el.FieldSpec("wrist", (3, *WRIST), "uint8", layout="CHW"),
        el.FieldSpec("state", (3,), "float32"),
        el.FieldSpec("action", (2,), "float32", role="action"),
        el.FieldSpec("reward", (), "float32", role="reward"),
        el.FieldSpec("task", (), "string", role="meta"),
        el.FieldSpec("seed", (), "int64", role="meta"),
    ]
)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The dataset's path, the written episodes, and each one's episode id (by its ``seed``)."""
    path = str(tmp_path_factory.mktemp("viewer") / "ds")
    episodes = _episodes()
    ds = el.Dataset.create(SCHEMA, path, info={"fps": FPS})
    ds.append_episodes(episodes)
    ds.flush()
    seeds = ds.sql("SELECT seed, episode_id FROM episodes").fetchall()
    ids = np.array([eid for _, eid in sorted(seeds)], dtype=np.int64)
    ds.close()
    return path, episodes, ids


def reference(episodes: list[dict], ids: np.ndarray, task: str, min_return: float) -> list[int]:
    """Ids of the episodes with ``task`` and a return above ``min_return``, from the written arrays."""
    keep = [i for i, e in enumerate(episodes) if e["meta"]["task"] == task and float(np.sum(e["rewards"])) > min_return]
    return sorted(int(ids[i]) for i in keep)


@pytest.fixture(scope="module")
def server(written):
    ds = el.Dataset.open(written[0], read_only=True)
    srv = start(ds, background=True)
    yield srv
    srv.shutdown()
    srv.server_close()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    """Status, content type and body of a GET (error statuses too)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=60) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def listed_ids(html: bytes) -> list[int]:
    return [int(v) for v in re.findall(rb'<tr data-episode="(\d+)"', html)]


def error_of(html: bytes) -> str:
    found = re.search(rb'<p id="error" class="error">(.*?)</p>', html, re.S)
    assert found, html[:500]
    assert b"Traceback" not in html
    return found.group(1).decode()


# ---- the HTTP endpoints


def test_list_pages_filter_and_sort_match_a_numpy_reference(server, written):
    _, episodes, ids = written
    where = "task = 'pick' AND return > 1.5"
    want = reference(episodes, ids, "pick", 1.5)
    assert 0 < len(want) < EPISODES // 3
    status, kind, html = get(server.url + "?" + urllib.parse.urlencode({"where": where}))
    assert status == 200 and kind.startswith("text/html")
    assert listed_ids(html) == want
    assert f'data-count="{len(want)}"'.encode() in html
    # every episode over the pages, each once, in episode-id order; the last page holds the rest
    pages = [listed_ids(get(f"{server.url}?page={p}")[2]) for p in (1, 2)]  # from 1, as the page says
    assert [len(p) for p in pages] == [PAGE_SIZE, EPISODES - PAGE_SIZE]
    assert pages[0] + pages[1] == sorted(ids.tolist())
    # sorted by return, highest first: the NumPy order of the written rewards' sums (ties by episode id)
    returns = np.array([np.sum(e["rewards"], dtype=np.float32) for e in episodes], dtype=np.float64)
    order = sorted(range(EPISODES), key=lambda i: (-returns[i], ids[i]))
    assert listed_ids(get(server.url + "?sort=return&desc=1")[2]) == [int(ids[i]) for i in order[:PAGE_SIZE]]


def test_bad_requests_get_one_message_and_no_traceback(server, written):
    status, _, html = get(server.url + "?where=" + urllib.parse.quote("no_such_column > 1"))
    assert status == 400 and "Binder Error" in error_of(html) and "no_such_column" in error_of(html)
    status, _, html = get(server.url + "?where=" + urllib.parse.quote("1; DROP TABLE episodes"))
    assert status == 400 and "Parser Error" in error_of(html)
    status, _, html = get(server.url + "episode/12345")
    assert status == 404 and error_of(html) == "no episode with id 12345"
    status, _, html = get(server.url + "episode/abc")
    assert status == 400 and "must be an integer" in error_of(html)
    status, _, html = get(server.url + "?sort=" + urllib.parse.quote('"length"; --'))
    assert status == 400 and "cannot sort by" in error_of(html)
    assert get(server.url + "?page=3")[0] == 404 and get(server.url + "?page=0")[0] == 404
    # an episode outside the filter is not on that filter's page
    outside = int(written[2][1])  # seed 1: task "place"
    status, _, html = get(f"{server.url}episode/{outside}?where=" + urllib.parse.quote("task = 'pick'"))
    assert status == 404 and "matching" in error_of(html)


def test_nothing_outside_the_static_assets_and_the_videos_is_served(server, written):
    eid = int(written[2][0])
    source = Path(el.__file__).read_bytes()
    for path in (
        "static/../server.py",
        "static/%2e%2e/server.py",
        "static/..%2fserver.py",
        "static/%2e%2e%2f%2e%2e%2f__init__.py",
        "static//etc/passwd",
        "../../../../etc/passwd",
        f"video/{eid}/../../../__init__.webm",
        f"video/{eid}/observation/state.webm",
        f"video/{eid}/%2e%2e/%2e%2e/x.webm",
    ):
        status, _, body = get(server.url + path)
        assert status == 404, path
        assert source[:200] not in body and b"root:" not in body
    assert get(server.url + "static/viewer.js")[0] == 200
    # read-only: no method that could change anything is answered
    request = urllib.request.Request(server.url, data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 501


def test_videos_have_the_cameras_frames_and_sizes_and_answer_ranges(server, written):
    import av

    _, episodes, ids = written
    for key, (h, w) in (("observation/front", FRONT), ("observation/wrist", WRIST)):
        status, kind, data = get(f"{server.url}video/{ids[4]}/{key}.webm")
        assert status == 200 and kind == "video/webm"
        with av.open(io.BytesIO(data)) as video:
            stream = video.streams.video[0]
            frames = [f.to_ndarray(format="rgb24") for f in video.decode(stream)]
        assert stream.codec_context.name == "vp9" and (stream.height, stream.width) == (h, w)
        assert len(frames) == len(episodes[4]["rewards"]) + 1
        if key == "observation/front":  # the decoded video shows the camera's frames (lossy, so within a bound)
            err = np.abs(np.stack(frames).astype(int) - episodes[4]["observations"]["front"].astype(int)).mean()
            assert err < 12, err
        status, _, part = get(f"{server.url}video/{ids[4]}/{key}.webm", {"Range": "bytes=10-109"})
        assert status == 206 and part == data[10:110]


def test_episode_and_dataset_pages(server, written):
    _, episodes, ids = written
    where = "task = 'push'"
    members = [int(ids[i]) for i in range(EPISODES) if episodes[i]["meta"]["task"] == "push"]
    status, _, html = get(f"{server.url}episode/{members[1]}?where=" + urllib.parse.quote(where))
    assert status == 200
    data = json.loads(re.search(rb'<script id="episode-data" type="application/json">(.*?)</script>', html).group(1))
    episode = episodes[int(np.flatnonzero(ids == members[1])[0])]
    assert data["frames"] == len(episode["rewards"]) + 1 and data["fps"] == FPS
    assert sorted(data["plots"]) == ["action", "observation/state", "reward"]
    np.testing.assert_allclose(np.array(data["plots"]["action"]).T, episode["actions"], rtol=1e-6)
    assert f"/episode/{members[0]}?".encode() in html and f"/episode/{members[2]}?".encode() in html
    status, _, html = get(server.url + "dataset?where=" + urllib.parse.quote(where))
    assert status == 200 and b"observation/front" in html and f"{len(members)} episodes".encode() in html
    status, kind, png = get(server.url + "histograms.png?where=" + urllib.parse.quote(where))
    assert status == 200 and kind == "image/png" and png.startswith(b"\x89PNG")


def test_the_viewer_never_writes_to_the_dataset(server, written):
    ds = el.Dataset.open(written[0], read_only=True)
    before = (ds.version, len(ds.history()), sorted(os.listdir(written[0])))
    get(server.url + "?where=" + urllib.parse.quote("seed > 3"))
    get(f"{server.url}video/{written[2][7]}/observation/front.webm")
    get(server.url + "dataset")
    after = el.Dataset.open(written[0], read_only=True)
    assert (after.version, len(after.history()), sorted(os.listdir(written[0]))) == before


def test_el_view_serves_a_view_in_the_background_until_stopped(written):
    """Notebooks: ``el.view(ds.where(...))`` returns the URL of a server in this process; ``stop()`` ends it."""
    _, episodes, ids = written
    ds = el.Dataset.open(written[0], read_only=True)
    link = el.view(ds.where("task = 'pick'"), where="return > 1.5")
    try:
        assert isinstance(link, str) and link.startswith("http://127.0.0.1:")
        assert listed_ids(get(link)[2]) == reference(episodes, ids, "pick", 1.5)
        assert f'<a href="{link}"' in link._repr_html_()  # a link, not a frame: the viewer refuses framing
    finally:
        link.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(link, timeout=10)


def test_a_dataset_on_object_storage_through_the_disk_cache(written, s3_server, s3_url, tmp_path):
    """An ``s3://`` dataset opened with ``cache_dir`` (what ``view --options ... --cache-dir`` does): the same pages."""
    ids = written[2]
    opts = s3_server.storage_options
    el.Dataset.open(written[0], read_only=True).where("seed < 8").copy_to(s3_url, opts, progress=False)
    cache = tmp_path / "cache"
    ds = el.Dataset.open(s3_url, storage_options=opts, read_only=True, cache_dir=cache)
    link = el.view(ds, where="task = 'pick'")
    try:
        assert listed_ids(get(link)[2]) == [int(ids[i]) for i in (0, 3, 6)]
        status, kind, data = get(f"{link}video/{ids[3]}/observation/wrist.webm")
        assert status == 200 and kind == "video/webm" and len(data) > 0
    finally:
        link.stop()
    assert any(p.is_file() for p in cache.rglob("*"))  # the camera's bytes came through the disk cache


# ---- el.to_rerun


def _recording(path: Path) -> dict[str, dict[str, list]]:
    """entity path -> column -> values over every chunk, in step order, read with rerun's own RrdReader."""
    from rerun.chunk import RrdReader

    out: dict[str, dict[str, list]] = {}
    for chunk in RrdReader(path).stream():
        batch = chunk.to_record_batch().to_pydict()
        entity = out.setdefault(chunk.entity_path, {})
        for name, values in batch.items():
            entity.setdefault(name, []).extend(values)
    for entity in out.values():
        if "step" in entity:
            order = np.argsort(entity["step"], kind="stable")
            for name in entity:
                entity[name] = [entity[name][i] for i in order]
    return out


def test_to_rerun_writes_the_chosen_episodes_cameras_and_series_on_the_step_timeline(written, tmp_path):
    pytest.importorskip("rerun")
    _, episodes, ids = written
    ds = el.Dataset.open(written[0], read_only=True)
    view = ds.where("task = 'push'")
    chosen = [int(view.episode_ids[0]), int(view.episode_ids[3])]
    path = tmp_path / "push.rrd"
    assert el.to_rerun(view, path, episodes=chosen) == 2
    recording = _recording(path)
    for eid in chosen:
        raw = episodes[int(np.flatnonzero(ids == eid)[0])]
        stored = ds.episode(id=eid).read().data  # the front camera is JPEG: the recording holds the decoded frames
        root = f"/episodes/{eid}"
        T = len(raw["rewards"])
        assert {k for k in recording if k.startswith(root + "/")} == {
            f"{root}/{k}"
            for k in ("columns", "observation/front", "observation/wrist", "observation/state", "action", "reward")
        }
        for key, want in (
            ("action", raw["actions"]),
            ("reward", raw["rewards"][:, None]),
            ("observation/state", raw["observations"]["state"]),
        ):
            series = recording[f"{root}/{key}"]
            assert series["step"] == list(range(len(want)))
            np.testing.assert_array_equal(np.array(series["Scalars:scalars"]), want.astype(np.float64))
        for key, frames in (
            ("front", stored["observation/front"]),
            ("wrist", raw["observations"]["wrist"].transpose(0, 2, 3, 1)),
        ):
            images = recording[f"{root}/observation/{key}"]
            assert images["step"] == list(range(T + 1))
            h, w = frames.shape[1:3]
            assert {(f[0]["width"], f[0]["height"]) for f in images["Image:format"]} == {(w, h)}
            np.testing.assert_array_equal(
                np.array([b[0] for b in images["Image:buffer"]], np.uint8).reshape(frames.shape), frames
            )
        columns = json.loads(recording[f"{root}/columns"]["TextDocument:text"][0][0])
        assert columns["task"] == "push" and columns["seed"] == raw["meta"]["seed"] and columns["length"] == T
    others = {k.split("/")[2] for k in recording if k.startswith("/episodes/")}
    assert others == {str(e) for e in chosen}
    with pytest.raises(KeyError, match=f"no episode with id {ids[1]}"):  # seed 1 is a "place" episode
        el.to_rerun(view, tmp_path / "none.rrd", episodes=[int(ids[1])])
    assert not (tmp_path / "none.rrd").exists()


# ---- the command


def _view(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "episodelake.cli", "view", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def command(written):
    """A running ``episodelake view`` of the dataset (its URL), stopped with SIGINT: its exit status must be 0."""
    proc = _view(written[0], "--port", "0", "--where", "task = 'pick'")
    line = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/", line)
    assert found, (line, proc.stderr.read() if proc.poll() is not None else "")
    yield found.group(0)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert "Traceback" not in proc.stderr.read()


def test_the_command_serves_its_filter_until_ctrl_c(command, written):
    _, episodes, ids = written
    status, _, html = get(command)
    assert status == 200 and listed_ids(html) == reference(episodes, ids, "pick", -1.0)
    assert get(command + "?where=")[0] == 200  # an empty filter: every episode
    assert len(listed_ids(get(command + "?where=")[2])) == PAGE_SIZE


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["MISSING"], 1, "episodelake: error: "),
        (["PATH", "--options", "{not json"], 2, "--options: not valid JSON"),
        (["PATH", "--options", "[1]"], 2, "must be a JSON object"),
        (["PATH", "--where", "nope >"], 1, "invalid where() predicate 'nope >'"),
    ],
)
def test_bad_command_lines_say_why_on_stderr(written, tmp_path, args, status, message):
    places = {"MISSING": str(tmp_path / "none"), "PATH": written[0]}
    proc = _view(*(places.get(a, a) for a in args), "--port", "0")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == status, (out, err)
    lines = err.strip().splitlines()
    assert message in lines[-1] and "Traceback" not in err
    assert len(lines) == 1 or lines[0].startswith("usage: episodelake view")  # argparse's usage, then the message


# ---- a real browser


def _chromium():
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip(
            "Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        )
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--mute-audio"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,900")
    return webdriver.Chrome(options=options, service=Service(driver))


@pytest.mark.slow  # ~40 s on a loaded 2-core box; CI's slow step installs Chromium (.ci/run)
def test_in_a_real_browser(command, written):
    """Load the list, type a filter, open an episode, play it, scrub it; keep a screenshot of the episode page."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    _, episodes, ids = written
    browser = _chromium()
    wait = WebDriverWait(browser, 30)
    try:
        browser.get(command)

        def rows() -> list[int]:
            # read in one script: the page may replace the table between a find and a read (a stale element)
            script = "return [...document.querySelectorAll('tbody tr')].map(r => r.dataset.episode)"
            ids = browser.execute_script(script)
            return [int(i) for i in ids]

        assert rows() == reference(episodes, ids, "pick", -1.0)
        box = browser.find_element(By.ID, "where")
        box.clear()
        box.send_keys("task = 'pick' AND return > 1.5", Keys.ENTER)
        want = reference(episodes, ids, "pick", 1.5)
        wait.until(lambda b: rows() == want)
        # a bad predicate: DuckDB's message on the page
        box = browser.find_element(By.ID, "where")
        box.clear()
        box.send_keys("retrun > 1", Keys.ENTER)
        wait.until(lambda b: b.find_elements(By.ID, "error"))
        assert "retrun" in browser.find_element(By.ID, "error").text
        browser.back()
        wait.until(lambda b: rows() == want)
        browser.find_element(By.CSS_SELECTOR, f'a.episode[href^="/episode/{want[1]}"]').click()
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "svg.plot"))
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.plot polyline")) == 3 + 2 + 1  # state, action, reward
        videos = browser.find_elements(By.CSS_SELECTOR, "video.camera")
        assert [v.get_attribute("data-key") for v in videos] == ["observation/front", "observation/wrist"]
        wait.until(
            lambda b: b.execute_script("return [...document.querySelectorAll('video')].every(v => v.readyState >= 2)")
        )
        sizes = browser.execute_script(
            "return [...document.querySelectorAll('video')].map(v => [v.videoWidth, v.videoHeight])"
        )
        assert sizes == [[FRONT[1], FRONT[0]], [WRIST[1], WRIST[0]]]
        # play: the videos' currentTime advances, the frame counter and the cursors follow
        browser.find_element(By.ID, "play").click()
        wait.until(lambda b: b.execute_script("return document.querySelector('video').currentTime") > 0.3)
        assert browser.find_element(By.ID, "frame-counter").text != "frame 1 / " + browser.find_element(
            By.ID, "scrubber"
        ).get_attribute("max")
        browser.find_element(By.ID, "play").click()  # pause
        # the scrubber moves every plot cursor and seeks every video to that frame
        scrubber = browser.find_element(By.ID, "scrubber")
        scrubber.send_keys(Keys.HOME)
        cursor_x = "return [...document.querySelectorAll('line.cursor')].map(c => c.getAttribute('x1'))"
        start_x = set(browser.execute_script(cursor_x))
        for _ in range(5):
            scrubber.send_keys(Keys.ARROW_RIGHT)
        cursors = set(browser.execute_script(cursor_x))
        assert len(cursors) == 1 and cursors != start_x
        assert browser.find_element(By.ID, "frame-counter").text.startswith("frame 6 /")
        times = browser.execute_script("return [...document.querySelectorAll('video')].map(v => v.currentTime)")
        assert times == pytest.approx([5.5 / FPS] * 2, abs=1e-3)
        wait.until(lambda b: b.execute_script("return [...document.querySelectorAll('video')].every(v => !v.seeking)"))
        out = Path(os.environ.get("EPISODELAKE_ARTIFACTS", Path(written[0]).parent))  # kept for a person to look at
        out.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(out / "viewer-episode.png"))
        print(f"screenshot: {out / 'viewer-episode.png'}")
    finally:
        browser.quit()
