"""Errors at small seams (issue 39, item 7): where a dataset may be created, plain values in quality messages, and
trim/split bounds named one by one. Every test here failed on fd0b29e but
``test_new_empty_and_dataset_folders_still_work``, which guards what the refusals must leave working.
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest

import episodelake as el
from episodelake.integrations.gymnasium import RecordEpisodes

T = 10  # transitions of the edited episode


def schema(**obs_options) -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("observation", (2,), "float32", **obs_options),
            el.FieldSpec("action", (), "int64", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("seed", (), "uint64", role="meta"),
        ]
    )


def episode(length: int = T, frozen: bool = False) -> dict:
    obs = np.arange(2 * (length + 1), dtype=np.float32).reshape(length + 1, 2)
    if frozen:
        obs[:] = obs[0]
    return {"observations": obs, "actions": np.zeros(length, np.int64), "rewards": np.zeros(length, np.float32)}


def tree(path) -> dict[str, bytes]:
    """Every file under ``path`` (relative path -> bytes): what "untouched" compares."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, path)] = fh.read()
    return out


# ---------------------------------------------------------------- where a dataset may be created


@pytest.mark.parametrize("overwrite", [False, True])
def test_create_on_a_file_is_refused_naming_the_path(tmp_path, overwrite):
    target = tmp_path / "file.txt"
    target.write_text("my notes")
    with pytest.raises(el.DatasetExistsError, match=rf"{target} is a file, not a folder"):
        el.Dataset.create(schema(), str(target), overwrite=overwrite)
    assert target.read_text() == "my notes"


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize(
    "make",
    [
        lambda path, overwrite: el.Dataset.create(schema(), path, overwrite=overwrite),
        lambda path, overwrite: el.Dataset.from_episodes([episode()], path, overwrite=overwrite),
        lambda path, overwrite: el.Dataset.from_episodes([episode()]).copy_to(
            path, overwrite=overwrite, progress=False
        ),
        lambda path, overwrite: RecordEpisodes(gym.make("CartPole-v1"), path, overwrite=overwrite),
        lambda path, overwrite: RecordEpisodes(gym.make("CartPole-v1"), path, info_keys=["x"], overwrite=overwrite),
    ],
    ids=["create", "from_episodes", "copy_to", "recorder", "recorder-waiting"],
)
def test_a_folder_holding_other_files_is_refused_and_left_untouched(tmp_path, make, overwrite):
    folder = tmp_path / "work"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    (folder / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = tree(folder)
    with pytest.raises(el.DatasetExistsError, match=rf"{folder} is not empty and holds no episodelake dataset"):
        make(str(folder), overwrite)
    assert tree(folder) == before


def test_an_interrupted_create_is_named_as_such(tmp_path):
    folder = tmp_path / "ds"
    el.Dataset.create(schema(), str(folder))
    (folder / "episodelake.json").unlink()  # as if the process died before writing its descriptor
    with pytest.raises(el.DatasetExistsError, match=r"holds an incomplete dataset .*overwrite=True to start over"):
        el.Dataset.create(schema(), str(folder))
    assert len(el.Dataset.create(schema(), str(folder), overwrite=True)) == 0  # issue 40: starts over


def test_new_empty_and_dataset_folders_still_work(tmp_path):
    el.Dataset.create(schema(), str(tmp_path / "new" / "ds"))
    (tmp_path / "empty").mkdir()
    el.Dataset.create(schema(), str(tmp_path / "empty"))
    ds = el.Dataset.from_episodes([episode()], str(tmp_path / "empty"), overwrite=True)  # replaces a dataset
    assert len(ds) == 1


# ---------------------------------------------------------------- plain values in quality messages


def test_quality_messages_print_plain_values():
    """The online writer's episode label carries its meta: a uint64 seed prints as 3, not array(3, dtype=uint64)."""
    ds = el.Dataset.create(schema(max_repeat=2))
    raw = episode(frozen=True)
    w = ds.new_episode(raw["observations"][0], seed=np.uint64(3))
    with pytest.raises(el.QualityError) as info:
        for t in range(T):
            w.add_step({"observations": raw["observations"][t + 1], "actions": 0, "rewards": 0.0, "truncated": t == 9})
    message = str(info.value)
    assert "{'seed': 3}" in message and "array(" not in message and "np." not in message
    assert "fails max_repeat=2 at step 2" in message


# ---------------------------------------------------------------- trim and split bounds


@pytest.fixture
def edited():
    ds = el.Dataset.from_episodes([episode()])
    return ds, int(ds.episode_ids[0])


@pytest.mark.parametrize(
    ("span", "message"),
    [
        ((5, 500), r"stop 500 is past the episode's 10 steps"),
        ((0, 11), r"stop 11 is past the episode's 10 steps"),
        ((-1, 5), r"start -1 is negative"),
        ((10, 10), r"start 10 is at or past the episode's 10 steps"),
        ((6, 3), r"\[6, 3\) is empty: stop must be above start"),
        ((4, 4), r"\[4, 4\) is empty"),
    ],
)
def test_trim_names_the_bad_bound_and_the_length(edited, span, message):
    ds, eid = edited
    before = ds.version
    with pytest.raises(el.ArgumentError, match=rf"^trim: episode {eid} has {T} transitions; {message}"):
        ds.edit.trim({eid: span})
    assert ds.version == before and ds.episode(0).length == T


def test_trim_head_and_tail_name_what_they_remove(edited):
    ds, eid = edited
    with pytest.raises(
        el.ArgumentError, match=rf"episode {eid} has {T} transitions; head=6 and tail=4 would remove 10"
    ):
        ds.edit.trim(head=6, tail=4)
    with pytest.raises(el.ArgumentError, match=r"head=0 and tail=12 would remove 12 of them"):
        ds.edit.trim(tail=12)
    assert ds.edit.trim(head=6, tail=3).steps_removed == 9


@pytest.mark.parametrize(
    ("at", "message"),
    [
        (500, r"500 is past the episode's 10 steps"),
        (10, r"the second half would be empty"),
        (0, r"the first half would be empty"),
        (-3, r"-3 is negative"),
    ],
)
def test_split_names_the_bad_bound_and_the_length(edited, at, message):
    ds, eid = edited
    with pytest.raises(el.ArgumentError, match=rf"split: episode {eid} has {T} transitions; at={at} .*\({message}\)"):
        ds.edit.split(eid, at)
    assert len(ds) == 1
