"""State files that are not a stream state are refused as ``ArgumentError`` naming the state (issue 39).

``el.load_state`` / ``loads_state`` of text that is not JSON, or JSON that is
not an object, and ``el.stream_from_state`` / ``describe`` of a value that is
not a dict, each raise :class:`el.ArgumentError` starting ``state:`` (never
a ``NameError``/``AttributeError`` from inside); the command line says so in
one line without a traceback (a real subprocess). The reference for "is it
JSON" is the standard library's own parser.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.lineage import describe, loads_state

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(el.__file__).resolve().parents[1]  # the library this test imported (a mutated copy's, in a mutation run)


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=40).filter(lambda t: not is_json(t)))
def test_text_that_is_not_json_is_an_argument_error(text):
    with pytest.raises(el.ArgumentError, match=r"^state: not JSON"):
        loads_state(text)


@settings(max_examples=60, deadline=None)
@given(value=JSON_VALUES.filter(lambda v: not isinstance(v, dict)))
def test_json_that_is_not_an_object_is_an_argument_error(value, tmp_path_factory):
    with pytest.raises(el.ArgumentError, match=r"^state: expected a JSON object, got "):
        loads_state(json.dumps(value))
    path = tmp_path_factory.mktemp("state") / "state.json"
    path.write_text(json.dumps(value))
    with pytest.raises(el.ArgumentError, match=r"^state: expected a JSON object"):
        el.load_state(path)
    with pytest.raises(el.ArgumentError, match=r"^state: expected a JSON object"):
        el.stream_from_state(path)


@settings(max_examples=40, deadline=None)
@given(value=st.one_of(st.none(), st.integers(), st.lists(st.integers(), max_size=3), st.binary(max_size=4)))
def test_a_state_that_is_not_a_dict_is_an_argument_error(value):
    with pytest.raises(el.ArgumentError, match=r"^state: expected a dict, got "):
        el.stream_from_state(value)
    with pytest.raises(el.ArgumentError, match=r"^state: expected a dict, got "):
        describe(value)


@pytest.mark.parametrize(
    "content, words",
    [("not json {", "state: not JSON"), ("[1, 2]", "state: expected a JSON object, got list")],
)
def test_the_lineage_command_refuses_a_bad_state_file_in_one_line(tmp_path, content, words):
    path = tmp_path / "state.json"
    path.write_text(content)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-m", "episodelake.cli", "lineage", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1
    assert out.stderr.startswith(f"episodelake: error: {words}") and "Traceback" not in out.stderr
