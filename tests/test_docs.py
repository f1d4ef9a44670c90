"""Every python snippet of README.md and docs/*.md runs as pasted, and prints what its comments say.

Each document runs in a fresh interpreter (cwd: an empty temporary directory), its snippets one after the
other in one namespace, as a reader pasting them in order would. A ``print(...)  # expected`` line is
checked against what it printed: the comment up to its first top-level ``": "`` (the rest explains) must
match the printed line token by token, where an upper-case name in the comment (``T``, ``B``) stands for
one integer, the same everywhere in the line. Comments that do not start like a value are prose.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

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

# What a document assumes already exists (it says so in its text): set up before its snippets run.
PRELUDE = {
    "docs/query.md": """
import numpy as np, episodelake as el
_rng = np.random.default_rng(0)
_schema = el.DatasetSchema([
    el.FieldSpec("state", (5,), "float32"),
    el.FieldSpec("camera", (3, 8, 8), "uint8", layout="CHW", storage="tensor"),
    el.FieldSpec("action", (2,), "float32", role="action"),
    el.FieldSpec("reward", (), "float32", role="reward"),
    el.FieldSpec("task", (), "str", role="meta"),
    el.FieldSpec("success", (), "bool", role="meta"),
])
def _episode(T, task):
    return {"observations": {"state": _rng.standard_normal((T + 1, 5)).astype(np.float32),
                             "camera": _rng.integers(0, 256, (T + 1, 3, 8, 8), dtype=np.uint8)},
            "actions": _rng.standard_normal((T, 2)).astype(np.float32),
            "rewards": (2 * _rng.standard_normal(T)).astype(np.float32),
            "meta": {"task": task, "success": bool(_rng.integers(0, 2))}}
el.Dataset.from_episodes([_episode(int(_rng.integers(40, 120)), t) for t in ["pick", "place"] * 4],
                         "robot-data", schema=_schema)
""",
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
    if doc in PRELUDE:
        plan.append((PRELUDE[doc], False))
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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "MPLBACKEND": "Agg"}
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
    offset = 1 if doc in PRELUDE else 0
    for tag, want in expected.items():
        block = int(tag.split(":")[0])
        if plan[block + offset][1]:
            continue
        assert tag in seen, f"{doc} snippet {tag}: the print never ran"
        for got in seen[tag]:
            assert output_matches(want, got), f"{doc} snippet {tag}: printed {got!r}, the comment says {want!r}"


def test_demo_command(tmp_path, capsys):
    """The demo's data is the environment's: every episode replays exactly from its seed and actions."""
    import episodelake as el
    from episodelake.cli import main

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
    batch = view.segment_stream(sequence_length=16, batch_size=32, seed=0).sample()
    for b in range(32):
        rows = truth[int(batch.episode_id[b])]
        s = int(batch.start[b])
        np.testing.assert_array_equal(batch.obs[b], rows[s : s + 16])
        np.testing.assert_array_equal(batch.next_obs[b], rows[s + 1 : s + 17])
