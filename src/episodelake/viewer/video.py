"""Camera frames as a WebM (VP9) video the browser plays, encoded once per (episode, field) and kept.

VP9 in WebM plays in every Chromium build, Debian's included (H.264 needs
the proprietary codecs some builds leave out); libvpx ships in PyAV's wheel.
Real-time settings keep an episode's encode well under its playing time.
"""

from __future__ import annotations

import io
import os
import tempfile
import threading
from collections.abc import Callable

import numpy as np

from ..core.errors import MissingDependencyError

CODEC = "libvpx-vp9"
MIME = "video/webm"
OPTIONS = {"deadline": "realtime", "cpu-used": "8", "crf": "32", "b": "0", "row-mt": "1"}


def hwc_frames(frames: np.ndarray, layout: str) -> np.ndarray:
    """``frames`` (time first, then ``layout``: ``"HWC"`` or ``"CHW"``) as contiguous ``[T, H, W, C]``."""
    return np.ascontiguousarray(frames if layout == "HWC" else frames.transpose(0, 2, 3, 1))


def encode_webm(frames: np.ndarray, fps: float) -> bytes:
    """``[T, H, W, 3]`` uint8 RGB frames as a WebM VP9 video at ``fps`` frames per second (any width and height)."""
    try:
        import av
    except ImportError as exc:
        raise MissingDependencyError("camera videos need PyAV: pip install 'episodelake[viewer]'") from exc
    from fractions import Fraction

    buf = io.BytesIO()
    with av.open(buf, "w", format="webm") as out:
        stream = out.add_stream(CODEC, rate=Fraction(fps).limit_denominator(1000), options=OPTIONS)
        assert isinstance(stream, av.VideoStream)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        for image in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        out.mux(stream.encode())
    return buf.getvalue()


class VideoCache:
    """Encoded videos as files in a private temporary folder, each encoded once even under concurrent requests.

    ``get(key, frames)`` returns the file of ``key`` (a tuple naming episode and
    field), calling ``frames()`` and encoding only the first time. ``close()``
    removes the folder.
    """

    def __init__(self, fps: float) -> None:
        self.fps = fps
        self._dir = tempfile.TemporaryDirectory(prefix="episodelake-viewer-")
        self._locks: dict[tuple, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, key: tuple[int, str], frames: Callable[[], np.ndarray]) -> str:
        path = os.path.join(self._dir.name, f"{key[0]}-{key[1].replace('/', '~')}.webm")
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if not os.path.exists(path):
                data = encode_webm(frames(), self.fps)
                with open(path + ".tmp", "wb") as f:
                    f.write(data)
                os.replace(path + ".tmp", path)
        return path

    def close(self) -> None:
        self._dir.cleanup()
