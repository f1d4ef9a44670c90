"""Maintenance of a stored dataset: the ``validate`` audit, ``vacuum``, copies.

May import: ``core``, ``storage``, ``read``, ``write``.
"""
