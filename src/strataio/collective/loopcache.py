"""Software caching of a rank's items across irregular loops (No et al., §3).

Between two loops over indirection arrays a rank's items fall in three sets: *re-referenced*
(needed by both loops: kept in memory, never written or read), *released* (needed only by
the loop that ended: written back) and *new* (needed only by the next loop: read). A
:class:`LoopCache` reads the first loop's items in full (the paper's ``read1``); each
:meth:`LoopCache.advance` builds the two incremental schedules of the released and the new
items only, writes the released items (``write2``) and reads the new ones (``read2``); and
:meth:`LoopCache.flush` writes every item still held (``write1``). The file then holds the same
bytes as the sequence without caching (read every item, run the loop, write every item, per
loop), provided no index is held by two ranks in one loop — the condition under which that
sequence's writes are defined at all; a schedule that breaks it raises
:class:`~strataio.errors.DuplicateWriteError` on every rank.

Memory: the cache holds the current loop's values and its schedule, O(items of the rank), and
reports its peak (:attr:`CacheStats.peak_bytes`) with the items and storage bytes it moved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from strataio.agreed import agree
from strataio.collective.irregular import IndexSchedule, ItemsIO, records
from strataio.errors import DuplicateWriteError, ShapeMismatchError, StrataError

if TYPE_CHECKING:
    from strataio.collective.file import File

__all__ = ["CacheStats", "LoopCache"]


@dataclass(slots=True)
class CacheStats:
    """What a cache moved and held on one rank (``totals()`` sums it over the ranks).

    ``items_read`` / ``items_written``: records of the rank's own indices read or written;
    ``storage_bytes_read`` / ``storage_bytes_written``: bytes its driver moved as an aggregator
    (sieved holes included); ``schedule_seconds``: time building incremental schedules;
    ``peak_bytes``: the most bytes of values and schedules the cache held at once.
    """

    items_read: int = 0
    items_written: int = 0
    storage_bytes_read: int = 0
    storage_bytes_written: int = 0
    schedule_seconds: float = 0.0
    peak_bytes: int = 0

    def add_read(self, io: ItemsIO) -> None:
        self.items_read += io.items
        self.storage_bytes_read += io.storage_bytes

    def add_write(self, io: ItemsIO) -> None:
        self.items_written += io.items
        self.storage_bytes_written += io.storage_bytes

    def held(self, nbytes: int) -> None:
        self.peak_bytes = max(self.peak_bytes, int(nbytes))


def _shared_error(sched: IndexSchedule) -> DuplicateWriteError:
    return DuplicateWriteError(
        f"loop cache: {sched.shared} indices are held by more than one rank in one loop; a "
        "cache keeps each rank's items across loops, which is coherent only when every index "
        "belongs to one rank"
    )


class LoopCache:
    """One loop's items of ``sched`` read from ``file`` (collective), kept across loops.

    ``dtype``: the dtype of :attr:`values` (its itemsize must be ``sched.itemsize``; default
    raw ``V{itemsize}`` records). :attr:`values` holds the current loop's items in the rank's
    own index order.
    """

    def __init__(self, file: File, sched: IndexSchedule, dtype: Any = None) -> None:
        err: Exception | None = None
        self._file = file
        self.stats = CacheStats()
        try:  # (a bad dtype or schedule on one rank: every rank must hear of it)
            if not isinstance(sched, IndexSchedule):
                raise StrataError(f"loop cache: expected an IndexSchedule, not {sched!r}")
            try:
                self._dtype = np.dtype((np.void, sched.itemsize) if dtype is None else dtype)
            except TypeError as exc:
                raise StrataError(f"loop cache: dtype {dtype!r} is not a numpy dtype") from exc
            if self._dtype.itemsize != sched.itemsize:
                raise ShapeMismatchError(
                    f"loop cache: dtype {self._dtype} has {self._dtype.itemsize}-byte items, "
                    f"the schedule {sched.itemsize}-byte ones"
                )
            if sched.shared:
                raise _shared_error(sched)
        except Exception as exc:
            err = exc
        agree(file.comm, err)
        self._sched = sched
        self.values: np.ndarray = np.empty(sched.n, dtype=self._dtype)
        self.stats.add_read(file.read_items(sched, self.values))
        self.stats.held(self.values.nbytes + sched.nbytes)

    @property
    def schedule(self) -> IndexSchedule:
        """The schedule of the current loop."""
        return self._sched

    def _check(self, values: Any, nxt: IndexSchedule | None) -> np.ndarray:
        """This rank's checks of an advance or flush (the caller agrees)."""
        cur = self._sched
        if not isinstance(values, np.ndarray) or not values.flags.c_contiguous:
            raise ShapeMismatchError("loop cache: values must be a C-contiguous numpy array")
        if values.dtype.hasobject:
            raise ShapeMismatchError(
                f"loop cache: values must hold plain data, not Python objects ({values.dtype})"
            )
        if values.nbytes != cur.n * cur.itemsize:
            raise ShapeMismatchError(
                f"loop cache: values hold {values.nbytes} bytes; the current loop's {cur.n} "
                f"indices of {cur.itemsize}-byte items need {cur.n * cur.itemsize}"
            )
        if nxt is not None:
            if not isinstance(nxt, IndexSchedule):
                raise StrataError(f"loop cache: expected an IndexSchedule, not {nxt!r}")
            if not nxt.compatible(self._file.comm):  # (its duplicates were counted elsewhere)
                raise StrataError(
                    f"loop cache: the next schedule was built for {nxt.nprocs} ranks (this is "
                    f"rank {nxt.rank}); the cache's file is open on {self._file.comm.Get_size()}"
                )
            if (nxt.nitems, nxt.itemsize) != (cur.nitems, cur.itemsize):
                raise StrataError(
                    f"loop cache: the next schedule is over {nxt.nitems} items of "
                    f"{nxt.itemsize} bytes, the cache's over {cur.nitems} of {cur.itemsize}"
                )
            if nxt.shared:
                raise _shared_error(nxt)
        return values.reshape(-1).view(np.uint8)

    def advance(self, next_sched: IndexSchedule, values: Any) -> np.ndarray:
        """End the current loop (its ``values``, possibly modified, in the rank's index order)
        and start the one of ``next_sched`` (collective): released items are written, new
        items read, re-referenced ones kept. Returns (and keeps as :attr:`values`) the next
        loop's values in the rank's index order of ``next_sched``."""
        comm = self._file.comm
        err: Exception | None = None
        data = np.zeros(0, dtype=np.uint8)
        try:
            data = self._check(values, next_sched)
        except Exception as exc:
            err = exc
        agree(comm, err)
        cur, nxt = self._sched, next_sched
        size = cur.itemsize
        old_u, new_u = cur.unique, nxt.unique
        # where each old item sits among the new ones (both sorted): kept or released
        at = np.searchsorted(new_u, old_u)
        kept = np.zeros(old_u.size, dtype=bool)
        if new_u.size:
            kept = new_u[np.minimum(at, new_u.size - 1)] == old_u
        fresh = np.ones(new_u.size, dtype=bool)
        fresh[at[kept]] = False

        t0 = time.perf_counter()
        opts = {"buffer_size": cur.buffer_size, "aggregators": cur.aggregators}
        # (subsets of two checked schedules: no agreement round needed)
        released = IndexSchedule(comm, old_u[~kept], cur.nitems, size, **opts, validate=False)
        new = IndexSchedule(comm, new_u[fresh], cur.nitems, size, **opts, validate=False)
        self.stats.schedule_seconds += time.perf_counter() - t0

        rec = records(data, size)  # the old loop's values; an index's last occurrence counts
        self.stats.add_write(self._file.write_items(released, rec[cur.last[~kept]]))
        incoming = np.empty(new.unique.size, dtype=rec.dtype)
        self.stats.add_read(self._file.read_items(new, incoming))
        # each next item from [old values, incoming]: one gather into the next loop's order
        src = np.empty(new_u.size, dtype=np.intp)
        src[at[kept]] = cur.last[kept]
        src[fresh] = rec.size + np.arange(incoming.size)
        pool = np.concatenate([rec, incoming])
        out = np.empty(nxt.n, dtype=self._dtype)
        np.take(pool, src[nxt.inverse], out=records(out.reshape(-1).view(np.uint8), size))
        self.stats.held(
            data.nbytes + pool.nbytes + src.nbytes + out.nbytes
            + cur.nbytes + nxt.nbytes + released.nbytes + new.nbytes
        )  # fmt: skip
        self._sched, self.values = nxt, out
        return out

    def flush(self, values: Any) -> None:
        """Write every item the cache holds, from ``values`` (the current loop's, in the
        rank's index order; collective)."""
        err: Exception | None = None
        try:
            self._check(values, None)
        except Exception as exc:
            err = exc
        agree(self._file.comm, err)
        self.stats.add_write(self._file.write_items(self._sched, values))

    def totals(self) -> CacheStats:
        """The stats summed over the ranks (``peak_bytes``: the largest rank's; collective)."""
        s = self.stats
        comm = self._file.comm
        sums = comm.allreduce(
            np.array(
                [s.items_read, s.items_written, s.storage_bytes_read, s.storage_bytes_written]
            ),
            op=MPI.SUM,
        )
        return CacheStats(
            *(int(v) for v in sums),
            schedule_seconds=comm.allreduce(s.schedule_seconds, op=MPI.MAX),
            peak_bytes=comm.allreduce(s.peak_bytes, op=MPI.MAX),
        )
