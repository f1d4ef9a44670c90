"""Tensor codecs: their names, their Zarr v3 metadata, and decoding one stored chunk.

Two kinds, chosen per field (:class:`~episodelake.schema.FieldSpec`):

* **Lossless** ``compression``: ``"zstd"``, or Blosc as ``"blosc-<cname>[-<shuffle>]"``
  with ``cname`` in lz4, lz4hc, zstd and ``shuffle`` in shuffle (default),
  bitshuffle, noshuffle. Standard Zarr v3 codecs: TensorStore writes and
  reads them, and so does zarr-python.
* **Lossy** ``codec`` (``"jpeg"``, ``"webp"``, ``"avif"``) with a ``quality``:
  one compressed image per Zarr inner chunk (a chunk is one frame), inner
  chunks packed into ``sharding_indexed`` shards. TensorStore cannot decode
  images, so these arrays are written shard by shard through its key-value
  store and decoded here with ``imagecodecs`` (which releases the GIL, so a
  thread pool decodes frames in parallel). The codec entries are named
  ``imagecodecs_<codec>``; zarr-python reads them after :func:`register_zarr_codecs`.
* **Exact image** ``codec`` (``"webp-lossless"``, ``"jpegxl-lossless"``), no
  quality: the same one-image-per-inner-chunk path, lossless; reads return the
  written frames bit for bit. Their encoder settings are fixed
  (:data:`EXACT_SETTINGS`), chosen exact: libjxl 0.11.2 at effort 1 returned a
  wrong pixel, so effort 1 is never used. Entries ``imagecodecs_webp_lossless``
  and ``imagecodecs_jpegxl_lossless``.
* **Video** ``codec`` (``"video:h264"``, ``"video:av1"``) with a ``quality``:
  one short closed GOP per inner chunk of ``chunk_rows`` consecutive frames
  (default :data:`VIDEO_GOP`), encoded with PyAV (libx264 / libsvtav1) in
  yuv420p and decoded (FFmpeg's h264 / libdav1d, one thread per chunk, the
  pool decoding chunks in parallel) back to RGB ``uint8``. A chunk's bytes
  are one or more *segments* (:func:`encode_segment`): appending to a partly
  filled chunk adds a segment and keeps the earlier frames' bytes. The codec
  entry is ``episodelake_video``; zarr-python reads it after :func:`register_zarr_codecs`.

:func:`chunk_decoder` is the one decode function of every chain we write:
forked processes (no TensorStore) and lossy arrays read through it.
"""

from __future__ import annotations

import importlib
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Protocol

import numpy as np

from . import lifecycle
from .errors import MissingDependencyError

BLOSC_NAMES = ("lz4", "lz4hc", "zstd")
SHUFFLES = ("shuffle", "bitshuffle", "noshuffle")
LOSSLESS = ("zstd", *(f"blosc-{c}{s}" for c in BLOSC_NAMES for s in ("", "-bitshuffle", "-noshuffle")))
IMAGE = ("jpeg", "webp", "avif")
VIDEO = ("video:h264", "video:av1")
LOSSY = (*IMAGE, *VIDEO)
EXACT_IMAGE = ("webp-lossless", "jpegxl-lossless")
FRAME_CODECS = (*LOSSY, *EXACT_IMAGE)  # every ``codec=``: stored by frames.FrameArray
# encoder settings of the exact image codecs, fixed: each was checked exact over thousands of noisy, clean and
# edge-valued frames (tests/test_image_codecs.py). WebP method 2 / level 50 stores 1.6% more than method 4
# at 4x its encode speed; JPEG-XL effort 2 is smaller and faster than effort 3 on noisy frames
# (benchmarks/bench_lossless.py)
EXACT_SETTINGS: dict[str, dict[str, Any]] = {
    "webp-lossless": {"method": 2, "level": 50},
    "jpegxl-lossless": {"effort": 2},
}
DEFAULT_QUALITY = {"jpeg": 90, "webp": 90, "avif": 80, "video:h264": 60, "video:av1": 55}
# channel counts each image codec stores (frames are H x W x C uint8)
CHANNELS = {"jpeg": (1, 3), "webp": (3, 4), "avif": (1, 3, 4), "video:h264": (3,), "video:av1": (3,)}
CHANNELS |= {"webp-lossless": (1, 3, 4), "jpegxl-lossless": (1, 3, 4)}  # webp-lossless: grey stored as R = G = B
# Declared loss: the PSNR (dB) each codec keeps at least at a quality (first row whose threshold the quality
# reaches) on rendered-like frames (smooth shading and flat objects, not noise) of at least 32 x 32 pixels.
PSNR_FLOORS = {
    # images: about 1.5 dB under the worst of several hundred random rendered-like frames of 32-40 px per bucket
    # (the smallest frames are the worst; hypothesis broke tighter floors, e.g. webp at quality 1, 32 x 32: 19.4 dB)
    "jpeg": ((90, 30.0), (75, 24.5), (30, 21.5), (10, 18.5), (1, 15.5)),
    "webp": ((30, 20.0), (1, 17.0)),
    "avif": ((75, 30.5), (50, 25.0), (30, 21.5), (10, 18.0), (1, 18.0)),
    # video: yuv420p halves chroma resolution, which caps small frames of saturated discs near 22 dB at any
    # quality (rendered 96 x 96 MuJoCo frames keep 35-40 dB, see docs/camera.md)
    "video:h264": ((75, 21.0), (50, 20.5), (30, 20.0), (10, 18.0), (1, 17.0)),
    "video:av1": ((75, 21.0), (50, 20.5), (30, 20.5), (10, 20.0), (1, 18.5)),
}
VIDEO_GOP = 16  # frames per video chunk (one closed GOP) by default
VIDEO_MIN_SIDE = 8  # smallest frame side the video encoders take (odd sides are padded to even for yuv420p)
# (encoder, decoder, largest crf, encoder options): quality q in [1, 100] is crf round((100 - q) * largest / 99)
_VIDEO = {
    "video:h264": ("libx264", "h264", 51, {"preset": "medium"}),
    "video:av1": ("libsvtav1", "libdav1d", 63, {"preset": "6"}),
}
_SEGMENT = struct.Struct("<4sIII")  # magic, first frame in the chunk, frames, packets
_MAGIC = b"ELV1"
AVIF_SPEED = 8  # libavif speed 0 (slowest, smallest) .. 10: 8 keeps writes near real time

_BLOSC_LEVEL = {"lz4": 5, "lz4hc": 5, "zstd": 3}


def optional(module: str) -> Any:
    """Import ``module`` (``imagecodecs``, ``google_crc32c``), or :class:`MissingDependencyError` naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(f"camera codecs need {module}: pip install 'episodelake[camera]'") from exc


def lossless_codecs(compression: str | None, itemsize: int) -> list[dict[str, Any]]:
    """The Zarr v3 bytes-to-bytes codecs of ``compression`` (None: none); ``ValueError`` for an unknown name."""
    if compression is None:
        return []
    if compression == "zstd":
        return [{"name": "zstd", "configuration": {"level": 3}}]
    parts = compression.split("-")
    if compression not in LOSSLESS or parts[0] != "blosc":
        raise ValueError(f"compression must be None or one of {LOSSLESS}, got {compression!r}")
    cname = parts[1]
    shuffle = parts[2] if len(parts) > 2 else "shuffle"
    conf = {"cname": cname, "clevel": _BLOSC_LEVEL[cname], "shuffle": shuffle, "typesize": itemsize, "blocksize": 0}
    return [{"name": "blosc", "configuration": conf}]


def check_lossy(
    codec: str, quality: int | None, shape: Sequence[int], layout: str | None, dtype: np.dtype
) -> int | None:
    """The quality to use for ``codec`` on frames of ``shape`` (None for an exact image codec, which takes
    none); ``ValueError`` saying what does not fit."""
    if codec not in FRAME_CODECS:
        raise ValueError(f"codec must be one of {FRAME_CODECS}, got {codec!r}")
    if dtype != np.uint8:
        raise ValueError(f"codec {codec!r} stores uint8 images, the field is {dtype}")
    if len(shape) != 3 or layout not in ("HWC", "CHW"):
        raise ValueError(f"codec {codec!r} needs a 3-D image field with layout 'HWC' or 'CHW' (shape {tuple(shape)})")
    channels = shape[layout.index("C")]
    if channels not in CHANNELS[codec]:
        raise ValueError(f"codec {codec!r} stores {CHANNELS[codec]} channels, the field has {channels}")
    if codec in EXACT_IMAGE:
        if quality is not None:
            raise ValueError(f"codec {codec!r} is lossless and takes no quality, got quality={quality!r}")
        return None
    q = DEFAULT_QUALITY[codec] if quality is None else quality
    if isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= 100:
        raise ValueError(f"quality must be an int in [1, 100], got {quality!r}")
    if codec in VIDEO and min(shape[i] for i, a in enumerate(layout) if a != "C") < VIDEO_MIN_SIDE:
        raise ValueError(f"codec {codec!r} needs frames of at least {VIDEO_MIN_SIDE} x {VIDEO_MIN_SIDE} pixels")
    return q


def crf(codec: str, quality: int) -> int:
    """The encoder's constant rate factor for video ``codec`` at ``quality`` (100: crf 0, 1: the largest crf)."""
    return round((100 - quality) * _VIDEO[codec][2] / 99)


def psnr_floor(codec: str, quality: int) -> float:
    """The declared PSNR floor (dB) of ``codec`` at ``quality`` (see :data:`PSNR_FLOORS`)."""
    return next(floor for threshold, floor in PSNR_FLOORS[codec] if quality >= threshold)


def psnr(reference: np.ndarray, decoded: np.ndarray) -> float:
    """Peak signal-to-noise ratio (dB) of 8-bit ``decoded`` against ``reference`` (inf when equal)."""
    mse = float(np.mean((reference.astype(np.float64) - decoded.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * float(np.log10(255.0**2 / mse))


def lossy_codec(codec: str, quality: int | None, layout: str) -> dict[str, Any]:
    """The Zarr v3 array-to-bytes codec entry of one inner chunk of a ``codec=`` field (images: ``[1, *shape]``)."""
    if codec in EXACT_IMAGE:
        return {"name": _entry(codec), "configuration": {**EXACT_SETTINGS[codec], "layout": layout}}
    if codec in VIDEO:
        assert quality is not None
        encoder, decoder = _VIDEO[codec][:2]
        conf = {"codec": codec[len("video:") :], "encoder": encoder, "decoder": decoder, "quality": quality}
        conf |= {"crf": crf(codec, quality), "pix_fmt": "yuv420p", "layout": layout, "format": "segments-v1"}
        return {"name": "episodelake_video", "configuration": conf}
    return {"name": f"imagecodecs_{codec}", "configuration": {"quality": quality, "layout": layout}}


def _av() -> Any:
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its configuration at every encoder start otherwise
    return optional("av")


def encode_segment(codec: str, quality: int, layout: str, first: int, frames: np.ndarray) -> bytes:
    """Consecutive uint8 RGB ``frames`` (in ``layout``) as one independently decodable video segment whose
    first frame is frame ``first`` of its chunk: a header, the packets' sizes, the packets (one closed GOP)."""
    av = _av()
    from fractions import Fraction

    hwc = frames.transpose(0, 2, 3, 1) if layout == "CHW" else frames
    h, w = hwc.shape[1:3]
    if h % 2 or w % 2:  # yuv420p needs even sides: repeat the last row/column, cropped again on decode
        hwc = np.pad(hwc, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    encoder, _, _, options = _VIDEO[codec]
    ctx = av.CodecContext.create(encoder, "w")
    ctx.width, ctx.height, ctx.pix_fmt = hwc.shape[2], hwc.shape[1], "yuv420p"
    ctx.time_base, ctx.framerate, ctx.gop_size = Fraction(1, 30), Fraction(30, 1), max(1, len(hwc))
    ctx.thread_count = 1  # chunks are encoded in parallel by the pool
    ctx.options = {**options, "crf": str(crf(codec, quality))}
    packets: list[bytes] = []
    for i, frame in enumerate(hwc):
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        vf.pts = i
        packets += [bytes(p) for p in ctx.encode(vf)]
    packets += [bytes(p) for p in ctx.encode(None)]
    sizes = np.array([len(p) for p in packets], "<u4").tobytes()
    return _SEGMENT.pack(_MAGIC, first, len(hwc), len(packets)) + sizes + b"".join(packets)


class ChunkDecoder(Protocol):
    """Decodes one stored inner chunk (see :func:`chunk_decoder`)."""

    def __call__(self, blob: bytes, stop: int | None = None) -> np.ndarray:
        """The chunk's rows from row 0 as an array of its shape but the first axis: at least its first ``stop``
        rows (all of them when None); only a video chunk stops early (its frames after ``stop`` undecoded), so
        the length of the result, not ``stop``, says which rows it holds."""
        ...


# (pid, thread) -> that thread's video decoding parts. Never freed: a thread-local would be freed in a forked
# child for the parent's pool threads, and freeing a scaler whose slice threads did not survive fork hangs.
_DECODING: dict[tuple[int, int], _VideoParts] = {}


class _VideoParts:
    """One thread's reusable video decoding parts, so a chunk opens nothing.

    * decoders by (name, height, width): a chunk is one closed GOP, so after
      its frames are drained (or decoding stopped at the last frame wanted)
      a flushed decoder decodes the next chunk as a fresh one would (opening
      libdav1d per chunk cost about as much as decoding a small chunk's
      frames);
    * YUV -> RGB converters by frame size: a converter keeps its scaler
      while the size stays (a new size rebuilds it, several times one
      frame's conversion), and converts on one thread (the pool already
      converts chunks in parallel; swscale's slice threads cost more than
      they save on small frames). Its frames are bit for bit those of
      ``VideoFrame.to_ndarray(format="rgb24")``.
    """

    def __init__(self, av: Any) -> None:
        from av.video.reformatter import VideoReformatter

        self.av = av
        self.converter = VideoReformatter
        self.decoders: dict[tuple[str, int, int], Any] = {}
        self.converters: dict[tuple[int, int], Any] = {}

    def decode(self, name: str, h: int, w: int, packets: Iterator[memoryview], want: int) -> list[Any]:
        """The first ``want`` frames of one closed GOP's ``packets`` (fewer only if the GOP holds fewer),
        packets fed only until that many are out; the decoder is dropped if they fail to decode.

        Stopping early returns the same frames as a whole decode: a frame
        depends only on the packets before it in decode order, and the
        decoder is flushed either way before the next GOP.
        """
        key = (name, h, w)
        ctx = self.decoders.pop(key, None)
        if ctx is None:
            ctx = self.av.CodecContext.create(name, "r")
            ctx.thread_count = 1  # chunks are decoded in parallel by the pool
        frames: list[Any] = []
        for packet in packets:
            frames += ctx.decode(self.av.Packet(packet))
            if len(frames) >= want:
                break
        else:
            frames += ctx.decode(None)  # drains the frames held back for reordering
        ctx.flush_buffers()  # out of draining (or mid-GOP): ready for the next GOP
        self.decoders[key] = ctx
        return frames[:want]

    def to_rgb(self, frames: list[Any], out: np.ndarray) -> None:
        """Write decoded ``frames`` (of the size of the chunk's decoder) as RGB into ``out`` (``len(frames)``
        frames, cropped to its height and width)."""
        for frame, dst in zip(frames, out, strict=True):
            reformat = self.converters.get((frame.height, frame.width))
            if reformat is None:
                reformat = self.converters[frame.height, frame.width] = self.converter().reformat
            dst[:] = reformat(frame, format="rgb24", threads=1).to_ndarray()[: dst.shape[0], : dst.shape[1]]


def _video_parts(av: Any) -> _VideoParts:
    """This thread's :class:`_VideoParts`."""
    key = (os.getpid(), threading.get_ident())
    if key not in _DECODING:
        _DECODING[key] = _VideoParts(av)
    return _DECODING[key]


def _video_decoder(conf: dict[str, Any], chunk_shape: tuple[int, ...]) -> ChunkDecoder:
    av = _av()
    layout = conf.get("layout", "HWC")
    decoder = {"h264": "h264", "av1": "libdav1d"}.get(conf.get("codec", ""))
    if decoder is None:
        raise ValueError(f"video codec {conf.get('codec')!r} is not episodelake's")
    frame_shape = chunk_shape[1:] if layout == "HWC" else (*chunk_shape[2:], chunk_shape[1])
    h, w = frame_shape[:2]

    def segment(blob: memoryview, at: int, out: np.ndarray) -> int:
        """Decode the segment at byte ``at`` into the frames of ``out`` (the chunk's first ``len(out)``) it
        holds, stopping at the last of them; return where the next segment starts."""
        magic, first, n, count = _SEGMENT.unpack_from(blob, at)
        if magic != _MAGIC or first + n > chunk_shape[0]:
            raise ValueError(f"not a video segment (frames {first}..{first + n} of a {chunk_shape[0]}-frame chunk)")
        at += _SEGMENT.size + 4 * count
        ends = (at + np.cumsum(np.frombuffer(blob, "<u4", count, at - 4 * count), dtype=np.int64)).tolist()
        want = min(n, len(out) - first)
        if want > 0:
            parts = _video_parts(av)
            packets = (blob[a:b] for a, b in zip([at, *ends][:-1], ends, strict=True))
            frames = parts.decode(decoder, h + h % 2, w + w % 2, packets, want)
            if len(frames) != want:
                raise ValueError(f"video segment decodes to {len(frames)} frames, expected {want}")
            if any((f.height, f.width) != (h + h % 2, w + w % 2) for f in frames):
                raise ValueError(f"video segment decodes to frames of another size than {h} x {w}")
            parts.to_rgb(frames, out[first : first + want])
        return ends[-1] if ends else at

    def run(blob: bytes, stop: int | None = None) -> np.ndarray:
        rows = chunk_shape[0] if stop is None else min(stop, chunk_shape[0])
        out = np.zeros((rows, *frame_shape), np.uint8)
        view, at = memoryview(blob), 0
        while at < len(view):  # later segments (appended) overwrite frames they share with earlier ones
            at = segment(view, at, out)
        return out.transpose(0, 3, 1, 2) if layout == "CHW" else out

    return run


def _entry(codec: str) -> str:
    """The Zarr codec entry name of image ``codec``."""
    return "imagecodecs_" + codec.replace("-", "_")


def encode_frame(codec: str, quality: int | None, layout: str, frame: np.ndarray) -> bytes:
    """One uint8 frame (in ``layout``) as ``codec`` bytes (``quality``: None for the exact codecs)."""
    imagecodecs = optional("imagecodecs")
    hwc = np.ascontiguousarray(frame.transpose(1, 2, 0) if layout == "CHW" else frame)
    if codec == "webp-lossless":
        rgb = np.repeat(hwc, 3, axis=2) if hwc.shape[2] == 1 else hwc  # libwebp has no grey images
        return bytes(imagecodecs.webp_encode(rgb, lossless=True, **EXACT_SETTINGS[codec]))
    if codec == "jpegxl-lossless":
        grey = hwc[:, :, 0] if hwc.shape[2] == 1 else hwc
        return bytes(imagecodecs.jpegxl_encode(grey, lossless=True, numthreads=1, **EXACT_SETTINGS[codec]))
    if hwc.shape[2] == 1 and codec == "jpeg":
        hwc = hwc[:, :, 0]
    if codec == "jpeg":
        return bytes(imagecodecs.jpeg8_encode(hwc, level=quality, subsampling="444"))
    if codec == "webp":
        return bytes(imagecodecs.webp_encode(hwc, level=quality, lossless=False, method=4))
    return bytes(imagecodecs.avif_encode(hwc, level=quality, speed=AVIF_SPEED, numthreads=1))


def _image_decoder(codec: str, layout: str, shape: tuple[int, ...]) -> Callable[[bytes], np.ndarray]:
    imagecodecs = optional("imagecodecs")
    decoders: dict[str, Callable[..., np.ndarray]] = {
        "jpeg": imagecodecs.jpeg8_decode,
        "webp": imagecodecs.webp_decode,
        "avif": partial(imagecodecs.avif_decode, numthreads=1),
        "webp-lossless": imagecodecs.webp_decode,
        "jpegxl-lossless": partial(imagecodecs.jpegxl_decode, numthreads=1),
    }
    channels = shape[-1] if layout == "HWC" else shape[1]
    decode = decoders[codec]
    if codec.startswith("webp") and channels == 4:  # libwebp drops an all-opaque alpha channel: ask for it back
        decode = partial(imagecodecs.webp_decode, hasalpha=True)

    def run(blob: bytes) -> np.ndarray:
        img = decode(blob)
        if img.ndim == 2:
            img = img[:, :, None]
        elif channels == 1 and img.shape[2] > 1:  # a grey frame stored as RGB (webp-lossless)
            img = img[:, :, :1]
        return img.transpose(2, 0, 1) if layout == "CHW" else img

    return run


def chunk_decoder(codecs: Sequence[dict[str, Any]], chunk_shape: tuple[int, ...], dtype: np.dtype) -> ChunkDecoder:
    """Decoder of one inner chunk stored with the Zarr v3 ``codecs`` (what we write): bytes -> ``chunk_shape``
    array, or with ``stop`` its first rows (:class:`ChunkDecoder`).

    ``ValueError`` for a chain we never write (the message names it). The
    decoder raises ``ValueError`` for bytes that do not decode to the chunk.
    """
    names = [c.get("name") for c in codecs]
    little = dtype.newbyteorder("<")
    want = int(np.prod(chunk_shape)) * dtype.itemsize
    if names == ["episodelake_video"]:
        video = _video_decoder(codecs[0].get("configuration") or {}, chunk_shape)

        def chunk(blob: bytes, stop: int | None = None) -> np.ndarray:
            try:
                return video(blob, stop)
            except Exception as exc:  # PyAV raises its own error types, struct and NumPy theirs for short bytes
                raise ValueError(f"undecodable video chunk: {exc}") from exc

        return chunk
    if len(names) == 1 and str(names[0]).startswith("imagecodecs_"):
        conf = codecs[0].get("configuration") or {}
        codec = next((c for c in (*IMAGE, *EXACT_IMAGE) if _entry(c) == names[0]), None)
        if codec is None:
            raise ValueError(f"codecs {names} are not episodelake's")
        image = _image_decoder(codec, conf.get("layout", "HWC"), chunk_shape)

        def lossy(blob: bytes, stop: int | None = None) -> np.ndarray:
            try:
                frame = image(blob)
            except Exception as exc:  # imagecodecs raises its own per-codec error types
                raise ValueError(f"undecodable frame: {exc}") from exc
            if frame.shape != chunk_shape[1:]:
                raise ValueError(f"frame decodes to shape {frame.shape}, expected {chunk_shape[1:]}")
            return frame[None]

        return lossy
    if not names or names[0] != "bytes" or len(names) > 2 or names[1:] not in ([], ["zstd"], ["blosc"]):
        raise ValueError(f"codecs {names} are not episodelake's")

    inflate: Callable[[bytes], Any] | None = None
    if names[1:] == ["zstd"]:
        import pyarrow as pa

        zstd = pa.Codec("zstd")
        inflate = partial(zstd.decompress, decompressed_size=want)
    elif names[1:] == ["blosc"]:
        inflate = partial(optional("imagecodecs").blosc_decode, numthreads=1)

    def lossless(blob: bytes, stop: int | None = None) -> np.ndarray:
        raw: Any = blob
        if inflate is not None:
            try:
                raw = inflate(blob)
            except Exception as exc:  # pyarrow and imagecodecs raise their own error types
                raise ValueError(f"undecodable chunk: {exc}") from exc
        if len(raw) != want:
            raise ValueError(f"chunk holds {len(raw)} bytes, expected {want}")
        return np.frombuffer(raw, little).reshape(chunk_shape)

    return lossless


class FrameShard:
    """The decoded frames of one shard of one-frame chunks (image codecs), filled in as frames are decoded: one
    decoded-chunk cache entry per shard, so a warm segment copies its frames in one slice, not one per frame."""

    def __init__(self, frames: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.frames = np.empty((frames, *shape), dtype)
        self.filled = np.zeros(frames, bool)  # set after its frame is written: a reader never sees a partial one
        self.nbytes = self.frames.nbytes


class ChunkCache:
    """Decoded chunks by key, the least recently used dropped past ``limit`` bytes (thread-safe).

    One per process (:data:`decoded_cache`): a warm random sampler of a
    compressed field then copies decoded rows instead of decoding them again,
    as a raw field's reads copy from the page cache. Keys name immutable
    bytes (see ``PlainArray``), so an entry never goes stale.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.nbytes = 0
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable | None) -> Any:
        """The entry under ``key`` (a decoded chunk, or a :class:`FrameShard`), or None."""
        if key is None:
            return None
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: Hashable | None, chunk: np.ndarray | FrameShard) -> None:
        if key is None or chunk.nbytes > self.limit:
            return
        if isinstance(chunk, np.ndarray):
            chunk.flags.writeable = False  # shared by every later batch
        with self._lock:
            old = self._items.pop(key, None)
            self.nbytes += chunk.nbytes - (0 if old is None else old.nbytes)
            self._items[key] = chunk
            while self.nbytes > self.limit:
                self.nbytes -= self._items.popitem(last=False)[1].nbytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = 0


# bytes of decoded chunks a process keeps (``EPISODELAKE_DECODED_CACHE_MB``, default 256; 0 turns it off)
decoded_cache = ChunkCache(int(float(os.environ.get("EPISODELAKE_DECODED_CACHE_MB", "256")) * (1 << 20)))

_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()


def codec_pool() -> ThreadPoolExecutor:
    """The process's thread pool for encoding and decoding chunks (one per process: a forked child builds its own)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1)), "episodelake-decode"))
        return _POOL[1]


def _reset_after_fork() -> None:
    global _POOL_LOCK
    _POOL_LOCK = threading.Lock()  # a parent thread may have held it at fork time
    decoded_cache._lock = threading.Lock()


lifecycle.after_fork("codecs", _reset_after_fork)


def register_zarr_codecs() -> None:
    """Register the frame codecs (lossy and exact images, video) with zarr-python 3 so ``zarr.open_array``
    reads episodelake's ``codec=`` arrays.

    Requires ``zarr>=3``; reading only (zarr-python cannot write them).
    """
    from dataclasses import dataclass

    from zarr.abc.codec import ArrayBytesCodec
    from zarr.core.buffer import default_buffer_prototype
    from zarr.registry import register_codec

    for entry in [*(_entry(c) for c in (*IMAGE, *EXACT_IMAGE)), "episodelake_video"]:

        @dataclass(frozen=True)
        class _Frames(ArrayBytesCodec):
            configuration: tuple[tuple[str, Any], ...] = ()
            name = entry
            is_fixed_size = False

            @classmethod
            def from_dict(cls, data: dict[str, Any]) -> Any:
                return cls(tuple(sorted((data.get("configuration") or {}).items())))

            def to_dict(self) -> dict[str, Any]:
                return {"name": self.name, "configuration": dict(self.configuration)}

            async def _decode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
                decode = chunk_decoder([self.to_dict()], tuple(chunk_spec.shape), np.dtype("uint8"))
                return default_buffer_prototype().nd_buffer.from_numpy_array(decode(chunk_bytes.to_bytes()))

            async def _encode_single(self, chunk_array: Any, chunk_spec: Any) -> Any:
                raise NotImplementedError("episodelake writes frame arrays itself")

            def compute_encoded_size(self, input_byte_length: int, chunk_spec: Any) -> int:
                raise NotImplementedError

        register_codec(entry, _Frames)
