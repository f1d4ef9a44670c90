"""Resumable ``segment_stream`` under ``torchdata.stateful_dataloader.StatefulDataLoader`` (and plain DataLoaders).

:class:`StreamDataset` is a ``torch.utils.data.IterableDataset`` that builds
one :meth:`~episodelake.Dataset.segment_stream` per ``DataLoader`` worker,
sharded over workers (and over DDP ranks: worker ``w`` of rank ``r`` reads
shard ``r * num_workers + w`` of ``world * num_workers``), and carries that
worker's stream state through torchdata's ``Stateful`` protocol
(``state_dict()`` / ``load_state_dict()`` on the dataset: the loader takes
each worker's state after every batch it yields and hands it back to the
same worker after ``StatefulDataLoader.load_state_dict``). So stopping after
``k`` batches, saving ``loader.state_dict()``, and loading it into the same
loader built again in a new process yields exactly the batches the
uninterrupted run yields after its ``k``-th (tested with ``num_workers=2``
in ``tests/test_trainer_resume.py``).

Each item is one whole batch (a :class:`~episodelake.batch.SegmentBatch`, or
what ``convert`` makes of it), so build the loader with ``batch_size=None``.
``torch`` is imported when this module is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from ..core.errors import ArgumentError

STATE_FORMAT = "episodelake.StreamDataset/1"


class StreamDataset(IterableDataset):
    """An iterable dataset of segment batches, one sharded stream per worker, resumable per worker.

    Args:
        collection: a Dataset, DatasetView or ``el.concat`` view.
        window: the stream's window (an int length or an ``el.Window``).
        shard: this process's ``(rank, world)`` (DDP); workers split it further.
        convert: applied to each batch in the worker (e.g.
            :func:`~episodelake.integrations.torch.to_torch`); None yields the
            :class:`~episodelake.batch.SegmentBatch` itself.
        **stream_args: every other :meth:`~episodelake.Dataset.segment_stream`
            argument (``batch_size``, ``sampler``, ``seed``, ``where``,
            ``prefetch``, ...). A finite pass sharded over workers needs a
            ``seed`` (every worker draws the same permutation).

    Contract: a worker's state is its stream's ``state_dict()`` after the last
    batch it returned, plus the shard it read; ``load_state_dict`` of a state
    taken for another shard raises ArgumentError. With replacement
    (``el.Uniform()``, ``el.Weighted``, ``el.Prioritized``, ``el.concat``
    mixing) the stream is infinite; finite passes end the loader's epoch when
    every worker's share is done (resume exact within the pass). Each
    ``iter(loader)`` rebuilds the streams: call :meth:`set_epoch` before each
    loader epoch so epochs differ. Workers must be forked
    (``multiprocessing_context="fork"``, Linux's default): the collection is
    handed to them as it is, not pickled.
    """

    def __init__(
        self,
        collection: Any,
        window: Any,
        *,
        shard: Sequence[int] | None = None,
        convert: Callable[[Any], Any] | None = None,
        **stream_args: Any,
    ) -> None:
        super().__init__()
        if "shard" in stream_args:
            raise ArgumentError("shard: pass it as StreamDataset(shard=(rank, world))")
        rank, world = (0, 1) if shard is None else (int(shard[0]), int(shard[1]))
        if not 0 <= rank < world:
            raise ArgumentError(f"shard must be (rank, world) with 0 <= rank < world, got {shard!r}")
        self.collection, self.window, self.convert = collection, window, convert
        self.rank, self.world = rank, world
        self.stream_args = stream_args
        self.epoch = 0
        self._stream: Any = None
        self._pending: dict[str, Any] | None = None
        # built once here: the arguments are checked in this process, and the collection's snapshot and index
        # columns are read before workers fork (deltalake's runtime cannot be used in a forked child)
        probe = collection.segment_stream(window, shard=(rank, world), **{**stream_args, "prefetch": 0})
        probe.close()

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s sequence (as ``DistributedSampler.set_epoch``): call it before each loader epoch.

        Every ``iter(loader)`` builds the workers' streams afresh, so without it
        each loader epoch repeats the first one's batches. Epoch 0 is the stream
        of ``seed`` itself; epoch ``e > 0`` uses a seed derived from ``(seed, e)``
        (a stream without ``seed`` draws fresh entropy anyway). Before resuming,
        call it with the checkpoint's epoch, then ``load_state_dict``.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ArgumentError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = epoch

    def _args(self) -> dict[str, Any]:
        args = dict(self.stream_args)
        seed = args.get("seed")
        if self.epoch and seed is not None:
            args["seed"] = int(np.random.SeedSequence([int(seed), self.epoch]).generate_state(1, np.uint64)[0] >> 1)
        return args

    def _shard(self) -> tuple[int, int]:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        return self.rank * workers + worker, self.world * workers

    def __iter__(self) -> Iterator[Any]:
        rank, world = self._shard()
        if self._stream is not None:
            self._stream.close()
        self._stream = self.collection.segment_stream(self.window, shard=(rank, world), **self._args())
        pending, self._pending = self._pending, None
        if pending is not None and pending["stream"] is not None:
            if tuple(pending["shard"]) != (rank, world):
                raise ArgumentError(f"state_dict: taken for shard {tuple(pending['shard'])}, this is {(rank, world)}")
            if pending.get("epoch", 0) != self.epoch:
                raise ArgumentError(f"state_dict: taken in epoch {pending.get('epoch', 0)}; call set_epoch() first")
            self._stream.load_state_dict(pending["stream"])
        return self._batches(self._stream)

    def _batches(self, stream: Any) -> Iterator[Any]:
        for batch in stream:
            yield batch if self.convert is None else self.convert(batch)

    def state_dict(self) -> dict[str, Any]:
        """This worker's resume point: its stream's state after the last batch returned (plain values)."""
        if self._stream is None:
            return self._pending or {
                "format": STATE_FORMAT,
                "shard": list(self._shard()),
                "epoch": self.epoch,
                "stream": None,
            }
        return {
            "format": STATE_FORMAT,
            "shard": list(self._shard()),
            "epoch": self.epoch,
            "stream": self._stream.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` at the next ``iter()`` (the loader restores it before iterating)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ArgumentError(f"state_dict: not a StreamDataset state ({STATE_FORMAT})")
        self._pending = state
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def __getstate__(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["_stream"] = None  # a worker builds its own
        return out

    def __repr__(self) -> str:
        return f"StreamDataset({self.window!r}, shard=({self.rank}, {self.world}), {self.stream_args})"
