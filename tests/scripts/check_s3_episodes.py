"""Reopen an S3 dataset in a fresh process and check it holds exactly the first N reference episodes.

Usage: ``python -m tests.scripts.check_s3_episodes URL OPTIONS_JSON SEED COUNT N``: the dataset at
``URL`` must have ``N`` episodes, equal byte for byte to the first ``N`` of ``make_episodes(SEED, COUNT)``
(generated here again, independently of what was written). Exit status 0 when it does.
"""

from __future__ import annotations

import json
import sys

from tests.test_s3 import assert_episode, make_episodes

import episodelake as el


def main(url: str, options: str, seed: str, count: str, n: str) -> None:
    eps = make_episodes(int(seed), int(count))[: int(n)]
    ds = el.Dataset.open(url, storage_options=json.loads(options), read_only=True)
    assert len(ds) == len(eps), f"{len(ds)} episodes, want {len(eps)}"
    assert not ds.maintenance.validate().problems, ds.maintenance.validate().problems
    for i, raw in enumerate(eps):
        assert_episode(ds.episode(i), raw)
    print(f"ok {len(eps)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
