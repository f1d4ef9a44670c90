"""The collection contract: one ``EpisodeCollection`` protocol, public members only, met by datasets and views."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import episodelake as el
from episodelake.read import collection
from episodelake.read.collection import EpisodeCollection, selection, subset

from .conftest import robot_schema
from .reference import random_episode

SRC = Path(el.__file__).parent


def _members(cls: type) -> set[str]:
    tree = ast.parse(Path(collection.__file__).read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    return {n.name for n in node.body if isinstance(n, ast.FunctionDef)}


def test_the_protocol_is_defined_once_with_public_members_only():
    defined = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "EpisodeCollection"
    ]
    assert defined == ["read/collection.py"]
    members = _members(EpisodeCollection)
    assert {"schema", "snapshot", "positions", "episode_ids", "where", "sql"} <= members
    assert [m for m in members if m.startswith("_") and m != "__len__"] == []


@pytest.fixture
def ds():
    rng = np.random.default_rng(0)
    ds = el.Dataset.create(robot_schema(), info={"robot": "arm"})
    ds.append_episodes(random_episode(rng, T).as_dict(unwrap_action=True) for T in (3, 6, 2, 8))
    ds.flush()
    return ds


def test_datasets_and_views_meet_the_contract(ds):
    view = ds.where("length > ?", [2])
    for chosen in (ds, view):
        for name in _members(EpisodeCollection):
            assert hasattr(chosen, name), name
        assert chosen.info == {"robot": "arm"}
        np.testing.assert_array_equal(chosen.episode_ids, chosen.snapshot().index["episode_id"][chosen.positions])
    assert len(view) == 3 and view.positions.tolist() == [0, 1, 3]


def test_subset_and_selection_tell_a_whole_dataset_from_a_view(ds):
    snap = ds.snapshot()
    assert subset(ds, snap) is None and selection(ds, snap) == ()
    every = ds.where("true")  # all episodes, but chosen by a recorded step
    assert subset(every, snap) is None and selection(every, snap) == ({"where": "true", "params": None},)
    view = ds.where("length > ?", [2]).select_episodes("SELECT episode_id FROM episodes WHERE length < 8")
    assert subset(view, snap).tolist() == [0, 1]
    assert selection(view, snap) == (
        {"where": "length > ?", "params": [2]},
        {"select_episodes": "SELECT episode_id FROM episodes WHERE length < 8", "params": None},
    )
    unrecorded = el.DatasetView(ds, snap, np.array([1, 2]))
    assert selection(unrecorded, snap) is None
    assert selection(el.DatasetView(ds, snap, np.arange(4)), snap) == ()
    ds.append_episodes([random_episode(np.random.default_rng(1), 4).as_dict(unwrap_action=True)])
    ds.flush()  # the dataset moved on: of the older snapshot it still holds every episode
    assert subset(ds, snap) is None and subset(ds, ds.snapshot()) is None
