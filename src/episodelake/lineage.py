"""Stream lineage: a saved stream state rebuilds the identical stream on any node, and prints readably.

A :meth:`SegmentStream.state_dict` holds ``"lineage"`` (dataset URL without
credentials, table version, selection steps, every stream argument, seed and
shard) next to the position. :func:`stream_from_state` opens the dataset at
that version, repeats the selection, builds the stream with those arguments
and loads the position; the stream's own check (episode fingerprint, segment
count, seed, ...) refuses a state that does not fit, so a rebuilt stream is
either identical or an :class:`ArgumentError`.

States hold NumPy arrays (a prioritized stream's priorities, a custom
sampler's state): :func:`save_state` writes them into JSON losslessly
(dtype, shape, base64 bytes) and :func:`load_state` reads them back.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .core.errors import ArgumentError
from .core.transforms import FrameTransform
from .dataset import Dataset, DatasetView
from .sampling.options import Anchors, Prioritized, Sequential, Shard, Strategy, Uniform, Weighted, Window
from .sampling.stream import SegmentStream

ARRAY_TAG = "__ndarray__"
# recorded segment_stream arguments passed on as they are (window, sampler and shard are rebuilt as objects)
PASSED = ("batch_size", "seed", "where", "filter", "prefetch", "drop_last", "follow", "transform")


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        data = base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii")
        return {ARRAY_TAG: {"dtype": value.dtype.str, "shape": list(value.shape), "data": data}}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {ARRAY_TAG}:
            spec = value[ARRAY_TAG]
            raw = base64.b64decode(spec["data"])
            return np.frombuffer(raw, dtype=np.dtype(spec["dtype"])).reshape(spec["shape"]).copy()
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def dumps_state(state: Mapping[str, Any]) -> str:
    """``state`` as JSON text; NumPy arrays kept exactly (dtype, shape, bytes)."""
    return json.dumps(_encode(state), indent=1)


def loads_state(text: str) -> dict[str, Any]:
    """The state :func:`dumps_state` wrote (arrays restored)."""
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArgumentError(f"state: not JSON ({exc})") from None
    if not isinstance(state, dict):
        raise ArgumentError(f"state: expected a JSON object, got {type(state).__name__}")
    return _decode(state)


def save_state(state: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``state`` (a ``stream.state_dict()``) to ``path`` as JSON, atomically (old or new, never half)."""
    if not isinstance(state, Mapping):
        raise ArgumentError(f"save_state: state must be a dict (stream.state_dict()), got {type(state).__name__}")
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(dumps_state(state))
    os.replace(tmp, target)


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state :func:`save_state` wrote to ``path``."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ArgumentError(f"state: {os.fspath(path)!r} is not a JSON text file") from None
    return loads_state(text)


def lineage_of(state: Any) -> dict[str, Any]:
    """The ``"lineage"`` of a stream state (ArgumentError naming what is missing)."""
    if not isinstance(state, Mapping):
        raise ArgumentError(f"state: expected a dict, got {type(state).__name__}")
    lineage = state.get("lineage")
    if not isinstance(lineage, Mapping) or not isinstance(lineage.get("stream"), Mapping):
        raise ArgumentError("state: no 'lineage' (saved by an older episodelake): rebuild the stream by hand")
    return dict(lineage)


def stream_from_state(
    state: Mapping[str, Any] | str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    collection: Dataset | DatasetView | None = None,
    filter: Callable[[Any], bool] | None = None,
    sampler: Any = None,
    transform: Mapping[str, Any] | None = None,
    prefetch: int | None = None,
) -> SegmentStream:
    """The stream a ``state_dict()`` was taken from, continuing right after it (a state dict or a state file).

    Opens the recorded dataset URL at the recorded version (read-only, with
    ``storage_options``: credentials are never in a state), repeats the
    recorded ``where``/``select_episodes`` steps, builds the stream with the
    recorded window, sampler, shard, seed and other arguments and loads the
    position. ``collection`` replaces the opened dataset (a stream over
    ``el.concat`` or a view chosen by other means); ``filter``/``sampler``/
    ``transform`` supply what the state could only name, and must be given
    exactly when the state names one: a callable filter, a custom Sampler
    object, an ``el.Weighted``/``el.Prioritized`` whose weights or priorities
    were an array, a callable transform (FrameTransform objects travel in the
    state); ``prefetch`` overrides the recorded depth (it never changes
    batches). States saved by 0.3 rebuild the same way. A follow stream is
    rebuilt at the recorded version, which it does not leave. ArgumentError
    when anything does not fit.
    """
    if isinstance(state, str | os.PathLike):
        state = load_state(state)
    lineage = lineage_of(state)
    arguments = dict(lineage["stream"])
    frames = arguments.get("transform")
    if isinstance(frames, Mapping) and "frames" in frames:
        arguments["transform"] = {key: _frame_transform(spec) for key, spec in frames["frames"].items()}
    named = {name: _named(arguments.get(name)) for name in ("filter", "weights", "sampler", "priority", "transform")}
    for name, given in (("filter", filter), ("transform", transform)):
        _check_given(name, name, arguments.get(name), named[name], given)
        if named[name]:
            arguments[name] = given
    need = next((name for name in ("sampler", "weights", "priority") if named[name]), "sampler")
    _check_given(need, "sampler", arguments.get(need), named[need], sampler)
    if prefetch is not None:
        arguments["prefetch"] = prefetch
    if collection is None:
        collection = _open(lineage, storage_options)
    try:
        window, options = _call(arguments, sampler)
        stream = collection.segment_stream(window, **options)
    except (TypeError, KeyError) as exc:
        raise ArgumentError(f"stream_from_state: the state's stream arguments do not fit: {exc}") from None
    stream.load_state_dict(dict(state))
    return stream


def _named(recorded: Any) -> bool:
    """Whether a recorded argument only names its value (``{"given": kind}``): the caller passes it again."""
    return isinstance(recorded, Mapping) and "given" in recorded


def _check_given(name: str, parameter: str, recorded: Any, needed: bool, given: Any) -> None:
    """ArgumentError unless ``given`` (the caller's ``parameter=``) is there exactly when the record only names it."""
    if needed and given is None:
        raise ArgumentError(f"stream_from_state: the stream had {name}={recorded['given']}; pass {parameter}= again")
    if not needed and given is not None:
        raise ArgumentError(f"stream_from_state: the stream had no {parameter} to replace (recorded {recorded!r})")


def _call(arguments: Mapping[str, Any], sampler: Any) -> tuple[Window, dict[str, Any]]:
    """The ``segment_stream`` call a lineage record describes (0.3's record: one keyword per option).

    ``sampler`` is the caller's replacement for a strategy the record only names.
    """
    window = Window(
        arguments.get("sequence_length"),
        arguments.get("context_length"),
        arguments.get("target_length"),
        arguments.get("pad", "suffix"),
        arguments.get("stride", 1),
    )
    if sampler is None:
        sampler = _strategy(arguments)
    rank, world = arguments.get("shard") or (0, 1)
    options = {key: arguments[key] for key in PASSED if key in arguments}
    options.update(sampler=sampler, shard=Shard(rank, world, arguments.get("shard_policy", "wrap")))
    if arguments.get("anchors") is not None:  # recorded by Anchors.record()
        options["anchors"] = Anchors(**arguments["anchors"])
    return window, options


def _strategy(arguments: Mapping[str, Any]) -> Strategy | None:
    """The sampling strategy a record describes (values it only names are passed by the caller)."""
    if arguments.get("priority") is not None:
        alpha, beta = arguments.get("alpha"), arguments.get("beta")
        defaults = Prioritized()
        return Prioritized(
            arguments["priority"],
            defaults.alpha if alpha is None else alpha,
            defaults.beta if beta is None else beta,
        )
    if arguments.get("weights") is not None:
        return Weighted(arguments["weights"])
    if arguments.get("shuffle") is False:
        return Sequential()
    if arguments.get("replacement") is False:
        return Uniform(replacement=False)
    return None


def _frame_transform(spec: Mapping[str, Any]) -> FrameTransform:
    """The FrameTransform whose fields ``spec`` holds (JSON turned its tuples into lists)."""
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()}
    return FrameTransform(**fields)


def _open(lineage: Mapping[str, Any], storage_options: Mapping[str, Any] | None) -> Dataset | DatasetView:
    url, version, selection = lineage.get("url"), lineage.get("version"), lineage.get("selection")
    if not isinstance(url, str):
        raise ArgumentError("stream_from_state: the state names no dataset URL; pass collection=")
    if url.startswith("memory://"):
        raise ArgumentError(f"stream_from_state: {url} was an in-memory dataset of another process; pass collection=")
    if selection is None:
        raise ArgumentError("stream_from_state: the stream read a view chosen by unrecorded means; pass collection=")
    collection: Dataset | DatasetView = Dataset.open(url, version, storage_options=storage_options, read_only=True)
    for step in selection:
        if "where" in step:
            collection = collection.where(step["where"], step.get("params"))
        else:
            collection = collection.select_episodes(step["select_episodes"], step.get("params"))
    return collection


def describe(state: Mapping[str, Any]) -> str:
    """A human-readable account of a stream state: where the data came from, how it is sampled, where it is."""
    lineage = lineage_of(state)
    args = lineage["stream"]
    params = state.get("params") or {}
    lines = [
        f"dataset    {lineage.get('url')}",
        f"version    {lineage.get('version')}",
    ]
    selection = lineage.get("selection")
    if selection is None:
        lines.append("selection  (a view chosen by unrecorded means)")
    for step in selection or []:
        kind = "where" if "where" in step else "select_episodes"
        extra = "" if step.get("params") is None else f"  params={step['params']!r}"
        lines.append(f"selection  {kind}: {step[kind]}{extra}")
    if args.get("context_length") is not None:
        length = f"context {args['context_length']} + target {args['target_length']}"
    else:
        length = f"{args.get('sequence_length')}"
    lines += [
        f"episodes   fingerprint {params.get('episodes')}, {params.get('segments')} segments",
        f"segments   length {length}, pad={args.get('pad')!r}, stride={args.get('stride')}",
        f"sampling   {_mode(state.get('mode'))}, batch_size={args.get('batch_size')}, seed={args.get('seed')}",
    ]
    for name in ("where", "weights", "priority", "alpha", "beta", "filter", "sampler", "transform"):
        value = args.get(name)
        if value is not None:
            shown = f"(given: {value['given']})" if isinstance(value, Mapping) and "given" in value else repr(value)
            lines.append(f"  {name:<9}{shown}")
    rank, world = args.get("shard") or (0, 1)
    lines.append(
        f"shard      rank {rank} of {world}, policy {args.get('shard_policy')!r}, drop_last={args.get('drop_last')}"
    )
    if state.get("mode") in ("ordered", "permutation"):
        finished = " (pass finished)" if state.get("finished") else ""
        lines.append(f"position   epoch {state.get('epoch')}, {state.get('consumed')} positions consumed{finished}")
    else:
        lines.append("position   the sampler's generator state (with replacement: no passes)")
    if args.get("follow"):
        lines.append("follow     yes (takes in new commits; rebuilt streams stay at the recorded version)")
    return "\n".join(lines)


def _mode(mode: Any) -> str:
    return {
        "random": "uniform/weighted with replacement",
        "permutation": "shuffled passes without replacement",
        "ordered": "ordered passes",
        "prioritized": "prioritized replay",
        "sampler": "custom sampler",
    }.get(str(mode), str(mode))
