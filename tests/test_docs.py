"""The README quick start and the docs' snippets work when pasted."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "docs/writing.md"]


@pytest.mark.parametrize("doc", DOCS)
def test_python_snippets_run(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)
    assert blocks, f"{doc} has no python snippets"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, f"{doc} snippet", "exec"), namespace)  # our own docs


def test_demo_command(tmp_path, capsys):
    from episodelake.cli import main

    assert main(["demo", str(tmp_path / "demo"), "--episodes", "12"]) == 0
    out = capsys.readouterr().out
    assert "collected 12 episodes" in out
    assert "obs[t + 1] == next_obs[t] inside each segment: True" in out
    import episodelake as el

    ds = el.Dataset.open(str(tmp_path / "demo"))
    assert len(ds) == 12
    assert sorted(r[0] for r in ds.sql("SELECT DISTINCT policy FROM episodes").fetchall()) == ["lean", "random"]
