"""Record Gymnasium environments into an episodelake dataset as they run.

* :class:`RecordEpisodes` wraps one ``gymnasium.Env``: every episode from
  ``reset()`` (whose observation is the episode's first row) to
  ``terminated``/``truncated`` becomes one dataset episode.
* :class:`RecordVectorEpisodes` wraps a ``gymnasium.vector.VectorEnv`` in
  ``NextStep`` or ``SameStep`` autoreset mode; each sub-env's episodes are
  stored exactly as a sequential run of that env would store them.

Per-episode meta: ``seed`` (the seed passed to ``reset``, None for unseeded
and auto resets), ``env_id``, ``env_index`` (vector envs), plus a static
mapping or a callable ``meta(context) -> mapping``. :func:`dataset_for_env`
creates a dataset whose descriptor ``info`` records the env spec, both spaces
(JSON, see :func:`space_to_json`) and the versions of the packages providing
the env, for reproducibility.

Both recorders take ``info_keys`` (info entries recorded as per-step fields
``extra/<key>``), ``outcome`` (meta fields read from the info of an episode's
last step, e.g. ``{"success": "is_success"}``), and, when they create the
dataset, ``schema``/``meta_fields``/``compression``/``field_options`` (see
:func:`schema_for_env`). A dataset the recorder creates always has the
``seed``/``env_id`` (``env_index``) meta fields, whatever schema is passed; a
:class:`Dataset` passed in is recorded into as it is: the recorder fills in
those of them it declares and leaves out the others.

An episode still running when the recorder is reset or closed was cut short:
it is dropped unless ``keep_partial=True`` (then it is stored with neither
flag set).

An episode the dataset's quality gate rejects (a ``FieldSpec`` constraint
or an ``el.Check`` with ``on_fail="reject"``, judged on its last step) is
handled by ``on_reject``: ``"raise"`` (default) raises the
:class:`QualityError` out of the ``step()`` that ended it (the recorder
stays usable: ``reset()`` starts the next episode); ``"skip"`` drops it and
goes on: the step returns as usual, ``recorder.rejected`` collects the
errors (its length is the count), and ``close()`` warns once with the count
per constraint or check. Quarantined and warned episodes are stored either
way (``on_fail="quarantine"``/``"warn"``).

Every argument is judged when the recorder is built, also when the dataset
waits for the first step (undeclared ``info_keys``/``outcome`` fields): the
create options are tried on an in-memory twin with stand-in fields, so a bad
check, capacity or option name fails at construction, not at the first
``step()`` (a check naming a not-yet-typed field binds at creation).
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata as md
import inspect
import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

from ..core.errors import ArgumentError, EpisodeStateError, QualityError, SchemaError, ValidationError
from ..core.quality import check_list
from ..core.schema import DatasetSchema, FieldSpec, schema_from_gym_spaces
from ..dataset import Dataset
from ..storage.location import resolve
from ..storage.store import check_target
from ..write.writer import EpisodeWriter, VectorEpisodeWriter

Meta = Mapping[str, Any] | Callable[[dict[str, Any]], Mapping[str, Any]] | None

_AUTORESET = {AutoresetMode.NEXT_STEP: "next_step", AutoresetMode.SAME_STEP: "same_step"}


# ---------------------------------------------------------------- spaces as JSON


def _bound(values: np.ndarray) -> Any:
    """Box bounds as JSON: one scalar when uniform, non-finite values as strings."""

    def enc(x: Any) -> Any:
        if isinstance(x, list):
            return [enc(v) for v in x]
        return x if isinstance(x, int | bool) or math.isfinite(x) else str(x)

    flat = values.reshape(-1)
    if flat.size and (flat == flat[0]).all():
        return enc(flat[0].item())
    return enc(values.tolist())


def space_to_json(space: gym.Space) -> dict[str, Any]:
    """A JSON-safe description of a Box, Discrete, MultiDiscrete, MultiBinary or Dict space."""
    kind = type(space).__name__
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_json(s) for k, s in space.spaces.items()}}
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": np.dtype(space.dtype).name,
            "low": _bound(space.low),
            "high": _bound(space.high),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": list(np.atleast_1d(space.n).tolist())}
    raise SchemaError(f"unsupported gym space {kind}")


def space_from_json(obj: Mapping[str, Any]) -> gym.Space:
    """Inverse of :func:`space_to_json`."""
    kind = obj["type"]
    if kind == "Dict":
        return gym.spaces.Dict({k: space_from_json(v) for k, v in obj["spaces"].items()})
    if kind == "Box":
        dtype = np.dtype(obj["dtype"])
        shape = tuple(obj["shape"])

        def dec(b: Any) -> np.ndarray:
            values = np.vectorize(lambda x: float(x) if isinstance(x, str) else x, otypes=[object])(np.array(b, object))
            return np.broadcast_to(values.astype(dtype), shape)

        return gym.spaces.Box(dec(obj["low"]), dec(obj["high"]), shape, dtype)
    if kind == "Discrete":
        return gym.spaces.Discrete(obj["n"], start=obj.get("start", 0))
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(obj["nvec"], dtype=obj["dtype"], start=obj.get("start"))
    if kind == "MultiBinary":
        n = obj["n"]
        return gym.spaces.MultiBinary(n[0] if len(n) == 1 else n)
    raise SchemaError(f"unknown space type {kind!r}")


# ---------------------------------------------------------------- env description


def _packages(entry_point: Any) -> dict[str, str]:
    """Versions of the installed distributions that provide an env's entry point."""
    module = entry_point.split(":")[0] if isinstance(entry_point, str) else getattr(entry_point, "__module__", "")
    top = (module or "").split(".")[0]
    out = {}
    for dist in md.packages_distributions().get(top, []):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    return out


def _spec(env: gym.Env | VectorEnv) -> Any:
    """The env's spec; a vector env without one: its first sub-env's, where the base env has ``get_attr``."""
    spec = getattr(env, "spec", None)
    if spec is None and isinstance(env, VectorEnv):
        get_attr = getattr(env.unwrapped, "get_attr", None)  # SyncVectorEnv/AsyncVectorEnv, not VectorEnv
        if get_attr is not None:
            spec = get_attr("spec")[0]
    return spec


def _spaces(env: gym.Env | VectorEnv) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of one env (a vector env's sub-env)."""
    if isinstance(env, VectorEnv):
        return env.single_observation_space, env.single_action_space
    return env.observation_space, env.action_space


def env_info(env: gym.Env | VectorEnv) -> dict[str, Any]:
    """What the descriptor records about ``env``: id, spec, spaces, providing packages."""
    obs_space, act_space = _spaces(env)
    spec = _spec(env)
    out: dict[str, Any] = {
        "env_id": spec.id if spec is not None else None,
        "observation_space": space_to_json(obs_space),
        "action_space": space_to_json(act_space),
    }
    if spec is not None:
        try:
            out["env_spec"] = json.loads(spec.to_json())
        except (ValueError, TypeError):  # kwargs that are not JSON (callables, objects)
            out["env_spec"] = {"id": spec.id, "entry_point": str(spec.entry_point)}
        out["packages"] = _packages(spec.entry_point)
    if isinstance(env, VectorEnv):
        out["num_envs"] = env.num_envs
        mode = env.metadata.get("autoreset_mode")
        out["autoreset_mode"] = getattr(mode, "value", mode)
    return out


# Meta the recorders fill in themselves, with the dtype they create it with.
_AUTO_META = {"seed": "uint64", "env_id": "str", "env_index": "int64"}
# create_options that shape the schema rather than being passed on to Dataset.create.
_SCHEMA_OPTIONS = ("schema", "meta_fields", "reward_dtype", "compression", "field_options")
# create_options passed on to Dataset.create (everything but the schema and the path).
_CREATE_OPTIONS = tuple(p for p in inspect.signature(Dataset.create).parameters if p not in ("cls", "schema", "path"))
ON_REJECT = ("raise", "skip")  # what a recorder does with an episode the quality gate rejects


def _auto_names(env: gym.Env | VectorEnv) -> tuple[str, ...]:
    """The meta fields a recorder of ``env`` fills in itself."""
    return ("seed", "env_id", "env_index") if isinstance(env, VectorEnv) else ("seed", "env_id")


def _check_auto_meta(f: FieldSpec) -> None:
    """A declared ``seed``/``env_id``/``env_index`` field must hold what the recorder stores there."""
    want = _AUTO_META[f.name]
    kind = f.np_dtype.kind
    if f.shape != () or (kind != "U" if want == "str" else kind not in "iu"):
        expected = "a scalar str" if want == "str" else f"a scalar integer (the recorder creates {want})"
        raise SchemaError(f"meta field {f.name!r} is {f.dtype}{list(f.shape)}; the recorder stores {expected} there")


def schema_for_env(
    env: gym.Env | VectorEnv,
    *,
    schema: DatasetSchema | None = None,
    meta_fields: Sequence[FieldSpec] = (),
    reward_dtype: Any = "float64",
    extra_fields: Sequence[FieldSpec] = (),
    compression: str | None = None,
    field_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> DatasetSchema:
    """The schema a recorder of ``env`` writes (single-env spaces for a vector env).

    * Starts from ``schema`` when given (its observation and action fields must
      match the spaces; ``reward_dtype`` is then ignored), else from the spaces
      with ``reward_dtype`` rewards (float64 by default: Gymnasium returns
      Python floats, nothing is rounded).
    * Adds ``meta_fields`` and ``extra_fields`` (per-step, ``role="extra"``).
    * Always has the meta fields ``seed`` (uint64: Gymnasium seeds are
      non-negative), ``env_id`` (str) and, for vector envs, ``env_index``
      (int64): added when absent; a declared field of that name must be a
      scalar integer (str for ``env_id``), else :class:`SchemaError`.
    * ``field_options`` maps field keys to :class:`FieldSpec` attribute
      overrides (``{"observation": {"chunk_rows": 32}}``); ``compression``
      (``"zstd"``) applies to every tensor field whose options set none.
    """
    if compression not in (None, "zstd"):
        raise SchemaError(f"compression must be None or 'zstd', got {compression!r}")
    obs_space, act_space = _spaces(env)
    if schema is None:
        base = list(schema_from_gym_spaces(obs_space, act_space, reward_dtype))
    elif isinstance(schema, DatasetSchema):
        check_spaces(schema, obs_space, act_space)
        base = list(schema)
    else:
        raise SchemaError(f"schema must be a DatasetSchema, got {type(schema).__name__}")
    have = {f.key for f in base}
    fields = base + list(meta_fields) + [f for f in extra_fields if f.key not in have]
    meta = {f.name: f for f in fields if f.role == "meta"}
    for name in _auto_names(env):
        if name in meta:
            _check_auto_meta(meta[name])
        else:
            fields.append(FieldSpec(name, (), _AUTO_META[name], role="meta"))
    options = dict(field_options or {})
    unknown = sorted(set(options) - {f.key for f in fields})
    if unknown:
        raise SchemaError(f"field_options names unknown field(s) {unknown}; fields are {[f.key for f in fields]}")
    out = []
    for f in fields:
        opts = dict(options.get(f.key, {}))
        if {"name", "role"} & set(opts):
            raise SchemaError(f"field_options[{f.key!r}] cannot change a field's name or role")
        try:
            f = dataclasses.replace(f, **opts)
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"field_options[{f.key!r}]: {exc}") from None
        if compression is not None and f.in_tensor and "compression" not in opts:
            f = dataclasses.replace(f, compression=compression)
        out.append(f)
    return DatasetSchema(out)


def dataset_for_env(
    env: gym.Env | VectorEnv,
    path: str | None = None,
    *,
    schema: DatasetSchema | None = None,
    meta_fields: Sequence[FieldSpec] = (),
    reward_dtype: Any = "float64",
    compression: str | None = None,
    field_options: Mapping[str, Mapping[str, Any]] | None = None,
    **create_options: Any,
) -> Dataset:
    """Create a dataset with the schema :func:`schema_for_env` gives for ``env``.

    The descriptor's ``info`` records :func:`env_info` (plus any ``info=``
    passed); the other ``create_options`` go to :meth:`Dataset.create`.
    """
    full = schema_for_env(
        env,
        schema=schema,
        meta_fields=meta_fields,
        reward_dtype=reward_dtype,
        compression=compression,
        field_options=field_options,
    )
    info = {**env_info(env), **dict(create_options.pop("info", None) or {})}
    return Dataset.create(full, path, info=info, **create_options)


def check_spaces(schema: DatasetSchema, observation_space: gym.Space, action_space: gym.Space) -> None:
    """Raise SchemaError unless ``schema``'s observation and action fields match the spaces."""
    expected = schema_from_gym_spaces(observation_space, action_space)
    for role in ("observation", "action"):
        want = {f.key: f for f in expected.role_fields(role)}
        have = {f.key: f for f in schema.role_fields(role)}
        if set(want) != set(have):
            raise SchemaError(f"{role} fields {sorted(have)} do not match the env's space {sorted(want)}")
        for key, f in want.items():
            if (have[key].shape, have[key].np_dtype) != (f.shape, f.np_dtype):
                raise SchemaError(
                    f"field {key!r} is {have[key].dtype}{list(have[key].shape)}, the env gives {f.dtype}{list(f.shape)}"
                )


def _infer_field(name: str, value: Any, role: str, what: str) -> FieldSpec:
    """A field holding ``value`` (its dtype and shape), named for the error if it cannot be one."""
    arr = np.asarray(value)
    try:
        return FieldSpec(name, arr.shape, "str" if arr.dtype.kind == "U" else arr.dtype, role=role)
    except SchemaError as exc:
        raise SchemaError(f"{what}: cannot record {type(value).__name__} values ({exc}); declare the field") from None


class _Recording:
    """The dataset a recorder writes and what it takes from ``info`` (shared by both recorders).

    ``info_keys`` become per-step fields ``extra/<key>``; ``outcome`` maps meta
    fields to the info key read at an episode's last step. Fields the schema
    does not declare are inferred from the first step's info, so the dataset
    is then created at the first step.
    """

    def __init__(
        self,
        env: gym.Env | VectorEnv,
        dataset: Dataset | str | None,
        info_keys: Sequence[str],
        outcome: Mapping[str, str] | None,
        create_options: dict[str, Any],
    ) -> None:
        if isinstance(info_keys, str):
            raise TypeError("info_keys must be a sequence of info key names, not one string")
        self.info_keys = tuple(info_keys)
        self.outcome = dict(outcome or {})
        self.env = env
        self.dataset: Dataset | None = None
        if isinstance(dataset, Dataset):
            if create_options:
                raise TypeError(
                    f"create options {sorted(create_options)} only apply when the recorder creates the dataset"
                )
            check_spaces(dataset.schema, *_spaces(env))
            # The user's own schema (el.schema_from_gym_spaces) may leave seed/env_id out: record only those declared.
            declared = {f.name: f for f in dataset.schema.meta_fields if f.name in _auto_names(env)}
            for f in declared.values():
                _check_auto_meta(f)
            self.auto_names: frozenset[str] = frozenset(declared)
            self._undeclared(dataset.schema, fail=True)
            self.dataset = dataset
            return
        self.auto_names = frozenset(_auto_names(env))
        self.path = dataset
        self.schema_options = {k: create_options.pop(k) for k in _SCHEMA_OPTIONS if k in create_options}
        unknown = sorted(set(create_options) - set(_CREATE_OPTIONS))
        if unknown:
            raise ArgumentError(
                f"unknown recorder option(s) {unknown}; the dataset's options are "
                f"{sorted([*_SCHEMA_OPTIONS, *_CREATE_OPTIONS])}"
            )
        self.create_options = create_options
        # Build the schema now with stand-ins for undeclared fields, so bad options fail here, not mid-run.
        extra, meta = self._undeclared(self._schema())
        full = self._schema(
            [FieldSpec(k, (), "float64", role="extra") for k in extra],
            [FieldSpec(m, (), "bool", role="meta") for m in meta],
        )
        if not extra and not meta:
            self.dataset = dataset_for_env(env, self.path, schema=full, **self.create_options)
            return
        # fail now rather than at the first step: the target, then every option on an in-memory twin
        check_target(
            resolve(dataset, dict(create_options.get("storage_options") or {})), bool(create_options.get("overwrite"))
        )
        self._rehearse(full, {*extra, *(f"extra/{k}" for k in extra), *meta, *(self.outcome[m] for m in meta)})

    def _rehearse(self, schema: DatasetSchema, standins: set[str]) -> None:
        """Create an in-memory dataset with ``schema`` (stand-in fields for the undeclared ones) and the create
        options, so that what :meth:`ensure` will create at the first step fails here if it can fail.

        Checks are judged as objects (:func:`check_list`); those whose
        predicate names none of ``standins`` are bound over the twin's views
        too (the others bind at creation, once their fields' types are known).
        """
        opts = {k: v for k, v in self.create_options.items() if k not in ("overwrite", "storage_options", "durable")}
        checks = opts.pop("checks", ())
        chosen = check_list(checks) if checks else ()
        bindable = [c for c in chosen if not any(n.lower() in c.predicate.lower() for n in standins)]
        dataset_for_env(self.env, None, schema=schema, checks=bindable, **opts).close()

    def _schema(self, extra: Sequence[FieldSpec] = (), meta: Sequence[FieldSpec] = ()) -> DatasetSchema:
        opts = dict(self.schema_options)
        meta_fields = [*opts.pop("meta_fields", ()), *meta]
        return schema_for_env(self.env, meta_fields=meta_fields, extra_fields=extra, **opts)

    def auto_meta(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The recorder's own meta (``seed``, ``env_id``, ``env_index``) that the dataset has fields for."""
        return {k: v for k, v in values.items() if k in self.auto_names}

    def _undeclared(self, schema: DatasetSchema, fail: bool = False) -> tuple[list[str], list[str]]:
        """(info keys, outcome meta names) that ``schema`` has no field for."""
        keys = {f.key for f in schema}
        extra = [k for k in self.info_keys if f"extra/{k}" not in keys]
        meta = [m for m in self.outcome if m not in {f.name for f in schema.meta_fields}]
        if fail and (extra or meta):
            raise SchemaError(
                f"the dataset has no field for info key(s) {extra} (extra/<key>) or outcome(s) {meta} (meta)"
            )
        extras = {f.name for f in schema.role_fields("extra")}
        if fail and extras - set(self.info_keys):
            raise SchemaError(f"extra field(s) {sorted(extras - set(self.info_keys))} are not in info_keys")
        return extra, meta

    def ensure(self, infos: Sequence[Mapping[str, Any]]) -> Dataset:
        """The dataset, created now (from these first-step infos) if it waited for them."""
        if self.dataset is not None:
            return self.dataset
        extra_keys, meta_names = self._undeclared(self._schema())
        found = {}
        for key in {*extra_keys, *(self.outcome[m] for m in meta_names)}:
            found[key] = next((info[key] for info in infos if key in info), _MISSING)
        missing = [k for k in extra_keys if found[k] is _MISSING]
        if missing:
            raise _missing_info("step 0", missing)
        extra = [_infer_field(k, found[k], "extra", f"info key {k!r}") for k in extra_keys]
        meta = []
        for m in meta_names:
            key = self.outcome[m]
            if found[key] is _MISSING:
                raise SchemaError(
                    f"outcome {m!r}: info key {key!r} is not in the first step's info, so its type is unknown; "
                    f"declare it, e.g. meta_fields=[FieldSpec({m!r}, (), 'bool', role='meta')]"
                )
            meta.append(_infer_field(m, found[key], "meta", f"outcome {m!r} (info key {key!r})"))
        self.dataset = dataset_for_env(self.env, self.path, schema=self._schema(extra, meta), **self.create_options)
        return self.dataset

    def extras(self, info: Mapping[str, Any], where: str) -> dict[str, Any] | None:
        """The step's ``info_keys`` values (None when there are none)."""
        if not self.info_keys:
            return None
        missing = [k for k in self.info_keys if k not in info]
        if missing:
            raise _missing_info(where, missing)
        return {k: info[k] for k in self.info_keys}

    def outcomes(self, info: Mapping[str, Any] | None) -> dict[str, Any]:
        """Outcome meta from an episode's last-step info; a key the info lacks gives None (null)."""
        info = info or {}
        return {m: info.get(key) for m, key in self.outcome.items()}


_MISSING = object()


def _missing_info(where: str, keys: list[str]) -> ValidationError:
    return ValidationError(f"{where}: info has no {keys} (info_keys are recorded at every step)")


def _episode_meta(auto: Mapping[str, Any], meta: Meta, context: dict[str, Any]) -> dict:
    """Auto meta, then the static mapping, then the callable's result."""
    extra = meta(context) if callable(meta) else meta
    return {**auto, **(extra or {})}


_NOT_CREATED = (
    "the dataset is created at the first step: undeclared info_keys/outcome fields take their types from it "
    "(declare them in schema= or meta_fields= to create it up front)"
)


# ---------------------------------------------------------------- single env


class RecordEpisodes(gym.Wrapper):
    """Record every episode of ``env`` into ``dataset`` (a Dataset, a path, or None for memory).

    With a path or None the dataset is created by :func:`dataset_for_env`
    (``create_options`` are passed on: ``schema``, ``meta_fields``,
    ``compression``, ``field_options``, ``reward_dtype``, and the options of
    :meth:`Dataset.create`). ``meta`` is a mapping of per-episode meta values
    or a callable receiving ``{"seed", "options", "info", "episode"}`` at each
    reset. ``info_keys`` are recorded at every step as fields ``extra/<key>``
    (a step whose info lacks one is a :class:`ValidationError`); ``outcome``
    maps meta fields to info keys read at the episode's last step
    (``{"success": "is_success"}``; a key that info lacks gives null). Episodes
    are committed in batches; ``close()`` (or ``dataset.flush()``) commits the
    rest. A passed Dataset (e.g. ``Dataset.create(schema_from_gym_spaces(...))``)
    must match the spaces; its episodes get ``seed``/``env_id`` meta only if
    it declares those fields (:func:`dataset_for_env` declares them).
    ``on_reject``: ``"raise"`` (default) or ``"skip"`` an episode the
    quality gate rejects (see the module docstring); ``rejected`` lists the
    skipped episodes' :class:`QualityError`.
    """

    def __init__(
        self,
        env: gym.Env,
        dataset: Dataset | str | None = None,
        meta: Meta = None,
        keep_partial: bool = False,
        info_keys: Sequence[str] = (),
        outcome: Mapping[str, str] | None = None,
        on_reject: str = "raise",
        **create_options: Any,
    ) -> None:
        super().__init__(env)
        self.on_reject = _on_reject(on_reject)
        self.rejected: list[QualityError] = []
        self._reported = 0
        self._rec = _Recording(env, dataset, info_keys, outcome, create_options)
        self.meta = meta
        self.keep_partial = keep_partial
        self.episodes_started = 0
        self._writer: EpisodeWriter | None = None
        self._start: tuple[Any, dict[str, Any]] | None = None  # reset waiting for the dataset
        self._last_info: Mapping[str, Any] | None = None
        spec = env.spec
        self._env_id = spec.id if spec is not None else None

    @property
    def dataset(self) -> Dataset:
        if self._rec.dataset is None:
            raise EpisodeStateError(_NOT_CREATED)
        return self._rec.dataset

    def _end_open(self) -> None:
        w = self._writer
        self._writer = None
        self._start = None
        if w is not None and not w.done:
            if self.keep_partial and w.length:
                try:
                    w.finish(**self._rec.outcomes(self._last_info))
                except QualityError as exc:
                    _rejected(self, exc)
            else:
                w.discard()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self._end_open()
        obs, info = self.env.reset(seed=seed, options=options)
        context = {"seed": seed, "options": options, "info": info, "episode": self.episodes_started}
        meta = _episode_meta(self._rec.auto_meta({"seed": seed, "env_id": self._env_id}), self.meta, context)
        if self._rec.dataset is None:
            self._start = (obs, meta)
        else:
            self._writer = self._rec.dataset.new_episode(obs, **meta)
        self.episodes_started += 1
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        if self._start is None and (self._writer is None or self._writer.done):
            raise EpisodeStateError("RecordEpisodes: call reset() before step() (the last episode ended)")
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._start is not None:
            first_obs, meta = self._start
            self._writer = self._rec.ensure([info]).new_episode(first_obs, **meta)
            self._start = None
        writer = self._writer
        assert writer is not None  # opened by reset() or just above (checked before stepping the env)
        # Gymnasium may set both (TimeLimit on a terminal step); the state is terminal, so terminated wins.
        step = {
            "observations": obs,
            "actions": action,
            "rewards": reward,
            "terminated": terminated,
            "truncated": bool(truncated) and not terminated,
        }
        extras = self._rec.extras(info, f"step {writer.length}")
        if extras is not None:
            step["extras"] = extras
        self._last_info = info
        try:
            if (terminated or truncated) and self._rec.outcome:
                writer.add_step(step, meta=self._rec.outcomes(info))
            else:
                writer.add_step(step)
        except QualityError as exc:  # the gate rejected the episode this step ended; the writer discarded it
            _rejected(self, exc)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        try:
            self._end_open()
            if self._rec.dataset is not None:
                self._rec.dataset.flush()
        finally:
            _report_rejected(self)
        super().close()


def _on_reject(value: Any) -> str:
    if not isinstance(value, str) or value not in ON_REJECT:
        raise ArgumentError(f"on_reject must be one of {ON_REJECT}, got {value!r}")
    return value


def _rejected(recorder: RecordEpisodes | RecordVectorEpisodes, exc: QualityError) -> None:
    """Raise ``exc`` (``on_reject="raise"``), or keep it in ``recorder.rejected`` (``"skip"``)."""
    if recorder.on_reject == "raise":
        raise exc
    recorder.rejected.append(exc)


def _report_rejected(recorder: RecordEpisodes | RecordVectorEpisodes) -> None:
    """Warn once about the episodes skipped since the last report: how many, per constraint or check."""
    new = recorder.rejected[recorder._reported :]
    recorder._reported = len(recorder.rejected)
    if not new:
        return
    counts = collections.Counter(exc.check for exc in new)
    per = ", ".join(f"{n} x {check!r}" for check, n in counts.most_common())
    warnings.warn(
        f"{type(recorder).__name__} skipped {len(new)} episode(s) the quality gate rejected ({per}); "
        "recorder.rejected holds the errors",
        stacklevel=3,
    )


# ---------------------------------------------------------------- vector env


def _env_info(infos: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s info from a vector env's batched infos (entries masked by ``_<key>``)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        out[key] = _env_info(value, i) if isinstance(value, Mapping) else value[i]
    return out


class RecordVectorEpisodes(VectorWrapper):
    """Record each sub-env of a ``gymnasium.vector.VectorEnv`` as its own sequence of episodes.

    Works in ``AutoresetMode.NEXT_STEP`` (the reset row after an episode ends
    records no transition) and ``SAME_STEP`` (the final observation comes from
    ``infos["final_obs"]``); see :class:`episodelake.writer.VectorEpisodeWriter`.
    ``meta`` is a mapping or a callable receiving ``{"env_index", "seed",
    "episode"}`` when each episode starts. ``seed`` meta: ``seed + i`` (or
    ``seed[i]``) for the episodes started by a seeded ``reset``, None after
    autoresets. ``info_keys``, ``outcome`` and ``create_options`` as for
    :class:`RecordEpisodes`; each env's info is read from the batched infos
    (its ``_<key>`` mask), and in ``SAME_STEP`` mode from
    ``infos["final_info"]`` on the step that ends its episode.
    ``on_reject`` and ``rejected`` as for :class:`RecordEpisodes`: with
    ``"raise"`` the error names the first rejected env (every env's step is
    recorded first), with ``"skip"`` each rejected episode's error, prefixed
    ``env <i>,``, joins ``rejected``.
    """

    def __init__(
        self,
        env: VectorEnv,
        dataset: Dataset | str | None = None,
        meta: Meta = None,
        keep_partial: bool = False,
        info_keys: Sequence[str] = (),
        outcome: Mapping[str, str] | None = None,
        on_reject: str = "raise",
        **create_options: Any,
    ) -> None:
        super().__init__(env)
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        mode = AutoresetMode(mode) if isinstance(mode, str) else mode
        if mode not in _AUTORESET:
            raise ArgumentError(f"RecordVectorEpisodes supports NEXT_STEP and SAME_STEP autoreset, not {mode}")
        self.on_reject = _on_reject(on_reject)
        self.rejected: list[QualityError] = []
        self._reported = 0
        self.autoreset_mode = _AUTORESET[mode]
        self._rec = _Recording(env, dataset, info_keys, outcome, create_options)
        self.meta = meta
        self.keep_partial = keep_partial
        self.episodes_started = 0
        self._writer: VectorEpisodeWriter | None = None
        self._reset_obs: Any = None  # reset waiting for the dataset
        n = env.num_envs
        self._seeds: list[int | None] = [None] * n
        self._ended = np.zeros(n, bool)
        self._last_info: list[Mapping[str, Any] | None] = [None] * n
        spec = _spec(env)
        self._env_id = spec.id if spec is not None else None

    @property
    def dataset(self) -> Dataset:
        if self._rec.dataset is None:
            raise EpisodeStateError(_NOT_CREATED)
        return self._rec.dataset

    def _episode_meta(self, i: int) -> dict[str, Any]:
        seed, self._seeds[i] = self._seeds[i], None  # only the first episode after reset() is seeded
        context = {"env_index": i, "seed": seed, "episode": self.episodes_started}
        self.episodes_started += 1
        auto = self._rec.auto_meta({"seed": seed, "env_id": self._env_id, "env_index": i})
        return _episode_meta(auto, self.meta, context)

    def _close_writer(self) -> None:
        w = self._writer
        if w is not None and self.keep_partial and self._rec.outcome:
            for i, ew in enumerate(w.writers):
                if ew is not None and not ew.done and ew.length:
                    w.set_meta(i, **self._rec.outcomes(self._last_info[i]))
        self._writer = None
        self._reset_obs = None
        if w is not None:
            try:
                w.close(finish_open=self.keep_partial)
            except QualityError as exc:
                _rejected(self, exc)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if options and "reset_mask" in options:
            raise ArgumentError("RecordVectorEpisodes does not support partial resets (options['reset_mask'])")
        self._close_writer()
        # gymnasium annotates VectorEnv.reset's seed as int | None; its vector envs also take one per env
        obs, infos = self.env.reset(seed=seed, options=options)  # type: ignore[arg-type]
        n = self.num_envs
        if seed is None:
            self._seeds = [None] * n
        elif isinstance(seed, int):
            self._seeds = [seed + i for i in range(n)]
        else:
            self._seeds = list(seed)
        self._ended[:] = False
        if self._rec.dataset is None:
            self._reset_obs = obs
        else:
            self._writer = self._rec.dataset.vector_writer(obs, n, self.autoreset_mode, meta=self._episode_meta)
        return obs, infos

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self._writer is None and self._reset_obs is None:
            raise EpisodeStateError("RecordVectorEpisodes: call reset() before step()")
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        term = np.asarray(terminated, dtype=bool)
        trunc = np.asarray(truncated, dtype=bool) & ~term
        ended = term | trunc
        # Env i's step info (None for a next_step reset row, which records no transition).
        step_infos: list[dict[str, Any] | None] = []
        for i in range(self.num_envs):
            if self._ended[i] and self.autoreset_mode == "next_step":
                step_infos.append(None)
            elif ended[i] and self.autoreset_mode == "same_step":
                step_infos.append(_env_info(infos.get("final_info", {}), i))
            else:
                step_infos.append(_env_info(infos, i))
        if self._writer is None:
            ds = self._rec.ensure([s for s in step_infos if s is not None])
            mode = self.autoreset_mode
            self._writer = ds.vector_writer(self._reset_obs, self.num_envs, mode, meta=self._episode_meta)
            self._reset_obs = None
        extras = None
        if self._rec.info_keys:
            extras = [
                None if s is None else self._rec.extras(s, f"env {i}, step {self._writer.writers[i].length}")
                for i, s in enumerate(step_infos)
            ]
        args = (obs, actions, rewards, term, trunc, infos, extras)
        rejected: QualityError | None = None
        try:
            if self._rec.outcome:
                meta = [self._rec.outcomes(s) if s is not None and ended[i] else None for i, s in enumerate(step_infos)]
                self._writer.add_steps(*args, meta=meta)
            else:
                self._writer.add_steps(*args)
        except QualityError as exc:  # every env's step was recorded; the rejected episodes were discarded
            rejected = exc
        for i, s in enumerate(step_infos):
            if s is not None:
                self._last_info[i] = s
        self._ended = ended
        if rejected is not None:
            if self.on_reject == "raise":
                raise rejected
            for i, err in self._writer.rejections:
                self.rejected.append(QualityError(f"env {i}, {err}", err.check, err.episode, err.step))
        return obs, rewards, terminated, truncated, infos

    def close(self, **kwargs: Any) -> None:
        try:
            self._close_writer()
            if self._rec.dataset is not None:
                self._rec.dataset.flush()
        finally:
            _report_rejected(self)
        super().close(**kwargs)
