"""Transition-aligned containers: Segment (one run of L transitions) and batches of them.

A segment stores each observation field once, as an ``L + 1`` row buffer
(``all_obs``); ``obs`` and ``next_obs`` are the views ``[:-1]`` and ``[1:]`` of
it along the time axis. Every other per-step field has ``L`` rows. A batch is
the same container with a leading batch axis (``time_axis=1``).

``map(fn)`` applies ``fn`` once per underlying buffer and re-derives the
views, so converting to torch tensors on a device keeps ``obs``/``next_obs``
sharing storage.

Meta values of a batch are typed arrays ``[B, *shape]`` in the field's dtype,
never object arrays (strings excepted: object arrays of ``str`` or None). An
unset (NULL) numeric/bool value holds the fill value of :func:`meta_fill`
(``0``, ``False``, NaN for floating and complex fields) and is False in
``meta_mask``, which has one bool entry per item for every meta field.

Fields are reached the same way whatever the schema: ``seg["observation/state"]``
is ``seg.obs["state"]`` and ``seg["observation"]`` is ``seg.obs`` (see
:func:`lookup`). A role made of one field reads as its array, a
:class:`FieldArray` that also takes that field's name as a key, so
``seg.obs["state"]`` works when ``state`` is the only observation field; a
role of several fields reads as a :class:`RoleView`. A wrong key raises
:class:`~episodelake.errors.FieldKeyError` listing the fields there are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .errors import FieldKeyError
from .schema import ROLE_ALIASES, DatasetSchema, role_of
from .spellings import Refused


def meta_fill(dtype: np.dtype) -> Any:
    """The value an unset (NULL) meta entry holds in a batch: NaN for float/complex, else zero (False)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "fc":
        return np.nan
    return False if dtype.kind == "b" else 0


def derived_meta_mask(meta: Mapping[str, Any], time_axis: int) -> dict[str, Any]:
    """Validity of meta values that carry no explicit mask: None marks an unset value.

    A single segment (``time_axis == 0``) gets one bool per field, a batch one per item.
    """
    if time_axis == 0:
        return {k: v is not None for k, v in meta.items()}
    out = {}
    for k, v in meta.items():
        arr = np.asarray(v)
        if arr.dtype == object:
            out[k] = np.fromiter((x is not None for x in arr), bool, len(arr))
        else:
            out[k] = np.ones(len(arr), dtype=bool)
    return out


class RoleView(Mapping[str, Any]):
    """A read-only mapping of a role's fields with attribute and nested access.

    ``view["keyboard/jump"]``, ``view["keyboard"]["jump"]`` and
    ``view.keyboard.jump`` are the same array. A key it does not have raises
    :class:`~episodelake.errors.FieldKeyError` (a ``KeyError``) naming the
    fields it has; ``role`` (e.g. ``"observation"``) only words that message.
    """

    def __init__(self, items: Mapping[str, Any], role: str = "") -> None:
        self._items = dict(items)
        self._role = role

    def __getitem__(self, key: str) -> Any:
        if key in self._items:
            return self._items[key]
        prefix = key.rstrip("/") + "/" if isinstance(key, str) else None
        sub = {k[len(prefix) :]: v for k, v in self._items.items() if prefix and k.startswith(prefix)}
        if not sub:
            where = f" in {self._role}" if self._role else ""
            raise FieldKeyError(f"no field {key!r}{where}; its fields: {sorted(self._items)}")
        return RoleView(sub, f"{self._role}/{key}" if self._role else key)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except FieldKeyError as exc:
            raise AttributeError(str(exc)) from None

    def __iter__(self) -> Iterator[str]:
        seen: list[str] = []
        for k in self._items:
            head = k.split("/", 1)[0]
            if head not in seen:
                seen.append(head)
        return iter(seen)

    def __len__(self) -> int:
        return len(list(iter(self)))

    def flat(self) -> dict[str, Any]:
        """All leaves keyed by their full ``/`` path."""
        return dict(self._items)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: {getattr(v, 'shape', '?')}" for k, v in self._items.items())
        return f"RoleView({inner})"


class FieldArray(np.ndarray):
    """The array of a role made of one field, which also takes that field's name as a key.

    ``seg.obs["state"]`` is ``seg.obs`` when ``state`` is the only
    observation field, so code written for several fields keeps working with
    one. String keys resolve as in a :class:`RoleView` of that one field (a
    wrong one raises :class:`~episodelake.errors.FieldKeyError`); every other
    use is NumPy's: it is an ``ndarray``, and indexing it, ufuncs and
    reductions give plain ``ndarray`` results. Made by :func:`role_value`.
    """

    _field: str
    _role: str

    def __array_finalize__(self, obj: Any) -> None:
        self._field = getattr(obj, "_field", "")
        self._role = getattr(obj, "_role", "")

    def __getitem__(self, key: Any) -> Any:
        plain = self.view(np.ndarray)
        if isinstance(key, str):
            return RoleView({self._field: plain}, self._role)[key]
        return plain[key]

    def __array_wrap__(self, obj: Any, context: Any = None, return_scalar: bool = False) -> Any:
        out = np.asarray(obj).view(np.ndarray)
        return out[()] if return_scalar else out

    def __repr__(self) -> str:
        return repr(self.view(np.ndarray))

    def __reduce__(self) -> Any:
        return self.view(np.ndarray).__reduce__()  # unpickles as the plain array


def role_value(items: Mapping[str, Any], role: str, unwrapped: bool) -> Any:
    """What a role attribute returns: its one field's array (a :class:`FieldArray` when it is a NumPy
    array; other array types, e.g. torch tensors after ``map``, as they are), else a :class:`RoleView`."""
    if not unwrapped:
        return RoleView(items, role)
    ((name, value),) = items.items()
    if type(value) is not np.ndarray:
        return value
    out = value.view(FieldArray)
    out._field, out._role = name, role
    return out


# ``seg[key]``: the first part of a key names a role view (any of its names) or a plain attribute.
VIEW_ATTRS = {
    **{alias: ("obs" if role == "observation" else role) for alias, role in ROLE_ALIASES.items()},
    **dict.fromkeys(("next_obs", "next_observation", "next_observations"), "next_obs"),
    **dict.fromkeys(("all_obs", "all_observation", "all_observations"), "all_obs"),
    "meta": "meta",
    "meta_mask": "meta_mask",
}


def lookup(container: Any, schema: DatasetSchema, key: Any, plain: Mapping[str, Any]) -> Any:
    """``container[key]`` for segments, batches and transitions, whatever the schema.

    ``key`` is a view (``"observation"``/``"obs"``, ``"next_obs"``,
    ``"all_obs"``, ``"action"``, ``"reward"``, ``"extra"``, ``"meta"``,
    ``"meta_mask"``: the attribute of that name) optionally followed by
    ``/<field name>`` (``"observation/state"`` is ``container.obs["state"]``,
    so a field's key reaches it), or the name of a ``plain`` entry (flags,
    ``mask``, ``episode_id``, ...). Anything else is a
    :class:`~episodelake.errors.FieldKeyError` listing the keys there are.
    """
    if not isinstance(key, str):
        raise TypeError(f"{type(container).__name__} keys are str (e.g. 'observation/state'), got {key!r}")
    head, _, rest = key.partition("/")
    attr = VIEW_ATTRS.get(head, "")
    value = getattr(container, attr, None) if attr else None  # Transitions has no all_obs
    if value is None:
        if head in plain and not rest:
            return plain[head]
        keys = [f.key for f in schema.step_fields] + [f"meta/{f.name}" for f in schema.meta_fields]
        raise FieldKeyError(
            f"{type(container).__name__} has no key {key!r}; its fields: {keys} (a role or view, e.g. "
            f"'observation', 'next_obs', 'meta', reads as the attribute; also {sorted(plain)})"
        )
    if not rest:
        return value
    if isinstance(value, RoleView):
        return value[rest]
    # one field: the array itself, reached by that field's name
    (f,) = schema.role_fields(role_of("observation" if attr in ("obs", "next_obs", "all_obs") else attr))
    return RoleView({f.name: value}, head)[rest]


class Segment:
    """Transitions ``[L]`` (or ``[B, L]`` for a batch) of one schema, role first.

    Attributes: ``obs``/``observation``, ``next_obs``/``next_observation``,
    ``all_obs``/``all_observations``, ``action``, ``reward``, ``extra``,
    ``terminated``, ``truncated``, ``mask``, ``meta`` (per-episode values),
    ``meta_mask`` (False where a meta value is unset; see the module
    docstring), ``episode_id`` and ``start`` (first transition index in the
    episode). Without an explicit ``meta_mask``, None values mark unset meta.
    ``seg[key]`` reaches a field by its key whatever the schema (see :func:`lookup`).
    """

    def __init__(
        self,
        schema: DatasetSchema,
        data: Mapping[str, Any],
        terminated: Any,
        truncated: Any,
        mask: Any,
        meta: Mapping[str, Any] | None = None,
        episode_id: Any = None,
        start: Any = None,
        time_axis: int = 0,
        meta_mask: Mapping[str, Any] | None = None,
    ) -> None:
        self.schema = schema
        self.data = dict(data)
        self.terminated = terminated
        self.truncated = truncated
        self.mask = mask
        self.meta = RoleView(meta or {}, "meta")
        self.meta_mask = RoleView(
            derived_meta_mask(meta or {}, time_axis) if meta_mask is None else meta_mask, "meta_mask"
        )
        self.episode_id = episode_id
        self.start = start
        self.time_axis = time_axis

    # ---- role views
    def _slice(self, arr: Any, sl: slice) -> Any:
        return arr[(slice(None),) * self.time_axis + (sl,)]

    def role(self, role: str, which: slice | None = None) -> Any:
        """The fields of ``role``; observation rows optionally sliced along time."""
        role = role_of(role)
        fields = self.schema.role_fields(role)
        items = {}
        for f in fields:
            arr = self.data[f.key]
            items[f.name] = self._slice(arr, which) if which is not None else arr
        return role_value(items, role, self.schema.unwrapped(role))

    def __getitem__(self, key: str) -> Any:
        """A field or view by key: ``seg["observation/state"]``, ``seg["observation"]``, ``seg["meta/task"]``."""
        plain = {
            "terminated": self.terminated,
            "truncated": self.truncated,
            "mask": self.mask,
            "episode_id": self.episode_id,
            "start": self.start,
        }
        return lookup(self, self.schema, key, plain)

    @property
    def all_obs(self) -> Any:
        return self.role("observation")

    @property
    def obs(self) -> Any:
        return self.role("observation", slice(None, -1))

    @property
    def next_obs(self) -> Any:
        return self.role("observation", slice(1, None))

    all_observations = all_obs
    observation = observations = obs
    next_observation = next_observations = next_obs

    @property
    def action(self) -> Any:
        return self.role("action")

    @property
    def reward(self) -> Any:
        return self.role("reward")

    actions, rewards = action, reward  # episodata's plural names
    # episodata's info views and select(): refused with what to read instead (:mod:`episodelake.core.spellings`)
    info, infos, next_info, next_infos, all_infos, select = (Refused("Segment") for _ in range(6))

    @property
    def extra(self) -> Any:
        return self.role("extra") if self.schema.role_fields("extra") else RoleView({}, "extra")

    def __len__(self) -> int:
        return int(np.shape(self.mask)[self.time_axis])

    def map(self, fn: Callable[[Any], Any]) -> Segment:
        """A new segment with ``fn`` applied once to every underlying buffer."""
        return Segment(
            self.schema,
            {k: fn(v) for k, v in self.data.items()},
            fn(self.terminated),
            fn(self.truncated),
            fn(self.mask),
            {k: fn(v) for k, v in self.meta.flat().items()},
            None if self.episode_id is None else fn(self.episode_id),
            None if self.start is None else fn(self.start),
            self.time_axis,
            {k: fn(v) for k, v in self.meta_mask.flat().items()},
        )

    def buffers(self) -> dict[str, Any]:
        """Every underlying buffer by name (observation fields hold L + 1 rows)."""
        out = dict(self.data)
        out.update(terminated=self.terminated, truncated=self.truncated, mask=self.mask)
        for k, v in self.meta.flat().items():
            out[f"meta/{k}"] = v
        for k, v in self.meta_mask.flat().items():
            out[f"meta_mask/{k}"] = v
        return out

    def __repr__(self) -> str:
        kind = "Batch" if self.time_axis else "Segment"
        shapes = ", ".join(f"{k}: {tuple(np.shape(v))}" for k, v in self.data.items())
        return f"{kind}({shapes})"
