"""Exit hooks and after-fork resets run in the order written in ``core/lifecycle.py``, whatever the import order.

Each case is a real ``python -c`` script in a subprocess: the order a
process registered its hooks in depends on which modules it imported first,
and exit and fork behaviour can only be seen from outside the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import episodelake as el
from episodelake.core import lifecycle
from episodelake.storage import table

from .workers.common import assert_all_match, episode

ROOT = Path(__file__).resolve().parents[1]
SEED = 11

# the hooks the library registers at import, in the order lifecycle.EXIT_STAGES / FORK_STAGES write them
LIBRARY_EXIT_HOOKS = [
    ["commit", "episodelake.write.commit._commit_at_exit"],
    ["prefetchers", "episodelake.sampling.prefetch._stop_all_prefetchers"],
    ["compactions", "episodelake.storage.table.join_compactions"],
    ["cache writes", "episodelake.storage.table_cache.wait"],
    ["databases", "episodelake.read.query._close_databases_at_exit"],
    ["gates", "episodelake.write.gate._close_at_exit"],
    ["snapshots", "episodelake.read.snapshot._release_arrow_at_exit"],
]
LIBRARY_FORK_HOOKS = [
    ["codecs", "episodelake.core.codecs._reset_after_fork"],
    ["fetchers", "episodelake.storage.fetch._reset_after_fork"],
    ["batching", "episodelake.read.batching._reset_lock_after_fork"],
]


def run_script(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )


def test_stage_lists_name_each_stage_once_and_threading_stages_come_first():
    names = [name for name, _ in lifecycle.EXIT_STAGES]
    assert len(set(names)) == len(names)
    assert len(set(lifecycle.FORK_STAGES)) == len(lifecycle.FORK_STAGES)
    moments = [moment for _, moment in lifecycle.EXIT_STAGES]
    assert moments == sorted(moments, key=["threading", "atexit"].index)


def test_unknown_stages_are_refused():
    with pytest.raises(ValueError, match="unknown exit stage 'comit'"):
        lifecycle.on_exit("comit", lambda: None)
    with pytest.raises(ValueError, match="unknown after-fork stage 'fetcher'"):
        lifecycle.after_fork("fetcher", lambda: None)


# Imports the named modules in the given order, under a package stand-in that skips episodelake/__init__.py
# (which would import everything in its own order), recording the order the stages are registered in.
ORDER_SCRIPT = """
import importlib, json, sys, types
package = types.ModuleType("episodelake")
package.__path__ = [sys.argv[1]]
sys.modules["episodelake"] = package
from episodelake.core import lifecycle
registered = []

def observed(register):
    def wrapper(stage, hook):
        registered.append(stage)
        register(stage, hook)
    return wrapper

lifecycle.on_exit, lifecycle.after_fork = observed(lifecycle.on_exit), observed(lifecycle.after_fork)
for name in sys.argv[2:]:
    importlib.import_module(name)
print(json.dumps({"registered": registered, "exit": lifecycle.exit_hooks(), "fork": lifecycle.fork_hooks()}))
"""

REGISTERING = (  # the modules that register hooks, imported after the ones a case names first
    "write.commit",
    "sampling.prefetch",
    "storage.table_cache",
    "storage.table",
    "read.query",
    "read.snapshot",
    "core.codecs",
    "storage.fetch",
    "read.batching",
)


@pytest.mark.parametrize(
    ("imports", "registered"),
    [
        (
            ["sampling.prefetch", "write.commit"],
            [
                "fetchers",
                "codecs",
                "cache writes",
                "compactions",
                "snapshots",
                "batching",
                "prefetchers",
                "gates",
                "commit",
                "databases",
            ],
        ),
        (
            ["write.commit", "read.query", "sampling.prefetch"],
            [
                "codecs",
                "fetchers",
                "cache writes",
                "compactions",
                "gates",
                "commit",
                "snapshots",
                "databases",
                "batching",
                "prefetchers",
            ],
        ),
        (
            ["read.query", "sampling.prefetch", "write.commit"],
            [
                "codecs",
                "cache writes",
                "compactions",
                "fetchers",
                "snapshots",
                "databases",
                "batching",
                "prefetchers",
                "gates",
                "commit",
            ],
        ),
    ],
)
def test_registered_order_is_the_written_order_whatever_the_import_order(imports, registered):
    names = [f"episodelake.{name}" for name in [*imports, *REGISTERING]]
    result = run_script(ORDER_SCRIPT, str(ROOT / "src" / "episodelake"), *names)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["registered"] == registered  # the import order really changed the registration order
    assert out["exit"] == LIBRARY_EXIT_HOOKS
    assert out["fork"] == LIBRARY_FORK_HOOKS


def test_the_package_registers_the_library_hooks_in_the_written_order():
    """Under the real package (which loads its modules on first use), the modules register in the written order."""
    result = run_script(
        "import importlib, json, episodelake; from episodelake.core import lifecycle; "
        f"[importlib.import_module('episodelake.' + m) for m in {list(REGISTERING)!r}]; "
        "print(json.dumps([lifecycle.exit_hooks(), lifecycle.fork_hooks()]))"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [LIBRARY_EXIT_HOOKS, LIBRARY_FORK_HOOKS]


# Probe hooks are registered into every stage in reverse order. A threading stage must run before non-daemon
# threads are joined and while concurrent.futures still takes work, an atexit stage after both; one failing
# probe must not stop the others.
RUN_SCRIPT = """
import threading
from concurrent.futures import ThreadPoolExecutor
from episodelake.core import lifecycle

def say(text):
    print(text, flush=True)

def pool_answer():
    try:
        return "pool ok" if ThreadPoolExecutor(1).submit(int, 1).result() == 1 else "pool wrong"
    except RuntimeError:
        return "pool refused"

released = threading.Event()

def worker():
    released.wait()
    say("thread ended")

def probe(stage):
    def hook():
        if stage == "compactions":
            raise RuntimeError("probe failure")
        say(f"{stage} {pool_answer()}")
        if stage == LAST_THREADING:
            released.set()
    return hook

LAST_THREADING = [name for name, moment in lifecycle.EXIT_STAGES if moment == "threading"][-1]
for stage, _ in reversed(lifecycle.EXIT_STAGES):
    lifecycle.on_exit(stage, probe(stage))
threading.Thread(target=worker).start()  # not a daemon: interpreter shutdown joins it
say("main ended")
"""


def test_hooks_run_in_the_written_order_at_their_moment_and_a_failing_one_does_not_stop_the_rest():
    result = run_script(RUN_SCRIPT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "main ended",
        "commit pool ok",
        "prefetchers pool ok",
        "cache writes pool ok",
        "thread ended",  # joined after the threading stages
        "databases pool refused",  # atexit: concurrent.futures has shut down
        "gates pool refused",
        "snapshots pool refused",
        "temp dirs pool refused",
    ]
    failed = "episodelake: exit hook 'compactions' (__main__.probe.<locals>.hook) failed: RuntimeError: probe failure"
    assert failed in result.stderr
    assert "Traceback" not in result.stderr


FORK_SCRIPT = """
import os, sys
import episodelake
from episodelake.core import codecs, lifecycle
from episodelake.read import batching
from episodelake.storage import fetch

ran = []
lifecycle.after_fork("batching", lambda: ran.append("batching"))
lifecycle.after_fork("codecs", lambda: 1 / 0)  # guarded: the other resets still run
locks = [codecs._POOL_LOCK, codecs.decoded_cache._lock, fetch._FETCHERS_LOCK, batching._READER_LOCK]
for lock in locks:
    lock.acquire()  # as if a parent thread held each at fork time
pid = os.fork()
if pid == 0:
    fresh = [codecs._POOL_LOCK, codecs.decoded_cache._lock, fetch._FETCHERS_LOCK, batching._READER_LOCK]
    ok = all(not lock.locked() for lock in fresh) and all(a is not b for a, b in zip(fresh, locks))
    ok = ok and ran == ["batching"] and codecs.codec_pool().submit(int, 7).result() == 7
    stages = [stage for stage, _ in lifecycle.fork_hooks()]
    ok = ok and stages == ["codecs", "codecs", "fetchers", "batching", "batching"]
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_runs_every_reset_and_gets_fresh_locks():
    result = run_script(FORK_SCRIPT)
    assert result.returncode == 0, result.stderr
    assert "episodelake: after-fork hook 'codecs'" in result.stderr and "ZeroDivisionError" in result.stderr


# A pending episode, a live prefetching stream and a compaction started by the last commit, all left to exit.
EXIT_SCRIPT = """
import sys
from tests.workers.common import crash_schema, episode, write_stepwise
import episodelake as el
from episodelake.storage import table

url, seed = sys.argv[1], int(sys.argv[2])
ds = el.Dataset.create(crash_schema(), url)
for i in range(table.COMPACT_EVERY - 1):
    write_stepwise(ds, episode(seed, i))
    ds.flush()
stream = ds.segment_stream(2, batch_size=4, seed=0, prefetch=2)
next(stream)
write_stepwise(ds, episode(seed, table.COMPACT_EVERY - 1))
ds.flush()  # the 64th commit starts a background compaction
write_stepwise(ds, episode(seed, table.COMPACT_EVERY))  # pending: committed at exit
"""


@pytest.mark.slow
def test_exit_commits_joins_the_stream_and_the_compaction_and_exits_0(tmp_path):
    url = str(tmp_path / "ds")
    result = run_script(EXIT_SCRIPT, url, str(SEED))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    ds = el.Dataset.open(url, read_only=True)
    assert_all_match(ds, [episode(SEED, i) for i in range(table.COMPACT_EVERY + 1)])
    assert "COMPACT" in [entry["operation"] for entry in ds.history()]  # the compaction was joined, not cut off
