"""The docs site (mkdocs.yml, issue 45, item 2): every guide in it, every public name in the reference.

``mkdocs build --strict`` itself runs where the ``docs`` extra is installed
(CI installs it); the page lists are checked everywhere.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import episodelake as el

ROOT = Path(__file__).resolve().parent.parent


def test_the_reference_lists_every_public_name():
    listed = re.findall(r"^::: episodelake\.(\w+)$", (ROOT / "docs" / "reference.md").read_text(), re.M)
    assert listed == list(el.__all__), "docs/reference.md and episodelake.__all__ differ"


def test_every_page_is_in_the_nav():
    nav = set(re.findall(r"^\s+- (?:[^:\n]+: )?([\w-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == nav, f"pages missing from mkdocs.yml's nav, or nav entries without a page: {pages ^ nav}"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason='needs the docs extra: pip install -e ".[docs]"')
def test_the_site_builds_strict(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "index.html").exists()
