"""The folder map in docs/architecture.md is the import rule, and the code keeps it.

Every import in ``src/episodelake`` (module level, inside functions, under
``TYPE_CHECKING``) is parsed and resolved to a (folder, module) unit. The map
lists folders in one-way order, each on a level, and the modules of each
folder in their import order. A module may import a unit of a folder on a
lower level, or a module listed before it in its own folder; nothing else.
That rules out upward imports, imports between sibling folders (``read`` and
``write``), and circles. The on-disk layout is spelled in ``storage/layout.py``
alone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "episodelake"
DOC = ROOT / "docs" / "architecture.md"
LAYOUT_LITERALS = ("episodelake.json", "_delta_log", "zarr.json", "_episodelake_compact.lock")
TOP = "."  # the folder name of modules directly under episodelake/
MAX_TOP_MODULES = 10


class Place(NamedTuple):
    """Where a unit sits on the map: its row's level, the row, and its position in the row."""

    level: int
    row: int
    position: int


def folder_map(text: str | None = None) -> dict[tuple[str, str], Place]:
    """(folder, module) -> Place, from the doc's "Folders and modules" table."""
    section = (DOC.read_text() if text is None else text).split("## Folders and modules", 1)[1].split("\n## ", 1)[0]
    out: dict[tuple[str, str], Place] = {}
    rows = re.findall(r"^\| (\d+) \| `([a-z_.]+)/?` \| ([^|]+) \|", section, flags=re.M)
    assert rows, "docs/architecture.md has no folder table"
    levels = [int(level) for level, _, _ in rows]
    assert levels == sorted(levels), "the folder table lists folders from the lowest level up"
    for row, (level, folder, modules) in enumerate(rows):
        names = re.findall(r"`([a-z_0-9]+)`", modules)
        for position, name in enumerate(names):
            assert (folder, name) not in out, f"{folder}/{name} listed twice in docs/architecture.md"
            out[folder, name] = Place(int(level), row, position)
        if folder != TOP:
            out[folder, "__init__"] = Place(int(level), row, len(names))  # a folder's face: after its modules
    return out


def unit_of(parts: list[str]) -> tuple[str, str]:
    """The map's unit for a module path under episodelake/ (``["read", "sql"]`` is read's ``sql``)."""
    if len(parts) == 1:
        return (parts[0], "__init__") if (PACKAGE / parts[0] / "__init__.py").exists() else (TOP, parts[0])
    return parts[0], parts[1]


def source_unit(path: Path) -> tuple[str, str]:
    rel = path.relative_to(PACKAGE)
    inner = rel.stem != "__init__" or len(rel.parts) > 2
    return unit_of([*rel.parts[:-1], rel.stem] if inner else list(rel.parts[:-1]))


def _is_module(parts: list[str]) -> bool:
    where = PACKAGE.joinpath(*parts)
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def imported(path: Path, source: str | None = None) -> set[tuple[str, str]]:
    """The units that ``path`` (or ``source`` placed there) imports, except its own."""
    package = list(path.relative_to(PACKAGE).parts[:-1])
    out: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        modules: list[list[str]] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
            elif node.module and node.module.split(".")[0] == "episodelake":
                base = []
            else:
                continue
            named = base + (node.module.split(".")[node.level == 0 :] if node.module else [])
            for alias in node.names:
                modules.append([*named, alias.name] if _is_module([*named, alias.name]) else named)
        elif isinstance(node, ast.Import):
            modules += [alias.name.split(".")[1:] for alias in node.names if alias.name.startswith("episodelake.")]
        out.update(unit_of(m) for m in modules if m)
    out.discard(source_unit(path))
    return out


def allowed(importer: Place, target: Place) -> bool:
    """A lower level, or earlier in the same folder row."""
    return target.level < importer.level or (target.row == importer.row and target.position < importer.position)


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


def test_every_module_is_on_the_map_and_every_entry_exists():
    listed = {unit for unit in folder_map() if unit[1] != "__init__"}
    present = {source_unit(p) for p in SOURCES} - {(f, "__init__") for f, _ in listed}
    assert present == listed


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_only_down_the_map(path):
    order = folder_map()
    me = source_unit(path)
    wrong = sorted(f"{f}/{m}" for f, m in imported(path) if not allowed(order[me], order[f, m]))
    assert not wrong, f"{path.relative_to(PACKAGE)} {order[me]} imports {wrong}: upward, sideways or circular"


def test_the_rule_fails_an_upward_a_sideways_and_a_circular_import():
    """A test of the test: planted imports that break the map are caught, including lazy and TYPE_CHECKING ones."""
    order = folder_map()
    snapshot = PACKAGE / "read" / "snapshot.py"
    planted = {
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..dataset import Dataset\n": (TOP, "dataset"),
        "def f():\n    from ..write import commit\n": ("write", "commit"),  # read and write are siblings
        "def f():\n    from .query import SQLResult\n": ("read", "query"),  # query imports snapshot: a circle
        "import episodelake.cli\n": ("cli", "__init__"),
    }
    for source, unit in planted.items():
        assert unit in imported(snapshot, source), source
        assert not allowed(order[source_unit(snapshot)], order[unit]), source
    assert allowed(order[source_unit(snapshot)], order["storage", "table"])


def test_folder_imports_resolve_to_units():
    assert imported(PACKAGE / "integrations" / "gymnasium.py") >= {(TOP, "dataset"), ("core", "schema")}
    assert ("integrations", "torch") in imported(PACKAGE / "integrations" / "jax.py")
    assert imported(PACKAGE / "cli" / "__init__.py") == {("cli", "main")}


def test_the_top_level_is_small_and_folders_say_what_they_own():
    top = [p for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= MAX_TOP_MODULES, sorted(p.name for p in top)
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import:" in doc, f"{init.relative_to(PACKAGE)} does not say what it may import"


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
    assert spelled == {"storage/layout.py"}
