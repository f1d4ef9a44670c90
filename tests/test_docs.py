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
        exec(compile(block, f"{doc} snippet", "exec"), namespace)  # noqa: S102 - our own docs
