"""TorchRL replay buffers over episodelake data: a read-only ``Storage`` and a trajectory-slice ``Sampler``.

:class:`EpisodeStorage` presents a Dataset, a view or an ``el.concat`` view to
``torchrl.data.ReplayBuffer`` / ``TensorDictReplayBuffer`` as a flat storage
of transitions (index ``i`` is the ``i``-th transition of the episodes in
collection order, sources one after another); :class:`SliceSampler` draws
trajectory-aligned slices of ``slice_len`` transitions that never cross an
episode boundary (TorchRL's ``SliceSampler(strict_length=True)``), planned by
episodelake's segment index: uniform over the valid slices, or weighted per
episode (``weights=``: SQL, a query or an array, as ``el.Weighted``), among
the episodes a ``where=`` predicate keeps, and over an ``el.concat`` with its
source weights. The storage reads the slices of a batch with one planned
read per source (not transition by transition).

Sampled TensorDicts, batch size ``[batch_size]`` (``num_slices`` slices of
``slice_len`` consecutive transitions, slice after slice; reshape with
``td.reshape(num_slices, -1)``), follow TorchRL's conventions:
``observation`` (one field; several: a nested TensorDict by field name),
``action``, ``("next", "observation")``, ``("next", "reward")`` (``[B, 1]`` for
a scalar reward), ``("next", "done")``, ``("next", "terminated")``,
``("next", "truncated")`` (``[B, 1]`` bool: ``terminated`` only on the last
step of a terminated episode, ``truncated`` only on the last step of a
truncated one, ``done = terminated | truncated``), root ``done`` /
``terminated`` / ``truncated`` (False: a stored state is never terminal),
``("collector", "traj_ids")`` (the episode id), ``episode_id``, ``step_count``
(``[B, 1]``, the transition's index in its episode) and ``index`` (the
storage indices, set by ``TensorDictReplayBuffer``). Extra fields come under
``extra``. ``torch``, ``tensordict`` and ``torchrl`` are imported when this
module is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage

from ..core.errors import ArgumentError
from ..read.batching import reader_for
from ..read.selection import episode_weights, select
from ..sampling.samplers import UniformSampler, WeightedSampler
from ..sampling.segment_index import SegmentIndex, check_positive
from .tensordict import _nested

STATE_FORMAT = "episodelake.torchrl/1"


def _sources(collection: Any) -> tuple[list[Any], list[float] | None]:
    """The collections a storage reads (one, or an ``el.concat``'s sources) and the concat's weights."""
    sources = getattr(collection, "sources", None)
    if sources is None:
        return [collection], None
    weights = getattr(collection, "weights", None)
    return list(sources), None if weights is None else [float(w) for w in weights]


class _Part:
    """One source: its snapshot, the positions it keeps, their reader."""

    def __init__(self, collection: Any, where: str | None, filter: Callable[[Any], bool] | None) -> None:
        self.collection = collection
        self.snap, self.positions = select(collection, where, filter)
        self.reader = reader_for(self.snap)
        self.lengths = np.asarray(self.snap.lengths[self.positions], np.int64)
        self.ids = np.asarray(self.snap.index["episode_id"], np.int64)[self.positions]


def identity(data: Any) -> Any:
    """The replay buffer's ``collate_fn``: the storage already returns one TensorDict."""
    return data


class EpisodeStorage(Storage):
    """A read-only TorchRL ``Storage`` of the transitions of a Dataset, view or ``el.concat`` view.

    Args:
        collection: what the buffer holds (a ``ds.where(...)`` view narrows it).
        where / filter: narrow it further (SQL over ``episodes``; a callable on each ``EpisodeRef``).

    ``len(storage)`` is the number of transitions; ``storage.get(index)`` takes
    ints, slices, lists, NumPy arrays or tensors of transition indices and
    returns a TensorDict (see the module docstring); runs of consecutive
    indices inside one episode are read as slices. Writing (``set``) raises
    ``RuntimeError``: build the buffer with
    ``torchrl.data.replay_buffers.ImmutableDatasetWriter()`` (as
    :func:`replay_buffer` does). ``state_dict()`` identifies the content
    (episode ids and lengths); ``load_state_dict`` of another content raises
    ``ArgumentError``.
    """

    def __init__(
        self, collection: Any, *, where: str | None = None, filter: Callable[[Any], bool] | None = None
    ) -> None:
        sources, self.source_weights = _sources(collection)
        self.parts = [_Part(src, where, filter) for src in sources]
        self.part_of = np.concatenate([np.full(len(p.positions), i, np.int64) for i, p in enumerate(self.parts)])
        self.local = np.concatenate([np.arange(len(p.positions), dtype=np.int64) for p in self.parts])
        self.lengths = np.concatenate([p.lengths for p in self.parts])
        self.episode_ids = np.concatenate([p.ids for p in self.parts])
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        super().__init__(max_size=max(int(self.offsets[-1]), 1))
        schema = self.parts[0].snap.schema
        for p in self.parts[1:]:
            if p.snap.schema.step_fields != schema.step_fields:
                raise ArgumentError("EpisodeStorage: the sources' step fields differ")
        self.schema = schema

    # ---- TorchRL's Storage interface
    def __len__(self) -> int:
        return int(self.offsets[-1])

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        raise RuntimeError("EpisodeStorage is read-only: write episodes to the dataset (ds.append_episodes)")

    def get(self, index: Any) -> TensorDict:
        """The transitions at ``index`` as one TensorDict (an int gives batch size ``[]``)."""
        scalar = isinstance(index, int | np.integer) or (isinstance(index, torch.Tensor) and index.ndim == 0)
        ids = self._ids(index)
        td = self._read(ids)
        return td[0] if scalar else td

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "episode_ids": self.episode_ids.tolist(),
            "lengths": self.lengths.tolist(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or state_dict.get("format") != STATE_FORMAT:
            raise ArgumentError(f"state_dict: not an EpisodeStorage state ({STATE_FORMAT})")
        if state_dict["episode_ids"] != self.episode_ids.tolist() or state_dict["lengths"] != self.lengths.tolist():
            raise ArgumentError("state_dict: taken from a storage holding other episodes")

    def _empty(self) -> None:
        raise RuntimeError("EpisodeStorage is read-only: it cannot be emptied")

    def dumps(self, path: Any) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        with open(Path(path) / "episodelake_storage.json", "w") as f:
            json.dump(self.state_dict(), f)

    def loads(self, path: Any) -> None:
        with open(Path(path) / "episodelake_storage.json") as f:
            self.load_state_dict(json.load(f))

    def __repr__(self) -> str:
        return f"EpisodeStorage({len(self.lengths)} episodes, {len(self)} transitions)"

    # ---- reads
    def _ids(self, index: Any) -> np.ndarray:
        n = len(self)
        if isinstance(index, slice):
            return np.arange(n, dtype=np.int64)[index]
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        ids = np.atleast_1d(np.asarray(index))
        if ids.dtype == bool:
            return np.flatnonzero(ids).astype(np.int64)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"EpisodeStorage indices must be integers, got dtype {ids.dtype}")
        ids = ids.astype(np.int64).reshape(-1)
        if ids.size and (ids.min() < -n or ids.max() >= n):
            raise IndexError(f"transition index out of range for {n} transitions")
        return ids % max(n, 1)

    def _read(self, ids: np.ndarray) -> TensorDict:
        ep = np.searchsorted(self.offsets, ids, side="right") - 1
        step = ids - self.offsets[ep]
        # runs of consecutive transitions of one episode: read as slices when they all have one length
        brk = np.ones(len(ids), bool)
        brk[1:] = (ep[1:] != ep[:-1]) | (step[1:] != step[:-1] + 1)
        starts = np.flatnonzero(brk)
        runs = np.diff(np.append(starts, len(ids)))
        L = int(runs[0]) if len(runs) and (runs == runs[0]).all() else 1
        first = starts if L > 1 else np.arange(len(ids))
        k, t0 = ep[first], step[first]
        flat: dict[str, list[np.ndarray]] = {}
        order: list[np.ndarray] = []
        for p, part in enumerate(self.parts):
            hit = np.flatnonzero(self.part_of[k] == p)
            if not hit.size:
                continue
            seg = part.reader.segments(part.positions[self.local[k[hit]]], t0[hit], L)
            for key, value in self._flatten(seg, L).items():
                flat.setdefault(key, []).append(value)
            order.append(hit)
        back = np.argsort(np.concatenate(order), kind="stable")
        cols = {}
        for key, parts in flat.items():
            value = np.concatenate(parts)[back] if len(parts) > 1 else parts[0]
            cols[key] = value.reshape(len(first) * L, *value.shape[2:])
        rows = np.repeat(np.arange(len(first)), L)  # slice of each output transition
        eid = self.episode_ids[k][rows]
        steps = (t0[:, None] + np.arange(L)).reshape(-1)
        return self._tensordict(cols, eid, steps)

    def _flatten(self, seg: Any, L: int) -> dict[str, np.ndarray]:
        out = {}
        for f in self.schema.step_fields:
            arr = np.asarray(seg.data[f.key])
            if f.role == "observation":
                out[f"obs:{f.key}"] = arr[:, :L]
                out[f"next_obs:{f.key}"] = arr[:, 1 : L + 1]
            else:
                out[f"{f.role}:{f.key}"] = arr
        out["terminated"] = np.asarray(seg.terminated)
        out["truncated"] = np.asarray(seg.truncated)
        return out

    def _tensordict(self, cols: dict[str, np.ndarray], eid: np.ndarray, steps: np.ndarray) -> TensorDict:
        B = len(eid)

        def role(prefix: str, role: str) -> Any:
            fields = self.schema.role_fields(role)
            items = {f.name: torch.from_numpy(np.ascontiguousarray(cols[f"{prefix}:{f.key}"])) for f in fields}
            if self.schema.unwrapped(role):
                return next(iter(items.values()))
            from ..core.segments import RoleView

            return _nested(RoleView(items, role))

        terminated = torch.from_numpy(cols["terminated"].copy()).unsqueeze(-1)
        truncated = torch.from_numpy(cols["truncated"].copy()).unsqueeze(-1)
        reward = role("reward", "reward")
        if isinstance(reward, torch.Tensor) and reward.ndim == 1:
            reward = reward.unsqueeze(-1)
        false = torch.zeros(B, 1, dtype=torch.bool)
        data: dict[str, Any] = {
            "observation": role("obs", "observation"),
            "action": role("action", "action"),
            "done": false,
            "terminated": false.clone(),
            "truncated": false.clone(),
            "episode_id": torch.from_numpy(eid),
            "step_count": torch.from_numpy(steps).unsqueeze(-1),
            "collector": {"traj_ids": torch.from_numpy(eid.copy())},
            "next": {
                "observation": role("next_obs", "observation"),
                "reward": reward,
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
        }
        if self.schema.role_fields("extra"):
            data["extra"] = role("extra", "extra")
        return TensorDict(data, batch_size=[B])


class SliceSampler(Sampler):
    """Trajectory-aligned slices planned by episodelake (TorchRL's ``SliceSampler(strict_length=True)``).

    Args:
        slice_len / num_slices: exactly one: the transitions per slice, or
            the slices per batch (``batch_size`` must be a multiple of it).
        weights: per-episode weights, as ``el.Weighted``'s (a SQL expression
            or query over ``episodes``, or an array with one value per
            episode of the storage); a slice is as likely as its episode's
            weight. Over an ``el.concat`` storage, each batch's slices come
            from source ``s`` with probability ``weights[s] / sum(weights)``
            (the concat's weights; uniform over the union without).
        where: SQL predicate over ``episodes``: only the episodes it keeps are drawn.
        seed: the generator's seed (None: fresh entropy).

    Draws with replacement; slices never cross an episode boundary, and
    episodes shorter than the slice are never drawn. ``sample`` returns the
    storage indices ``[num_slices * slice_len]`` (slice after slice, each
    ascending) and an empty info dict; ``state_dict()`` is the generator's
    state (a sampler built with the same arguments continues the same draws
    after ``load_state_dict``).
    """

    def __init__(
        self,
        *,
        slice_len: int | None = None,
        num_slices: int | None = None,
        weights: str | Sequence[float] | np.ndarray | None = None,
        where: str | None = None,
        seed: int | None = None,
    ) -> None:
        if (slice_len is None) == (num_slices is None):
            raise ArgumentError("SliceSampler: give exactly one of slice_len and num_slices")
        self.slice_len = None if slice_len is None else check_positive(slice_len, "slice_len")
        self.num_slices = None if num_slices is None else check_positive(num_slices, "num_slices")
        self.weights, self.where = weights, where
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (1 << 63))  # type: ignore[operator]
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        self._plans: dict[tuple[int, int], tuple[SegmentIndex, Any]] = {}

    def _plan(self, storage: EpisodeStorage, L: int) -> tuple[SegmentIndex, Any]:
        key = (id(storage), L)
        if key not in self._plans:
            if not isinstance(storage, EpisodeStorage):
                raise ArgumentError("SliceSampler samples an EpisodeStorage")
            E = len(storage.lengths)
            index = SegmentIndex(np.arange(E, dtype=np.int64), storage.lengths, L, pad=None)
            w = np.ones(E)
            if self.weights is not None:
                if isinstance(self.weights, str):
                    w = np.concatenate(
                        [episode_weights(p.collection, p.snap, p.positions, self.weights) for p in storage.parts]
                    )
                else:
                    w = np.asarray(self.weights, np.float64)
                    if w.shape != (E,):
                        raise ArgumentError(f"weights: expected one value per episode ({E}), got shape {w.shape}")
            if self.where is not None:
                keep = [np.isin(p.positions, select(p.collection, self.where)[1]) for p in storage.parts]
                w = w * np.concatenate(keep)
            if storage.source_weights is not None:  # each source's share of the draws, then its episodes' weights
                share = np.asarray(storage.source_weights, np.float64)
                mass = np.bincount(storage.part_of, w * index.counts, minlength=len(share))
                scale = np.divide(share, mass, out=np.zeros_like(share), where=mass > 0)
                w = w * scale[storage.part_of]
            uniform = self.weights is None and self.where is None and storage.source_weights is None
            sampler = UniformSampler(0) if uniform else WeightedSampler(0, index.episode_weights_table(w))
            self._plans[key] = (index, sampler)
        return self._plans[key]

    def _lengths(self, batch_size: int) -> tuple[int, int]:
        if self.slice_len is not None:
            L, n = self.slice_len, batch_size // self.slice_len
        else:
            n = int(self.num_slices or 0)
            L = batch_size // max(n, 1)
        if n * L != batch_size or n == 0:
            raise ArgumentError(
                f"SliceSampler: batch_size {batch_size} is not a multiple of "
                f"{'slice_len' if self.slice_len is not None else 'num_slices'}"
            )
        return L, n

    def sample(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict]:
        L, n = self._lengths(batch_size)
        index, sampler = self._plan(storage, L)
        sampler.rng = self.rng  # the one generator: its state is this sampler's state
        k, row = index.locate(sampler.sample(index, n))
        ids = (storage.offsets[index.positions[k]] + row)[:, None] + np.arange(L)
        return torch.from_numpy(ids.reshape(-1)), {}

    def _empty(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "seed": self.seed, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or state_dict.get("format") != STATE_FORMAT:
            raise ArgumentError(f"state_dict: not a SliceSampler state ({STATE_FORMAT})")
        self.seed = int(state_dict["seed"])
        self.rng = np.random.default_rng(self.seed)
        self.rng.bit_generator.state = state_dict["rng"]

    def dumps(self, path: Any) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        with open(Path(path) / "episodelake_sampler.json", "w") as f:
            json.dump(self.state_dict(), f)

    def loads(self, path: Any) -> None:
        with open(Path(path) / "episodelake_sampler.json") as f:
            self.load_state_dict(json.load(f))

    def __repr__(self) -> str:
        return f"SliceSampler(slice_len={self.slice_len}, num_slices={self.num_slices}, seed={self.seed})"


def replay_buffer(
    collection: Any,
    *,
    batch_size: int,
    slice_len: int | None = None,
    num_slices: int | None = None,
    weights: str | Sequence[float] | np.ndarray | None = None,
    where: str | None = None,
    seed: int | None = None,
    **buffer_args: Any,
) -> Any:
    """A ``torchrl.data.TensorDictReplayBuffer`` over ``collection``: :class:`EpisodeStorage`,
    :class:`SliceSampler` (``slice_len``/``num_slices``, ``weights``, ``where``, ``seed``), an
    ``ImmutableDatasetWriter`` and the storage's own batches (``collate_fn``); other keyword arguments go to
    the buffer (``transform=``, ``prefetch=``, ...)."""
    from torchrl.data import TensorDictReplayBuffer
    from torchrl.data.replay_buffers import ImmutableDatasetWriter

    return TensorDictReplayBuffer(
        storage=EpisodeStorage(collection),
        sampler=SliceSampler(slice_len=slice_len, num_slices=num_slices, weights=weights, where=where, seed=seed),
        writer=ImmutableDatasetWriter(),
        collate_fn=identity,
        batch_size=batch_size,
        **buffer_args,
    )
