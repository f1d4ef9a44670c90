"""JAX helper for sampled batches. ``jax`` is imported only when called."""

from __future__ import annotations

from typing import Any

import numpy as np

from .torch import NUMERIC_KINDS


def to_jax(batch: Any, device: Any = None) -> Any:
    """``batch`` with numeric buffers as JAX arrays on ``device`` (each buffer copied once).

    The copy never aliases the sampler's reusable NumPy buffers. Numeric/bool
    meta and ``meta_mask`` become JAX arrays; ``str`` meta stays a NumPy
    object array of ``str``/None. Without ``jax_enable_x64`` JAX stores 64-bit
    values in 32 bits; an integer buffer whose values do not fit (such as
    ``episode_id``) therefore stays a NumPy array instead of being truncated.
    """
    import jax

    x64 = bool(jax.config.read("jax_enable_x64"))

    def convert(x: Any) -> Any:
        if not isinstance(x, np.ndarray) or x.dtype.kind not in NUMERIC_KINDS:
            return x
        if not x64 and x.dtype.kind in "iu" and x.dtype.itemsize == 8 and x.size:
            narrow = np.int32 if x.dtype.kind == "i" else np.uint32
            info = np.iinfo(narrow)
            if x.min() < info.min or x.max() > info.max:
                return x
        return jax.device_put(x, device, may_alias=False)

    return batch.map(convert)
