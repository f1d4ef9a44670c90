"""Importers from the formats users already have; ``import_dataset(FORMAT, src, dst)`` dispatches.

Formats: ``minari`` (:mod:`.minari`), ``d4rl`` (:mod:`.d4rl`),
``memmap-replay`` (:mod:`.memmap_replay`), ``episodata`` (:mod:`.episodata`),
``lerobot`` (:mod:`.lerobot`).

Shared contract: an import creates a new dataset at ``dst`` (None: in memory)
and commits every episode, or, on any error, removes what it created and
re-raises (an existing ``dst`` is never touched without ``overwrite=True``).
Every imported episode carries the meta field ``source_episode``: its index
or id in the source. Action-out sources (row ``t`` holds the observation
where action ``t`` was taken: D4RL, memmap-replay-buffer) are converted to
action-in once, by :func:`.common.action_out_episode`.

May import: ``integrations``, the façade and every folder below it.
"""

from .common import import_dataset, import_report

__all__ = ["import_dataset", "import_report"]
