"""The video chunk decoder against an independent per-frame PyAV decode: each thread's reused decoder and its
one colour conversion per segment (frames stacked into one tall yuv420p frame) return exactly the frames a
fresh decoder converting frame by frame does, chunk after chunk of any size, segments appended included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from episodelake.core import codecs

from .test_codecs import smooth_frames


def reference(codec: str, blob: bytes, h: int, w: int, frames: int) -> np.ndarray:
    """The chunk decoded the plain way: a fresh decoder per segment, ``to_ndarray(format="rgb24")`` per frame."""
    import av

    out = np.zeros((frames, h, w, 3), np.uint8)
    at = 0
    while at < len(blob):
        _, first, n, count = codecs._SEGMENT.unpack_from(blob, at)
        at += codecs._SEGMENT.size
        sizes = np.frombuffer(blob, "<u4", count, at).tolist()
        at += 4 * count
        ctx = av.CodecContext.create({"video:h264": "h264", "video:av1": "libdav1d"}[codec], "r")
        got = []
        for size in [*sizes, None]:
            packet = None if size is None else av.Packet(blob[at : at + size])
            at += size or 0
            got += [f.to_ndarray(format="rgb24")[:h, :w] for f in ctx.decode(packet)]
        out[first : first + n] = np.stack(got)
    return out


@settings(max_examples=20, deadline=None)
@given(
    codec=st.sampled_from(codecs.VIDEO),
    quality=st.integers(1, 100),
    sizes=st.lists(st.tuples(st.integers(8, 40), st.integers(8, 40)), min_size=1, max_size=3),
    n=st.integers(1, 9),
    first=st.integers(0, 4),
    seed=st.integers(0, 2**31),
)
def test_reused_decoders_and_tall_conversion_equal_a_fresh_per_frame_decode(codec, quality, sizes, n, first, seed):
    rng = np.random.default_rng(seed)
    for h, w in [*sizes, sizes[0]]:  # back to the first size: a decoder kept from earlier chunks is reused
        frames = smooth_frames(rng, first + n, h, w)
        blob = codecs.encode_segment(codec, quality, "HWC", 0, frames)
        blob += codecs.encode_segment(codec, quality, "HWC", first, frames[first:][:, ::-1].copy())
        chain = [codecs.lossy_codec(codec, quality, "HWC")]
        decode = codecs.chunk_decoder(chain, (first + n, h, w, 3), np.dtype("uint8"))
        want = reference(codec, blob, h, w, first + n)
        np.testing.assert_array_equal(decode(blob), want)
        np.testing.assert_array_equal(decode(blob), want)  # the same chunk again, on the flushed decoder
