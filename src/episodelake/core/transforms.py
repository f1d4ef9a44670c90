"""Frame transforms applied when a batch is assembled (``transform=`` of ``segment_stream``, ``segments``
and ``sample_transitions``).

A :class:`FrameTransform` crops, resizes, normalizes and lays out the frames
of one image field (``layout`` ``"HWC"`` or ``"CHW"``), in that order. Frames
stay ``uint8`` through crop (a view) and resize (computed in float32, rounded
back to ``uint8``); only ``mean``/``std`` normalization turns them into
``float32``, as the last step. Resizing is bilinear with antialiasing (a
triangle filter widened by the downscale factor, as Pillow's and
``torch.nn.functional.interpolate(..., antialias=True)``'s bilinear), done as
two small matrix products per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from .errors import ArgumentError
from .schema import DatasetSchema, FieldSpec

LAYOUTS = ("HWC", "CHW")


@dataclass(frozen=True)
class FrameTransform:
    """What to do to a batch of frames of one image field (each step optional).

    Args:
        crop: ``(top, left, height, width)`` in input pixels.
        resize: ``(height, width)`` after the crop.
        mean, std: per channel (or one value), in units of 255: output
            ``(x / 255 - mean) / std`` as ``float32``. Without them frames stay ``uint8``.
        layout: ``"HWC"`` or ``"CHW"`` output (None: the field's layout).
    """

    crop: tuple[int, int, int, int] | None = None
    resize: tuple[int, int] | None = None
    mean: float | Sequence[float] | None = None
    std: float | Sequence[float] | None = None
    layout: str | None = None

    def check(self, f: FieldSpec) -> None:
        """Raise :class:`ArgumentError` naming ``f`` when this transform does not fit its frames."""
        what = f"transform of field {f.key!r}"
        if len(f.shape) != 3 or f.layout not in LAYOUTS:
            raise ArgumentError(f"{what}: frames need a 3-D field with layout 'HWC' or 'CHW' (shape {f.shape})")
        h, w, c = _hwc(f)
        if self.crop is not None:
            top, left, ch, cw = _ints(self.crop, 4, f"{what}: crop")
            if top < 0 or left < 0 or ch <= 0 or cw <= 0 or top + ch > h or left + cw > w:
                raise ArgumentError(f"{what}: crop {self.crop} does not fit frames of {h}x{w}")
        if self.resize is not None and min(_ints(self.resize, 2, f"{what}: resize")) <= 0:
            raise ArgumentError(f"{what}: resize {self.resize} must be positive")
        if (self.mean is None) != (self.std is None):
            raise ArgumentError(f"{what}: give both mean and std (or neither)")
        for name, value in (("mean", self.mean), ("std", self.std)):
            if value is not None and np.size(value) not in (1, c):
                raise ArgumentError(f"{what}: {name} needs 1 or {c} values, got {np.size(value)}")
        if self.std is not None and not np.all(np.asarray(self.std, np.float64) > 0):
            raise ArgumentError(f"{what}: std must be positive")
        if self.layout is not None and self.layout not in LAYOUTS:
            raise ArgumentError(f"{what}: layout must be one of {LAYOUTS}, got {self.layout!r}")

    def __call__(self, frames: np.ndarray, f: FieldSpec) -> np.ndarray:
        """``frames`` ``[..., *f.shape]`` transformed (a new array)."""
        x = np.moveaxis(frames, -3, -1) if f.layout == "CHW" else frames
        if self.crop is not None:
            top, left, ch, cw = self.crop
            x = x[..., top : top + ch, left : left + cw, :]
        if self.resize is not None and tuple(self.resize) != x.shape[-3:-1]:
            x = _resize(x, int(self.resize[0]), int(self.resize[1]), keep_uint8=self.mean is None)
        if self.mean is not None:
            mean = np.asarray(self.mean, np.float32) * 255
            scale = 1 / (np.asarray(self.std, np.float32) * 255)
            x = (x.astype(np.float32) - mean) * scale
        if (self.layout or f.layout) == "CHW":
            x = np.moveaxis(x, -1, -3)
        return np.ascontiguousarray(x)


Transform = FrameTransform | Callable[[np.ndarray], np.ndarray]


def check_transforms(schema: DatasetSchema, transform: Mapping[str, Transform] | None) -> dict[str, Transform]:
    """``transform`` validated against ``schema``: keys are step fields, :class:`FrameTransform` s fit them."""
    if transform is None:
        return {}
    if not isinstance(transform, Mapping):
        raise ArgumentError(f"transform must map field keys to a FrameTransform or a callable, got {transform!r}")
    keys = {f.key for f in schema.step_fields}
    out: dict[str, Transform] = {}
    for key, t in transform.items():
        if key not in keys:
            raise ArgumentError(f"transform: {key!r} is not a step field (step fields: {sorted(keys)})")
        if isinstance(t, FrameTransform):
            t.check(schema[key])
        elif not callable(t):
            raise ArgumentError(f"transform of field {key!r}: give a FrameTransform or a callable, got {t!r}")
        out[key] = t
    return out


def apply_transforms(buffers: dict[str, Any], schema: DatasetSchema, transforms: Mapping[str, Transform]) -> None:
    """Replace the field buffers of a batch (``Segment.data``, ``Transitions.buffers``) by their transforms."""
    for key, t in transforms.items():
        buffers[key] = t(buffers[key], schema[key]) if isinstance(t, FrameTransform) else t(buffers[key])


def _hwc(f: FieldSpec) -> tuple[int, int, int]:
    assert f.layout is not None
    return f.shape[f.layout.index("H")], f.shape[f.layout.index("W")], f.shape[f.layout.index("C")]


def _ints(value: Any, n: int, what: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        out = ()
    if len(out) != n or any(isinstance(v, bool) for v in value):
        raise ArgumentError(f"{what} needs {n} ints, got {value!r}")
    return out


def _resize(x: np.ndarray, height: int, width: int, keep_uint8: bool) -> np.ndarray:
    """``x`` ``[..., H, W, C]`` resized to ``[..., height, width, C]`` (antialiased bilinear)."""
    *lead, h, w, c = x.shape
    rows, cols = _weights(h, height), _weights(w, width)
    flat = x.reshape(-1, h, w * c).astype(np.float32)
    y = np.matmul(rows, flat).reshape(-1, height, w, c)  # along H
    y = np.matmul(y.transpose(0, 1, 3, 2), cols.T).transpose(0, 1, 3, 2)  # along W
    y = y.reshape(*lead, height, width, c)
    return np.clip(np.rint(y), 0, 255).astype(np.uint8) if keep_uint8 else y


@cache
def _weights(size: int, out: int) -> np.ndarray:
    """``[out, size]`` antialiased bilinear weights (Pillow's algorithm; rows sum to 1)."""
    scale = size / out
    support = max(scale, 1.0)
    centers = (np.arange(out) + 0.5) * scale
    src = np.arange(size) + 0.5
    w = np.maximum(0.0, 1.0 - np.abs(src[None, :] - centers[:, None]) / support)
    w /= w.sum(axis=1, keepdims=True)
    return w.astype(np.float32)
