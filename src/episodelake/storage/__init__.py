"""Bytes at a location: the on-disk layout, filesystems and URLs, caches, coalesced fetches, Zarr v3 tensor
arrays and frame arrays, the Delta episode table, table-row encoding, the derived side table as read, the
``Store`` that holds them together.

May import: ``core``.
"""
