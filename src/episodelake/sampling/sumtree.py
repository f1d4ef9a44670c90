"""A vectorized sum tree: batched O(log n) updates and batched prefix-sum search over non-negative leaves.

Why hand-written: no maintained PyPI package offers a NumPy-vectorized sum
tree (cpprb keeps its C++ segment tree inside its own replay buffer class,
TorchRL's C++ tree does not load beside our torch wheel, and the stand-alone
segment-tree packages are unmaintained single-item Python or C bindings).

Layout: the leaves and every level above them are grouped in blocks of
``BLOCK`` nodes, and a node's value is the sum of its child block. The top
level (at most ``TOP`` nodes) keeps its prefix sums and is searched with
``np.searchsorted``. With ``BLOCK = 16`` and ``TOP = 4096`` a million leaves
take two block levels under the top one. A search gathers the block rows it
walks through and takes their prefix sums then; an update rewrites the
leaves and the values of the touched blocks' ancestors. Block prefix sums
are one matrix product with a triangle of ones (several times faster than
``np.cumsum(axis=1)`` on rows this short): each row is summed in one fixed
order, so its prefix sums never decrease and a zero child adds exactly
nothing. A search writes them after a column of zeros (a reused buffer), so
the sum before each chosen child is one gather, with no branch for the first
child. A
batch of ``k`` searches or updates is a handful of NumPy calls on
``[k, BLOCK]`` arrays per level: ``O(k * BLOCK * log n)`` work, ``O(log n)``
calls, no stored per-block prefix sums (half the memory, and the rows a
search read are the rows the following update of the same leaves reads).
Sums are recomputed from the values, never adjusted by differences, so
they do not drift.

Search semantics: ``find(u)`` returns for each ``u`` the leaf ``i`` with
``S(i) <= u < S(i + 1)`` (``S`` the prefix sums), so a leaf of value 0 is
never returned; ``u`` at or past the total (rounding) gives the last
positive leaf. The descent first runs without keeping each residual inside
its node (rounding can push it past a block's end); it can only then end on
a zero leaf, and exactly those searches run again with the residual clamped
at every level.
"""

from __future__ import annotations

import numpy as np

BLOCK = 16
TOP = 4096


class SumTree:
    """Non-negative float64 leaves ``0 .. len - 1`` with their prefix sums (see module docstring).

    Grows by :meth:`extend` (capacity doubles, amortized ``O(1)`` per leaf).
    ``block``/``top``: the layout's block and top-level widths (tests use small ones).
    """

    def __init__(self, capacity: int = 0, block: int = BLOCK, top: int = TOP) -> None:
        self.block, self.top = block, top
        self._triangle = np.triu(np.ones((block, block)))
        self._ones = np.ones(block - 1)
        self._scratch = self._search_buffers(0)
        self._build(np.zeros(max(int(capacity), 1)))
        self._n = 0

    def _build(self, leaves: np.ndarray) -> None:
        """Lay out levels for ``len(leaves)`` leaves (capacity) and fill every sum from them: ``O(n)``."""
        b = self.block
        nodes, levels = len(leaves), 1
        while nodes > self.top:  # blocks needed on the level above
            nodes, levels = -(-nodes // b), levels + 1
        # level 0: the top block; every node below it has a whole child block (padding leaves are 0)
        sizes = [nodes * b**level for level in range(levels)]
        self._vals = [np.zeros(s) for s in sizes]
        self._vals[-1][: len(leaves)] = leaves
        for level in range(len(sizes) - 1, 0, -1):
            self._vals[level - 1][:] = self._block_sums(level, slice(None))
        self._top = np.zeros(sizes[0] + 1)  # prefix sums of the top level, with a leading 0
        np.cumsum(self._vals[0], out=self._top[1:])

    def _prefix(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Prefix sums of each row, as a product with an upper triangle of ones (much faster than
        ``np.cumsum(axis=1)`` on short rows; a fixed summation order per row keeps them non-decreasing)."""
        return np.matmul(rows, self._triangle, out=out)

    def _block_sums(self, level: int, blocks: np.ndarray | slice) -> np.ndarray:
        return self._prefix(self._vals[level].reshape(-1, self.block)[blocks])[:, -1]

    def _search_buffers(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``[k, block + 1]`` zeros (a search writes prefix sums after column 0) and the flat row starts."""
        b = self.block
        return np.zeros((k, b + 1)), np.arange(k, dtype=np.int64) * (b + 1)

    def __len__(self) -> int:
        return self._n

    @property
    def capacity(self) -> int:
        return len(self._vals[-1])

    @property
    def total(self) -> float:
        """The sum of every leaf."""
        return float(self._top[-1])

    @property
    def leaves(self) -> np.ndarray:
        """Leaf values ``[len]`` (a read-only view)."""
        view = self._vals[-1][: self._n]
        view.flags.writeable = False
        return view

    def extend(self, values: np.ndarray) -> np.ndarray:
        """Append leaves; returns their indices."""
        values = np.asarray(values, dtype=np.float64)
        start, stop = self._n, self._n + len(values)
        if stop > self.capacity:
            leaves = np.zeros(max(stop, 2 * self.capacity))
            leaves[:start] = self._vals[-1][:start]
            leaves[start:stop] = values
            self._build(leaves)
        else:
            self.update(np.arange(start, stop), values, unique=True)
        self._n = stop
        return np.arange(start, stop, dtype=np.int64)

    @staticmethod
    def last_wins(leaves: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(leaves, values)`` without repeated leaves, keeping each one's last value.

        (A NumPy scatter with repeated indices keeps an unspecified one.)
        """
        if len(leaves) < 2:
            return leaves, values
        order = np.argsort(leaves, kind="stable")
        ranked = leaves[order]
        last = order[np.append(ranked[1:] != ranked[:-1], True)]
        return leaves[last], values[last]

    def update(self, leaves: np.ndarray, values: np.ndarray, unique: bool = False) -> None:
        """Set ``leaf[leaves[j]] = values[j]``; for a repeated leaf the last value wins (``unique``: none repeats).

        ``O(log n)`` NumPy calls for the whole batch.
        """
        i = np.asarray(leaves, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if not unique:
            i, values = self.last_wins(i, values)
        self._vals[-1][i] = values
        for level in range(len(self._vals) - 1, 0, -1):
            i = i // self.block  # repeated blocks are fine: every copy writes the same sum
            self._vals[level - 1][i] = self._block_sums(level, i)
        np.cumsum(self._vals[0], out=self._top[1:])

    def find(self, u: np.ndarray) -> np.ndarray:
        """Leaf ``i`` with ``S(i) <= u < S(i + 1)`` for each ``u`` in ``[0, total)`` (see module docstring)."""
        return self.find_values(u)[0]

    def find_values(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`find`'s leaves and their values (all positive)."""
        u = np.asarray(u, dtype=np.float64)
        u = np.minimum(u, np.nextafter(self._top[-1], 0.0))  # stay inside the last positive node
        leaf = self._descend(u, clamp=False)
        values = self._vals[-1][leaf]
        redo = np.flatnonzero(values == 0)
        if len(redo):
            leaf[redo] = self._descend(u[redo], clamp=True)
            values[redo] = self._vals[-1][leaf[redo]]
        return leaf, values

    def _descend(self, u: np.ndarray, clamp: bool) -> np.ndarray:
        top = self._top
        node = np.searchsorted(top[1:], u, side="right")
        u = u - top[node]
        b = self.block
        if len(self._scratch[1]) != len(u):
            buffers = self._search_buffers(len(u))
            if not clamp:  # the batch size of the ordinary search: keep (the clamped redo is rare and small)
                self._scratch = buffers
        else:
            buffers = self._scratch
        cs, offsets = buffers  # cs[:, c]: the sum of children before c; cs[:, b]: the node's value
        for vals in self._vals[1:]:
            self._prefix(vals.reshape(-1, b)[node], out=cs[:, 1:])
            if clamp:  # keep the residual inside this node
                u = np.minimum(u, np.nextafter(cs[:, b], 0.0))
            # j: children 0 .. b - 2 whose prefix sum is <= u (a matrix product counts them fastest)
            j = ((cs[:, 1:b] <= u[:, None]) @ self._ones).astype(np.int64)
            u = u - cs.ravel()[offsets + j]
            node = node * b + j
        return node

    def sample(self, rng: np.random.Generator, k: int) -> np.ndarray:
        """``k`` leaves drawn with replacement, ``P(i) = leaf[i] / total``; the total must be positive."""
        return self.sample_values(rng, k)[0]

    def sample_values(self, rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`sample`'s leaves and their values (one draw of the generator, as :meth:`sample`)."""
        return self.find_values(rng.random(k) * self.total)
