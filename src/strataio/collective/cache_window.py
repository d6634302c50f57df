"""Realm caches reachable by every rank: the coherence protocol for independent calls.

Persistent realms make an aggregator's cache coherent for collective calls (it alone touches
its realm). An independent call bypasses the aggregators, so before it moves a byte it must
find the cached pages it touches and make the file right: this module keeps each aggregator's
cache memory (:class:`~strataio.collective.realm_cache.CacheMemory`: page table, dirty ranges,
arena) in one MPI window, created when the file opens. The protocol, for a rank about to read
or write the sorted byte runs ``R`` independently:

1. the persistent realms name the aggregators owning bytes of ``R`` (stripe arithmetic);
2. for each, the rank takes an exclusive passive-target lock on that aggregator's window, gets
   its page table, gets the dirty bytes of the pages overlapping ``R`` (one ``Get`` through an
   hindexed datatype) and writes them to the file itself (under a byte-range lock over them,
   as independent writes take: a sieving write's read-modify-write cannot undo them), marks
   them clean — and, before a write, drops those pages — puts the table back with its
   generation bumped (so the owner re-indexes it) and unlocks;
3. then it does its own I/O straight on the file.

The owner takes the same lock on its own window while it uses its cache (:meth:`SharedCaches.
hold`, released by :meth:`SharedCaches.release`). It holds it only while no other rank can be
in an independent call — within a two-phase call after its planning collective, which every
rank must have entered, until the call's closing agreement; around a flush in ``sync``,
``close`` or ``set_size`` — so waiting for it never waits on a collective.

Progress: with the MPICH installed here (ch4, one node) a passive-target lock is granted only
when the target enters MPI: measured, a ``Lock``/``Get`` on a rank busy in Python for 3 s
completed after 3.0 s, at once with ``MPIR_CVAR_ASYNC_PROGRESS=1`` (but every lock then cost
~0.5 ms instead of ~70 us on 2 cores). An independent call may so wait until the owners next
call MPI; it never deadlocks, since every rank reaches ``close``, and ranks waiting on each
other's locks are inside MPI. The same holds across nodes, where RMA needs the target's
progress the more; there a job that computes long between I/O calls should set async progress.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

from strataio.collective.driver import Driver
from strataio.collective.realm_cache import (
    CacheMemory,
    PageGrid,
    dirty_pieces,
    overlapping,
    write_dirty,
)
from strataio.errors import HintError
from strataio.layout.extents import Extents, exclusive_cumsum

__all__ = ["SharedCaches", "owners_of"]

_I64 = np.int64


def owners_of(runs: Extents, stripe: int, naggr: int) -> np.ndarray:
    """The aggregator indices (sorted) owning bytes of ``runs`` under striped realms: stripe
    ``k`` belongs to aggregator ``k mod naggr``."""
    if not len(runs):
        return np.zeros(0, dtype=_I64)
    k0 = runs.offsets // stripe
    count = np.minimum((runs.ends - 1) // stripe - k0 + 1, naggr)
    if int(count.max()) >= naggr:
        return np.arange(naggr, dtype=_I64)
    first = np.repeat(k0, count)
    step = np.arange(first.size, dtype=_I64) - np.repeat(exclusive_cumsum(count), count)
    return np.unique((first + step) % naggr)


def memory_to_share() -> int:
    """The most bytes the windows of the ranks on this node could hold together: the node's
    memory, and the free room of ``/dev/shm`` where there is one (MPI places them there, in
    one segment). An upper bound: a job's memory limit may be lower."""
    room = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        shm = os.statvfs("/dev/shm")
    except OSError:
        return room
    return min(room, shm.f_bavail * shm.f_frsize)


def room_error(nbytes: int, on_node: int) -> HintError | None:
    """The error of caches of ``nbytes`` per aggregator taking ``on_node`` bytes on one node
    when the node cannot give that much (:func:`memory_to_share`), else None."""
    room = memory_to_share()
    if on_node <= room:
        return None
    return HintError(
        f"realm caches of {on_node} bytes on one node (strataio_realm_cache={nbytes} "
        f"per aggregator there): more than the node can give ({room} bytes: its "
        "memory, and the free room of /dev/shm, where MPI places the windows of ranks "
        "on one node); a smaller cache, or fewer aggregators per node"
    )


class SharedCaches:
    """One MPI window over every rank's cache memory (``nbytes`` on this rank, 0 on ranks
    without a cache); created and freed collectively over ``comm``. The ranks must have
    agreed first that the node can give it (:func:`room_error`, which ``File.open`` checks
    with the other hints): a window MPI cannot allocate fails on its rank alone and leaves
    the others inside the collective allocation, or kills the job at its first touch."""

    def __init__(self, comm: MPI.Comm, nbytes: int) -> None:
        self._comm = comm
        self._rank = comm.Get_rank()
        self._win = MPI.Win.Allocate(max(int(nbytes), 0), 1, comm=comm)
        self.memory = (
            np.frombuffer(self._win.tomemory(), dtype=np.uint8)
            if nbytes
            else np.zeros(0, dtype=np.uint8)
        )
        self._held = False
        self.remote_bytes = 0
        """Dirty bytes this rank wrote back from other ranks' caches."""

    def hold(self) -> None:
        """Lock this rank's own cache against the protocol (nothing if held already)."""
        if not self._held:
            self._win.Lock(self._rank, MPI.LOCK_EXCLUSIVE)
            self._win.Sync()  # (other ranks' edits visible to local loads)
            self._held = True

    def release(self) -> None:
        """Unlock this rank's own cache (nothing if not held)."""
        if self._held:
            self._win.Sync()
            self._win.Unlock(self._rank)
            self._held = False

    @contextmanager
    def own(self) -> Iterator[None]:
        """This rank's own cache, locked, for the duration."""
        self.hold()
        try:
            yield
        finally:
            self.release()

    def clean(
        self, rank: int, runs: Extents, driver: Driver, drop: bool, shape: tuple[int, int, int]
    ) -> None:
        """Step 2 of the protocol on another rank's cache: write back its dirty pages holding
        bytes of ``runs`` (sorted disjoint) through ``driver``, and with ``drop`` forget them.
        ``shape``: ``(slot bytes, slots, stripe)`` of every cache of the file."""
        slot, nslots, stripe = shape
        win, meta = self._win, CacheMemory.meta_bytes(nslots)
        table = np.empty(meta, dtype=np.uint8)
        win.Lock(rank, MPI.LOCK_EXCLUSIVE)
        try:
            win.Get(table, rank, (0, meta, MPI.BYTE))
            win.Flush(rank)
            mem = CacheMemory(nslots, slot, table)
            grid = PageGrid(slot, stripe)
            slots = np.flatnonzero(overlapping(grid, mem.slot_page, runs))
            if not slots.size:
                return
            off, length, at = dirty_pieces(grid, mem, slots)
            if off.size:
                data = np.empty(int(length.sum()), dtype=np.uint8)
                pieces = MPI.BYTE.Create_hindexed(length.tolist(), (at + meta).tolist())
                pieces.Commit()
                try:
                    win.Get(data, rank, (0, 1, pieces))
                    win.Flush(rank)
                finally:
                    pieces.Free()
                write_dirty(driver, off, length, exclusive_cumsum(length), data)
                self.remote_bytes += data.size
            mem.dirty_lo[slots] = 0
            mem.dirty_hi[slots] = 0
            if drop:
                mem.slot_page[slots] = -1
            mem.header[0] += 1
            win.Put(table, rank, (0, meta, MPI.BYTE))
        finally:
            win.Unlock(rank)

    def free(self) -> None:
        """Free the window (collective)."""
        self.release()
        self._win.Free()
