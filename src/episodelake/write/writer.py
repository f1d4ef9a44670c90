"""Episode writers: step by step, whole episodes, and N parallel (vector) envs.

Contracts:

* Every value is validated (see :mod:`checks`) before anything changes. A
  rejected ``add_step``, ``set_meta`` or episode raises :class:`ValidationError`
  naming the field and the step and leaves the writer (and the dataset)
  exactly as before.
* Meta can be given at ``new_episode``, with any step (``add_step(step,
  meta=...)``), through ``set_meta``/``writer.meta[name] = value`` and at
  ``finish(**meta)``, until the episode is handed to the commit queue; a meta
  write after that raises :class:`EpisodeStateError` (never silently lost).
* The step that sets ``terminated``/``truncated`` ends the episode and hands
  it over at once, unless ``required`` meta fields are still missing: then
  the writer holds it (``awaiting_meta``) and hands it over as soon as the
  last of them is set.
* Handed-over episodes go to the dataset's :class:`~episodelake.commit.CommitSink`
  and are committed by its triggers (see :mod:`commit`). Memory held: the
  pending episodes (at most about ``commit_bytes`` plus one episode) plus each
  open or held episode's step buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np

from ..core.checks import (
    check_flags,
    check_meta,
    check_values,
    missing_required,
    plain,
    plain_value,
    split_role,
    step_plan,
)
from ..core.episode import FinishedEpisode, python_meta
from ..core.errors import ArgumentError, EpisodeStateError, QualityError, ValidationError
from ..core.schema import STEP_KEYS, DatasetSchema, FieldSpec, flatten_role
from ..core.spellings import Refused
from .commit import CommitSink

Meta = Mapping[str, Any]
QUEUED_MESSAGE = (
    "episode already finished and queued for commit; pass meta= to the last add_step, call set_meta "
    "before the last step, or declare the field required=True to set it after the last step"
)


_MISSING: Any = object()
STEP_ROLES = ("observation", "action", "reward", "extra")


def with_defaults(schema: DatasetSchema, role: str, value: Any) -> Any:
    """``value`` of ``role`` with declared defaults filled in for omitted fields.

    ``value`` is a role's value, or ``_MISSING`` when the step omits the role:
    then it is filled only when every field of the role has a default.
    Anything else (a plain array, or a field without a default missing) is
    returned for :func:`split_role` to accept or reject with its usual message.
    """
    defaults = {f.name: f.default_value for f in schema.role_fields(role) if f.default_value is not None}
    if not defaults:
        return value
    if value is _MISSING:
        if len(defaults) < len(schema.role_fields(role)):
            return value
        value = {}
    elif not isinstance(value, Mapping):
        return value
    return {**defaults, **flatten_role(value)}


class _Buffers:
    """Growable per-field step buffers (doubling), so add_step is O(1) amortized."""

    def __init__(self, fields: Sequence[FieldSpec], capacity: int = 64) -> None:
        self.fields = fields
        self.arrays = {f.key: np.empty((capacity, *f.shape), f.np_dtype) for f in fields}
        self.size = {f.key: 0 for f in fields}

    def put(self, values: Mapping[str, Any]) -> None:
        """Append one row to each field of ``values`` (one assignment each)."""
        arrays, size = self.arrays, self.size
        for key, value in values.items():
            arr = arrays[key]
            n = size[key]
            if n == len(arr):
                arr = arrays[key] = np.concatenate([arr, np.empty_like(arr)])
            arr[n] = value
            size[key] = n + 1

    def take(self) -> dict[str, np.ndarray]:
        return {k: a[: self.size[k]].copy() for k, a in self.arrays.items()}


class EpisodeMeta(MutableMapping[str, Any]):
    """A writer's meta values. Assigning an item validates it at once (:class:`ValidationError`).

    Writable until the episode is handed to the commit queue, then every write
    raises :class:`EpisodeStateError`. Deleting an item makes the field
    missing again (NULL, or awaited when required).
    """

    def __init__(self, writer: EpisodeWriter) -> None:
        self._writer = writer

    def __getitem__(self, name: str) -> Any:
        return python_meta(self._writer._meta[name])

    def __setitem__(self, name: str, value: Any) -> None:
        self._writer.set_meta(**{name: value})

    def __delitem__(self, name: str) -> None:
        self._writer._writable()
        del self._writer._meta[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._writer._meta)

    def __len__(self) -> int:
        return len(self._writer._meta)

    def __repr__(self) -> str:
        return repr(_plain_meta(self._writer._meta))


class EpisodeWriter:
    """Records one episode step by step. Create with :meth:`Dataset.new_episode`.

    The step that sets ``terminated`` or ``truncated`` ends the episode;
    ``finish(**meta)`` ends it without either flag (e.g. a collection budget
    ran out) and ``discard()`` drops it. An ended episode is handed to the
    commit queue at once, or, while ``required`` meta fields are missing, held
    until they are set (``done`` is True, ``awaiting_meta`` names them). An
    episode is never visible until committed.
    """

    def __init__(self, sink: CommitSink, initial_obs: Any, meta: Meta) -> None:
        self.sink = sink
        schema = sink.schema
        self._meta = check_meta(schema, meta, "new_episode")
        obs = split_role(
            schema, "observation", with_defaults(schema, "observation", initial_obs), "initial observation"
        )
        checked = {k: check_values(schema[k], v, (), "initial observation") for k, v in obs.items()}
        self._bufs = _Buffers(schema.step_fields)
        self._bufs.put(checked)
        self._roles = [(r, schema.role_fields(r)) for r in STEP_ROLES]
        self._plan = step_plan(schema, STEP_ROLES)
        self._n_fields = sum(len(fields) for _, fields in self._roles)
        self.length = 0
        self._state = "open"  # -> "awaiting" (held for required meta) -> "queued"; or "discarded"
        self._ended: tuple[dict[str, np.ndarray], bool, bool] | None = None

    @property
    def done(self) -> bool:
        """True once the episode ended (or was discarded): no more steps."""
        return self._state != "open"

    @property
    def meta(self) -> EpisodeMeta:
        """The episode's meta values; ``writer.meta[name] = value`` validates and sets one."""
        return EpisodeMeta(self)

    @property
    def awaiting_meta(self) -> tuple[str, ...]:
        """Required meta fields an ended episode still waits for (empty unless it is held)."""
        return missing_required(self.sink.schema, self._meta) if self._state == "awaiting" else ()

    def add_step(self, step: Mapping[str, Any], meta: Meta | None = None) -> EpisodeWriter:
        """Append one transition (and merge ``meta``); validates everything before storing anything.

        ``step`` holds ``observations`` (the observation the action produced),
        ``actions``, ``rewards``, optional ``extras``, ``terminated`` and
        ``truncated`` (singular names and ``obs`` are accepted too). A field
        with a declared ``FieldSpec(default=...)`` may be omitted (or its whole
        role, when every field of the role has one): its default is stored.
        """
        self._apply(*self.check_step(step, meta))
        return self

    def check_step(
        self, step: Mapping[str, Any], meta: Meta | None = None
    ) -> tuple[dict[str, np.ndarray], bool, bool, dict[str, Any]]:
        """Validate ``step`` and ``meta`` without storing them: (values by key, terminated, truncated, meta)."""
        if self.done:
            raise EpisodeStateError(f"step {self.length}: the episode already ended; start a new one")
        where = f"step {self.length}"
        plain = self._plain(step)
        if plain is not None:
            terminated, truncated = check_flags(step.get("terminated", False), step.get("truncated", False), where)
            return plain, terminated, truncated, check_meta(self.sink.schema, meta, where) if meta else {}
        schema = self.sink.schema
        by_role: dict[str, Any] = {}
        for key, value in step.items():
            if key in ("terminated", "truncated"):
                continue
            role = STEP_KEYS.get(key)
            if role is None:
                raise ValidationError(
                    f"{where}: unknown key {key!r}; expected {sorted(STEP_KEYS)} + terminated/truncated"
                )
            if role in by_role:
                raise ValidationError(f"{where}: {role} given twice")
            by_role[role] = value
        checked: dict[str, np.ndarray] = {}
        for role, fields in self._roles:
            if not fields:
                continue
            value = with_defaults(schema, role, by_role.get(role, _MISSING))
            if value is _MISSING:
                raise ValidationError(f"{where}: missing {role}")
            for k, v in split_role(schema, role, value, where).items():
                checked[k] = check_values(schema[k], v, (), where)
        terminated, truncated = check_flags(step.get("terminated", False), step.get("truncated", False), where)
        return checked, terminated, truncated, check_meta(schema, meta, where) if meta else {}

    def _plain(self, step: Mapping[str, Any]) -> dict[str, Any] | None:
        """The step's values by field key when each is already storable as is (see :func:`plain_value`).

        None sends the step down the general path, which fills defaults and
        raises the errors; this one only ever accepts what that one would.
        """
        plan = self._plan
        out: dict[str, Any] = {}
        for key, value in step.items():
            spec = plan.get(key)
            if spec is None:
                if key in ("terminated", "truncated"):
                    continue
                return None
            k, dtype, shape, finite = spec
            v = plain_value(dtype, shape, finite, value)
            if v is None or k in out:
                return None
            out[k] = v
        return out if len(out) == self._n_fields else None

    def _apply(
        self, checked: Mapping[str, np.ndarray], terminated: bool, truncated: bool, meta: Mapping[str, Any]
    ) -> None:
        self._bufs.put(checked)
        self._meta.update(meta)
        self.length += 1
        if terminated or truncated:
            self._end(terminated, truncated)

    def set_meta(self, **values: Any) -> None:
        """Validate and merge meta values (all or nothing); hands a held episode over once complete."""
        self._writable()
        self._meta.update(check_meta(self.sink.schema, values, self._where()))
        if self._state == "awaiting" and not self.awaiting_meta:
            self._hand_over()

    def finish(self, **meta: Any) -> None:
        """End the episode here without a terminal flag, merging ``meta``.

        On an episode held for required meta, this is :meth:`set_meta`.
        """
        if self._state == "awaiting":
            self.set_meta(**meta)
            return
        if self._state != "open":
            raise EpisodeStateError(
                "the episode already ended" if self._state == "queued" else "the episode was discarded"
            )
        checked = check_meta(self.sink.schema, meta, self._where())
        if self.length == 0:
            raise ValidationError("an episode needs at least one step")
        self._meta.update(checked)
        self._end(False, False)

    def discard(self) -> None:
        """Drop the episode (running or held for meta); nothing of it is ever stored."""
        if self._state == "queued":
            raise EpisodeStateError(
                "the episode already ended and was handed to the commit queue; "
                "ds.flush(discard=True) drops uncommitted episodes"
            )
        if self._state == "awaiting":
            self.sink.release(self)
        self._state = "discarded"
        self._bufs = _Buffers(())
        self._ended = None

    def _where(self) -> str:
        return f"step {self.length}" if self._state == "open" else f"episode of {self.length} steps (ended)"

    def _writable(self) -> None:
        if self._state == "queued":
            raise EpisodeStateError(QUEUED_MESSAGE)
        if self._state == "discarded":
            raise EpisodeStateError("the episode was discarded")

    def _end(self, terminated: bool, truncated: bool) -> None:
        self._ended = (self._bufs.take(), terminated, truncated)
        self._bufs = _Buffers(())
        if missing_required(self.sink.schema, self._meta):
            self._state = "awaiting"
            self.sink.hold(self)
        else:
            self._hand_over()

    def _hand_over(self) -> None:
        assert self._ended is not None
        data, terminated, truncated = self._ended
        if self._state == "awaiting":
            self.sink.release(self)
        self._state = "queued"
        self._ended = None
        # created_at is the hand-over time: a held episode must not sort before ones already committed.
        episode = FinishedEpisode(data, self.length, terminated, truncated, dict(self._meta))
        try:
            self.sink.submit(episode, f"episode of {self.length} steps (meta {plain(self._meta)})")
        except QualityError:
            self._state = "discarded"  # rejected by the quality gate: never stored; the next episode starts afresh
            raise

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if self._state == "open":
            if exc_type is None and self.length:
                self.finish()
            else:
                self.discard()
        elif self._state == "awaiting" and exc_type is not None:
            self.discard()

    # episodata's writer calls: refused with what to write instead (:mod:`episodelake.core.spellings`)
    end, add_steps, episode_id = (Refused("EpisodeWriter") for _ in range(3))

    def __repr__(self) -> str:
        missing = self.awaiting_meta
        state = f"awaiting meta {list(missing)}" if missing else self._state
        return f"EpisodeWriter({self.length} steps, {state}, meta={_plain_meta(self._meta)})"


def _plain_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in meta.items()}


class VectorEpisodeWriter:
    """Records N parallel envs (Gymnasium 1.x vector API) as N sequential runs.

    ``autoreset_mode`` follows ``gymnasium.vector.AutoresetMode``:

    * ``"next_step"`` (Gymnasium's default): after env i ends, the next
      ``add_steps`` row for i is its reset (action ignored, reward 0); that row
      starts i's next episode and records no transition.
    * ``"same_step"``: the row that ends env i carries the *reset* observation;
      the true last observation comes from ``infos["final_obs"][i]``.

    ``meta`` is a mapping (same meta for every episode) or a callable
    ``meta(env_index) -> mapping`` called when each episode starts.
    """

    # episodata's VectorWriter calls: refused with what to write instead (:mod:`episodelake.core.spellings`)
    reset, step = (Refused("VectorEpisodeWriter") for _ in range(2))

    def __init__(
        self,
        sink: CommitSink,
        initial_obs: Any,
        num_envs: int,
        autoreset_mode: str = "next_step",
        meta: Meta | Callable[[int], Meta] | None = None,
    ) -> None:
        # Accept "next_step", gymnasium's AutoresetMode.NEXT_STEP and its value "NextStep".
        mode = str(getattr(autoreset_mode, "value", autoreset_mode)).lower().replace("_", "")
        mode = {"nextstep": "next_step", "samestep": "same_step"}.get(mode, mode)
        if mode not in ("next_step", "same_step"):
            raise ArgumentError(f"autoreset_mode must be 'next_step' or 'same_step', got {autoreset_mode!r}")
        if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer) or num_envs < 1:
            raise ArgumentError(f"num_envs must be a positive int, got {num_envs!r}")
        self.sink = sink
        self.num_envs = int(num_envs)
        self.mode = mode
        self.meta = meta or {}
        self.writers: list[EpisodeWriter] = [self._start(i, _index(initial_obs, i)) for i in range(num_envs)]
        # Per env: the episode the latest add_steps ended, kept while it is held for required meta.
        self._ended: list[EpisodeWriter | None] = [None] * num_envs
        # (env index, error) of every episode the latest add_steps rejected (it raises for the first)
        self.rejections: list[tuple[int, QualityError]] = []

    def _start(self, i: int, obs: Any) -> EpisodeWriter:
        meta = self.meta(i) if callable(self.meta) else self.meta
        return EpisodeWriter(self.sink, obs, meta)

    def add_steps(
        self,
        observations: Any,
        actions: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
        infos: Mapping[str, Any] | None = None,
        extras: Any = None,
        meta: Sequence[Meta | None] | Callable[[int], Meta | None] | None = None,
    ) -> None:
        """Record one ``env.step`` result for all envs (the batch the vector env returned).

        ``meta``: per-env meta merged into the episode each env's row belongs
        to (the ending episode on its last row, so it can record its outcome;
        the new episode on a next-step reset row): a sequence of
        mappings-or-None, one per env, or a callable ``meta(env_index)``.
        Episodes the quality gate rejects: every env's row is applied first,
        then :class:`QualityError` for the first rejected env; ``rejections``
        lists ``(env index, error)`` for every one (empty after a call
        without).
        """
        infos = infos or {}
        term = np.asarray(terminated, dtype=bool).reshape(self.num_envs)
        trunc = np.asarray(truncated, dtype=bool).reshape(self.num_envs)
        metas = self._row_meta(meta)
        # Validate every env's row first so a rejected call changes nothing.
        plan: list[tuple[int, Any, Any]] = []
        for i in range(self.num_envs):
            obs_i = _index(observations, i)
            writer = self.writers[i]
            if writer.done:  # next_step mode: this row is the reset
                plan.append((i, check_meta(self.sink.schema, metas[i], f"env {i}, reset row"), obs_i))
                continue
            ended = bool(term[i] or trunc[i])
            step_obs = obs_i
            if ended and self.mode == "same_step":
                if "final_obs" not in infos:
                    raise ValidationError(f"env {i}: same_step autoreset needs infos['final_obs']")
                step_obs = infos["final_obs"][i]
            step = {
                "observations": step_obs,
                "actions": _index(actions, i),
                "rewards": _index(rewards, i),
                "terminated": bool(term[i]),
                "truncated": bool(trunc[i]),
            }
            if extras is not None:
                step["extras"] = _index(extras, i)
            try:
                checked = writer.check_step(step, metas[i])
            except ValidationError as exc:
                raise ValidationError(f"env {i}, {exc}") from exc
            plan.append((i, checked, obs_i if ended and self.mode == "same_step" else None))
        self._ended = [w if w is not None and w.awaiting_meta else None for w in self._ended]
        rejected: list[tuple[int, QualityError]] = []  # every env's step is applied before a rejection is raised
        for i, checked, obs_i in plan:
            if isinstance(checked, dict):  # reset row: start the next episode with this row's meta
                self.writers[i] = self._start(i, obs_i)
                self.writers[i]._meta.update(checked)
                continue
            writer = self.writers[i]
            try:
                writer._apply(*checked)
            except QualityError as exc:  # the ended episode was refused (discarded); the env goes on
                rejected.append((i, exc))
            if writer.done:
                self._ended[i] = writer
            if obs_i is not None:
                self.writers[i] = self._start(i, obs_i)
        self.rejections = rejected
        if rejected:
            env, first = rejected[0]
            more = f" ({len(rejected) - 1} more env(s) rejected too)" if len(rejected) > 1 else ""
            raise QualityError(f"env {env}, {first}{more}", first.check, first.episode, first.step) from first

    def _row_meta(self, meta: Sequence[Meta | None] | Callable[[int], Meta | None] | None) -> list[Meta]:
        if meta is None:
            return [{}] * self.num_envs
        rows = [meta(i) for i in range(self.num_envs)] if callable(meta) else list(meta)
        if len(rows) != self.num_envs:
            raise ValidationError(f"meta has {len(rows)} entries for {self.num_envs} envs")
        for i, row in enumerate(rows):
            if row is not None and not isinstance(row, Mapping):
                raise ValidationError(f"env {i}: meta must be a mapping or None, got {type(row).__name__}")
        return [row or {} for row in rows]

    def set_meta(self, i: int, **values: Any) -> None:
        """Set meta of env ``i``'s episode: the one held for required meta, else the one the latest
        ``add_steps`` ended (:class:`EpisodeStateError` once queued), else the running one."""
        if not 0 <= i < self.num_envs:
            raise IndexError(f"env index {i} out of range for {self.num_envs} envs")
        (self._ended[i] or self.writers[i]).set_meta(**values)

    @property
    def awaiting_meta(self) -> dict[int, tuple[str, ...]]:
        """Env index -> required meta fields its ended episode still waits for."""
        return {i: w.awaiting_meta for i, w in enumerate(self._ended) if w is not None and w.awaiting_meta}

    def close(self, finish_open: bool = False) -> None:
        """Discard (default) or finish the episodes still running in each env (held ones stay held)."""
        for w in self.writers:
            if not w.done:
                if finish_open and w.length:
                    w.finish()
                else:
                    w.discard()


def _index(batch: Any, i: int) -> Any:
    if isinstance(batch, Mapping):
        return {k: _index(v, i) for k, v in batch.items()}
    return batch[i]
