"""Mutation run: plant realistic one-line bugs in a copy of the library and see which the tests catch.

usage (from the repository root, with the project's venv active)::

    python tools/mutate.py [--per-module 3] [--seed 0] [--timeout 300] [--copy /tmp/episodelake-mut]
                           [--modules sampling/segment_index sampling/samplers ...] [--named-only]
                           [--rerun RESULTS.jsonl] [--out mutation-results.jsonl]

The committed tree at ``--rev`` (``git archive``, default HEAD) is unpacked
into ``--copy`` first; nothing under this checkout is ever modified. For each
module of :data:`MODULE_TESTS` (named by its path under ``src/episodelake/``,
``read/query`` for ``read/query.py``) the script lists every one-line mutation of
the kinds in :data:`OPERATORS` (comparisons off by one or flipped, ``and``/
``or``, a dropped ``not``, ``min``/``max`` swapped, constants ±1, a removed
``raise``/``return``/``continue``, a removed ``.result()``/``.wait()``),
skips docstrings, comments and mutants that do not compile, and draws
``--per-module`` of them with a seeded generator (same seed, same tree: same
mutants). The hand-planted :data:`NAMED` mutations (bugs found in 0.2, and in 0.8 by issue 39) run
too (``--no-named`` leaves them out). Each mutant is written into the copy, the module's test files run
(``pytest -x -q``, default markers; tests named one by one run whatever
their marker) with the copy first on ``PYTHONPATH``, and
the outcome recorded: ``killed`` (a test failed), ``survived`` (all passed),
``timeout`` (ran past ``--timeout``; counted as killed, as mutmut does) or
``error``. Results go to ``--out`` as JSON lines (a rerun with the same
``--out`` skips mutants already recorded); survivors are printed at the end.
``--rerun`` runs only the survivors of an earlier results file (after tests
were added), each planted again on the line that still reads as it did.
While the file ``--pause`` exists, the run waits between mutants
(so the machine can run something else; it never times a mutant that way).
Before mutating, every module's tests run unmutated (``--baseline-runs``
times): a test failing in any of them (broken at that commit, or flaky) is
left out of that module's mutant runs (it would make every mutant look
killed) and named in the log.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import tokenize
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "src/episodelake"

# module (its path under src/episodelake/, no .py) -> the test files that cover it (existing ones, plus the property
# tests written for its survivors)
MODULE_TESTS: dict[str, list[str]] = {
    "sampling/segment_index": ["test_sampling.py", "test_properties_sampling.py"],
    "sampling/samplers": ["test_priority.py", "test_properties_sampling.py", "test_properties_priority.py"],
    "sampling/sumtree": ["test_priority.py", "test_properties_priority.py"],
    "sampling/stream": [
        "test_sampling.py",
        "test_properties_sampling.py",
        "test_follow_pending.py",
        "test_refresh.py",
        "test_properties_resume.py",
    ],
    "sampling/planner": ["test_sampling.py", "test_properties_sampling.py", "test_properties_resume.py"],
    "sampling/options": ["test_options.py", "test_bad_input.py"],
    "sampling/anchors": ["test_anchors.py", "test_properties_anchors.py"],
    "core/quality": ["test_quality_audit.py", "test_properties_checks.py"],
    "read/audit": ["test_quality_audit.py", "test_notebook.py"],
    "write/quality": ["test_quality_audit.py", "test_properties_checks.py"],
    "core/constraints": ["test_constraints.py", "test_properties_meta_bounds.py", "test_constraint_on_fail.py"],
    "write/gate": [
        "test_quality_commit.py",
        "test_constraints.py",
        "test_constraint_on_fail.py",
        "test_gym_quality.py",
    ],
    "ops/schema_edit": ["test_schema_edit.py"],
    "ops/merge": ["test_merge.py"],
    "ops/copy": ["test_copy.py", "test_image_codecs.py"],
    "sampling/prefetch": ["test_sampling.py", "test_shutdown.py", "test_prefetch.py"],
    "core/lifecycle": ["test_lifecycle.py"],
    "ops/namespaces": ["test_face.py", "test_maintenance.py", "test_derived.py", "test_bad_input.py", "test_edit.py"],
    "ops/edit": ["test_edit.py", "test_properties_meta_bounds.py", "test_properties_split.py", "test_error_seams.py"],
    "viewer/server": ["test_viewer.py", "test_viewer_security.py"],
    "viewer/pages": ["test_viewer.py", "test_viewer_security.py"],
    "storage/sql/__init__": ["test_sql_sandbox.py", "test_query.py", "test_properties_query_limits.py"],
    "integrations/gymnasium": ["test_gym_recording.py", "test_gym_quality.py"],
    "storage/retention": [
        "test_capacity.py",
        "test_properties_capacity.py",
        "test_replay_disk.py",
        "test_capacity_options.py",
    ],
    "read/collection": ["test_collection.py", "test_concat.py"],
    "read/selection": ["test_query.py", "test_properties_selection.py"],
    "core/stats": ["test_stats_scale.py", "test_stats_files.py", "test_query.py", "test_maintenance.py"],
    "storage/table_cache": ["test_table_cache.py", "test_stats_files.py", "test_where_unscanned.py"],
    "read/query": [
        "test_query.py",
        "test_where_unscanned.py",
        "test_table_corruption.py",
        "test_properties_selection.py",
        "test_sql_faults.py",
        "test_sql_sandbox.py",
    ],
    "sampling/priority": ["test_priority.py", "test_properties_priority.py"],
    "write/commit": [
        "test_exit_commit.py::test_normal_exit_commits_finished_episodes",
        "test_exit_commit.py::test_a_forked_child_never_commits_the_parents_episodes",
        "test_read_your_writes.py",
        "test_properties_commit.py",
        "test_follow_pending.py",
    ],
    "write/writer": ["test_roundtrip.py", "test_outcome_meta.py", "test_properties_commit.py"],
    "read/snapshot": ["test_corruption.py", "test_properties_verify.py"],
    "storage/location": ["test_location.py", "test_secrets.py", "test_properties_location.py"],
    "storage/fetch": ["test_snapshot_reads.py", "test_fork_workers.py"],
    "read/batching": ["test_sampling.py", "test_properties_sampling.py", "test_resident.py", "test_follow_pending.py"],
    "lineage": [
        "test_lineage.py",
        "test_options.py",
        "test_secrets.py",
        "test_properties_state_files.py",
        "test_properties_resume.py",
    ],
    "dataset": ["test_read_your_writes.py", "test_properties_read_your_writes.py"],
}
# modules drawn from when --modules is not given (dataset.py only carries a named mutation)
DEFAULT_MODULES = [m for m in MODULE_TESTS if m != "dataset"]


@dataclass(frozen=True)
class Mutant:
    module: str
    line: int  # 1-based
    kind: str
    before: str  # the original line (stripped)
    after: str  # the mutated line (stripped)
    name: str = ""  # named (hand-planted) mutations only

    @property
    def key(self) -> str:
        # no line number: a rerun after edits elsewhere in the module still finds the same mutant
        return f"{self.module}:{self.kind}:{self.before}:{self.after}"


# (kind, regex, replacement): applied one occurrence at a time within a line of code
OPERATORS: list[tuple[str, str, str]] = [
    ("lt->le", r"(?<=\s)<(?=\s)", "<="),
    ("le->lt", r"(?<=\s)<=(?=\s)", "<"),
    ("gt->ge", r"(?<=\s)>(?=\s)", ">="),
    ("ge->gt", r"(?<=\s)>=(?=\s)", ">"),
    ("eq->ne", r"(?<=\s)==(?=\s)", "!="),
    ("ne->eq", r"(?<=\s)!=(?=\s)", "=="),
    ("and->or", r"(?<=\s)and(?=\s)", "or"),
    ("or->and", r"(?<=\s)or(?=\s)", "and"),
    ("drop-not", r"(?<![\w.])not\s+(?!in\b)", ""),
    ("min->max", r"(?<![\w.])min\(", "max("),
    ("max->min", r"(?<![\w.])max\(", "min("),
    ("np.minimum->maximum", r"np\.minimum\(", "np.maximum("),
    ("np.maximum->minimum", r"np\.maximum\(", "np.minimum("),
    ("plus1->plus0", r"\+ 1\b", "+ 0"),
    ("minus1->minus0", r"- 1\b", "- 0"),
    ("const+1", r"(?<![\w.\[])([2-9]|1[0-9])(?![\w.\]])", "<+1>"),
    ("const-1", r"(?<![\w.\[])([1-9]|1[0-9])(?![\w.\]])", "<-1>"),
    ("drop-result", r"\.result\(\)", ""),
    ("drop-wait", r"\.wait\(\)", ""),
    ("side-right->left", r"side=\"right\"", 'side="left"'),
    ("drop-copy", r"\.copy\(\)", ""),
]
# whole statements replaced by ``pass`` (single-line ones only)
DROPPED = {ast.Raise: "drop-raise", ast.Return: "drop-return", ast.Continue: "drop-continue", ast.Break: "drop-break"}

# The bugs the 0.2 mutation run found surviving (issue 20), and those hand-planted against 0.8 (issue 39), planted
# exactly: (name, module, old, new).
NAMED: list[tuple[str, str, str, str]] = [
    (
        "last starts of each episode never sampled",
        "sampling/segment_index",
        "j = np.floor(rng.random(n) * self.shard_counts[k]).astype(np.int64)",
        "j = np.floor(rng.random(n) * (self.shard_counts[k] - 1)).astype(np.int64)",
    ),
    (
        "a filter on a view widens back to the parent",
        "read/query",
        'cur.register("episode_index", state.index_table(chosen))',  # 0.9: the subset is named first
        'cur.register("episode_index", state.index_table(None))',
    ),
    (
        "the table commit no longer waits for its tensor writes",
        "write/commit",
        "            try:\n                w.result()\n",
        "            try:\n                pass\n",
    ),
    (
        "a cached verification skips the second read of a corrupt episode",
        "read/snapshot",
        "        try:\n            rows = read_many([(arr, start, stop)])[0]\n",
        "        self._verified.add((f.key, p))\n        try:\n            rows = read_many([(arr, start, stop)])[0]\n",
    ),
    (
        "priorities updated for items no longer in the collection",
        "sampling/samplers",
        "self._tree.update(idx, self._powered(p) * self._live[idx], unique=True)",
        "self._tree.update(idx, self._powered(p), unique=True)",
    ),
    (
        "a forked child commits its parent's episodes at its own exit",
        "write/commit",
        "if sink.pid != os.getpid() or sink.store.location.ephemeral:",
        "if sink.store.location.ephemeral:",
    ),
    (
        "one read entry point skips read-your-writes",
        "dataset",
        "        self.snapshot()  # read-your-writes: this object's finished episodes are committed first\n",
        "",
    ),
    (
        "credentials matched case-sensitively",
        "storage/location",
        "lowered = str(name).lower()",
        "lowered = str(name)",
    ),
    # hand-planted against 0.8 (issue 39) that the suite missed; each now has the property test that kills it
    (
        "anchor weights ignored when episode weights are given",
        "sampling/anchors",
        "return self.item_mass(w if self.weight is None else w * self.weight)",
        "return self.item_mass(w)",
    ),
    (
        "weighted anchors of a shard drawn from every shard's",
        "sampling/anchors",
        "mass = np.cumsum(weight[self.rank :: self.world], dtype=np.float64)",
        "mass = np.cumsum(weight, dtype=np.float64)",
    ),
    (
        "capacity eviction ordered by id before time",
        "storage/retention",
        "        order = np.lexsort((ids, created))\n        k = evict_count(",
        "        order = np.lexsort((created, ids))\n        k = evict_count(",
    ),
    (
        "a state taken at the end of a pass resumes into an empty epoch",
        "sampling/stream",
        "        self._state = self._planner.state()\n        self._done = self._planner.pass_finished()\n",
        "        self._state = self._planner.state()\n        self._done = False\n",
    ),
    (
        "a bounded meta field refuses a missing value at write",
        "core/constraints",
        "bad = _out_of_bounds(f, bound, rows) & valid",
        "bad = _out_of_bounds(f, bound, rows)",
    ),
    (
        "a bounded meta field refuses a missing value in set_meta",
        "ops/edit",
        'bad = ~(rows >= limit if bound == "min" else rows <= limit).all(axis=1) & valid',
        'bad = ~(rows >= limit if bound == "min" else rows <= limit).all(axis=1)',
    ),
    (
        "split cuts an observation-aligned derived column as if it had T rows",
        "ops/edit",
        "columns[f.key] = pa.array([rows[: at + extra_rows(f)], rows[at:]], f.arrow_type())",
        "columns[f.key] = pa.array([rows[:at], rows[at:]], f.arrow_type())",
    ),
    (
        "split refused exactly at capacity",
        "ops/edit",
        "snap.num_episodes + 1 > capacity.episodes:",
        "snap.num_episodes + 1 >= capacity.episodes:",
    ),
    (
        "a check re-added with another on_fail silently ignored",
        "core/quality",
        "        elif have[c.name] != c:",
        "        elif (have[c.name].predicate, have[c.name].level) != (c.predicate, c.level):",
    ),
]


def code_lines(source: str) -> set[int]:
    """Line numbers holding code: not docstrings, not comments, not blank."""
    tree = ast.parse(source)
    doc: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                doc.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.OP, tokenize.NAME, tokenize.NUMBER) and tok.start[0] not in doc:
            lines.add(tok.start[0])
    return lines


def strip_strings_and_comment(line: str) -> str:
    """``line`` with string literals and a trailing comment blanked (same length), so patterns skip them."""
    out, quote, i = [], "", 0
    while i < len(line):
        c = line[i]
        if quote:
            out.append(" " if c != quote else c)
            if c == "\\":
                out.append(" ")
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
            out.append(c)
        elif c == "#":
            out.append(" " * (len(line) - i))
            break
        else:
            out.append(c)
        i += 1
    return "".join(out)[: len(line)]


def candidates(module: str, source: str) -> list[tuple[Mutant, str]]:
    """Every compiling one-line mutant of ``source``: (mutant, mutated source)."""
    lines = source.splitlines(keepends=True)
    original = ast.dump(ast.parse(source))
    found: list[tuple[Mutant, str]] = []

    def add(lineno: int, kind: str, new_line: str) -> None:
        mutated = "".join(lines[: lineno - 1]) + new_line + "".join(lines[lineno:])
        try:
            tree = ast.parse(mutated)
            compile(tree, module, "exec")
        except SyntaxError:
            return
        if ast.dump(tree) == original:
            return
        found.append((Mutant(module, lineno, kind, lines[lineno - 1].strip(), new_line.strip()), mutated))

    for lineno in sorted(code_lines(source)):
        line = lines[lineno - 1]
        masked = strip_strings_and_comment(line)
        if masked.lstrip().startswith(("import ", "from ", "@", "def ", "class ")):
            continue
        for kind, pattern, repl in OPERATORS:
            for m in re.finditer(pattern, masked):
                if repl in ("<+1>", "<-1>"):
                    value = int(m.group(1)) + (1 if repl == "<+1>" else -1)
                    new = line[: m.start()] + str(value) + line[m.end() :]
                else:
                    new = line[: m.start()] + repl + line[m.end() :]
                add(lineno, kind, new)
    for node in ast.walk(ast.parse(source)):
        kind = DROPPED.get(type(node))
        if kind and node.lineno == node.end_lineno:  # type: ignore[attr-defined]
            line = lines[node.lineno - 1]  # type: ignore[attr-defined]
            indent = line[: len(line) - len(line.lstrip())]
            if line.strip().startswith(("raise", "return", "continue", "break")):
                add(node.lineno, kind, f"{indent}pass\n")  # type: ignore[attr-defined]
    return found


def named_mutants(modules: list[str], src: Path) -> list[tuple[Mutant, str]]:
    out = []
    for name, module, old, new in NAMED:
        if module not in modules:
            continue
        source = (src / f"{module}.py").read_text()
        if source.count(old) != 1:  # the module changed: say so, run the others
            print(f"SKIPPED named mutation {name!r}: its line is found {source.count(old)} times in {module}.py")
            continue
        mutated = source.replace(old, new)
        line = source[: source.index(old)].count("\n") + 1
        out.append((Mutant(module, line, "named", old.strip()[:120], new.strip()[:120], name), mutated))
    return out


def draw(module: str, source: str, n: int, seed: int) -> list[tuple[Mutant, str]]:
    found = candidates(module, source)
    rng = random.Random(int(hashlib.sha256(f"{seed}:{module}".encode()).hexdigest()[:8], 16))
    return rng.sample(found, min(n, len(found)))


def copy_tree(dest: Path, rev: str) -> None:
    """The committed tree at ``rev`` (never the working tree, which others may be editing) into ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def markers(tests: list[str]) -> list[str]:
    """Tests named one by one (``file::test``) run whatever their marker: a slow one was chosen on purpose."""
    return ["-m", "slow or not slow"] if any("::" in test for test in tests) else []


def run_tests(copy: Path, tests: list[str], timeout: float, deselect: list[str] = ()) -> tuple[str, float, str]:
    """(outcome, seconds, output) of ``pytest -x -q`` over ``tests`` in ``copy``, without the ``deselect`` ids."""
    env = dict(os.environ, PYTHONPATH=str(copy / "src"), PYTHONDONTWRITEBYTECODE="1")
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", *markers(tests), *tests]
    argv += [arg for test in deselect for arg in ("--deselect", test)]
    start = time.monotonic()  # the run's duration is reported, never used to decide an outcome but the timeout
    proc = subprocess.Popen(
        argv, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", time.monotonic() - start, ""
    outcome = {0: "survived", 1: "killed"}.get(proc.returncode, "killed" if proc.returncode == 2 else "error")
    return outcome, time.monotonic() - start, out


def what_of(mutant: Mutant) -> str:
    return mutant.name or f"{mutant.module}:{mutant.line} {mutant.after}"


def last_line(out: str) -> str:
    return out.strip().splitlines()[-1] if out.strip() else ""


def baseline_failures(copy: Path, tests: list[str], runs: int) -> tuple[list[str], float]:
    """Tests that fail on the unmutated tree in any of ``runs`` runs (they are left out), and the longest run."""
    failed: set[str] = set()
    took = 0.0
    for _ in range(runs):
        env = dict(os.environ, PYTHONPATH=str(copy / "src"), PYTHONDONTWRITEBYTECODE="1")
        argv = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *markers(tests), *tests]
        start = time.monotonic()
        out = subprocess.run(argv, cwd=copy, env=env, capture_output=True, text=True).stdout
        took = max(took, time.monotonic() - start)
        failed |= {line.split()[1] for line in out.splitlines() if line.startswith(("FAILED ", "ERROR "))}
    return sorted(failed), took


def replanted(src: Path, records: list[dict], named: list[tuple[Mutant, str]]) -> list[tuple[Mutant, str]]:
    """The survivors of ``records`` planted again in today's ``src``: each drawn one on the line that still
    reads as it did (the nearest such line to where it was), so commits elsewhere in a module move nothing."""
    by_name = {m.name: (m, s) for m, s in named if m.name}
    plan = []
    for r in records:
        if r["outcome"] != "survived":
            continue
        if r["name"]:
            if r["name"] in by_name:
                plan.append(by_name[r["name"]])
            continue
        lines = (src / f"{r['module']}.py").read_text().splitlines(keepends=True)
        found = [i for i, line in enumerate(lines) if line.strip() == r["before"]]
        if not found:
            print(f"GONE {r['module']}:{r['line']} {r['before']!r}: the line changed since")
            continue
        i = min(found, key=lambda i: abs(i + 1 - r["line"]))
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        mutated = "".join(lines[:i]) + indent + r["after"] + "\n" + "".join(lines[i + 1 :])
        fields = {k: r[k] for k in ("module", "kind", "before", "after", "name")}
        plan.append((Mutant(line=i + 1, **fields), mutated))
    return plan


def wait_while(pause: Path) -> None:
    """Block while ``pause`` exists; ``pause`` + ``.paused`` says that the run is waiting."""
    if not pause.exists():
        return
    marker = pause.with_name(pause.name + ".paused")
    marker.touch()
    while pause.exists():
        time.sleep(2)  # nothing is measured meanwhile: this only waits for a person to remove the file
    marker.unlink(missing_ok=True)


def test_paths(copy: Path, module: str, properties: str) -> list[str]:
    """The module's test files (or ``file::test`` ids) present in ``copy``.

    ``properties``: ``"with"`` every one, ``"without"`` none of ``test_properties_*``, ``"only"`` only those
    (enough to rerun the survivors of a run without them: the other tests passed on each of those mutants).
    """
    keep = {"with": lambda p: True, "without": lambda p: not p, "only": lambda p: p}[properties]
    return [
        f"tests/{t}"
        for t in MODULE_TESTS[module]
        if (copy / "tests" / t.split("::")[0]).exists() and keep(t.startswith("test_properties_"))
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-module", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60, help="per-mutant floor; the limit is max(this, 3 x baseline)")
    ap.add_argument("--copy", type=Path, default=Path("/tmp/episodelake-mut"))
    ap.add_argument("--modules", nargs="*", default=DEFAULT_MODULES, help="paths under src/episodelake/, no .py")
    ap.add_argument("--named-only", action="store_true")
    ap.add_argument("--no-named", action="store_true", help="leave out the named mutations (drawn ones only)")
    ap.add_argument("--rerun", type=Path, help="run only the survivors recorded in this results file")
    ap.add_argument("--out", type=Path, default=Path("mutation-results.jsonl"))
    ap.add_argument("--properties", choices=["with", "without", "only"], default="with", help="tests/test_properties_*")
    ap.add_argument("--baseline-runs", type=int, default=1, help="unmutated runs per test set (0: none)")
    ap.add_argument("--rev", default="HEAD", help="the commit whose tree is mutated (default HEAD)")
    ap.add_argument("--pause", type=Path, default=Path("/tmp/mutate.pause"), help="waits while it exists")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    args = ap.parse_args()
    unknown = [m for m in args.modules if m not in MODULE_TESTS]
    if unknown:
        ap.error(f"no tests mapped for {unknown}; modules: {' '.join(MODULE_TESTS)}")

    modules = list(dict.fromkeys([*args.modules, *(m for _, m, _, _ in NAMED)]))
    copy_tree(args.copy, args.rev)
    src = args.copy / PKG
    plan: list[tuple[Mutant, str]] = [] if args.no_named else named_mutants(modules, src)
    if not args.named_only and not args.rerun:
        for module in args.modules:
            if module != "dataset":
                plan += draw(module, (src / f"{module}.py").read_text(), args.per_module, args.seed)
    if args.rerun:
        plan = replanted(src, [json.loads(line) for line in args.rerun.read_text().splitlines()], plan)
    if args.list:
        for m, _ in plan:
            print(f"{m.module}:{m.line} [{m.kind}] {m.name or m.after}")
        print(f"{len(plan)} mutants")
        return

    done = {r["key"] for r in map(json.loads, args.out.read_text().splitlines())} if args.out.exists() else set()
    baseline: dict[tuple[str, ...], tuple[list[str], float]] = {}
    started = time.monotonic()
    with args.out.open("a") as results:
        for i, (mutant, mutated) in enumerate(plan):
            if mutant.key in done:
                continue
            wait_while(args.pause)
            tests = test_paths(args.copy, mutant.module, args.properties)
            if not tests:  # pytest without paths would run the whole suite
                print(f"no test files for {mutant.module} ({args.properties} properties): {what_of(mutant)}")
                continue
            if tuple(tests) not in baseline:  # modules with the same test files share one baseline
                if args.baseline_runs == 0:  # told that the unmutated tests pass: no baseline, --timeout as the limit
                    baseline[tuple(tests)] = ([], 0.0)
                else:
                    baseline[tuple(tests)] = baseline_failures(args.copy, tests, args.baseline_runs)
                failing, secs = baseline[tuple(tests)]
                print(f"baseline {tests}: {secs:.0f}s, failing unmutated (left out): {failing}", flush=True)
            failing, secs = baseline[tuple(tests)]
            path = args.copy / PKG / f"{mutant.module}.py"
            original = path.read_text()
            path.write_text(mutated)
            try:
                outcome, took, out = run_tests(args.copy, tests, max(args.timeout, 3 * secs), failing)
            finally:
                path.write_text(original)
            tail = last_line(out)
            record = {**asdict(mutant), "key": mutant.key, "outcome": outcome, "seconds": round(took, 1), "tail": tail}
            results.write(json.dumps(record) + "\n")
            results.flush()
            what = mutant.name or mutant.after
            print(f"[{i + 1}/{len(plan)}] {outcome:8s} {took:5.0f}s {mutant.module}:{mutant.line} {what}", flush=True)
    print(f"ran in {time.monotonic() - started:.0f}s")
    summarize(args.out)


def summarize(path: Path, after: Path | None = None) -> None:
    """Per-module counts and the survivors of a results file; with ``after`` (a ``--rerun`` of its survivors),
    the survivors before and after side by side."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    later = {r["key"]: r["outcome"] for r in map(json.loads, after.read_text().splitlines())} if after else {}
    by: dict[str, dict[str, int]] = {}
    for r in rows:
        c = by.setdefault(r["module"], {"mutants": 0, "killed": 0, "survived": 0, "error": 0, "after": 0})
        c["mutants"] += 1
        c[{"timeout": "killed"}.get(r["outcome"], r["outcome"])] += 1  # a timeout counts as killed
        if r["outcome"] == "survived" and later.get(r["key"], "survived") == "survived":
            c["after"] += 1
    print("| module | mutants | killed | survived | survived after |\n|---|---|---|---|---|")
    by["all"] = {k: sum(c[k] for c in by.values()) for k in ("mutants", "killed", "survived", "error", "after")}
    for module, c in by.items():
        left = c["after"] if after else "-"
        print(f"| {module} | {c['mutants']} | {c['killed']} | {c['survived']} | {left} |")
    for r in rows:
        if r["outcome"] == "survived":
            what = r["name"] or f"{r['before']}  ->  {r['after']}"
            now = f" [after: {later.get(r['key'], 'not rerun')}]" if after else ""
            print(f"SURVIVED {r['module']}:{r['line']} [{r['kind']}] {what}{now}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--summary"]:
        summarize(Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
    else:
        main()
