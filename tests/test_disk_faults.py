"""Local disk faults: a file system that fills up under a writer, a read-only mount, unreadable tensor files.

Each writer runs tests/scripts/disk_faults.py in a real subprocess on a small
tmpfs (``mount -t tmpfs -o size=...``) filled up to a few hundred KiB by a
ballast file, so the disk fills after a few dozen episodes; removing the
ballast frees space. The parent then reopens the dataset (a fresh process:
this one never opened it before) and compares every visible episode with the
ground truth regenerated from ``(seed, index)`` (tests/workers/common.episode),
so nothing committed is lost and nothing partial is visible. The read-only
case bind-mounts a dataset and remounts the bind read-only. Mounting needs
root (CAP_SYS_ADMIN): the tests skip, saying so, where it is not permitted.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import episodelake as el
from episodelake.storage import faults

from .scripts.disk_faults import schema as script_schema
from .workers.common import assert_all_match, crash_schema, episode, write_stepwise

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "disk_faults.py"
SEED = 11
TMPFS_BYTES = 8 << 20
FREE_BYTES = 320 << 10  # left free next to the ballast: a few dozen episodes


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, check=False)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A tmpfs of TMPFS_BYTES, all but FREE_BYTES taken by ``ballast`` (remove it to free space)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = _mount("-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mnt))
    if done.returncode:
        pytest.skip(f"mounting a tmpfs is not permitted here (needs root): {done.stderr.strip()}")
    try:
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        (mnt / "ballast").write_bytes(b"\0" * (free - FREE_BYTES))
        yield mnt
    finally:
        _umount(mnt)


def run_writer(mode: str, url: str, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), mode, url, str(SEED), *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )


def read_line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"the script ended without a result:\n{proc.communicate(timeout=60)[1]}")
    return json.loads(line)


def check_plain(text: str) -> None:
    """A message a user can read: no NUL path separators, no terminal colour codes."""
    assert "\x00" not in text and "\\x00" not in text
    assert "\x1b[" not in text


def indexes(ds: el.Dataset) -> list[int]:
    return [int(e.meta["index"]) for e in ds.episodes()]


def assert_committed(url: str, count: int) -> None:
    """A fresh open sees exactly episode(SEED, 0..count-1), byte for byte."""
    ds = el.Dataset.open(url, read_only=True)
    assert indexes(ds) == list(range(count))
    assert_all_match(ds, [episode(SEED, i) for i in range(count)])


@pytest.mark.parametrize("path", ["tensors", "table"])
def test_disk_full_raises_storage_error_and_a_later_flush_commits(small_disk, path):
    url = str(small_disk / "ds")
    proc = run_writer("fill", url, *(["--tensors"] if path == "tensors" else []))
    error = read_line(proc)["error"]
    assert error["storage"] and error["errno"] == errno.ENOSPC, error
    assert error["dataset"] == url and url in error["text"] and "no space left" in error["text"]
    assert error["cause"] != "NoneType"  # chained to the library's own error
    check_plain(error["text"])
    failed_at = error["index"]
    assert failed_at >= 2  # at least one commit landed before the disk filled
    # While the disk is full: a fresh reader sees whole committed episodes only, a prefix of those recorded.
    seen = indexes(el.Dataset.open(url, read_only=True))
    assert seen == list(range(len(seen))) and len(seen) <= failed_at
    assert_committed(url, len(seen))
    (small_disk / "ballast").unlink()
    proc.stdin.write("freed\n")
    proc.stdin.flush()
    flushed = read_line(proc)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert flushed["flushed"] is not None
    # The episode whose finish() raised and every one pending with it are committed now, once each.
    assert_committed(url, failed_at + 1)
    assert "panicked" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("path", ["tensors", "table"])
def test_exit_at_disk_full_names_the_lost_episodes_once(small_disk, path):
    url = str(small_disk / "ds")
    proc = run_writer("exit", url, *(["--tensors"] if path == "tensors" else []))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err  # the script's own status: it ended normally
    failed_at = json.loads(out.splitlines()[0])["error"]["index"]
    ds = el.Dataset.open(url, read_only=True)
    seen = indexes(ds)
    assert seen == list(range(len(seen)))
    assert_all_match(ds, [episode(SEED, i) for i in seen])
    lost = [i for i in range(failed_at + 1) if i not in seen]
    assert lost  # the pending episodes could not be committed at exit
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("episodelake: not committed at exit: ")
    assert f"{len(lost)} finished episode(s)" in lines[0] and "no space left" in lines[0]
    named = [i for i in range(failed_at + 1) if f"'index': {i}}}" in lines[0]]
    assert named == lost
    check_plain(lines[0])


def test_bulk_write_at_disk_full_raises_and_leaves_nothing_pending(small_disk):
    """A bulk batch that hits the full disk raises StorageError; the batches committed before it stay."""
    url = str(small_disk / "ds")
    ds = el.Dataset.create(crash_schema(), url, commit_episodes=1)
    written = 0
    with pytest.raises(el.StorageError) as info:
        for _ in range(10_000):
            ds.append_episodes([episode(SEED, written + i).as_dict(unwrap_action=True) for i in range(4)])
            written += 4
    assert info.value.errno == errno.ENOSPC and info.value.dataset == url
    check_plain(str(info.value))
    assert written >= 4
    (small_disk / "ballast").unlink()
    assert ds.flush() is None  # the failed batch was not queued
    assert_committed(url, written)


def test_create_on_a_full_disk_raises_enospc(small_disk):
    stat = os.statvfs(small_disk)
    (small_disk / "filler").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize))
    url = str(small_disk / "ds")
    with pytest.raises(el.StorageError) as info:
        el.Dataset.create(crash_schema(), url)
    assert info.value.errno == errno.ENOSPC and info.value.dataset == url, info.value
    check_plain(str(info.value))
    (small_disk / "filler").unlink()
    with pytest.raises(el.DatasetNotFoundError):  # no descriptor: nothing half-created passes for a dataset
        el.Dataset.open(url, read_only=True)
    ds = el.Dataset.create(crash_schema(), url)  # with space again, creating there works
    write_stepwise(ds, episode(SEED, 0))
    ds.close()
    assert_committed(url, 1)


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` and the SHA-256 of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def read_only_mount(tmp_path) -> Iterator[tuple[Path, Path]]:
    """(source dir holding a dataset ``ds`` of episode(SEED, 0..2), its read-only bind mount)."""
    src, mnt = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    mnt.mkdir()
    ds = el.Dataset.create(crash_schema(), str(src / "ds"))
    for i in range(3):
        write_stepwise(ds, episode(SEED, i))
    ds.close()
    done = _mount("--bind", str(src), str(mnt))
    if done.returncode:
        pytest.skip(f"bind mounts are not permitted here (needs root): {done.stderr.strip()}")
    try:
        done = _mount("-o", "remount,ro,bind", str(mnt))
        if done.returncode:
            pytest.skip(f"remounting read-only is not permitted here: {done.stderr.strip()}")
        yield src, mnt
    finally:
        _umount(mnt)


def test_read_only_mount_reads_and_refuses_writes_with_erofs(read_only_mount, capfd):
    src, mnt = read_only_mount
    before = tree_digest(src)
    url = str(mnt / "ds")
    assert_committed(url, 3)  # reading works
    ds = el.Dataset.open(url)  # a writable open works too (and reads)...
    assert len(ds) == 3
    raw = episode(SEED, 3)
    attempts = {
        "new_episode": lambda: ds.new_episode({k: v[0] for k, v in raw.obs.items()}),
        "vector_writer": lambda: ds.vector_writer({k: v[:2] for k, v in raw.obs.items()}, num_envs=2),
        "append_episodes": lambda: ds.append_episodes([raw.as_dict(unwrap_action=True)]),
        "create": lambda: el.Dataset.create(crash_schema(), str(mnt / "new")),
        "delete": lambda: ds.delete([ds.episode(0).episode_id]),
    }
    for name, attempt in attempts.items():  # ...but writing raises StorageError EROFS
        with pytest.raises(el.StorageError) as info:
            attempt()
        err = info.value
        assert err.errno == errno.EROFS, (name, err)
        assert isinstance(err, OSError) and "read-only" in str(err), name
        assert str(mnt) in str(err) and err.dataset.startswith(str(mnt)), name
        check_plain(str(err))
    assert tree_digest(src) == before  # nothing was written
    assert not (src / "new").exists()
    assert "panicked" not in capfd.readouterr().err  # deltalake's panic report on the failed table write is dropped


@pytest.mark.parametrize("tensors", [True, False], ids=["tensors", "table"])
def test_mount_turning_read_only_under_a_writer(tmp_path, tensors):
    """The file system goes read-only (as ext4 does on errors) with episodes pending: flush() raises EROFS
    in plain words; once writable again the next flush() commits them."""
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    done = _mount("--bind", str(src), str(mnt))
    if done.returncode:
        pytest.skip(f"bind mounts are not permitted here (needs root): {done.stderr.strip()}")
    try:
        url = str(mnt / "ds")
        ds = el.Dataset.create(script_schema(tensors), url)
        for i in range(3):
            write_stepwise(ds, episode(SEED, i))
        ds.flush()
        write_stepwise(ds, episode(SEED, 3))  # pending
        assert _mount("-o", "remount,ro,bind", str(mnt)).returncode == 0
        with pytest.raises(el.StorageError) as info:
            ds.flush()
        assert info.value.errno == errno.EROFS and info.value.dataset == url, info.value
        check_plain(str(info.value))
        assert_committed(url, 3)
        assert _mount("-o", "remount,rw,bind", str(mnt)).returncode == 0
        assert ds.flush() is not None
        assert_committed(url, 4)
    finally:
        _umount(mnt)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can enter (pytest's own temporary root is private to its user)."""
    path = Path(tempfile.mkdtemp(prefix="episodelake-faults-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        subprocess.run(["chmod", "-R", "u+rwX", str(path)], check=False)
        shutil.rmtree(path)


def as_nobody(*args: str, home: Path) -> subprocess.Popen:
    """The script run as user nobody (root reads and writes past every permission)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to run the script as another user")
    return subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, str(SCRIPT), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home)},
        cwd=ROOT,
    )


def test_writer_on_a_root_it_may_not_write_gets_eacces(shared_dir):
    url = str(shared_dir / "ds")
    el.Dataset.create(crash_schema(), url).close()
    subprocess.run(["chmod", "-R", "a+rX,go-w", url], check=True)
    before = tree_digest(shared_dir / "ds")
    proc = as_nobody("write", url, str(SEED), home=shared_dir)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    error = json.loads(out)["error"]
    assert error["storage"] and error["errno"] == errno.EACCES and error["dataset"] == url, error
    assert "permission denied" in error["text"]
    assert tree_digest(shared_dir / "ds") == before


def test_prefetch_failure_raises_once_in_the_foreground(shared_dir):
    """Tensor files made unreadable under a prefetching stream: next() raises StorageError EACCES once."""
    url = str(shared_dir / "ds")
    ds = el.Dataset.create(crash_schema(), url)
    ds.append_episodes([episode(SEED, i).as_dict(unwrap_action=True) for i in range(64)])
    ds.close()
    subprocess.run(["chmod", "-R", "a+rX", url], check=True)
    proc = as_nobody("prefetch", url, str(SEED), home=shared_dir)
    try:
        assert read_line(proc) == {"ready": True}
        subprocess.run(["chmod", "-R", "go-r", str(shared_dir / "ds" / "tensors")], check=True)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = read_line(proc)
        _, err = proc.communicate(timeout=120)
    finally:
        subprocess.run(["chmod", "-R", "a+rX", url], check=False)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    raised = result["raised"]
    assert raised["storage"] and raised["errno"] == errno.EACCES, raised
    check_plain(raised["text"])
    assert result["after"] == "StopIteration"  # raised once; the stream then ends
    assert "Traceback" not in err and "panicked" not in err, err
    assert_all_match(el.Dataset.open(url, read_only=True), [episode(SEED, i) for i in range(64)])


# Rust's two report shapes: with a backtrace (RUST_BACKTRACE=1, as deltalake prints them) and without.
PANICS = (
    "\nthread 'tokio-rt-worker' (7315) panicked at /cargo/object_store-0.13.2/src/buffered.rs:369:41:\n"
    "Already shut down\nstack backtrace:\n   0: rust_begin_unwind\n"
    "             at /rustc/library/std/src/panicking.rs:1\n"
    "note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n",
    "thread 'main' panicked at src/lib.rs:4:5:\nForked process detected\n"
    "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n",
)


def test_panic_reports_are_dropped_from_stderr_only_when_the_block_failed(capfd):
    written = "kept before\n" + PANICS[0] + "kept between\n" + PANICS[1] + "kept after\n"
    with faults.quiet_panics():
        os.write(2, written.encode())
    assert capfd.readouterr().err == written  # a block that succeeded: stderr unchanged, panics included
    with pytest.raises(RuntimeError), faults.quiet_panics():
        os.write(2, written.encode())
        raise RuntimeError("the commit failed")
    assert capfd.readouterr().err == "kept before\nkept between\nkept after\n"


def test_compact_on_a_read_only_mount_opened_writable_raises_erofs(read_only_mount):
    """Issue 40, 5: ``maintenance.compact()`` on a read-only mount raised a raw ``OSError`` creating its lock
    file; it is a StorageError (EROFS) naming the dataset and the lock, like every other write."""
    src, mnt = read_only_mount
    before = tree_digest(src)
    ds = el.Dataset.open(str(mnt / "ds"))
    with pytest.raises(el.StorageError) as info:
        ds.maintenance.compact()
    err = info.value
    assert err.errno == errno.EROFS and "_episodelake_compact.lock" in str(err), str(err)
    assert err.dataset == str(mnt / "ds")
    check_plain(str(err))
    assert tree_digest(src) == before
