"""Every python snippet of README.md and docs/*.md runs as pasted, and prints what its comments say.

Each document runs in a fresh interpreter (cwd: an empty temporary directory, only the package on the
path), its snippets one after the other in one namespace, as a reader pasting them in order would; nothing
is set up before them, so a document creates whatever it uses. What they import must come with the
README's install command (``pip install -e ".[all]"``): every module a runnable snippet imports belongs to
a distribution that ``episodelake[all]`` requires, directly or through its dependencies.

A ``print(...)  # expected`` line is checked against what it printed: the comment up to its first
top-level ``": "`` (the rest explains) must match the printed line token by token, where an upper-case
name in the comment (``T``, ``B``) stands for one integer, the same everywhere in the line. Comments that
do not start like a value are prose.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

# Snippets that need something a test machine does not have; matched by a text the snippet contains,
# so a stale entry (the snippet changed) fails below instead of silently skipping something else.
NOT_RUNNABLE = {
    'import_dataset("minari", "mujoco/pusher/expert-v0"': "downloads a Minari dataset",
    '"memmap-replay",\n    "./replay_data"': "needs a memmap-replay-buffer folder",
    'import_dataset("episodata", "cartpole"': "needs an episodata dataset",
    'opts = {"key": "AKIA...", "secret": "..."': "placeholder credentials for a real S3 account",
    "fs = s3fs.S3FileSystem(asynchronous=True, **opts)": "continues the placeholder-credentials snippet",
    'local = ds.copy_to("/data/pick-v1")': "writes to /data and the placeholder S3 account",
    'with S3Server("/tmp/s3data") as server:': "starts a SeaweedFS server (tests/test_s3.py covers it)",
}

DRIVER = r"""
import json, sys, textwrap
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for i, (code, skip) in enumerate(blocks):
    if skip:
        continue
    print(f"@@block {i}", flush=True)
    exec(compile(code, f"snippet {i}", "exec"), namespace)
    print(flush=True)
"""

VALUE_START = re.compile(r"""^(\(|\[|\{|'|"|-?\d|True\b|False\b|None\b|array\()""")
TOKEN = re.compile(r"[A-Za-z_]\w*|-?\d+(?:\.\d+)?(?:e-?\d+)?|\.\.\.|\S")


def expected_part(comment: str) -> str | None:
    """The expected output a comment states, or None when the comment is prose."""
    comment = comment.strip()
    if not VALUE_START.match(comment):
        return None
    depth, quote = 0, None
    for i, ch in enumerate(comment):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and comment[i : i + 2] == ": ":
            return comment[:i].strip()
    return comment


def output_matches(expected: str, printed: str) -> bool:
    want, got = TOKEN.findall(expected), TOKEN.findall(printed)
    bound: dict[str, str] = {}
    for i, w in enumerate(want):
        if w == "...":
            return True
        if i >= len(got):
            return False
        g = got[i]
        if re.fullmatch(r"[A-Z]", w) and re.fullmatch(r"\d+", g):
            if bound.setdefault(w, g) != g:
                return False
        elif w != g:
            return False
    return len(want) == len(got)


def instrument(code: str, block: int) -> tuple[str, dict[str, str]]:
    """``code`` with a marker line printed before each ``print(...)  # expected`` line."""
    out, expected = [], {}
    for n, line in enumerate(code.splitlines()):
        m = re.match(r"^(\s*)print\(.*\)\s+#(.*)$", line)
        want = expected_part(m.group(2)) if m else None
        if want is not None:
            tag = f"{block}:{n + 1}"
            expected[tag] = want
            out.append(f"{m.group(1)}print('@@print {tag}')")
        out.append(line)
    return "\n".join(out) + "\n", expected


def snippets(doc: str) -> list[str]:
    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)]


def test_not_runnable_entries_are_current():
    text = "\n".join(b for doc in DOCS for b in snippets(doc))
    stale = [k for k in NOT_RUNNABLE if k not in text]
    assert not stale, f"NOT_RUNNABLE entries match no snippet any more: {stale}"


def test_expected_output_parsing():
    """The comparison itself: shapes with a symbol, explanations after ': ', prose, mismatches."""
    assert expected_part(" (T, 4) (T, 4) (T,)") == "(T, 4) (T, 4) (T,)"
    assert expected_part(" 91: 15 + 25 + 49 starts") == "91"
    assert expected_part(" {'seed': 0, 'policy': 'random'}") == "{'seed': 0, 'policy': 'random'}"
    assert expected_part(" what would go") is None
    assert output_matches("(T, 4) (T, 4) (T,)", "(23, 4) (23, 4) (23,)")
    assert not output_matches("(T, 4) (T, 4) (T,)", "(23, 4) (22, 4) (23,)")
    assert not output_matches("(32, 8, 4)", "(32, 8, 5)")
    assert not output_matches("(32, 8)", "(32, 8, 4)")
    assert output_matches("[1, 2, ...]", "[1, 2, 3, 4]")


@pytest.mark.parametrize("doc", DOCS)
def test_python_snippets_run_and_print_what_they_say(doc, tmp_path):
    blocks = snippets(doc)
    if not blocks:
        pytest.skip(f"{doc} has no python snippets")
    expected: dict[str, str] = {}
    plan = []
    for i, code in enumerate(blocks):
        code, want = instrument(code, i)
        expected.update(want)
        plan.append((code, any(k in blocks[i] for k in NOT_RUNNABLE)))
    if all(skip for _, skip in plan):
        pytest.skip(f"every snippet of {doc} needs outside resources")
    (tmp_path / "blocks.json").write_text(json.dumps(plan))
    (tmp_path / "driver.py").write_text(DRIVER)
    work = tmp_path / "cwd"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MPLBACKEND": "Agg"}  # not the repository's tests
    run = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "blocks.json")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"{doc}: a snippet failed\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    lines = run.stdout.splitlines()
    seen: dict[str, list[str]] = {}
    for i, line in enumerate(lines):
        if line.startswith("@@print "):
            seen.setdefault(line.split()[1], []).append(lines[i + 1])
    for tag, want in expected.items():
        block = int(tag.split(":")[0])
        if plan[block][1]:
            continue
        assert tag in seen, f"{doc} snippet {tag}: the print never ran"
        for got in seen[tag]:
            assert output_matches(want, got), f"{doc} snippet {tag}: printed {got!r}, the comment says {want!r}"


def test_demo_command(tmp_path, capsys):
    """The demo's data is the environment's: every episode replays exactly from its seed and actions."""
    import episodelake as el
    from episodelake.cli.main import main

    assert main(["demo", str(tmp_path / "demo"), "--episodes", "12"]) == 0
    out = capsys.readouterr().out
    assert "collected 12 episodes" in out
    assert "obs[t + 1] == next_obs[t] inside each segment: True" in out
    ds = el.Dataset.open(str(tmp_path / "demo"))
    assert len(ds) == 12
    assert sorted(r[0] for r in ds.sql("SELECT DISTINCT policy FROM episodes").fetchall()) == ["lean", "random"]
    env = gym.make("CartPole-v1")
    truth = {}
    for ref in ds.episodes():
        seg = ref.read()
        obs, _ = env.reset(seed=int(ref.meta["seed"]))
        rows, rewards = [obs], []
        for a in seg.action:
            obs, r, terminated, truncated, _ = env.step(int(a))
            rows.append(obs)
            rewards.append(r)
        assert (terminated, truncated) == (ref.terminated, ref.truncated)
        np.testing.assert_array_equal(seg.all_obs, np.stack(rows))
        np.testing.assert_array_equal(seg.reward, np.array(rewards, np.float32))
        truth[ref.episode_id] = np.stack(rows)
    # the sampler's obs/next_obs against the replayed trajectories, not against each other
    view = ds.where("policy = 'lean' AND length >= 20")
    batch = view.segment_stream(16, batch_size=32, seed=0).sample()
    for b in range(32):
        rows = truth[int(batch.episode_id[b])]
        s = int(batch.start[b])
        np.testing.assert_array_equal(batch.obs[b], rows[s : s + 16])
        np.testing.assert_array_equal(batch.next_obs[b], rows[s + 1 : s + 17])


def readme_install() -> set[str]:
    """The distributions ``pip install -e ".[all]"`` brings: pyproject's own lists, then what each requires."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    direct, todo, seen = list(project["dependencies"]), ["all"], set()
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for spec in extras[extra]:
            req = Requirement(spec)
            if canonicalize_name(req.name) == "episodelake":
                todo.extend(e for e in req.extras if e not in seen)
            else:
                direct.append(spec)
    closure: dict[str, set[str]] = {}  # distribution -> the extras asked of it
    pending = [Requirement(spec) for spec in direct]
    while pending:
        req = pending.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        first, new = name not in closure, set(req.extras) - closure.get(name, set())
        if not first and not new:
            continue
        closure.setdefault(name, set()).update(new)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: its modules are then missing below
        asked = ({""} if first else set()) | new
        for spec in requires:
            dep = Requirement(spec)
            if dep.marker is None:
                if first:
                    pending.append(dep)
            elif any(dep.marker.evaluate({"extra": e}) for e in asked):
                dep.marker = None
                pending.append(dep)
    return set(closure)


def imported_modules(code: str) -> set[str]:
    """Top-level names of the modules ``code`` imports (absolute imports only)."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_snippet_imports_come_with_the_readme_install():
    """What a runnable snippet imports is installed by ``pip install -e ".[all]"`` (a bare `import zarr`
    in docs/interop.md once needed the dev extra)."""
    installed = readme_install()
    owners = metadata.packages_distributions()
    missing = {}
    for doc in DOCS:
        for code in snippets(doc):
            if any(k in code for k in NOT_RUNNABLE):
                continue
            for module in imported_modules(code) - set(sys.stdlib_module_names) - {"episodelake"}:
                dists = {canonicalize_name(d) for d in owners.get(module, [])}
                if not dists & installed:
                    missing.setdefault(doc, set()).add(f"{module} (from {sorted(dists) or 'nothing installed'})")
    assert not missing, f"snippets import modules that episodelake[all] does not install: {missing}"
