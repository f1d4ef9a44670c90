"""Run one benchmark command on two commits of episodelake, alternating, in one run.

A refactor must not slow the hot paths, and this shared machine drifts: so the
"before" and "after" runs alternate (before, after, before, after, ...) inside
one invocation, each commit's own benchmark file against its own sources, and
the figures are read side by side. Each commit is checked out in a temporary
git worktree (removed afterwards); the current virtual environment runs both,
with ``PYTHONPATH`` pointing at that worktree's ``src``.

Run: ``.venv/bin/python benchmarks/before_after.py BEFORE AFTER --rounds 2 -- benchmarks/bench_write.py --quick``
(``AFTER`` may be ``HEAD``; the command after ``--`` is a benchmark path and its arguments).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worktree(ref: str, where: Path) -> Path:
    """A detached checkout of ``ref`` under ``where``."""
    path = where / ref.replace("/", "_")
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref], check=True, capture_output=True
    )
    return path


def run(tree: Path, command: list[str]) -> tuple[float, str]:
    """Seconds and output of ``command`` run from ``tree`` with its sources first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    start = time.perf_counter()
    out = subprocess.run([sys.executable, *command], cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{command} failed in {tree}:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return time.perf_counter() - start, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=2, help="before/after pairs")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        ap.error("give the benchmark after --: -- benchmarks/bench_X.py [args]")
    with tempfile.TemporaryDirectory(prefix="episodelake-before-after-") as tmp:
        trees = {ref: worktree(ref, Path(tmp)) for ref in (args.before, args.after)}
        try:
            for r in range(args.rounds):
                for ref, tree in trees.items():
                    seconds, text = run(tree, command)
                    print(f"===== round {r + 1}, {ref} ({seconds:.0f} s): {' '.join(command)}")
                    print(text, flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


if __name__ == "__main__":
    main()
