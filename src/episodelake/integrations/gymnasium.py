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

An episode still running when the recorder is reset or closed was cut short:
it is dropped unless ``keep_partial=True`` (then it is stored with neither
flag set).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

from ..dataset import Dataset
from ..errors import EpisodeStateError, SchemaError, ValidationError
from ..schema import DatasetSchema, FieldSpec, schema_from_gym_spaces
from ..writer import EpisodeWriter, VectorEpisodeWriter

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
    spec = getattr(env, "spec", None)
    if spec is None and isinstance(env, VectorEnv):
        spec = env.get_attr("spec")[0]
    return spec


def env_info(env: gym.Env | VectorEnv) -> dict[str, Any]:
    """What the descriptor records about ``env``: id, spec, spaces, providing packages."""
    vector = isinstance(env, VectorEnv)
    obs_space = env.single_observation_space if vector else env.observation_space
    act_space = env.single_action_space if vector else env.action_space
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
    if vector:
        out["num_envs"] = env.num_envs
        mode = env.metadata.get("autoreset_mode")
        out["autoreset_mode"] = getattr(mode, "value", mode)
    return out


def dataset_for_env(
    env: gym.Env | VectorEnv,
    path: str | None = None,
    *,
    meta_fields: Sequence[FieldSpec] = (),
    reward_dtype: Any = "float64",
    **create_options: Any,
) -> Dataset:
    """Create a dataset whose schema fits ``env``'s spaces (single-env spaces for a vector env).

    Meta fields ``seed`` (uint64: Gymnasium seeds are non-negative), ``env_id``
    (str) and, for vector envs, ``env_index`` (int64) are added before
    ``meta_fields``. Rewards default to float64 (Gymnasium returns Python
    floats; nothing is rounded).
    """
    vector = isinstance(env, VectorEnv)
    auto = [FieldSpec("seed", (), "uint64", role="meta"), FieldSpec("env_id", (), "str", role="meta")]
    if vector:
        auto.append(FieldSpec("env_index", (), "int64", role="meta"))
    names = {f.name for f in meta_fields}
    meta = [f for f in auto if f.name not in names] + list(meta_fields)
    obs_space = env.single_observation_space if vector else env.observation_space
    act_space = env.single_action_space if vector else env.action_space
    schema = schema_from_gym_spaces(obs_space, act_space, reward_dtype, meta)
    info = {**env_info(env), **dict(create_options.pop("info", None) or {})}
    return Dataset.create(schema, path, info=info, **create_options)


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


def _resolve_dataset(dataset: Dataset | str | None, env: gym.Env | VectorEnv, create_options: Any) -> Dataset:
    if isinstance(dataset, Dataset):
        if create_options:
            raise TypeError(f"create options {sorted(create_options)} only apply when the recorder creates the dataset")
        vector = isinstance(env, VectorEnv)
        check_spaces(
            dataset.schema,
            env.single_observation_space if vector else env.observation_space,
            env.single_action_space if vector else env.action_space,
        )
        return dataset
    return dataset_for_env(env, dataset, **create_options)


def _episode_meta(schema: DatasetSchema, auto: Mapping[str, Any], meta: Meta, context: dict[str, Any]) -> dict:
    """Auto meta (only the fields the schema has), then the static mapping, then the callable's result."""
    names = {f.name for f in schema.meta_fields}
    out = {k: v for k, v in auto.items() if k in names}
    extra = meta(context) if callable(meta) else meta
    out.update(extra or {})
    return out


# ---------------------------------------------------------------- single env


class RecordEpisodes(gym.Wrapper):
    """Record every episode of ``env`` into ``dataset`` (a Dataset, a path, or None for memory).

    With a path or None the dataset is created by :func:`dataset_for_env`
    (``create_options`` are passed on). ``meta`` is a mapping of per-episode
    meta values or a callable receiving ``{"seed", "options", "info",
    "episode"}`` at each reset. Episodes are committed in batches; ``close()``
    (or ``dataset.flush()``) commits the rest.
    """

    def __init__(
        self,
        env: gym.Env,
        dataset: Dataset | str | None = None,
        meta: Meta = None,
        keep_partial: bool = False,
        **create_options: Any,
    ) -> None:
        super().__init__(env)
        self.dataset = _resolve_dataset(dataset, env, create_options)
        self.meta = meta
        self.keep_partial = keep_partial
        self.episodes_started = 0
        self._writer: EpisodeWriter | None = None
        spec = env.spec
        self._env_id = spec.id if spec is not None else None

    def _end_open(self) -> None:
        w = self._writer
        if w is not None and not w.done:
            if self.keep_partial and w.length:
                w.finish()
            else:
                w.discard()
        self._writer = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self._end_open()
        obs, info = self.env.reset(seed=seed, options=options)
        context = {"seed": seed, "options": options, "info": info, "episode": self.episodes_started}
        auto = {"seed": seed, "env_id": self._env_id}
        meta = _episode_meta(self.dataset.schema, auto, self.meta, context)
        self._writer = self.dataset.new_episode(obs, **meta)
        self.episodes_started += 1
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        if self._writer is None or self._writer.done:
            raise EpisodeStateError("RecordEpisodes: call reset() before step() (the last episode ended)")
        obs, reward, terminated, truncated, info = self.env.step(action)
        # Gymnasium may set both (TimeLimit on a terminal step); the state is terminal, so terminated wins.
        self._writer.add_step(
            {
                "observations": obs,
                "actions": action,
                "rewards": reward,
                "terminated": terminated,
                "truncated": bool(truncated) and not terminated,
            }
        )
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._end_open()
        self.dataset.flush()
        super().close()


# ---------------------------------------------------------------- vector env


class RecordVectorEpisodes(VectorWrapper):
    """Record each sub-env of a ``gymnasium.vector.VectorEnv`` as its own sequence of episodes.

    Works in ``AutoresetMode.NEXT_STEP`` (the reset row after an episode ends
    records no transition) and ``SAME_STEP`` (the final observation comes from
    ``infos["final_obs"]``); see :class:`episodelake.writer.VectorEpisodeWriter`.
    ``meta`` is a mapping or a callable receiving ``{"env_index", "seed",
    "episode"}`` when each episode starts. ``seed`` meta: ``seed + i`` (or
    ``seed[i]``) for the episodes started by a seeded ``reset``, None after
    autoresets.
    """

    def __init__(
        self,
        env: VectorEnv,
        dataset: Dataset | str | None = None,
        meta: Meta = None,
        keep_partial: bool = False,
        **create_options: Any,
    ) -> None:
        super().__init__(env)
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        mode = AutoresetMode(mode) if isinstance(mode, str) else mode
        if mode not in _AUTORESET:
            raise ValidationError(f"RecordVectorEpisodes supports NEXT_STEP and SAME_STEP autoreset, not {mode}")
        self.autoreset_mode = _AUTORESET[mode]
        self.dataset = _resolve_dataset(dataset, env, create_options)
        self.meta = meta
        self.keep_partial = keep_partial
        self.episodes_started = 0
        self._writer: VectorEpisodeWriter | None = None
        self._seeds: list[int | None] = [None] * env.num_envs
        spec = _spec(env)
        self._env_id = spec.id if spec is not None else None

    def _episode_meta(self, i: int) -> dict[str, Any]:
        seed, self._seeds[i] = self._seeds[i], None  # only the first episode after reset() is seeded
        context = {"env_index": i, "seed": seed, "episode": self.episodes_started}
        self.episodes_started += 1
        auto = {"seed": seed, "env_id": self._env_id, "env_index": i}
        return _episode_meta(self.dataset.schema, auto, self.meta, context)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if options and "reset_mask" in options:
            raise ValidationError("RecordVectorEpisodes does not support partial resets (options['reset_mask'])")
        if self._writer is not None:
            self._writer.close(finish_open=self.keep_partial)
        obs, infos = self.env.reset(seed=seed, options=options)
        n = self.num_envs
        if seed is None:
            self._seeds = [None] * n
        elif isinstance(seed, int):
            self._seeds = [seed + i for i in range(n)]
        else:
            self._seeds = list(seed)
        self._writer = self.dataset.vector_writer(obs, n, self.autoreset_mode, meta=self._episode_meta)
        return obs, infos

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self._writer is None:
            raise EpisodeStateError("RecordVectorEpisodes: call reset() before step()")
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        term = np.asarray(terminated, dtype=bool)
        self._writer.add_steps(obs, actions, rewards, term, np.asarray(truncated, dtype=bool) & ~term, infos)
        return obs, rewards, terminated, truncated, infos

    def close(self, **kwargs: Any) -> None:
        if self._writer is not None:
            self._writer.close(finish_open=self.keep_partial)
            self._writer = None
        self.dataset.flush()
        super().close(**kwargs)
