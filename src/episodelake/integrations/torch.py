"""PyTorch helpers for sampled batches. ``torch`` is imported only when a helper is called.

``to_torch(batch, device)`` converts every numeric buffer once (``batch.map``),
so ``obs``/``next_obs`` stay views of one tensor on the device. Buffers go
through ``torch.from_numpy`` (no copy) and then ``.to(device)``. Meta values
are typed arrays (unset entries hold the fill value, ``meta_mask`` is False
there), so they become tensors too; only ``str`` meta stays a NumPy object
array of ``str``/None.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NUMERIC_KINDS = "biufc"


def to_torch(batch: Any, device: Any = None, non_blocking: bool = False, pin_memory: bool = False) -> Any:
    """``batch`` (a Segment, SegmentBatch or Transitions) with numeric buffers as torch tensors.

    ``pin_memory=True`` pins host buffers first (with ``non_blocking=True``
    the host-to-GPU copies then overlap compute). Without ``device`` the
    tensors share memory with the NumPy buffers.
    """
    import torch

    def convert(x: Any) -> Any:
        if not isinstance(x, np.ndarray) or x.dtype.kind not in NUMERIC_KINDS:
            return x
        t = torch.from_numpy(x)
        if pin_memory:
            t = t.pin_memory()
        return t if device is None else t.to(device, non_blocking=non_blocking)

    return batch.map(convert)


def collate_to_torch(items: Any) -> Any:
    """A DataLoader ``collate_fn``: :func:`episodelake.batch.collate`, then :func:`to_torch` (shared memory)."""
    from ..sampling.batch import collate

    return to_torch(collate(items))
