"""JAX helper for sampled batches. ``jax`` is imported only when called."""

from __future__ import annotations

from typing import Any

import numpy as np

from .torch import NUMERIC_KINDS


def to_jax(batch: Any, device: Any = None) -> Any:
    """``batch`` with numeric buffers as JAX arrays on ``device`` (each buffer copied once).

    The copy never aliases the sampler's reusable NumPy buffers; string or
    object meta values stay NumPy arrays.
    """
    import jax

    def convert(x: Any) -> Any:
        if not isinstance(x, np.ndarray) or x.dtype.kind not in NUMERIC_KINDS:
            return x
        return jax.device_put(x, device, may_alias=False)

    return batch.map(convert)
