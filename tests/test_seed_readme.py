"""The seed episodata README's thirteen examples run against episodelake, only the import changed (issue 41).

The README's ```python blocks are pasted in order into ONE script, as a user
porting episodata code would paste them into a script or a notebook, with
``from episodata`` changed to ``from episodelake`` and nothing else of the
example text (where no CUDA device exists, ``"cuda"`` reads ``"cpu"``). The
script runs in a fresh folder in a subprocess. Around the examples the
harness adds only what the README leaves to the reader, each marked below:
the arrays example 4 names (``frame0``, ``frames``, ...), a segment with the
nested action example 5 reads, and the dataset example 13 opens
(``old_npz_dataset``, an episodelake copy: episodata's npz format itself is
not read, see docs/ecosystem.md). After each example it checks what the
README says that example gives: shapes, masks, the observation overlap,
the context/target split, the custom sampler's draws, the TensorDict's
shared storage, the copy. The seed README lives in ``shared/seeds/`` beside
the checkout (``../shared/seeds/`` from the repository root).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED = (ROOT / ".." / "shared" / "seeds" / "episodata-README.txt").resolve()

# What the harness runs before an example: only what the README leaves to the reader.
BEFORE = {
    4: """
rng = np.random.default_rng(4)
T4 = 12
frame0 = rng.integers(0, 255, (3, 16, 16), dtype=np.uint8)
state0 = rng.standard_normal(5).astype(np.float32)
frames = rng.integers(0, 255, (T4, 3, 16, 16), dtype=np.uint8)
states = rng.standard_normal((T4, 5)).astype(np.float32)
moves = rng.standard_normal((T4, 2)).astype(np.float32)
camera_actions = rng.standard_normal((T4, 2)).astype(np.float32)
rewards = rng.standard_normal(T4).astype(np.float32)
""",
    5: """
jumps = rng.integers(0, 2, T4).astype(np.int64)
nested = {**episode, "actions": {"move": moves, "keyboard": {"jump": jumps}}}
segment = Dataset.from_episodes([nested]).episode(0).read()
""",
    13: """
dataset.copy_to("old_npz_dataset")
""",
}

# What the README says each example gives, checked after it.
AFTER = {
    1: """
assert len(dataset) == 1 and writer.done
T = dataset.episode(0).length
assert T >= 1 and dataset.episode(0).terminated == terminated and dataset.episode(0).truncated == truncated
""",
    2: """
assert segment.obs.shape == (T, 4) and segment.next_obs.shape == (T, 4)
assert segment.action.shape == (T,) and segment.reward.shape == (T,) and segment.terminated.shape == (T,)
assert np.array_equal(segment.obs[1:], segment.next_obs[:-1])  # one L + 1 row buffer
assert np.array_equal(segment.all_obs[1:], segment.next_obs) and segment.all_obs.shape == (T + 1, 4)
assert segment.terminated[-1] == terminated and not segment.terminated[:-1].any()
""",
    3: """
assert batch.obs.shape == (64, 32, 4) and batch.next_obs.shape == (64, 32, 4) and batch.mask.shape == (64, 32)
real = min(T, 32)
assert (batch.mask.sum(axis=1) == real).all() and batch.mask[:, :real].all()  # padded at the end: False
assert np.array_equal(batch.obs[:, 1:], batch.next_obs[:, :-1])
""",
    4: """
assert np.array_equal(segment.obs.camera[0], frame0) and np.array_equal(segment.obs.camera[1:], frames[:-1])
assert np.array_equal(segment.next_obs.camera, frames) and np.array_equal(segment.obs.state[0], state0)
assert np.array_equal(segment.action.move, moves) and np.array_equal(segment.action.camera, camera_actions)
assert np.array_equal(segment.obs["camera"], segment.obs.camera) and np.array_equal(segment.reward, rewards)
""",
    5: """
assert np.array_equal(segment.action["keyboard/jump"], jumps)
assert np.array_equal(segment.action.keyboard.jump, jumps)
""",
    6: """
spec = {f.key: f for f in dataset.schema.fields}
assert spec["observation/camera"].shape == (3, 64, 64) and spec["observation/camera"].layout == "CHW"
assert str(spec["observation/camera"].dtype) == "uint8" and spec["observation/state"].shape == (7,)
assert spec["action"].shape == (4,) and spec["reward"].shape == () and len(dataset) == 0
""",
    7: """
assert os.path.isdir("rollouts") and Path(dataset.location.path).resolve() == Path("rollouts").resolve()
ep = dataset.episode(0)
assert len(dataset) == 1 and ep.length == 100 and ep.terminated
seg = ep.read()
assert seg.obs.shape == (100, 4) and seg.action.dtype == np.int64 and seg.reward.dtype == np.float32
""",
    8: """
import torch
assert len(segments) == 100 - 32 + 1
assert isinstance(batch.obs, torch.Tensor) and tuple(batch.obs.shape) == ((100 - 32 + 1) % 64, 32, 4)
assert batch.obs.device.type == DEVICE and batch.mask.shape == (5, 32)
assert batch.obs.untyped_storage().data_ptr() == batch.next_obs.untyped_storage().data_ptr()  # shared after map
""",
    9: """
assert batch.context.obs.shape == (64, 8, 4) and batch.target.obs.shape == (64, 24, 4)
assert batch.obs.shape == (64, 32, 4)
assert np.array_equal(np.concatenate([batch.context.obs, batch.target.obs], axis=1), batch.obs)
""",
    10: """
assert transitions.obs.shape == (256, 4) and transitions.action.shape == (256,)
one_pass = list(dataset.segment_stream(sequence_length=32, batch_size=64, shuffle=False))
assert [len(b.start) for b in one_pass] == [64, 5]
assert np.array_equal(np.concatenate([b.start for b in one_pass]), np.arange(100 - 32 + 1))
assert np.array_equal(batch.start, one_pass[-1].start)
assert stream.sample().obs.shape[1:] == (32, 4)
""",
    11: """
batch = stream.sample()
drawn = np.random.default_rng(0).integers(100 - 32 + 1, size=64)
assert batch.obs.shape == (64, 32, 4) and np.array_equal(batch.start, drawn)
""",
    12: """
assert tuple(td.batch_size) == (64,) and tuple(td["observation"].shape) == (64, 32, 4)
assert td["observation"].device.type == DEVICE
shared = td["observation"].untyped_storage().data_ptr() == td["next", "observation"].untyped_storage().data_ptr()
assert shared  # device given to batch_to_tensordict: one observation buffer
""",
    13: """
assert os.path.isdir("chunked_dataset") and len(dataset) == len(source) == 1
assert np.array_equal(dataset.episode(0).read().obs, source.episode(0).read().obs)
""",
}


def examples() -> list[str]:
    """The README's ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```", SEED.read_text(), flags=re.DOTALL | re.MULTILINE)


def ported(block: str) -> str:
    """The example as a user porting it writes it: only the package name changed."""
    return block.replace("from episodata.utils import", "from episodelake.utils import").replace(
        "from episodata import", "from episodelake import"
    )


def cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not SEED.is_file(), reason=f"the seed README is not at {SEED} (shared/ beside the checkout)")
def test_the_seed_readme_examples_run_in_order_and_give_what_it_says(tmp_path):
    blocks = examples()
    assert len(blocks) == 13
    device = "cuda" if cuda() else "cpu"
    parts = ["import os", "from pathlib import Path", "import numpy as np", f"DEVICE = {device!r}"]
    for n, block in enumerate(blocks, start=1):
        text = ported(block)
        assert "episodata" not in text, f"example {n} still names episodata"
        if device != "cuda":
            text = text.replace('"cuda"', '"cpu"')
        parts += [f"# ---- harness before example {n}", BEFORE.get(n, ""), f"# ---- example {n}", text]
        parts += [f"# ---- harness checks of example {n}", AFTER[n], f"print('example {n} ok', flush=True)"]
    script = tmp_path / "readme.py"
    script.write_text("\n".join(parts))
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    done = re.findall(r"^example (\d+) ok$", run.stdout, flags=re.MULTILINE)
    assert run.returncode == 0, f"failed after examples {done}:\n{run.stderr[-4000:]}"
    assert done == [str(n) for n in range(1, 14)]
