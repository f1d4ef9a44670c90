"""``import episodelake`` and the command line's ``--help``/``--version`` start fast (issue 45, item 4).

The package's public names load on first use (PEP 562 ``__getattr__`` in
``episodelake/__init__.py``), and the command line imports its engines inside
each command, so neither the import nor ``--help`` pays for TensorStore,
DuckDB, deltalake, pandas or PyArrow's dataset layer. Each check runs in a
fresh interpreter: this test process has long since imported all of them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "tensorstore",
    "duckdb",
    "deltalake",
    "pandas",
    "pyarrow",
    "pyarrow.dataset",
    "numpy",
    "av",
    "torch",
    "jax",
    "zarr",
    "fsspec",
    "gymnasium",
    "rerun",
    "PIL",
    "matplotlib",
)


def _fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter and return its stdout."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def _loaded_after(statement: str) -> list[str]:
    """The HEAVY modules present in ``sys.modules`` after ``statement`` in a fresh interpreter."""
    code = f"import json, sys\n{statement}\nprint(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    return json.loads(_fresh(code))


def test_import_loads_no_heavy_engine():
    assert _loaded_after("import episodelake") == []


def test_the_command_line_module_loads_no_heavy_engine():
    assert _loaded_after("import episodelake.cli.main") == []


def test_a_public_name_loads_on_first_use_and_is_the_same_object():
    out = _fresh(
        "import sys, episodelake as el\n"
        "from episodelake.dataset import Dataset\n"
        "from episodelake.sampling.batch import SegmentBatch\n"
        "assert el.Dataset is Dataset and el.Batch is SegmentBatch\n"
        "assert 'tensorstore' in sys.modules\n"
        "assert set(el.__all__) <= set(dir(el))\n"
        "print('ok')"
    )
    assert out.strip() == "ok"


def test_every_public_name_resolves():
    out = _fresh("import episodelake as el\nprint(all(getattr(el, n) is not None for n in el.__all__))")
    assert out.strip() == "True"


def test_an_unknown_name_is_an_attribute_error():
    import episodelake as el

    with pytest.raises(AttributeError):
        el.no_such_name  # noqa: B018


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_answer_without_the_engines(flag: str):
    code = (
        "import json, sys\n"
        "from episodelake.cli import main\n"
        "try:\n"
        f"    main([{flag!r}])\n"
        "except SystemExit as stop:\n"
        "    assert stop.code == 0, stop.code\n"
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
    if flag == "--version":
        import episodelake

        assert done.stdout.strip() == f"episodelake {episodelake.__version__}"
    else:
        assert "usage: episodelake" in done.stdout


def test_the_installed_command_answers_version():
    done = subprocess.run(
        [sys.executable, "-m", "episodelake.cli", "--version"], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.startswith("episodelake ")
