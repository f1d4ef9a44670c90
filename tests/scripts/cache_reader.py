"""Sample an object-store dataset through a disk cache; report what was downloaded (tests/test_s3_speed.py).

``python tests/scripts/cache_reader.py URL CACHE_DIR BATCHES SEED`` with the
storage options as JSON in ``CACHE_READER_OPTIONS``: opens the dataset with
``cache_dir=CACHE_DIR``, draws ``BATCHES`` segment_stream batches (batch 8,
length 4, seed SEED) and prints one JSON line: the CRC-32 of every batch's
camera, and the fetcher's requests, bytes received, cache hits and corrupt
entries found.
"""

from __future__ import annotations

import json
import os
import sys
import zlib

import numpy as np

import episodelake as el
from episodelake.storage import fetch


def main() -> None:
    url, cache_dir, batches, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    opts = json.loads(os.environ["CACHE_READER_OPTIONS"])
    ds = el.Dataset.open(url, storage_options=opts, read_only=True, cache_dir=cache_dir)
    # no prefetch: exactly BATCHES batches are read, so two runs read the same bytes
    stream = iter(ds.segment_stream(4, batch_size=8, seed=seed, prefetch=0))
    crcs = [zlib.crc32(np.ascontiguousarray(next(stream).all_obs["camera"]).data) for _ in range(batches)]
    f = fetch.fetcher(ds.location)
    assert f.disk is not None
    stats = {"requests": f.stats.requests, "bytes": f.stats.bytes, "hits": f.stats.hits, "corrupt": f.disk.corrupt}
    print(json.dumps({"crcs": crcs, **stats}))


if __name__ == "__main__":
    main()
