"""episodata's sampling keywords, translated once into the option objects (:mod:`.options`).

episodata 0.2 spelled a segment's shape and order as keywords:
``sequence_length=N``, ``context_length=C, target_length=T``, ``pad=``,
``shuffle=``, ``fields=``, ``read_chunk_size=``. ``segments``,
``segment_stream`` and ``sample_transitions`` of a Dataset, a DatasetView and
an ``el.concat`` view take them as extra keywords and hand them to
:func:`spelled`, the one translation: it returns the :class:`Window` and the
``sampler=`` the same call written with option objects passes, so both
spellings build the same stream (same batches for the same seed, same
``state_dict()``). A keyword that cannot mean here what it meant there is an
:class:`~episodelake.errors.ArgumentError` saying what to write instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.errors import ArgumentError
from .options import Sequential, Window

LENGTHS = ("sequence_length", "context_length", "target_length")
# the episodata keywords each method takes, beyond the ones episodelake spells the same
TAKEN = {
    "segments": (*LENGTHS, "pad", "fields"),
    "segment_stream": (*LENGTHS, "pad", "fields", "shuffle", "read_chunk_size"),
    "sample_transitions": ("fields",),
}


def spelled(method: str, window: Any, sampler: Any, spellings: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(window, sampler)`` for ``method`` called with ``window``, ``sampler`` and episodata's ``spellings``.

    Without spellings both come back unchanged. ``sequence_length=N``:
    ``el.Window(N, pad=pad)``; ``context_length=C, target_length=T``:
    ``el.Window(context=C, target=T, pad=pad)``; no length at all (and no
    ``window``): episodata's one-transition segments, ``el.Window(1)``;
    ``shuffle=False``: ``sampler=el.Sequential()`` (True: the default
    sampler); ``fields=None`` and ``read_chunk_size=`` change nothing
    (batches hold every field; reads are planned per batch). Refused, with
    what to write instead: a keyword ``method`` does not take, a window
    given twice, ``target_length`` alone, ``fields=`` naming fields,
    ``shuffle=False`` with a ``sampler``.
    """
    taken = TAKEN[method]
    unknown = sorted(set(spellings) - set(taken))
    if unknown:
        raise ArgumentError(
            f"{method}() got unexpected keyword(s) {unknown}; of episodata's keywords it takes {list(taken)}"
        )
    if spellings.get("fields") is not None:
        raise ArgumentError(
            f"{method}: fields={spellings['fields']!r} is not taken: batches hold every field of the schema; "
            "drop fields= and read the ones you need (batch.obs['camera'], batch['observation/camera'])"
        )
    chunk = spellings.get("read_chunk_size")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ArgumentError(f"read_chunk_size must be a positive int or None, got {chunk!r}")
    if "shuffle" in spellings:
        shuffle = spellings["shuffle"]
        if not isinstance(shuffle, bool):
            raise ArgumentError(f"shuffle must be a bool, got {shuffle!r}")
        if not shuffle:
            if sampler is not None:
                raise ArgumentError(
                    f"{method}: shuffle=False and sampler={sampler!r} both choose the order; give one: "
                    "sampler=el.Sequential() is shuffle=False"
                )
            sampler = Sequential()
    shaped = [k for k in (*LENGTHS, "pad") if k in spellings]
    if not shaped:
        return (Window(1) if window is None and method != "sample_transitions" else window), sampler
    if window is not None:
        raise ArgumentError(
            f"{method}: the window is given twice, as {window!r} and as {shaped}; give one "
            "(sequence_length=N is el.Window(N), context_length=C, target_length=T is el.Window(context=C, target=T))"
        )
    length, context, target = (spellings.get(k) for k in LENGTHS)
    pad = spellings.get("pad", "suffix")
    if target is None:
        if context is not None:
            raise ArgumentError(
                f"{method}: context_length={context!r} needs target_length= (el.Window(context=C, target=T))"
            )
        return Window(1 if length is None else length, pad=pad), sampler
    if length is not None:
        raise ArgumentError(
            f"{method}: sequence_length={length!r} and target_length={target!r} both set the length; "
            "give sequence_length=N, or context_length=C and target_length=T"
        )
    if not context:
        raise ArgumentError(
            f"{method}: target_length={target!r} without a context is not taken (episodata's empty context); "
            f"write sequence_length={target!r} (el.Window({target!r})), or give context_length= too"
        )
    return Window(context=context, target=target, pad=pad), sampler
