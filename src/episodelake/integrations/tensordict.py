"""TensorDict view of sampled batches (TorchRL layout). ``tensordict``/``torch`` load only when called.

Layout, batch size ``[B]``: ``observation`` (or ``observation/<name>`` nested
for dict observations), ``action``, ``mask``, ``episode_id``, ``start``,
``meta/<name>`` for every meta field (numeric/bool: a tensor holding the fill
value where unset; ``str``: non-tensor data, a ``NonTensorStack`` of ``str``
or None), ``meta_mask/<name>`` (bool, False where unset), and under ``next``:
``observation``, ``reward``, ``terminated``, ``truncated``, ``done``
(``terminated | truncated``).
Transitions add ``discount``, ``n_steps`` and the ``*_mask`` fields.
``observation`` and ``("next", "observation")`` are views of one tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.segments import RoleView
from .torch import to_torch


def _nested(value: Any) -> Any:
    if not isinstance(value, RoleView):
        return value
    out: dict[str, Any] = {}
    for key, leaf in value.flat().items():
        *parents, last = key.split("/")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = leaf
    return out


def batch_to_tensordict(batch: Any, device: Any = None) -> Any:
    """A ``TensorDict`` of a SegmentBatch or Transitions batch (see module docstring)."""
    import torch
    from tensordict import TensorDict

    tb = to_torch(batch, device)
    data: dict[str, Any] = {
        "observation": _nested(tb.obs),
        "action": _nested(tb.action),
        "episode_id": tb.episode_id,
        "start": tb.start,
        "next": {
            "observation": _nested(tb.next_obs),
            "reward": _nested(tb.reward),
            "terminated": tb.terminated,
            "truncated": tb.truncated,
            "done": tb.terminated | tb.truncated,
        },
    }
    for name in ("mask", "discount", "n_steps", "obs_mask", "next_obs_mask", "action_mask"):
        value = getattr(tb, name, None)
        if value is not None:
            data[name] = value
    meta = {k: v if isinstance(v, torch.Tensor) else _non_tensor(k, v) for k, v in tb.meta.flat().items()}
    if meta:
        data["meta"] = meta
        data["meta_mask"] = tb.meta_mask.flat()
    return TensorDict(data, batch_size=[len(tb.episode_id)], device=device)


def _non_tensor(name: str, values: Any) -> Any:
    """String meta as per-item non-tensor data (never dropped); anything else non-numeric is an error."""
    from tensordict import NonTensorStack

    items = values.tolist() if isinstance(values, np.ndarray) else list(values)
    if not all(v is None or isinstance(v, str) for v in items):
        raise TypeError(f"batch_to_tensordict: meta field {name!r} holds values that are neither numbers nor str")
    return NonTensorStack.from_list(items)
