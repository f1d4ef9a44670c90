"""Episode writers: step by step, whole episodes, and N parallel (vector) envs.

Contracts:

* Every value is validated (see :mod:`validation`) before anything changes. A
  rejected ``add_step`` or episode raises :class:`ValidationError` naming the
  field and the step and leaves the writer (and the dataset) exactly as before.
* Finished episodes go to the dataset's :class:`~episodelake.commit.CommitSink`
  and become visible only when it commits them. Memory held: the pending
  episodes (at most about ``commit_bytes`` plus one episode) plus each open
  episode's step buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .commit import CommitSink, FinishedEpisode
from .errors import EpisodeStateError, ValidationError
from .schema import FieldSpec
from .validation import STEP_KEYS, check_flags, check_meta, check_values, episode_from_dict, split_role


class _Buffers:
    """Growable per-field step buffers (doubling), so add_step is O(1) amortized."""

    def __init__(self, fields: Sequence[FieldSpec], capacity: int = 64) -> None:
        self.fields = fields
        self.arrays = {f.key: np.empty((capacity, *f.shape), f.np_dtype) for f in fields}
        self.size = {f.key: 0 for f in fields}

    def put(self, key: str, value: np.ndarray) -> None:
        arr = self.arrays[key]
        n = self.size[key]
        if n == len(arr):
            arr = np.concatenate([arr, np.empty_like(arr)])
            self.arrays[key] = arr
        arr[n] = value
        self.size[key] = n + 1

    def take(self) -> dict[str, np.ndarray]:
        return {k: a[: self.size[k]].copy() for k, a in self.arrays.items()}


class EpisodeWriter:
    """Records one episode step by step. Create with :meth:`Dataset.new_episode`.

    The writer finalizes itself on the step that sets ``terminated`` or
    ``truncated``; ``finish()`` ends an episode without either flag (e.g. a
    collection budget ran out) and ``discard()`` drops it. An episode is never
    visible until committed.
    """

    def __init__(self, sink: CommitSink, initial_obs: Any, meta: Mapping[str, Any]) -> None:
        self.sink = sink
        schema = sink.schema
        self.meta = check_meta(schema, meta, "new_episode")
        obs = split_role(schema, "observation", initial_obs, "initial observation")
        checked = {k: check_values(schema[k], v, (), "initial observation") for k, v in obs.items()}
        self._bufs = _Buffers(schema.step_fields)
        for k, v in checked.items():
            self._bufs.put(k, v)
        self._roles = [(r, schema.role_fields(r)) for r in ("observation", "action", "reward", "extra")]
        self.length = 0
        self.done = False

    def add_step(self, step: Mapping[str, Any]) -> EpisodeWriter:
        """Append one transition; validates everything before storing anything.

        ``step`` holds ``observations`` (the observation the action produced),
        ``actions``, ``rewards``, optional ``extras``, ``terminated`` and
        ``truncated`` (singular names and ``obs`` are accepted too).
        """
        self._apply(*self.check_step(step))
        return self

    def check_step(self, step: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], bool, bool]:
        """Validate ``step`` without storing it: (values by field key, terminated, truncated)."""
        if self.done:
            raise EpisodeStateError(f"step {self.length}: the episode already ended; start a new one")
        where = f"step {self.length}"
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
            if role not in by_role:
                raise ValidationError(f"{where}: missing {role}")
            for k, v in split_role(schema, role, by_role[role], where).items():
                checked[k] = check_values(schema[k], v, (), where)
        terminated, truncated = check_flags(step.get("terminated", False), step.get("truncated", False), where)
        return checked, terminated, truncated

    def _apply(self, checked: Mapping[str, np.ndarray], terminated: bool, truncated: bool) -> None:
        for k, v in checked.items():
            self._bufs.put(k, v)
        self.length += 1
        if terminated or truncated:
            self._finish(terminated, truncated)

    def finish(self) -> None:
        """End the episode here without a terminal flag (neither terminated nor truncated)."""
        if self.done:
            raise EpisodeStateError("the episode already ended")
        self._finish(False, False)

    def discard(self) -> None:
        """Drop the episode; nothing of it is ever stored."""
        self.done = True
        self._bufs = _Buffers(())

    def _finish(self, terminated: bool, truncated: bool) -> None:
        if self.length == 0:
            raise ValidationError("an episode needs at least one step")
        self.done = True
        data = self._bufs.take()
        self._bufs = _Buffers(())
        self.sink.submit(FinishedEpisode(data, self.length, terminated, truncated, self.meta))

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if not self.done:
            if exc_type is None and self.length:
                self.finish()
            else:
                self.discard()


def write_episodes(sink: CommitSink, episodes: Iterable[Mapping[str, Any]]) -> int:
    """Validate and submit dict-form episodes; returns how many were written.

    A rejected episode withdraws this call's episodes that are still pending
    (so a batch within one commit is all or nothing); episodes an automatic
    commit already stored during the call stay.
    """
    count = 0
    seq, kept = sink.seq, len(sink.pending)
    try:
        for i, ep in enumerate(episodes):
            sink.submit(episode_from_dict(sink.schema, ep, f"episode {i}"))
            count += 1
    except ValidationError:
        sink.pending = sink.pending[:kept] if sink.seq == seq else []
        sink.pending_bytes = sum(e.nbytes for e in sink.pending)
        raise
    return count


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

    def __init__(
        self,
        sink: CommitSink,
        initial_obs: Any,
        num_envs: int,
        autoreset_mode: str = "next_step",
        meta: Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None = None,
    ) -> None:
        # Accept "next_step", gymnasium's AutoresetMode.NEXT_STEP and its value "NextStep".
        mode = str(getattr(autoreset_mode, "value", autoreset_mode)).lower().replace("_", "")
        mode = {"nextstep": "next_step", "samestep": "same_step"}.get(mode, mode)
        if mode not in ("next_step", "same_step"):
            raise ValidationError(f"autoreset_mode must be 'next_step' or 'same_step', got {autoreset_mode!r}")
        self.sink = sink
        self.num_envs = num_envs
        self.mode = mode
        self.meta = meta or {}
        self.writers: list[EpisodeWriter | None] = [self._start(i, _index(initial_obs, i)) for i in range(num_envs)]

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
    ) -> None:
        """Record one ``env.step`` result for all envs (the batch the vector env returned)."""
        infos = infos or {}
        term = np.asarray(terminated, dtype=bool).reshape(self.num_envs)
        trunc = np.asarray(truncated, dtype=bool).reshape(self.num_envs)
        # Validate every env's row first so a rejected call changes nothing.
        plan: list[tuple[int, Any, Any]] = []
        for i in range(self.num_envs):
            obs_i = _index(observations, i)
            writer = self.writers[i]
            if writer is None or writer.done:  # next_step mode: this row is the reset
                plan.append((i, "reset", obs_i))
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
                checked = writer.check_step(step)
            except ValidationError as exc:
                raise ValidationError(f"env {i}, {exc}") from exc
            plan.append((i, checked, obs_i if ended and self.mode == "same_step" else None))
        for i, checked, restart in plan:
            if checked == "reset":
                self.writers[i] = self._start(i, restart)
                continue
            self.writers[i]._apply(*checked)
            if restart is not None:
                self.writers[i] = self._start(i, restart)

    def close(self, finish_open: bool = False) -> None:
        """Discard (default) or finish the episodes still running in each env."""
        for w in self.writers:
            if w is not None and not w.done:
                if finish_open and w.length:
                    w.finish()
                else:
                    w.discard()


def _index(batch: Any, i: int) -> Any:
    if isinstance(batch, Mapping):
        return {k: _index(v, i) for k, v in batch.items()}
    return batch[i]
