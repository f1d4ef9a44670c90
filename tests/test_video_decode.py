"""The video chunk decoder against an independent per-frame PyAV decode: each thread's reused decoders and
converters, and decodes that stop at the last frame a read needs, return exactly the frames a fresh decoder
converting frame by frame does, chunk after chunk of any size, segments appended included; the decoded-chunk
cache keeps a chunk's first frames as just those."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.core import codecs
from episodelake.storage.location import resolve
from episodelake.storage.store import Store

from .test_codecs import camera_schema, episode, smooth_frames, write


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
def test_reused_decoders_and_converters_equal_a_fresh_per_frame_decode(codec, quality, sizes, n, first, seed):
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


@settings(max_examples=25, deadline=None)
@given(
    codec=st.sampled_from(codecs.VIDEO),
    quality=st.integers(1, 100),
    h=st.integers(8, 40),
    w=st.integers(8, 40),
    layout=st.sampled_from(["HWC", "CHW"]),
    n=st.integers(1, 12),
    first=st.integers(0, 4),
    appended=st.booleans(),
    stops=st.lists(st.integers(0, 18), min_size=1, max_size=4),
    seed=st.integers(0, 2**31),
)
def test_partial_decodes_equal_the_first_frames_of_a_fresh_per_frame_decode(
    codec, quality, h, w, layout, n, first, appended, stops, seed
):
    """A chunk decoded only up to frame ``stop`` (B-frames held back for reordering included: h264) returns
    exactly that many frames, each as a fresh whole decode has it; the thread's decoder, stopped mid-GOP, then
    decodes whole chunks (and other stops) exactly again."""
    frames = smooth_frames(np.random.default_rng(seed), first + n, h, w)
    store = (lambda f: f.transpose(0, 3, 1, 2).copy()) if layout == "CHW" else (lambda f: f)
    blob = codecs.encode_segment(codec, quality, layout, 0, store(frames))
    if appended:  # a second segment from frame `first` on: a stop inside either decodes what it needs of both
        blob += codecs.encode_segment(codec, quality, layout, first, store(frames[first:][:, ::-1].copy()))
    R = first + n
    want = store(reference(codec, blob, h, w, R))
    shape = want.shape[1:]
    decode = codecs.chunk_decoder([codecs.lossy_codec(codec, quality, layout)], (R, *shape), np.dtype("uint8"))
    for stop in [*stops, None, *stops]:
        got = decode(blob, stop)
        rows = R if stop is None else min(stop, R)
        assert got.shape == (rows, *shape)
        np.testing.assert_array_equal(got, want[:rows])


def test_the_decoded_cache_never_serves_a_chunks_first_frames_as_the_whole_chunk(tmp_path, monkeypatch):
    """Rows from a chunk's start only decode that far and the cache keeps just those frames; a later read past
    them decodes the chunk again (up to its last row read) and returns what a read with nothing cached does."""
    frames = smooth_frames(np.random.default_rng(5), 24, 16, 16)
    path = str(tmp_path / "ds")
    ds = write(path, camera_schema((16, 16, 3), codec="video:h264", chunk_rows=8), [episode(frames)])
    store = Store.open(resolve(path, {}))
    f, writer = store.schema["observation/camera"], str(ds.snapshot().index["writer"][0])
    cache = codecs.ChunkCache(64 << 20)
    monkeypatch.setattr(codecs, "decoded_cache", cache)
    whole = store.open_array(writer, f).read(0, 24).result()  # every chunk decoded whole
    cache.clear()
    arr = store.open_array(writer, f)
    np.testing.assert_array_equal(arr.read(0, 3).result(), whole[:3])
    assert cache.nbytes == 3 * f.step_bytes  # chunk 0's first 3 frames, no more
    np.testing.assert_array_equal(arr.read(2, 13).result(), whole[2:13])  # chunk 0 again, whole; chunk 1 to row 13
    assert cache.nbytes == (8 + 5) * f.step_bytes
    np.testing.assert_array_equal(arr.read(0, 8).result(), whole[:8])  # a hit: nothing decoded, nothing added
    assert cache.nbytes == (8 + 5) * f.step_bytes
    np.testing.assert_array_equal(arr.read(9, 24).result(), whole[9:24])
    assert cache.nbytes == 24 * f.step_bytes
    np.testing.assert_array_equal(el.Dataset.open(path).episode(0).read().all_obs, whole)
