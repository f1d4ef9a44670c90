"""The error hierarchy: every public error is exported, documented in docs/errors.md and an EpisodeLakeError;
real calls raise the documented class (arguments apart from data, existing datasets apart from other files)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import episodelake as el
from episodelake.core import errors

DOC = Path(__file__).resolve().parent.parent / "docs" / "errors.md"


def public_errors() -> dict[str, type[BaseException]]:
    """Every exception class errors.py defines."""
    return {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == errors.__name__
    }


def documented() -> dict[str, str]:
    """docs/errors.md's sections: ``### `Name``` heading -> its text."""
    parts = re.split(r"^### `(\w+)`\s*$", DOC.read_text(), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (3,), "float32"),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
        ]
    )


def episode(T: int = 4) -> dict:
    return {
        "observations": np.zeros((T + 1, 3), np.float32),
        "actions": np.zeros(T, np.int64),
        "rewards": np.zeros(T, np.float32),
    }


def test_every_error_is_exported_and_in_the_hierarchy():
    found = public_errors()
    assert len(found) >= 15
    for name, cls in found.items():
        assert getattr(el, name) is cls, f"el.{name} is not exported"
        assert name in el.__all__
        assert issubclass(cls, el.EpisodeLakeError)


def test_every_error_is_documented_with_its_bases():
    docs = documented()
    assert sorted(docs) == sorted(public_errors()), "docs/errors.md must have one section per error"
    for name, cls in public_errors().items():
        bases = re.search(r"Bases?: (.+?)\.", docs[name].replace("\n", " "))
        assert bases, f"docs/errors.md: {name} does not state its bases"
        assert re.findall(r"`(\w+)`", bases.group(1)) == [b.__name__ for b in cls.__bases__], name


def test_builtin_compatibility():
    assert issubclass(el.DatasetExistsError, FileExistsError)
    assert issubclass(el.ArgumentError, el.ValidationError)
    assert issubclass(el.ArgumentError, ValueError)
    assert issubclass(el.MissingDependencyError, ImportError)
    assert not issubclass(el.ValidationError, el.ArgumentError)


def test_create_over_an_existing_dataset(tmp_path):
    el.Dataset.create(schema(), str(tmp_path / "ds"))
    with pytest.raises(el.DatasetExistsError, match="overwrite=True") as info:
        el.Dataset.create(schema(), str(tmp_path / "ds"))
    assert isinstance(info.value, FileExistsError)
    with pytest.raises(FileExistsError):  # handlers written for the builtin keep working
        el.Dataset.from_episodes([episode()], str(tmp_path / "ds"))


@pytest.mark.parametrize(
    "call",
    [
        lambda ds: ds.segment_stream(0),
        lambda ds: ds.segments(el.Window(2, pad="middle")),
        lambda ds: ds.sample_transitions(2, gamma=2.0),
        lambda ds: ds.copy_to(None, chunk_rows={"nope": 3}),
        lambda ds: ds.maintenance.vacuum(retention_hours=-1),
        lambda ds: el.Dataset.open(ds.location.url, version=-1),
        lambda ds: el.Dataset.open(ds.location.url, commit_every=3),
        lambda ds: ds.vector_writer({"state": np.zeros((2, 3), np.float32)}, 0),
    ],
)
def test_bad_arguments_raise_argument_error(tmp_path, call):
    ds = el.Dataset.from_episodes([episode(), episode()], str(tmp_path / "ds"), schema=schema())
    with pytest.raises(el.ArgumentError) as info:
        call(ds)
    assert isinstance(info.value, el.ValidationError)  # `except ValidationError` still catches it


def test_bad_data_raises_validation_error_not_argument_error(tmp_path):
    ds = el.Dataset.create(schema(), str(tmp_path / "ds"))
    bad = {**episode(), "actions": np.zeros((4, 2), np.int64)}
    with pytest.raises(el.ValidationError, match="field 'action' has shape") as info:
        ds.append_episodes([bad])
    assert not isinstance(info.value, el.ArgumentError)
    with pytest.raises(el.ValidationError) as info:
        ds.new_episode({"state": np.zeros(3, np.float32)}).add_step(
            {"observation": {"state": np.zeros(4, np.float32)}, "action": 1, "reward": 0.0}
        )
    assert type(info.value) is el.ValidationError
