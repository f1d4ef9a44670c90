"""The module map in docs/architecture.md is the import rule, and the code keeps it.

Every import in ``src/episodelake`` (module level, inside functions, under
``TYPE_CHECKING``) is parsed; a module may import only modules of a lower
layer, or of its own layer listed before it. That rules out upward imports
and import circles. The on-disk layout is spelled in ``layout.py`` alone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "episodelake"
DOC = ROOT / "docs" / "architecture.md"
LAYOUT_LITERALS = ("episodelake.json", "_delta_log", "zarr.json", "_episodelake_compact.lock")


def layer_table() -> dict[str, tuple[int, int]]:
    """Module name -> (layer, position in its layer), from the doc's "Modules and layers" table."""
    section = DOC.read_text().split("## Modules and layers", 1)[1].split("\n## ", 1)[0]
    order: dict[str, tuple[int, int]] = {}
    for layer, modules in re.findall(r"^\| (\d+) \| ([^|]+) \|", section, flags=re.M):
        for pos, name in enumerate(re.findall(r"`([a-z_]+)`", modules)):
            assert name not in order, f"{name} listed twice in docs/architecture.md"
            order[name] = (int(layer), pos)
    return order


def module_of(path: Path) -> str:
    """The map's name for a source file: its top-level module or package under episodelake/."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def imported(path: Path, source: str | None = None) -> set[str]:
    """Our modules that ``path`` (or ``source`` placed there) imports, except its own package's parts."""
    own = module_of(path)
    depth = len(path.relative_to(PACKAGE).parts) - 1  # 0 for top-level modules, 1 inside a subpackage
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                up = node.level - 1 - depth  # < 0: still inside the subpackage
                if up < 0:
                    continue
                if node.module:
                    targets.append(node.module.split(".")[0])
                else:
                    targets += [alias.name for alias in node.names]
            elif node.module and node.module.split(".")[0] == "episodelake":
                parts = node.module.split(".")
                targets += [parts[1]] if len(parts) > 1 else [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "episodelake" and len(parts) > 1:
                    targets.append(parts[1])
        out.update(t for t in targets if t != own)
    return out


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


def test_every_module_is_on_the_map_and_every_entry_exists():
    order = layer_table()
    assert {module_of(p) for p in SOURCES} == set(order)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_only_down_the_layers(path):
    order = layer_table()
    me = module_of(path)
    upward = sorted(t for t in imported(path) if order[t] >= order[me])
    assert not upward, f"{path.relative_to(PACKAGE)} (layer {order[me][0]}) imports {upward} from its layer or above"


def test_the_rule_sees_lazy_and_type_checking_imports():
    """A test of the test: imports hidden under TYPE_CHECKING or inside functions are found."""
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .dataset import Dataset\n"
    source += "def f():\n    from . import stream\n    import episodelake.cli\n"
    assert imported(PACKAGE / "query.py", source) == {"dataset", "stream", "cli"}


def test_subpackage_imports_resolve_to_top_level_modules():
    assert imported(PACKAGE / "integrations" / "gymnasium.py") >= {"dataset", "schema"}
    assert "torch" not in imported(PACKAGE / "integrations" / "jax.py")  # its own package's module


def test_layout_strings_live_in_layout_only():
    spelled = {
        str(p.relative_to(PACKAGE))
        for p in SOURCES
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and any(lit in node.value for lit in LAYOUT_LITERALS)
        and not (isinstance(node.value, str) and node.value.strip().count("\n"))  # docstrings may describe the layout
    }
    assert spelled == {"layout.py"}
