"""The README is a front door a newcomer reads in minutes (issue 45, items 1 and 6).

Every python block of README.md runs alone, as pasted into a fresh interpreter in
an empty folder, with nothing from the blocks before it (tests/test_docs.py runs
them in order and checks their printed values). The README stays short, lists
every install extra, and the demo's folder is ignored by git.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_BYTES = 15_000


def python_blocks() -> list[str]:
    """The README's python blocks, in order."""
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize("index", range(len(python_blocks())), ids=lambda i: f"block{i}")
def test_each_block_runs_alone_in_a_fresh_folder(index: int, tmp_path: Path):
    code = python_blocks()[index]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MPLBACKEND": "Agg"}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"README block {index} fails alone:\n{code}\n{run.stderr[-3000:]}"


def test_the_readme_is_short():
    size = len(README.read_bytes())
    assert size <= MAX_BYTES, f"README.md is {size} bytes; long figures go to docs/benchmarks.md, detail to the guides"


def test_every_install_extra_is_listed():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    install = README.read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in extras if name != "all" and f"| `{name}` |" not in install]
    assert not missing, f"README's Install section omits the extras {missing}"


def test_the_readme_keeps_the_two_set_up_commands():
    text = README.read_text()
    assert 'pip install -e ".[all]" && episodelake demo' in text
    assert 'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && python -m pytest -q' in text


def test_the_demo_folder_is_ignored():
    assert "/episodelake-demo/" in (ROOT / ".gitignore").read_text().split()
