"""The process's lifecycle: what episodelake does at interpreter exit and in a forked child, in one written order.

Modules do not register with Python themselves. They hand their hooks to a
named stage (``on_exit("commit", fn)``, ``after_fork("fetchers", fn)``), and
this module runs the stages in the order of :data:`EXIT_STAGES` and
:data:`FORK_STAGES`, whatever the order the modules were imported in (hooks of
one stage run in the order they were registered). Each hook is guarded: one
that fails prints one line on stderr and the next hook still runs; only a
``KeyboardInterrupt`` or ``SystemExit`` (the user stopping the exit) stops the
rest.

Exit has two moments, each stage bound to one of them:

- ``"threading"``: ``threading``'s exit hooks, the first step of interpreter
  shutdown: before ``concurrent.futures`` shuts its pools down (the exit
  commit and a compaction still submit work to them), before non-daemon
  threads are joined, before ``atexit`` callbacks and long before native
  static destructors (no prefetch thread may be inside a TensorStore read
  when TensorStore tears down).
- ``"atexit"``: ``atexit`` callbacks, after the threads are joined, while the
  interpreter and the native libraries are still fully alive.

Python is told once per moment, when the first hook of that moment is
registered (so, as before, after the libraries the registering module imports
have registered theirs, and before those imported later).
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401  registers the pools' shutdown before our threading hook, so it runs after it
import os
import sys
import threading
from collections.abc import Callable
from typing import Literal

Moment = Literal["threading", "atexit"]

EXIT_STAGES: tuple[tuple[str, Moment], ...] = (
    ("commit", "threading"),  # write/commit.py: commit every live sink of this process (needs the pools)
    ("prefetchers", "threading"),  # sampling: stop and join the streams' prefetch threads
    ("compactions", "threading"),  # storage/table.py: join background compactions (the exit commit may start one)
    ("cache writes", "threading"),  # storage/table.py: wait for the table cache's entries being written
    ("databases", "atexit"),  # read/query.py: close the DuckDB connections and databases
    ("gates", "atexit"),  # write/gate.py: close the commit gate's DuckDB cursors and database
    ("snapshots", "atexit"),  # read/snapshot.py: drop the snapshots' Arrow datasets while Arrow is alive
    ("temp dirs", "atexit"),  # storage/location.py: remove the private credential directories
)
"""The exit stages in the order they run, each with its moment (threading stages all run before atexit ones)."""

FORK_STAGES: tuple[str, ...] = (
    "codecs",  # core/codecs.py: the codec pool's lock and the decoded-chunk cache's lock
    "fetchers",  # storage/fetch.py: the fetcher registry's lock
    "batching",  # read/batching.py: the window reader's lock
)
"""The after-fork stages, run in the child in this order (locks a parent thread may have held at fork time)."""

_MOMENTS: dict[str, Moment] = dict(EXIT_STAGES)
_EXIT_HOOKS: dict[str, list[Callable[[], object]]] = {name: [] for name, _ in EXIT_STAGES}
_FORK_HOOKS: dict[str, list[Callable[[], object]]] = {name: [] for name in FORK_STAGES}
_TOLD_PYTHON: set[str] = set()  # the moments ("threading", "atexit", "fork") whose runner Python already calls
_LOCK = threading.Lock()


def on_exit(stage: str, hook: Callable[[], object]) -> None:
    """Run ``hook`` at interpreter exit, in ``stage``'s place of :data:`EXIT_STAGES` (``ValueError`` if unknown)."""
    moment = _MOMENTS.get(stage)
    if moment is None:
        raise ValueError(f"unknown exit stage {stage!r}; the stages are {', '.join(_MOMENTS)}")
    with _LOCK:
        _EXIT_HOOKS[stage].append(hook)
        _tell_python(moment)


def after_fork(stage: str, hook: Callable[[], object]) -> None:
    """Run ``hook`` in a forked child, in ``stage``'s place of :data:`FORK_STAGES` (``ValueError`` if unknown)."""
    if stage not in _FORK_HOOKS:
        raise ValueError(f"unknown after-fork stage {stage!r}; the stages are {', '.join(FORK_STAGES)}")
    with _LOCK:
        _FORK_HOOKS[stage].append(hook)
        _tell_python("fork")


def exit_hooks() -> list[tuple[str, str]]:
    """``(stage, hook name)`` of every registered exit hook, in the order they will run."""
    with _LOCK:
        return [(stage, _name(hook)) for stage, _ in EXIT_STAGES for hook in _EXIT_HOOKS[stage]]


def fork_hooks() -> list[tuple[str, str]]:
    """``(stage, hook name)`` of every registered after-fork hook, in the order a forked child runs them."""
    with _LOCK:
        return [(stage, _name(hook)) for stage in FORK_STAGES for hook in _FORK_HOOKS[stage]]


def _name(hook: Callable[[], object]) -> str:
    target = getattr(hook, "func", hook)  # a functools.partial names its function
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def _tell_python(moment: str) -> None:
    if moment in _TOLD_PYTHON:
        return
    _TOLD_PYTHON.add(moment)
    if moment == "threading":
        threading._register_atexit(_run_threading_exit)  # type: ignore[attr-defined]
    elif moment == "atexit":
        atexit.register(_run_atexit)
    else:
        os.register_at_fork(after_in_child=_run_after_fork)


def _run(what: str, stage: str, hooks: list[Callable[[], object]]) -> None:
    for hook in hooks:
        try:
            hook()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # BaseException: deltalake's Rust panics arrive as pyo3's PanicException
            why = f"{type(exc).__name__}: {exc}"
            print(f"episodelake: {what} hook {stage!r} ({_name(hook)}) failed: {why}", file=sys.stderr)


def _run_exit(moment: Moment) -> None:
    with _LOCK:
        due = [(stage, list(_EXIT_HOOKS[stage])) for stage, at in EXIT_STAGES if at == moment]
    for stage, hooks in due:
        _run("exit", stage, hooks)


def _run_threading_exit() -> None:
    _run_exit("threading")


def _run_atexit() -> None:
    _run_exit("atexit")


def _run_after_fork() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # a parent thread may have held it at fork time
    for stage in FORK_STAGES:
        _run("after-fork", stage, _FORK_HOOKS[stage])
