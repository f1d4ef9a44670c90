"""The stream's planner: which global segment ids each batch holds, and the state to resume from after it.

Finite passes (ordered or in a seeded permutation per epoch) dealt round-robin
over the shard's ranks, or draws with replacement through a
:class:`~episodelake.samplers.Sampler` from this rank's shard of the index;
:meth:`_Planner.state` and :meth:`_Planner.load` are the position part of a
stream's ``state_dict()``.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import numpy as np

from ..core.errors import ArgumentError
from .samplers import PrioritizedSampler, Sampler, StatefulSampler, UniformSampler
from .segment_index import SegmentIndex

STATE_FORMAT = 2

FINITE_MODES = ("ordered", "permutation")
# where a state keeps its sampler's state: the built-in samplers' generator ("random"), a user sampler's own;
# a prioritized stream's generator ("rng") and, taken when state_dict() is called, its priorities ("priorities")
SAMPLER_STATE = {"random": "rng", "sampler": "sampler"}
SEEDED_MODES = ("permutation", "random", "prioritized")


class _Planner:
    """Which global segment ids each batch holds, and the state to resume from after it.

    Finite passes walk a global sequence of the ``N`` segment ids: ``0 .. N - 1``
    (``"ordered"``) or a permutation seeded by ``(seed, epoch)``
    (``"permutation"``). ``consumed`` counts the sequence positions the whole
    world took in this pass; rank ``r`` of world ``w`` deals positions
    round-robin, so its next batch holds positions ``consumed + r + w * j``
    for ``j < b``, where ``b = min(batch_size, ceil((N - consumed) / w))``
    (``"wrap"``: positions ``>= N`` wrap to the start of the sequence) or
    ``floor((N - consumed) / w)`` (``"drop"``). Every rank computes the same
    ``b``, so every rank yields the same number of batches, and after ``k``
    batches exactly positions ``[0, consumed)`` are taken whatever the world
    size: a state resumes on any rank, and on a new world size.

    With replacement (mode ``"random"``: a built-in sampler) and with a
    custom sampler (mode ``"sampler"``) each rank draws through the
    :class:`~episodelake.samplers.Sampler` protocol from its own shard of the
    index (:class:`SegmentIndex`); the built-in samplers' generator is seeded by
    ``seed`` (world size 1) or ``(seed, rank)``. That state is per rank.
    Prioritized (mode ``"prioritized"``) draws through a
    :class:`~episodelake.samplers.PrioritizedSampler` and keeps the last
    draw's slots and importance weights in ``drawn``.
    """

    def __init__(
        self,
        index: SegmentIndex,
        batch_size: int,
        mode: str,
        seed: int,
        sampler: Sampler | None,
        drop_last: bool,
        shard_policy: str,
        params: dict[str, Any],
        seed_given: bool,
    ) -> None:
        self.index = index
        self.batch_size = batch_size
        self.mode = mode
        self.sampler = sampler
        self.drop_last = drop_last
        self.shard_policy = shard_policy
        self.params = params
        self.seed_given = seed_given
        self.drawn: tuple[np.ndarray, np.ndarray] | None = None
        self._reset(seed, epoch=0, consumed=0)

    def _reset(self, seed: int, epoch: int, consumed: int) -> None:
        self.seed = seed
        self.params["seed"] = seed
        self.epoch = epoch
        self.consumed = consumed
        self.ended = False  # a pass that ended stays ended, even where another world size could go on
        self._perm: np.ndarray | None = None

    @property
    def finite(self) -> bool:
        return self.mode in FINITE_MODES

    def per_rank(self, left: int) -> int:
        """Items each rank takes from ``left`` remaining positions of a pass."""
        w = self.index.world
        return max(-(-left // w) if self.shard_policy == "wrap" else left // w, 0)

    def _next_count(self) -> int:
        b = min(self.batch_size, self.per_rank(self.index.total - self.consumed))
        return 0 if self.drop_last and b < self.batch_size else b

    def pass_finished(self) -> bool:
        return self.finite and (self.ended or self._next_count() == 0)

    def new_pass(self) -> None:
        self.epoch += 1
        self.consumed = 0
        self.ended = False
        self._perm = None

    def next_ids(self) -> np.ndarray | None:
        """Global segment ids of the next batch; None at the end of a finite pass."""
        B, index = self.batch_size, self.index
        if self.mode == "prioritized":
            local, slots, weights = cast(PrioritizedSampler, self.sampler).draw(B)
            self.drawn = (slots, weights)
            return index.to_global(local)
        if type(self.sampler) is UniformSampler:  # in range by construction: no need to check its ids
            local = self.sampler.sample(index, B)
            return local if index.world == 1 else index.rank + index.world * local
        if self.sampler is not None:
            local = np.asarray(self.sampler.sample(index, B))
            return None if local.size == 0 else index.to_global(local)
        b = 0 if self.ended else self._next_count()
        if b == 0:
            self.ended = True
            return None
        N = index.total
        pos = (self.consumed + index.rank + index.world * np.arange(b, dtype=np.int64)) % N
        self.consumed += b * index.world
        if self.mode == "ordered":
            return pos
        if self._perm is None:
            self._perm = np.random.default_rng([self.seed, self.epoch]).permutation(N)
        return self._perm[pos]

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": STATE_FORMAT,
            "mode": self.mode,
            "params": dict(self.params),
            "epoch": self.epoch,
            "consumed": self.consumed,
            "finished": self.pass_finished(),
        }
        key = SAMPLER_STATE.get(self.mode)
        if key is not None and self.sampler is not None and hasattr(self.sampler, "state_dict"):
            saved = self.sampler.state_dict()
            # a built-in sampler's generator state is a fresh dict every call: no copy needed (one per batch)
            out[key] = saved if isinstance(self.sampler, UniformSampler) else copy.deepcopy(saved)
        if self.mode == "prioritized":  # the generator only (a fresh dict): priorities are taken by state_dict()
            out["rng"] = cast(PrioritizedSampler, self.sampler).rng.bit_generator.state
        return out

    def check(self, state: dict[str, Any]) -> None:
        """Raise ArgumentError naming the first parameter in which ``state``'s stream differs from this one."""
        if not isinstance(state, dict):
            raise ArgumentError(f"state_dict: expected a dict, got {type(state).__name__}")
        if state.get("format") != STATE_FORMAT:
            raise ArgumentError(f"state_dict: format is {state.get('format')!r}, this version reads {STATE_FORMAT}")
        saved, mine = state.get("params") or {}, self.params

        def mismatch(name: str, theirs: Any, ours: Any) -> ArgumentError:
            return ArgumentError(
                f"state_dict: {name} is {theirs!r} in the saved state but {ours!r} in this stream "
                "(a state loads only into a stream over the same segments, sampled the same way)"
            )

        if state.get("mode") != self.mode:
            raise mismatch("mode (sampler=)", state.get("mode"), self.mode)
        for key in (
            "sequence_length",
            "pad",
            "stride",
            "segments",
            "episodes",
            "weights",
            "anchors",
            "drop_last",
            "alpha",
            "beta",
        ):
            if saved.get(key) != mine[key]:
                raise mismatch(key, saved.get(key), mine[key])
        if self.mode in SEEDED_MODES and self.seed_given and saved.get("seed") != mine["seed"]:
            raise mismatch("seed", saved.get("seed"), mine["seed"])
        if self.finite:
            if saved.get("shard_policy") != mine["shard_policy"]:
                raise mismatch("shard_policy", saved.get("shard_policy"), mine["shard_policy"])
            theirs = _global_batch(saved)
            ours = mine["batch_size"] * mine["world"]
            if saved.get("world") == mine["world"] and saved.get("batch_size") != mine["batch_size"]:
                raise mismatch("batch_size", saved.get("batch_size"), mine["batch_size"])
            if theirs != ours:
                raise mismatch("global batch size (batch_size * world size)", theirs, ours)
        else:
            for key in ("world", "rank"):
                if saved.get(key) != mine[key]:
                    raise mismatch(
                        f"shard {key} (per-rank state of a stream with replacement or a sampler)",
                        saved.get(key),
                        mine[key],
                    )
            if saved.get("batch_size") != mine["batch_size"]:
                raise mismatch("batch_size", saved.get("batch_size"), mine["batch_size"])
        for key in ("epoch", "consumed"):
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ArgumentError(f"state_dict: {key} must be an int >= 0, got {value!r}")
        if self.mode in ("random", "prioritized") and not isinstance(state.get("rng"), dict):
            raise ArgumentError("state_dict: no generator state ('rng') saved")
        if self.mode == "sampler" and "sampler" not in state and hasattr(self.sampler, "state_dict"):
            raise ArgumentError("state_dict: no sampler state saved, but this stream's sampler has one")

    def load(self, state: dict[str, Any]) -> None:
        self.check(state)
        key = SAMPLER_STATE.get(self.mode)
        if key is not None and key in state:
            cast(StatefulSampler, self.sampler).load_state_dict(copy.deepcopy(state[key]))
        if self.mode == "prioritized":
            cast(PrioritizedSampler, self.sampler).rng.bit_generator.state = copy.deepcopy(state["rng"])
        self._reset(int(state["params"]["seed"]), int(state["epoch"]), int(state["consumed"]))
        self.ended = bool(state.get("finished"))


def _global_batch(params: dict[str, Any]) -> Any:
    try:
        return int(params["batch_size"]) * int(params["world"])
    except (KeyError, TypeError, ValueError):
        return None
