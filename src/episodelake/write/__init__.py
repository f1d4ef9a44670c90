"""The write path: commit batching, episode writers, bulk writes, derived-column declarations and updates.
Never imports the read path.

May import: ``core``, ``storage``.
"""
