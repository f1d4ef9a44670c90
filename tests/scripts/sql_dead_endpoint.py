"""In a fresh process: queries of an S3 dataset whose endpoint dies after the first query raise StorageError.

``python -m tests.scripts.sql_dead_endpoint URL OPTIONS_JSON`` (the server's storage options) prints one
``<call> StorageError <dataset>`` line per call and exits 0, or exits 1 naming the call that did not.
"""

from __future__ import annotations

import json
import sys

from tests.fault_proxy import FaultProxy

import episodelake as el

TIMEOUTS = {
    "connect_timeout": 2,
    "read_timeout": 5,
    "max_retries": 2,
    "initial_delay": 0.01,
    "max_delay": 0.1,
    "deadline": 15,
}


def main(url: str, options: dict) -> int:
    with FaultProxy(options["endpoint_url"]) as proxy:
        reader = el.Dataset.open(url, storage_options={**proxy.storage_options(options), "timeouts": TIMEOUTS})
        assert reader.sql("SELECT count(*) FROM episodes").fetchall() == [(5,)]
        pending = reader.sql("SELECT * FROM steps")
        proxy.set_down(True)
        calls = {
            "fetch": pending.fetchall,
            "fetchnumpy": lambda: reader.sql('SELECT "observation/state" FROM episodes').fetchnumpy(),
            "where": lambda: reader.where("list_max(reward) > 0"),
        }
        for name, call in calls.items():
            try:
                call()
            except el.StorageError as exc:
                assert exc.__cause__ is not None, name
                print(name, type(exc).__name__, exc.dataset, flush=True)
            else:
                print(f"{name}: no StorageError", flush=True)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2])))
