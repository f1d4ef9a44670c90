"""Record episodes the way a user script does, then end in a chosen way (for tests/test_exit_commit.py).

``python tests/scripts/exit_record.py URL SEED N --end {normal,raise,wait,loop} --holder {global,local}``
records ``episode(SEED, i)`` for i < N (``loop``: until interrupted) with
new_episode/add_step and sets the required ``success`` meta after the last
step, as a collection loop does; it never calls ``flush()`` or ``close()``.
``--open`` leaves one more episode running, ``--await-last`` leaves the last
one without its ``success``. Storage options come as JSON in
``EXIT_STORAGE_OPTIONS``. ``--sigint-in-commit`` makes the first table commit
send this process a SIGINT right after the commit is recorded (installed by
monkeypatching here: the library has no test hooks), i.e. a Ctrl-C that lands
inside a commit. Lines on stdout: ``ready`` once the N episodes are
recorded (``loop``: after the first N), then the script ends:

* ``normal``: returns; ``raise``: an uncaught RuntimeError;
* ``wait``: blocks reading stdin until the parent interrupts or kills it;
* ``loop``: keeps recording until the parent interrupts it (needs ``--holder global``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import signal
import sys

from tests.workers.common import crash_schema, episode, write_stepwise

import episodelake as el
from episodelake.storage import table

DS = None  # --holder global keeps the dataset here until exit


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(dataclasses.replace(f, required=f.name == "success") for f in crash_schema().fields)


def record(ds: el.Dataset, seed: int, index: int, outcome: bool = True) -> None:
    """Record ``episode(seed, index)``; its ``success`` outcome is set after the last step (if ``outcome``)."""
    write_stepwise(ds, episode(seed, index), held=("success",), set_held=outcome)


def run(args: argparse.Namespace) -> el.Dataset:
    options = json.loads(os.environ.get("EXIT_STORAGE_OPTIONS", "{}"))
    ds = el.Dataset.create(schema(), args.url, storage_options=options, commit_episodes=args.commit_episodes)
    for i in range(args.n):
        record(ds, args.seed, i, outcome=not (args.await_last and i == args.n - 1))
    if args.open:
        raw = episode(args.seed, args.n)
        ds.new_episode({k: v[0] for k, v in raw.obs.items()}).add_step(
            {"observations": {k: v[1] for k, v in raw.obs.items()}, "actions": 0, "rewards": 0.0}
        )
    return ds


def sigint_in_first_commit() -> None:
    original = table.EpisodeTable.append
    sent = []

    def append(self, rows, *args, **kwargs):
        version = original(self, rows, *args, **kwargs)
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: still inside the commit
        return version

    table.EpisodeTable.append = append


def main() -> None:
    global DS
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("seed", type=int)
    p.add_argument("n", type=int)
    p.add_argument("--end", choices=["normal", "raise", "wait", "loop"], default="normal")
    p.add_argument("--holder", choices=["global", "local"], default="global")
    p.add_argument("--commit-episodes", type=int, default=64)
    p.add_argument("--open", action="store_true")
    p.add_argument("--await-last", action="store_true")
    p.add_argument("--sigint-in-commit", action="store_true")
    args = p.parse_args()
    if args.sigint_in_commit:
        sigint_in_first_commit()
    if args.holder == "global":
        DS = run(args)
    else:
        run(args)  # the dataset was a local of a function that returned: nothing references it now
        gc.collect()
    print("ready", flush=True)
    if args.end == "raise":
        raise RuntimeError("the user's script failed")
    if args.end == "wait":
        sys.stdin.readline()
    if args.end == "loop":
        for i in range(args.n, 10**9):
            record(DS, args.seed, i)


if __name__ == "__main__":
    main()
