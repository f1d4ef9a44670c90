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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .schema import DatasetSchema, role_of


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
    ``view.keyboard.jump`` are the same array.
    """

    def __init__(self, items: Mapping[str, Any]) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        if key in self._items:
            return self._items[key]
        prefix = key.rstrip("/") + "/"
        sub = {k[len(prefix) :]: v for k, v in self._items.items() if k.startswith(prefix)}
        if not sub:
            raise KeyError(key)
        return RoleView(sub)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no field {name!r}; fields: {sorted(self._items)}") from None

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


class Segment:
    """Transitions ``[L]`` (or ``[B, L]`` for a batch) of one schema, role first.

    Attributes: ``obs``/``observation``, ``next_obs``/``next_observation``,
    ``all_obs``/``all_observations``, ``action``, ``reward``, ``extra``,
    ``terminated``, ``truncated``, ``mask``, ``meta`` (per-episode values),
    ``meta_mask`` (False where a meta value is unset; see the module
    docstring), ``episode_id`` and ``start`` (first transition index in the
    episode). Without an explicit ``meta_mask``, None values mark unset meta.
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
        self.meta = RoleView(meta or {})
        self.meta_mask = RoleView(derived_meta_mask(meta or {}, time_axis) if meta_mask is None else meta_mask)
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
        if self.schema.unwrapped(role):
            return next(iter(items.values()))
        return RoleView(items)

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
    observation = obs
    next_observation = next_obs

    @property
    def action(self) -> Any:
        return self.role("action")

    @property
    def reward(self) -> Any:
        return self.role("reward")

    @property
    def extra(self) -> Any:
        return self.role("extra") if self.schema.role_fields("extra") else RoleView({})

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
