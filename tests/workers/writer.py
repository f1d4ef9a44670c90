"""Writer subprocess for the crash and concurrency tests.

``python -m tests.workers.writer append PATH SEED N PER_COMMIT`` waits for a
line on stdin, then appends ``episode(SEED, i)`` for i < N, flushing every
PER_COMMIT episodes and printing ``committed i j ...`` after each commit.

``python -m tests.workers.writer serve`` is a fork server for crash trials: it
imports everything once, then for each JSON trial on stdin forks a child that
writes and (maybe) dies; it prints the child's output, then ``exit STATUS``.
A trial's ``crash`` picks where the child SIGKILLs itself; the hooks are
installed by monkeypatching in the child only (the library has no test hooks):

* ``none``: no self-kill (the parent may kill it at a random output line);
* ``step``: after ``at`` add_step calls in total (mid-episode);
* ``tensor``: right after the tensor write is issued, before it completes;
* ``before-commit``: tensors written, table commit not started;
* ``parquet``: during the commit, as soon as a new Parquet data file appears;
* ``after-commit``: the commit returned, the writer has not recorded it.

The last four hit the ``at``-th commit of the trial (0-based).

Kill points are deterministic: at each of them the child prints ``point NAME``
and blocks (``sigwait`` on SIGUSR1) until the parent SIGKILLs it; after each
``episode``/``committed`` line it blocks too, and the parent either kills it
there or lets it go on with SIGUSR1. (The ``parquet`` point is seen by a
thread watching the directory: it prints the line and SIGSTOPs the process.)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import episodelake as el
from episodelake.storage import table, tensors

from .common import episode, write_stepwise


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # unbuffered: a kill never loses or duplicates output


def wait_for_parent() -> None:
    """Block until the parent lets us go on (SIGUSR1) or kills us."""
    signal.sigwait({signal.SIGUSR1})


def halt(name: str) -> None:
    """A named kill point: report it, then wait for the parent's SIGKILL."""
    say(f"point {name}")
    while True:
        wait_for_parent()


def report(line: str) -> None:
    """An output line the parent may kill us after."""
    say(line)
    wait_for_parent()


class Countdown:
    """True on the ``at``-th call (0-based): earlier commits succeed, leaving committed rows before the crash."""

    def __init__(self, at: int) -> None:
        self.left = at

    def tick(self) -> bool:
        self.left -= 1
        return self.left < 0


def install_crash(path: str, crash: str, at: int) -> None:
    calls = Countdown(at)
    if crash == "step":
        original_step = el.EpisodeWriter.add_step
        count = [0]

        def add_step(self, step):
            if count[0] == at:
                halt("step")
            count[0] += 1
            return original_step(self, step)

        el.EpisodeWriter.add_step = add_step
    elif crash == "tensor":
        # die right after a tensor write was issued (it may be half done), before the commit
        original_write = tensors.TensorArray.write

        def write(self, *args, **kwargs):
            out = original_write(self, *args, **kwargs)
            if calls.tick():
                halt("tensor")
            return out

        tensors.TensorArray.write = write
    elif crash in ("before-commit", "parquet", "after-commit"):
        original_commit = table.EpisodeTable.append

        def commit(self, rows, *args, **kwargs):
            if not calls.tick():
                return original_commit(self, rows, *args, **kwargs)
            if crash == "before-commit":
                halt("before-commit")
            if crash == "parquet":
                threading.Thread(target=stop_on_new_parquet, args=(path, parquet_files(path)), daemon=True).start()
            original_commit(self, rows, *args, **kwargs)
            halt("parquet" if crash == "parquet" else "after-commit")  # parquet: the commit won the race

        table.EpisodeTable.append = commit


def parquet_files(path: str) -> set[str]:
    out = set()
    for root, _, files in os.walk(os.path.join(path, "episodes")):
        if "_delta_log" not in root:
            out.update(os.path.join(root, f) for f in files if f.endswith(".parquet"))
    return out


def stop_on_new_parquet(path: str, before: set[str]) -> None:
    while parquet_files(path) <= before:
        pass
    say("point parquet")
    os.kill(os.getpid(), signal.SIGSTOP)  # every thread stops; the parent's SIGKILL ends it


def trial(cmd: dict) -> None:
    install_crash(cmd["path"], cmd["crash"], cmd.get("at", 0))
    ds = el.Dataset.open(cmd["path"], commit_episodes=1_000_000)
    seed, per_commit = cmd["seed"], cmd["per_commit"]
    batch: list[int] = []
    for i in range(cmd["episodes"]):
        report(f"episode {i}")
        raw = episode(seed, i)
        if cmd["stepwise"]:
            write_stepwise(ds, raw)
        else:
            ds.append_episodes([raw.as_dict(unwrap_action=True)])
        batch.append(i)
        if len(batch) == per_commit or i == cmd["episodes"] - 1:
            ds.flush()
            report("committed " + " ".join(map(str, batch)))
            batch = []


def serve() -> None:
    for line in iter(sys.stdin.readline, ""):
        cmd = json.loads(line)
        pid = os.fork()
        if pid == 0:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # queued until sigwait takes it
            say(f"pid {os.getpid()}")
            try:
                trial(cmd)
                say("done")
            except BaseException as exc:
                say(f"error {exc!r}")
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        say(f"exit {status}")


def append(path: str, seed: int, n: int, per_commit: int) -> None:
    ds = el.Dataset.open(path, commit_episodes=1_000_000)
    sys.stdin.readline()  # start together with the other writers
    for start in range(0, n, per_commit):
        batch = list(range(start, min(n, start + per_commit)))
        ds.append_episodes([episode(seed, i).as_dict(unwrap_action=True) for i in batch])
        ds.flush()
        say("committed " + " ".join(map(str, batch)))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        append(sys.argv[2], *(int(a) for a in sys.argv[3:6]))
