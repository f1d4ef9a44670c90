"""Maintenance of a stored dataset: the ``validate`` audit, ``vacuum``, copies; ``ds.maintenance``/``ds.columns``.

May import: ``core``, ``storage``, ``read``, ``write``.
"""
