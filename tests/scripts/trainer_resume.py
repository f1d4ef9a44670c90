"""Stop a trainer's loader after K batches, save its state, resume it in a new process (tests/test_trainer_resume.py).

``python tests/scripts/trainer_resume.py stop ROOT K N [CASES]``: for every case of
:data:`CASES`, runs the uninterrupted loader for ``K + N`` batches
(``ROOT/<case>.full.npz``), then a fresh loader for ``K`` batches and saves
its state (``ROOT/<case>.state.pt``, ``torch.save``) and nothing else.

``python tests/scripts/trainer_resume.py resume ROOT N [CASES]``: for every case,
builds the loader again from the datasets under ``ROOT``, loads the saved
state and writes its next ``N`` batches to ``ROOT/<case>.resumed.npz``.

``CASES``: comma-separated case names (default: all).
Batches are written as ``<i>/<key>`` arrays: every buffer of the batch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

import episodelake as el

torch.set_num_threads(1)


def datasets(root: Path) -> tuple[el.Dataset, el.Dataset]:
    return el.Dataset.open(str(root / "a")), el.Dataset.open(str(root / "b"))


def _torchdata_segments(root: Path) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    segs = datasets(root)[0].segments(6)
    gen = torch.Generator().manual_seed(7)
    return StatefulDataLoader(segs, batch_size=4, shuffle=True, num_workers=2, collate_fn=segs.collate, generator=gen)


def _stream_loader(collection: Any, **args: Any) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from episodelake.integrations.stateful import StreamDataset

    return StatefulDataLoader(StreamDataset(collection, 6, batch_size=4, **args), batch_size=None, num_workers=2)


def _grain(root: Path) -> Any:
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():  # Grain's worker processes read absl flags (absl.app.run parses them)
        flags.FLAGS.mark_as_parsed()

    from episodelake.integrations.grain import GrainSource

    source = GrainSource(datasets(root)[0].segments(6))
    sampler = grain.samplers.IndexSampler(
        len(source), shard_options=grain.sharding.NoSharding(), shuffle=True, num_epochs=1, seed=5
    )
    return grain.DataLoader(data_source=source, sampler=sampler, operations=[grain.transforms.Batch(4)], worker_count=2)


CASES: dict[str, Callable[[Path], Any]] = {
    "segments": _torchdata_segments,
    "stream": lambda root: _stream_loader(datasets(root)[0], seed=3),
    "stream_pass": lambda root: _stream_loader(datasets(root)[0], seed=3, sampler=el.Uniform(replacement=False)),
    "weighted": lambda root: _stream_loader(
        datasets(root)[0], seed=4, sampler=el.Weighted("CASE WHEN success THEN 4 ELSE 1 END")
    ),
    "rank1_of_2": lambda root: _stream_loader(datasets(root)[0], seed=9, shard=(1, 2)),
    "mixed": lambda root: _stream_loader(el.concat(list(datasets(root)), weights=[3, 1]), seed=6),
    "grain": _grain,
}


def buffers(batch: Any) -> dict[str, np.ndarray]:
    """Every array of a batch: a SegmentBatch's buffers, or a Grain batch (a dict of arrays) as it is."""
    if isinstance(batch, dict):
        return {k: np.asarray(v) for k, v in batch.items()}
    out = {k: np.asarray(v) for k, v in batch.buffers().items() if np.asarray(v).dtype != object}
    out.update(episode_id=np.asarray(batch.episode_id), start=np.asarray(batch.start))
    if hasattr(batch, "source"):
        out["source"] = np.asarray(batch.source)
    return out


def take(batches: Iterator[Any], n: int) -> list[dict[str, np.ndarray]]:
    return [buffers(next(batches)) for _ in range(n)]


def save(path: Path, batches: list[dict[str, np.ndarray]]) -> None:
    np.savez(path, **{f"{i}/{k}": v for i, b in enumerate(batches) for k, v in b.items()})


def grain_state(it: Any) -> Any:
    return it.get_state()


def main(argv: list[str]) -> None:
    mode, root = argv[0], Path(argv[1])
    wanted = argv[4 if mode == "stop" else 3].split(",") if len(argv) > (4 if mode == "stop" else 3) else list(CASES)
    for case in wanted:
        make = CASES[case]
        if mode == "stop":
            k, n = int(argv[2]), int(argv[3])
            save(root / f"{case}.full.npz", take(iter(make(root)), k + n))
            loader = make(root)
            it = iter(loader)
            take(it, k)
            state = it.get_state() if case == "grain" else loader.state_dict()
            torch.save(state, root / f"{case}.state.pt")
        else:
            n = int(argv[2])
            loader = make(root)
            state = torch.load(root / f"{case}.state.pt", weights_only=False)
            if case == "grain":
                it = iter(loader)
                it.set_state(state)
            else:
                loader.load_state_dict(state)
                it = iter(loader)
            save(root / f"{case}.resumed.npz", take(it, n))


if __name__ == "__main__":
    main(sys.argv[1:])
