"""Batches a ``DataLoader`` worker hands to the main process through shared memory, not pickled bytes.

A worker of a PyTorch ``DataLoader`` (:func:`loader_worker_slots` finds out
from ``torch.utils.data.get_worker_info()``, without importing torch) gathers
each batch of :class:`~episodelake.sampling.segment_dataset.SegmentDataset`
straight into a **slot**: an anonymous shared-memory file (``memfd_create``)
that the worker keeps open and mapped. The batch it returns, a
:class:`SlotBatch`, pickles its large buffers as ``(offset, dtype, shape)`` in
that slot plus the worker's pid and descriptor number; the process that
unpickles it opens ``/proc/<pid>/fd/<fd>``, maps the file and gets a plain
:class:`~episodelake.sampling.batch.SegmentBatch` whose buffers are views of
its mapping, kept alive by the usual NumPy references (a tensor made with
``torch.from_numpy`` included). No byte of them is pickled or copied, and
slots have no name: the kernel frees one when the last process holding it
lets go, so nothing is left in ``/dev/shm`` whatever way a worker ends.

Reuse: each pickling takes one of the slot's :data:`TICKETS` ticket bytes in
its header page, and the consumer clears its ticket when the last view of its
mapping is gone (a ``weakref.finalize``, only in the process that mapped it).
The worker reuses (or closes) a slot only once no ticket is taken and it
holds no view of the slot itself, so a descriptor number a batch names
always names its slot; a batch it never pickled (a ``collate_fn`` that
converted it) frees its slot the same way. Free slots too small for the
batch at hand, or more than :data:`KEEP_FREE` of them, are closed.

Where ``memfd_create`` or ``/proc`` is not available (not Linux), or with
``EPISODELAKE_LOADER_SLOTS=0``, batches pickle as before
(:func:`loader_worker_slots` returns None). The consumer must be allowed to
open the worker's descriptors (same user, as a ``DataLoader``'s main process
is).
"""

from __future__ import annotations

import mmap
import os
import sys
import weakref
from typing import Any

import numpy as np

from ..read import batching
from .batch import SegmentBatch

HEADER = mmap.PAGESIZE  # a slot's first page: the ticket bytes
TICKETS = 64  # picklings of one slot's batch in flight at once (more are pickled by value)
KEEP_FREE = 4  # free slots a worker keeps mapped beyond those in flight


class Slot:
    """One shared-memory file of the worker: the header page, then the batch's buffers at page-aligned offsets."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create("episodelake-batch")
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.tickets = np.frombuffer(self.map, np.uint8, TICKETS)
        self.base = np.frombuffer(self.map, np.uint8)  # every buffer handed out is a view of it

    def free(self) -> bool:
        """No ticket taken and no view of the slot alive in this process."""
        # references to base: this object's attribute and getrefcount's argument
        return sys.getrefcount(self.base) == 2 and not self.tickets.any()

    def ticket(self) -> int | None:
        """A ticket for one pickling (None when all of them are taken)."""
        untaken = np.flatnonzero(self.tickets == 0)
        if not len(untaken):
            return None
        k = int(untaken[0])
        self.tickets[k] = 1
        return k

    def offset(self, arr: np.ndarray) -> int | None:
        """``arr``'s byte offset in the slot if it is a C-contiguous view of it, else None."""
        if arr.base is not self.base or not arr.flags.c_contiguous:
            return None
        return arr.ctypes.data - self.base.ctypes.data

    def close(self) -> None:
        """Unmap and close (consumers' mappings stay valid)."""
        del self.tickets, self.base
        self.map.close()
        os.close(self.fd)


class Arena:
    """Hands out one batch's buffers from a slot, in order (:class:`~episodelake.read.batching.Buffers`)."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.used = HEADER

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self.used + nbytes > self.slot.size:  # not planned for: a private buffer, pickled by value
            return batching.aligned_empty(shape, dtype)[1]
        out = self.slot.base[self.used : self.used + nbytes].view(dtype).reshape(shape)
        self.used += -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        return out


def slot_bytes(layout: list[tuple[tuple[int, ...], np.dtype]]) -> int:
    """The slot size holding buffers of ``layout`` (``(shape, dtype)`` each) at page-aligned offsets."""
    page = mmap.PAGESIZE
    body = sum(-(-int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize // page) * page for s, d in layout)
    return HEADER + body


class SlotPool:
    """This worker process's slots (see module docstring)."""

    def __init__(self) -> None:
        self.slots: list[Slot] = []

    def arena(self, size: int) -> Arena:
        """An arena over a free slot of at least ``size`` bytes (a new one if none is free)."""
        free = [s for s in self.slots if s.free()]
        fits = [s for s in free if s.size >= size]
        if fits:
            chosen = min(fits, key=lambda s: s.size)
        else:
            chosen = Slot(size)
            self.slots.append(chosen)
        spare = [s for s in free if s is not chosen]
        drop = [s for s in spare if s.size < size] + [s for s in spare if s.size >= size][KEEP_FREE:]
        for s in drop:  # too small for this batch size, or more free slots than kept
            self.slots.remove(s)
            s.close()
        return Arena(chosen)


class SlotBatch(SegmentBatch):
    """A batch whose large buffers live in a worker's slot; unpickles as a plain :class:`SegmentBatch`."""

    slot: Slot

    @classmethod
    def of(cls, batch: SegmentBatch, slot: Slot) -> SlotBatch:
        """``batch`` (whose buffers were taken from an :class:`Arena` over ``slot``) as a slot batch."""
        out = cls.__new__(cls)
        out.__dict__.update(batch.__dict__)
        out.slot = slot
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        state = {k: v for k, v in self.__dict__.items() if k != "slot"}
        ticket = self.slot.ticket()
        if ticket is None:
            return (_plain, (state,))
        refs = {}
        for key, arr in self.data.items():
            off = self.slot.offset(arr)
            if off is not None:
                refs[key] = (off, arr.dtype.str, arr.shape)
        state["data"] = {k: v for k, v in self.data.items() if k not in refs}
        where = (os.getpid(), self.slot.fd, self.slot.size, ticket)
        return (_attach, (where, refs, list(self.data), state))


def _plain(state: dict[str, Any]) -> SegmentBatch:
    out = SegmentBatch.__new__(SegmentBatch)
    out.__dict__.update(state)
    return out


def _attach(
    where: tuple[int, int, int, int],
    refs: dict[str, tuple[int, str, tuple[int, ...]]],
    order: list[str],
    state: dict[str, Any],
) -> SegmentBatch:
    """The consumer's side: map the worker's slot, views of it as the batch's buffers.

    ``where``: the worker's pid, the slot's descriptor there, its size and
    this pickling's ticket; ``refs``: each buffer in the slot by field key,
    ``(offset, dtype, shape)``; ``order``: the field keys in the batch's
    order; ``state``: the rest of the batch.
    """
    pid, fd_there, size, ticket = where
    path = f"/proc/{pid}/fd/{fd_there}"
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise OSError(
            exc.errno,
            f"cannot map a DataLoader worker's batch ({path}: {exc.strerror}); "
            "EPISODELAKE_LOADER_SLOTS=0 makes workers pickle batches instead",
        ) from exc
    try:
        mapped = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    base = np.frombuffer(mapped, np.uint8)
    weakref.finalize(base, _release, mapped, ticket, os.getpid())
    data = dict(state["data"])
    for key, (off, dtype, shape) in refs.items():
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        data[key] = base[off : off + nbytes].view(dt).reshape(shape)
    return _plain({**state, "data": {k: data[k] for k in order}})


def _release(mapped: mmap.mmap, ticket: int, pid: int) -> None:
    """Clear the consumer's ticket (only in the process that mapped the slot, not in a fork of it)."""
    if os.getpid() == pid and not mapped.closed:
        mapped[ticket] = 0


_state: dict[str, Any] = {"pid": None, "pool": None}


def _pool() -> SlotPool | None:
    """A fresh pool; None where slots cannot work here (or ``EPISODELAKE_LOADER_SLOTS=0``)."""
    if os.environ.get("EPISODELAKE_LOADER_SLOTS", "1") == "0" or not hasattr(os, "memfd_create"):
        return None
    try:
        probe = Slot(HEADER)
        try:
            os.close(os.open(f"/proc/{os.getpid()}/fd/{probe.fd}", os.O_RDWR))
        finally:
            probe.close()
    except OSError:
        return None
    return SlotPool()


def loader_worker_slots() -> SlotPool | None:
    """This process's :class:`SlotPool` if it is a PyTorch ``DataLoader`` worker and slots work here, else None.

    The first call in a worker also sets the process up as one
    (:func:`~episodelake.read.batching.serve_loader_worker`).
    """
    if _state["pid"] == os.getpid():
        return _state["pool"]
    torch = sys.modules.get("torch")
    data = getattr(getattr(torch, "utils", None), "data", None)
    info = getattr(data, "get_worker_info", lambda: None)()
    if info is None:
        return None
    batching.serve_loader_worker()
    _state["pid"], _state["pool"] = os.getpid(), _pool()
    return _state["pool"]
