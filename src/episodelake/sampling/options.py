"""Sampling options as values, defined and checked once: windows, strategies, shards.

Every sampling method takes the same objects:

* ``window``: a :class:`Window` (which segments: length ``L``, or context
  ``C`` + target ``T``; padding; stride), or a plain int ``L``, which means
  ``Window(L)``;
* ``sampler=``: a strategy (:class:`Uniform`, the default; :class:`Sequential`;
  :class:`Weighted`; :class:`Prioritized`) or any object with
  ``sample(index, batch_size)`` (the :class:`~episodelake.samplers.Sampler`
  protocol, e.g. a :class:`~episodelake.samplers.PrioritizedSampler` kept
  across calls);
* ``shard=``: None, ``(rank, world)`` or a :class:`Shard`;
* ``anchors=``: None, or :class:`Anchors` (segments positioned on the steps a
  SQL predicate picks).

The objects check their own fields when made; :func:`window_of`,
:func:`sampler_of` and :func:`shard_of` turn what a method was given into
them, and refuse a strategy the method does not take, naming the method and
what it takes. Every message names the parameter and the bad value
(:class:`~episodelake.errors.ArgumentError`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import ArgumentError
from ..read.query import where_condition
from .samplers import Sampler, check_exponent
from .segment_index import check_pad, check_positive, check_shard

SHARD_POLICIES = ("wrap", "drop")


@dataclass(frozen=True)
class Window:
    """Which segments: ``length`` transitions each, or ``context`` + ``target`` (``length = context + target``).

    ``pad``: a short episode gives one padded segment, real transitions first
    (``"suffix"``) or last (``"prefix"``), or none (None). ``stride``: the
    distance between segment starts within an episode. Given ``context`` and
    ``target``, ``length`` is filled in and batches carry
    ``batch.context``/``batch.target``.
    """

    length: int | None = None
    context: int | None = None
    target: int | None = None
    pad: str | None = "suffix"
    stride: int = 1

    def __post_init__(self) -> None:
        if (self.context is None) != (self.target is None):
            raise ArgumentError(
                f"window: give both context and target, got context={self.context!r}, target={self.target!r}"
            )
        if self.context is not None:
            total = check_positive(self.context, "window context") + check_positive(self.target, "window target")
            if self.length is not None and self.length != total:
                raise ArgumentError(f"window: length={self.length!r} disagrees with context + target = {total}")
            object.__setattr__(self, "length", total)
        elif self.length is None:
            raise ArgumentError("window: give a length, or context and target")
        else:
            check_positive(self.length, "window length")
        check_pad(self.pad, "window pad")
        check_positive(self.stride, "window stride")

    @property
    def size(self) -> int:
        """Transitions per segment, ``L``."""
        return int(self.length)  # type: ignore[arg-type]  # __post_init__ always sets it


@dataclass(frozen=True)
class Uniform:
    """Segments uniformly: with replacement (infinite, the default), or finite passes in a new seeded order each."""

    replacement: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.replacement, bool):
            raise ArgumentError(f"Uniform replacement must be a bool, got {self.replacement!r}")


@dataclass(frozen=True)
class Sequential:
    """One finite pass in segment order."""


@dataclass(frozen=True)
class Weighted:
    """With replacement, a segment as likely as its episode's weight.

    ``weights``: a SQL expression over the ``episodes`` view or a query
    returning ``episode_id, weight``, or an array with one value per episode
    of the collection (see :func:`~episodelake.selection.episode_weights`).
    """

    weights: Any

    def __post_init__(self) -> None:
        if self.weights is None or isinstance(self.weights, bool):
            raise ArgumentError(f"Weighted weights must be a SQL string or an array, got {self.weights!r}")


@dataclass(frozen=True)
class Prioritized:
    """Prioritized replay: item ``i`` drawn with probability ``p_i ** alpha / sum(p ** alpha)``.

    ``priority``: each item's starting priority: a number, the key of a
    scalar per-step field, a SQL expression or query over ``episodes``, or an
    array (see :mod:`episodelake.priority`). Batches carry ``indices`` and
    importance ``weights`` (``(N * P) ** -beta`` over the batch's largest).
    """

    priority: Any = 1.0
    alpha: float = 0.6
    beta: float = 0.4

    def __post_init__(self) -> None:
        if self.priority is None or isinstance(self.priority, bool):
            raise ArgumentError(
                f"Prioritized priority must be a number, a field or SQL string, or an array, got {self.priority!r}"
            )
        check_exponent(self.alpha, "Prioritized alpha")
        check_exponent(self.beta, "Prioritized beta")


@dataclass(frozen=True)
class Shard:
    """This rank's disjoint part of the segments: rank ``rank`` of ``world``.

    ``policy``: how a finite sharded pass evens out ``N`` segments over the
    ranks so that each yields as many batches: ``"wrap"`` (like
    ``torch.utils.data.DistributedSampler``) repeats the first
    ``ceil(N / world) * world - N`` positions of the pass; ``"drop"`` leaves
    out the last ``N % world``.
    """

    rank: int
    world: int
    policy: str = "wrap"

    def __post_init__(self) -> None:
        check_shard(self.rank, self.world)
        if self.policy not in SHARD_POLICIES:
            raise ArgumentError(f"shard policy must be 'wrap' or 'drop', got {self.policy!r}")


@dataclass(frozen=True)
class Anchors:
    """Segments positioned on steps: one per row of ``steps`` where ``predicate`` is true (its anchor).

    ``predicate``: one SQL expression over the ``steps`` view (``episode_id``,
    ``t``, ``terminated``, ``truncated`` and every small per-step field; see
    docs/query.md), run sandboxed like ``where()``. A segment starts
    ``offset`` transitions from its anchor's step ``t``: it holds transitions
    ``t + offset .. t + offset + L - 1`` (``offset=-15`` with ``L = 16``: the 16
    ending at the anchor). ``params`` binds the placeholders of ``predicate``
    and ``weights`` (positional ``?``: the predicate's first). ``weights``:
    None (anchors drawn uniformly) or one SQL expression over ``steps``, each
    anchor's draw weight (finite, ``>= 0``) when drawing with replacement.
    """

    predicate: str
    offset: int = 0
    params: Any = None
    weights: str | None = None

    def __post_init__(self) -> None:
        where_condition(self.predicate, self.params, "Anchors")
        if isinstance(self.offset, bool) or not isinstance(self.offset, int | np.integer):
            raise ArgumentError(f"Anchors offset must be an int, got {self.offset!r}")
        object.__setattr__(self, "offset", int(self.offset))
        if self.weights is not None:
            if not isinstance(self.weights, str):
                raise ArgumentError(f"Anchors weights must be None or a SQL expression, got {self.weights!r}")
            where_condition(self.weights, self.params, "Anchors weights")

    def record(self) -> dict[str, Any]:
        """The anchors as plain JSON values (stream state and lineage); ``Anchors(**record)`` rebuilds them."""
        params = self.params
        if isinstance(params, Mapping):
            params = {str(k): v for k, v in params.items()}
        elif params is not None:
            params = list(params)
        return {"predicate": self.predicate, "offset": self.offset, "params": params, "weights": self.weights}


def anchors_of(anchors: Any) -> Anchors | None:
    """``anchors`` as given: None or an :class:`Anchors`; anything else is an ArgumentError."""
    if anchors is not None and not isinstance(anchors, Anchors):
        raise ArgumentError(f"anchors must be None or el.Anchors(predicate, offset, params, weights), got {anchors!r}")
    return anchors


Strategy = Uniform | Sequential | Weighted | Prioritized

# what each kind of sampler= value is called in messages
KINDS = {
    "uniform": "el.Uniform()",
    "passes": "el.Uniform(replacement=False)",
    "sequential": "el.Sequential()",
    "weighted": "el.Weighted(weights)",
    "prioritized": "el.Prioritized(priority, alpha, beta)",
    "sampler": "a Sampler (an object with sample(index, batch_size))",
}


def window_of(window: Any) -> Window:
    """``window`` as a :class:`Window`: a Window as is, a positive int ``L`` as ``Window(L)``."""
    if isinstance(window, Window):
        return window
    if isinstance(window, bool) or not isinstance(window, int | np.integer):
        raise ArgumentError(f"window must be a positive int or an el.Window, got {window!r}")
    return Window(int(window))


def shard_of(shard: Any) -> Shard | None:
    """``shard`` as a :class:`Shard`: None as None, ``(rank, world)`` as ``Shard(rank, world)``."""
    if shard is None or isinstance(shard, Shard):
        return shard
    if isinstance(shard, str) or not isinstance(shard, Sequence) or len(shard) != 2:
        raise ArgumentError(f"shard must be (rank, world) or an el.Shard, got {shard!r}")
    return Shard(shard[0], shard[1])


def kind_of(sampler: Strategy | Sampler) -> str:
    """The :data:`KINDS` key of a value :func:`sampler_of` returned."""
    if isinstance(sampler, Uniform):
        return "uniform" if sampler.replacement else "passes"
    if isinstance(sampler, Sequential):
        return "sequential"
    if isinstance(sampler, Weighted):
        return "weighted"
    if isinstance(sampler, Prioritized):
        return "prioritized"
    return "sampler"


def sampler_of(
    sampler: Any, method: str, allowed: Sequence[str], default: Strategy | None = None
) -> Strategy | Sampler:
    """What ``method``'s ``sampler=`` argument chose (None: ``default``, else ``Uniform()``).

    ``allowed`` lists the :data:`KINDS` ``method`` takes; any other is an
    ArgumentError naming the method and what it takes.
    """
    if sampler is None:
        sampler = Uniform() if default is None else default
    elif not isinstance(sampler, Strategy) and not callable(getattr(sampler, "sample", None)):
        raise ArgumentError(
            "sampler must be el.Uniform, el.Sequential, el.Weighted, el.Prioritized or an object with "
            f"sample(index, batch_size), got {sampler!r}"
        )
    kind = kind_of(sampler)
    if kind not in allowed:
        takes = ", ".join(KINDS[k] for k in allowed)
        raise ArgumentError(f"{method}: sampler={sampler!r} does not apply; it takes {takes}")
    return sampler
