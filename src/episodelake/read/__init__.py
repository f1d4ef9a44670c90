"""Reads of one pinned version: snapshots, changes between versions, selections, planned batch and window
reads, SQL views and queries. Never imports the write path.

May import: ``core``, ``storage``.
"""
