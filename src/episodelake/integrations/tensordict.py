"""TensorDict view of sampled batches (TorchRL layout). ``tensordict``/``torch`` load only when called.

Layout, batch size ``[B]``: ``observation`` (or ``observation/<name>`` nested
for dict observations), ``action``, ``mask``, ``episode_id``, ``start``,
``meta/<name>`` (numeric meta only), and under ``next``: ``observation``,
``reward``, ``terminated``, ``truncated``, ``done`` (``terminated | truncated``).
Transitions add ``discount``, ``n_steps`` and the ``*_mask`` fields.
``observation`` and ``("next", "observation")`` are views of one tensor.
"""

from __future__ import annotations

from typing import Any

from ..segments import RoleView
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
    meta = {k: v for k, v in tb.meta.flat().items() if isinstance(v, torch.Tensor)}
    if meta:
        data["meta"] = meta
    return TensorDict(data, batch_size=[len(tb.episode_id)], device=device)
