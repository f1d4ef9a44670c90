"""From a snapshot to training batches: samplers and the sum tree, the option objects (windows, strategies,
shards), priorities, batches, map-style segments, the stream (planner, prefetch, resume), transitions,
trajectories, Ray sources.

May import: ``core``, ``storage``, ``read``, ``write``.
"""
