"""Irregular collective I/O through indirection arrays: index schedules (No et al., §2).

An unstructured-mesh code reaches a global 1-D array (``nitems`` records of ``itemsize``
bytes, stored in canonical order from byte 0 of a file) through an *indirection array*: each
rank lists the global indices it needs, in its own order, with repeats. An
:class:`IndexSchedule` is the paper's schedule, built once (collectively) and reused by every
read and write with the same indices, on any file of the same item count:

- *data domains*: the item range is split evenly over the aggregators (by default every rank,
  as in the paper: each processor reads or writes ``D / P`` bytes); aggregator ``a`` alone
  reads and writes items ``[a * per, (a + 1) * per)``, so its read-modify-writes of holes
  cannot race with another aggregator;
- *which aggregator serves each index*: ``index // per`` over the rank's sorted unique indices;
- *communication coalescing*: those indices in destination order, so each peer's items are one
  contiguous message; the aggregators learn once, at build, which items each rank wants;
- *iterations bounded by the buffer*: an aggregator takes the union of what the ranks want
  from it in groups of at most ``buffer_size // itemsize`` items, one group per iteration.

A transfer then costs, per iteration, one aggregator access of its group through the File's
driver (runs of consecutive items coalesced, small holes sieved by the rule of
:mod:`strataio.collective.fileio`) and one ``Alltoallv`` of whole records. Building is numpy
over all indices (argsort, searchsorted, bincount, unique), never a Python loop per index. A
schedule holds O(indices of the rank + indices it serves) memory, never O(``nitems``).

Writes: an index two ranks write is an error (:class:`~strataio.errors.DuplicateWriteError`
on every rank, nothing written) unless the file's hint ``strataio_duplicate_writes`` is
``last-rank`` (the highest rank's value is written). Repeats of an index within one rank's
indirection array write the value of its last occurrence. Every error is agreed on every rank
(:mod:`strataio.agreed`) before any byte is written.

Reads past the end of the file: as for every read of :class:`strataio.File` (and MPI-IO's,
whose status counts only what lay before the end), a read is no error and says what it read.
An item is read when it lies wholly before the end of the file; :attr:`ItemsIO.items` counts
those of the rank, and :attr:`ItemsIO.file_items` says where the file ended, so the records
of ``out`` that hold data are those whose index is below it. The others read as zeros, as
bytes past the end do in every read here (an item the end cuts holds its bytes before the
end, then zeros). The end is the smallest size the aggregators saw before reading (every
rank, for a schedule with no item on any rank), the same on every rank: a file that grows
meanwhile may have given more than is counted, never less.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from strataio.agreed import agree, differs_in, raise_agreed
from strataio.collective.driver import Driver
from strataio.collective.fileio import (
    AUTO_THRESHOLD,
    SIEVE_READ_BYTES,
    ReadPlan,
    sieve_threshold,
    span_holes,
    window_spans,
)
from strataio.errors import (
    BackendError,
    DuplicateWriteError,
    ReadOnlyError,
    SelectionError,
    ShapeMismatchError,
    StrataError,
)
from strataio.layout.extents import Extents
from strataio.layout.pieces import plan_copy, scratch
from strataio.storage.vectored import VectoredPlan

__all__ = ["LAST_RANK", "REFUSE", "IndexSchedule", "ItemsIO", "read_items", "write_items"]

_I64 = np.int64
#: the largest file offset (an MPI_Offset, a signed 64-bit integer): the end of the items
_MAX_OFFSET = 2**63 - 1
#: ROMIO's ``cb_buffer_size`` default: the buffer of an aggregator per iteration
DEFAULT_BUFFER = 16 * 1024 * 1024
#: values of the ``strataio_duplicate_writes`` hint
REFUSE = "error"
LAST_RANK = "last-rank"


def _whole(value: Any, what: str) -> int:
    """``value`` as an int (Python or numpy integer); a float such as 10.7 is a caller's
    mistake that truncating would hide."""
    try:
        return operator.index(value)
    except TypeError:
        raise StrataError(f"index schedule: {what} must be an integer, not {value!r}") from None


@dataclass(frozen=True, slots=True)
class ItemsIO:
    """What one rank's part of a read or write moved: ``items`` (records of its own indirection
    array, repeats counted once; for a read, only those that lay wholly before the end of the
    file) and ``storage_bytes`` (bytes its driver moved as an aggregator, holes read through
    by sieving included). ``file_items``, for a read: the whole items the file held (its size
    in bytes floor-divided by the item size, at most ``nitems``); the records of ``out`` read
    are those whose index is below it (``sched.indices < file_items``), the others are zeros.
    None for a write."""

    items: int
    storage_bytes: int
    file_items: int | None = None


def records(buf: np.ndarray, itemsize: int) -> np.ndarray:
    """A flat byte buffer as a 1-D array of records: an unsigned integer for 1, 2, 4 or 8
    bytes, else one void element (measured: gathers of 2-D rows of words, or of structured
    records, are up to 1.7 times slower for 12-32-byte records)."""
    if itemsize in (1, 2, 4, 8):
        return buf.view(np.dtype(f"u{itemsize}"))
    return buf.view(np.dtype((np.void, itemsize)))


def _as_bytes(arr: Any, what: str, writable: bool) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise ShapeMismatchError(f"{what} must be a numpy array, not {type(arr).__name__}")
    if not arr.flags.c_contiguous:
        raise ShapeMismatchError(f"{what} must be C-contiguous")
    if arr.dtype.hasobject:  # (references to Python objects, not bytes of records)
        raise ShapeMismatchError(f"{what} must hold plain data, not Python objects ({arr.dtype})")
    if writable and not arr.flags.writeable:
        raise ShapeMismatchError(f"{what} is read-only")
    return arr.reshape(-1).view(np.uint8)


def _runs(items: np.ndarray, itemsize: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of consecutive sorted unique ``items`` as byte pieces: file offsets, lengths and
    positions in a buffer holding the items packed in order."""
    if items.size == 0:
        z = np.zeros(0, dtype=_I64)
        return z, z, z
    brk = np.flatnonzero(np.diff(items) != 1) + 1
    first = np.concatenate(([0], brk))
    count = np.diff(np.append(first, items.size))
    return items[first] * itemsize, count * itemsize, first.astype(_I64) * itemsize


def _unique(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``a``'s sorted unique values, each element's position among them, the stable sort
    order of ``a`` and where each unique value's run starts in it (``np.unique`` with
    ``return_inverse`` less its overheads; a stable sort also finds sorted runs, such as
    the per-rank requests an aggregator receives)."""
    order = np.argsort(a, kind="stable")
    s = a[order]
    new = np.ones(a.size, dtype=bool)
    new[1:] = s[1:] != s[:-1]
    first = np.flatnonzero(new)
    inverse = np.empty(a.size, dtype=np.intp)
    inverse[order] = np.cumsum(new) - 1
    return s[first], inverse, order, first


class _Group:
    """An aggregator's share of one iteration: the sorted unique items it accesses, and the
    positions in that group of what each rank wants (ordered by rank, then index)."""

    __slots__ = ("items", "pos", "counts", "displs", "_plans", "_winners")

    def __init__(self, items: np.ndarray, pos: np.ndarray, counts: np.ndarray) -> None:
        self.items = items
        self.pos = pos
        self.counts = counts
        self.displs = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(_I64)
        self._plans: dict[tuple[str, int], Any] = {}
        self._winners: tuple[np.ndarray, np.ndarray] | None = None

    def winners(self) -> tuple[np.ndarray, np.ndarray]:
        """For duplicate writes under ``last-rank``: which received records to keep (the last
        one per item: the highest rank's) and their positions in the group."""
        if self._winners is None:
            order = np.argsort(self.pos, kind="stable")
            p = self.pos[order]
            last = np.append(p[1:] != p[:-1], True)
            sel = order[last]
            self._winners = (sel, self.pos[sel])
        return self._winners

    def read_plan(self, itemsize: int, max_hole: int, max_span: int) -> tuple[ReadPlan, int]:
        """The group's file read (and the bytes it moves): runs of consecutive items in one
        piece each, holes up to ``max_hole`` bytes read through."""
        key = ("r", max_hole)
        if key not in self._plans:
            off, ln, mem = _runs(self.items, itemsize)
            plan = ReadPlan(Extents(off, ln, mem), max_span, max_hole)
            moved = int(ln.sum())
            if off.size > 1 and max_hole > 0:
                holes = off[1:] - (off[:-1] + ln[:-1])
                moved += int(holes[holes <= max_hole].sum())
            self._plans[key] = (plan, moved)
        return self._plans[key]

    def write_plan(self, itemsize: int, threshold: int | None, max_span: int) -> _WritePlan:
        key = ("w", -2 if threshold is None else threshold)
        if key not in self._plans:
            self._plans[key] = _WritePlan(*_runs(self.items, itemsize), threshold, max_span)
        return self._plans[key]


class _WritePlan:
    """An aggregator's write of one group: the runs straight from the group buffer when no
    span is worth sieving, else covering spans read back where they have holes, the runs
    copied in and the spans written (read-modify-write inside the aggregator's own realm)."""

    __slots__ = ("_copy", "_direct", "_fill", "_size", "_spans", "moved")

    def __init__(
        self,
        off: np.ndarray,
        ln: np.ndarray,
        mem: np.ndarray,
        threshold: int | None,
        max_span: int,
    ) -> None:
        self._direct: VectoredPlan | None = None
        sp_off, sp_len = off, ln
        holed = np.zeros(0, dtype=bool)
        if threshold is not None and off.size > 1:
            sp_off, sp_len = window_spans(off, ln, max_span, True, threshold)
            holed = span_holes(off, ln, sp_off, sp_len)
        if not holed.any():
            self._direct = VectoredPlan(off, ln, mem)
            self.moved = int(ln.sum())
            return
        at = np.concatenate(([0], np.cumsum(sp_len)[:-1])).astype(_I64)
        self._size = int(sp_len.sum())
        self._fill = VectoredPlan(sp_off[holed], sp_len[holed], at[holed])
        span = np.searchsorted(sp_off, off, side="right") - 1
        self._copy = plan_copy(at[span] + (off - sp_off[span]), mem, ln)
        self._spans = VectoredPlan(sp_off, sp_len, at)
        self.moved = self._size + int(sp_len[holed].sum())

    def run(self, driver: Driver, group: np.ndarray) -> None:
        if self._direct is not None:
            driver.writev(self._direct, group)
            return
        stage = scratch(self._size, "items-stage")
        driver.readv(self._fill, stage)
        self._copy.run(stage, group)
        driver.writev(self._spans, stage)


class IndexSchedule:
    """The communication and I/O plan of one indirection array per rank (collective).

    ``indices``: the global item indices this rank needs (integers, any order, repeats
    allowed, possibly none) of a global array of ``nitems`` items of ``itemsize`` bytes.
    ``buffer_size``: bytes of items an aggregator handles per iteration (default 16 MiB,
    ROMIO's ``cb_buffer_size``). ``aggregators``: the ranks that access the file (default:
    every rank). ``nitems``, ``itemsize``, ``buffer_size`` and ``aggregators`` must be the
    same on every rank, the items' end and ``buffer_size`` at most 2**63 - 1 bytes. Raises :class:`~strataio.errors.SelectionError` (an index out of
    range) or :class:`~strataio.errors.StrataError` on every rank when any rank's arguments
    are bad or differ from another's.
    ``validate=False`` skips that agreement (one collective) for indices known to be valid,
    such as subsets of another schedule's; a bad one then raises on its rank alone, and the
    others are left waiting, so it is for callers that derive the indices themselves.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        indices: Any,
        nitems: int,
        itemsize: int,
        *,
        buffer_size: int | None = None,
        aggregators: Any = None,
        validate: bool = True,
    ) -> None:
        t0 = time.perf_counter()
        nprocs, rank = comm.Get_size(), comm.Get_rank()
        err: Exception | None = None
        idx = np.zeros(0, dtype=_I64)
        aggs = np.arange(nprocs, dtype=_I64)
        try:
            nitems, itemsize = _whole(nitems, "nitems"), _whole(itemsize, "itemsize")
            if nitems < 0:
                raise StrataError(f"index schedule: nitems {nitems} is negative")
            if itemsize < 1:
                raise StrataError(f"index schedule: itemsize {itemsize} is not at least 1 byte")
            if nitems * itemsize > _MAX_OFFSET:  # (nor does a file offset hold the end)
                raise StrataError(
                    f"index schedule: {nitems} items of {itemsize} bytes end past the largest "
                    "file offset (2**63 - 1 bytes)"
                )
            buffer_size = (
                DEFAULT_BUFFER if buffer_size is None else _whole(buffer_size, "buffer_size")
            )
            if buffer_size > _MAX_OFFSET:
                raise StrataError(
                    f"index schedule: buffer_size {buffer_size} is past 2**63 - 1 bytes"
                )
            if buffer_size < itemsize:
                raise StrataError(
                    f"index schedule: buffer_size {buffer_size} is smaller than one "
                    f"{itemsize}-byte item"
                )
            if aggregators is not None:
                given = np.asarray(aggregators)
                if given.size and given.dtype.kind not in "iu":
                    raise StrataError(
                        f"index schedule: aggregators must be ranks (integers), not {given.dtype}"
                    )
                aggs = np.unique(given.astype(_I64, copy=False))
                if aggs.size == 0 or aggs[0] < 0 or aggs[-1] >= nprocs:
                    raise StrataError(
                        f"index schedule: aggregators {aggregators!r} are not ranks of 0..{nprocs - 1}"
                    )
            raw = np.asarray(indices)
            if raw.size and raw.dtype.kind not in "iu":
                raise SelectionError(f"indices must be integers, not {raw.dtype}")
            if raw.size and raw.dtype.kind == "u" and int(raw.max()) > _MAX_OFFSET:
                raise SelectionError(  # (before the cast to int64 wraps it negative)
                    f"index {int(raw.max())} is out of range for an array of {nitems} items "
                    f"(rank {rank})"
                )
            idx = raw.astype(_I64, copy=False).reshape(-1)
            if idx.size:
                lo, hi = int(idx.min()), int(idx.max())
                if lo < 0 or hi >= nitems:
                    bad = lo if lo < 0 else hi
                    raise SelectionError(
                        f"index {bad} is out of range for an array of {nitems} items "
                        f"(rank {rank}, {int(((idx < 0) | (idx >= nitems)).sum())} bad indices)"
                    )
        except Exception as exc:  # every rank must hear of it
            err = exc
        if validate:
            agree(comm, err)
            # ranks whose items or domains differ would exchange records of other sizes
            # (truncated messages, wrong bytes) and leave the next collective call waiting
            # (the aggregators as a digest: sets of one count, sum and sum of squares differ)
            if differs_in(comm, aggs.tobytes(), nitems, itemsize, buffer_size, aggs.size):
                raise StrataError(
                    f"index schedule: nitems, itemsize, buffer_size and aggregators must be "
                    f"the same on every rank (this rank: {nitems}, {itemsize}, {buffer_size}, "
                    f"{aggs.tolist() if aggs.size <= 8 else f'{aggs.size} ranks'})"
                )
        elif err is not None:  # (a caller's broken promise: only this rank knows)
            raise err
        self.nitems, self.itemsize, self.buffer_size = nitems, itemsize, buffer_size
        self.nprocs, self.rank = nprocs, rank
        self.aggregators = aggs
        naggr = aggs.size
        self.per = max(-(-nitems // naggr), 1)
        """Items in each aggregator's data domain (the last one may hold fewer)."""

        # The rank's unique indices, sorted (so grouped by destination), with the position of
        # each index among them and the last occurrence of each (whose value a write takes).
        n = idx.size
        self.unique, self.inverse, order, first = _unique(idx)
        self.last = order[np.append(first[1:], n) - 1] if n else np.zeros(0, dtype=np.intp)
        self.n = n

        # Coalesced requests: one contiguous run of the sorted unique indices per aggregator.
        seg = np.searchsorted(self.unique, np.arange(naggr + 1, dtype=_I64) * self.per)
        scount = np.zeros(nprocs, dtype=_I64)
        sdispl = np.zeros(nprocs, dtype=_I64)
        scount[aggs] = np.diff(seg)
        sdispl[aggs] = seg[:-1]
        rcount = np.empty(nprocs, dtype=_I64)
        comm.Alltoall(scount, rcount)
        rdispl = np.concatenate(([0], np.cumsum(rcount)[:-1])).astype(_I64)
        wanted = np.empty(int(rcount.sum()), dtype=_I64)
        comm.Alltoallv(
            [self.unique, (scount, sdispl), MPI.INT64_T], [wanted, (rcount, rdispl), MPI.INT64_T]
        )

        # Aggregator side: the union of what is wanted from it, in groups of B items.
        per_iter = max(buffer_size // itemsize, 1)
        self.groups: list[_Group] = []
        shared = 0
        counts = np.zeros((0, nprocs), dtype=_I64)
        if wanted.size:
            src = np.repeat(np.arange(nprocs, dtype=_I64), rcount)
            union, inv, _, first = _unique(wanted)
            shared = int((np.diff(np.append(first, wanted.size)) > 1).sum())
            grp = inv // per_iter
            ngroups = -(-union.size // per_iter)
            counts = np.bincount(grp * nprocs + src, minlength=ngroups * nprocs)
            counts = counts.reshape(ngroups, nprocs).astype(_I64)
            by_group = np.argsort(grp, kind="stable")  # (group, rank, index) order
            pos = inv[by_group] - grp[by_group] * per_iter
            bounds = np.concatenate(([0], np.cumsum(counts.sum(axis=1))))
            for k in range(ngroups):  # (a loop per iteration; the items are numpy)
                self.groups.append(
                    _Group(
                        union[k * per_iter : (k + 1) * per_iter],
                        pos[bounds[k] : bounds[k + 1]],
                        counts[k],
                    )
                )
        table = np.empty((nprocs, 2), dtype=_I64)
        comm.Allgather(np.array([len(self.groups), shared], dtype=_I64), table)
        self.iterations, self.shared = int(table[:, 0].max()), int(table[:, 1].sum())
        """Iterations of a transfer (the most groups any aggregator has); ``shared``: indices
        wanted by more than one rank (a write of them needs ``last-rank``)."""

        # Requester side: how many items each aggregator sends in each iteration, and where
        # they land among this rank's unique indices (aggregator segment, then iteration).
        k_all = self.iterations
        tell = np.zeros((nprocs, k_all), dtype=_I64)
        tell[:, : counts.shape[0]] = counts.T
        heard = np.empty((nprocs, k_all), dtype=_I64)
        comm.Alltoall(tell, heard)
        self.counts = np.ascontiguousarray(heard.T)  # (iteration, rank) items from that rank
        start = np.zeros(nprocs, dtype=_I64)
        start[aggs] = seg[:-1]
        within = np.cumsum(self.counts, axis=0) - self.counts
        self.displs = start[None, :] + within
        if not np.array_equal(self.counts.sum(axis=0), scount):  # (an internal invariant)
            raise StrataError("index schedule: aggregators' counts disagree with the requests")
        self.build_seconds = time.perf_counter() - t0
        """Seconds this rank spent building the schedule."""

    @property
    def indices(self) -> np.ndarray:
        """This rank's indices in its own order (rebuilt from the unique indices)."""
        return self.unique[self.inverse]

    @property
    def nbytes(self) -> int:
        """Bytes of memory the schedule holds on this rank (its index arrays and plans'
        inputs): O(indices of the rank + indices it serves + iterations × ranks),
        independent of ``nitems``."""
        arrays = [self.unique, self.inverse, self.last, self.counts, self.displs]
        for g in self.groups:
            arrays += [g.items, g.pos, g.counts]
        return int(sum(a.nbytes for a in arrays))

    def compatible(self, comm: MPI.Comm) -> bool:
        """Whether this schedule can run on ``comm`` (the same processes in the same order)."""
        return comm.Get_size() == self.nprocs and comm.Get_rank() == self.rank

    def __repr__(self) -> str:
        return (
            f"IndexSchedule({self.n} indices, {self.unique.size} unique, nitems={self.nitems}, "
            f"itemsize={self.itemsize}, {self.iterations} iterations)"
        )


def _check_call(
    comm: MPI.Comm,
    driver: Driver | None,
    sched: IndexSchedule,
    buf: Any,
    what: str,
    path: str,
    writable_buf: bool,
) -> np.ndarray:
    """This rank's checks of a read or write (raised locally; the caller agrees)."""
    if not isinstance(sched, IndexSchedule):
        raise StrataError(f"{what}: expected an IndexSchedule, not {type(sched).__name__}")
    if not sched.compatible(comm):
        raise StrataError(
            f"{what}: the schedule was built for {sched.nprocs} ranks (this is rank "
            f"{sched.rank}); {path} is open on {comm.Get_size()} (rank {comm.Get_rank()})"
        )
    data = _as_bytes(buf, "out" if writable_buf else "values", writable_buf)
    want = sched.n * sched.itemsize
    if data.size != want:
        raise ShapeMismatchError(
            f"{what}: {'out' if writable_buf else 'values'} holds {data.size} bytes; the "
            f"schedule's {sched.n} indices of {sched.itemsize}-byte items need {want} "
            f"(rank {sched.rank})"
        )
    if sched.groups and driver is None:
        raise StrataError(
            f"{what}: rank {sched.rank} aggregates items but did not open {path} "
            "(romio_no_indep_rw=true: build the schedule with the file's aggregators)"
        )
    return data


def _read_hole(hints: Any, items: np.ndarray, itemsize: int) -> int:
    """Largest hole an aggregator's read of a group crosses (bytes): the measured rule
    (``SIEVE_READ_BYTES``), none with ``romio_ds_read=disable``, or all of them when the
    group's density reaches ``romio_cb_ds_threshold`` percent."""
    threshold = sieve_threshold(hints, False)
    if threshold is None:
        return 0
    if threshold == AUTO_THRESHOLD:
        return SIEVE_READ_BYTES
    extent = (int(items[-1]) - int(items[0]) + 1) if items.size else 1
    return np.iinfo(_I64).max // 2 if 100 * items.size // extent >= threshold else 0


def read_items(
    comm: MPI.Comm,
    driver: Driver | None,
    sched: IndexSchedule,
    out: Any,
    hints: Any,
    path: str,
    write_only: bool,
    file_size: Callable[[], int],
) -> ItemsIO:
    """Collective read of ``sched``'s items into ``out`` (a C-contiguous array of
    ``sched.n * sched.itemsize`` bytes, filled in the rank's own index order). ``file_size``
    gives the file's size in bytes (raising :class:`StrataError`); the aggregators take it
    before reading (every rank, where no rank has an item), and a failure of it on any rank
    raises on every rank. Items past the end of the file are not read: they read as zeros,
    and the result counts only the items read and says where the file ended (see the
    module's docstring)."""
    err: Exception | None = None
    data = np.zeros(0, dtype=np.uint8)
    try:
        if write_only:
            raise ReadOnlyError(f"{path}: opened write-only; reads are not allowed")
        data = _check_call(comm, driver, sched, out, "read_items", path, True)
    except Exception as exc:
        err = exc
    agree(comm, err)
    size = sched.itemsize
    mine = scratch(sched.unique.size * size, "items-mine")
    rtype = MPI.BYTE.Create_contiguous(size).Commit()
    moved = 0
    # (an error flag, and minus the smallest size an aggregator saw: one MAX reduction)
    flag = np.array([0, np.iinfo(_I64).min], dtype=_I64)
    # (no iteration: no rank has an item, none aggregates, and every rank looks instead)
    if sched.groups or not sched.iterations:
        try:
            flag[1] = -file_size()
        except (OSError, StrataError) as exc:
            err = exc if isinstance(exc, StrataError) else BackendError(f"{path}: {exc}")
    req = MPI.REQUEST_NULL
    try:
        for k in range(sched.iterations):
            send = np.zeros(0, dtype=np.uint8)
            scount = np.zeros(sched.nprocs, dtype=_I64)
            sdispl = scount
            if k < len(sched.groups) and err is None:
                g = sched.groups[k]
                buf = scratch(g.items.size * size, "items-group")
                try:
                    plan, n = g.read_plan(size, _read_hole(hints, g.items, size), sched.buffer_size)
                    plan.run(driver, buf)
                    moved += n
                except (OSError, StrataError) as exc:  # keep exchanging: no rank may hang
                    err = exc if isinstance(exc, StrataError) else BackendError(f"{path}: {exc}")
                send = scratch(g.pos.size * size, "items-send")
                np.take(records(buf, size), g.pos, out=records(send, size))
                scount, sdispl = g.counts, g.displs
            elif k < len(sched.groups):
                g = sched.groups[k]
                send = np.zeros(g.pos.size * size, dtype=np.uint8)
                scount, sdispl = g.counts, g.displs
            if k == sched.iterations - 1:  # every read is done: agree during the exchange
                flag[0] = err is not None
                req = comm.Iallreduce(MPI.IN_PLACE, flag, op=MPI.MAX)
            comm.Alltoallv(
                [send, (scount, sdispl), rtype],
                [mine, (sched.counts[k], sched.displs[k]), rtype],
            )
    finally:
        rtype.Free()
    if not sched.iterations:  # (no exchange to agree during)
        flag[0] = err is not None
        comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX)
    req.Wait()
    if flag[0]:
        raise_agreed(comm, err)
    np.take(records(mine, size), sched.inverse, out=records(data, size))
    nbytes = -int(flag[1])
    whole = min(nbytes // size, sched.nitems)
    return ItemsIO(int(np.searchsorted(sched.unique, whole)), moved, whole)


def write_items(
    comm: MPI.Comm,
    driver: Driver | None,
    sched: IndexSchedule,
    values: Any,
    hints: Any,
    path: str,
    read_only: bool,
) -> ItemsIO:
    """Collective write of ``values`` (``sched.n`` items in the rank's own index order) to
    ``sched``'s items. An index written by two ranks raises
    :class:`~strataio.errors.DuplicateWriteError` on every rank unless ``hints`` say
    ``strataio_duplicate_writes=last-rank``; nothing is written when any rank fails a check."""
    err: Exception | None = None
    data = np.zeros(0, dtype=np.uint8)
    last_rank = str(getattr(hints, "strataio_duplicate_writes", REFUSE)) == LAST_RANK
    try:
        if read_only:
            raise ReadOnlyError(f"{path}: opened read-only")
        data = _check_call(comm, driver, sched, values, "write_items", path, False)
        if sched.shared and not last_rank:
            raise DuplicateWriteError(
                f"write_items: {sched.shared} indices are written by more than one rank; "
                "give each index to one rank, or open the file with the hint "
                "strataio_duplicate_writes=last-rank (the highest rank's value wins)"
            )
    except Exception as exc:
        err = exc
    agree(comm, err)
    size = sched.itemsize
    mine = scratch(sched.unique.size * size, "items-mine")
    np.take(records(data, size), sched.last, out=records(mine, size))
    threshold = sieve_threshold(hints, True)
    if threshold is not None and driver is not None and not driver.read_write:
        threshold = None  # (a write-only file cannot read its holes back)
    rtype = MPI.BYTE.Create_contiguous(size).Commit()
    moved = 0
    try:
        for k in range(sched.iterations):
            g = sched.groups[k] if k < len(sched.groups) else None
            recv = scratch((g.pos.size if g else 0) * size, "items-send")
            zero = np.zeros(sched.nprocs, dtype=_I64)
            comm.Alltoallv(
                [mine, (sched.counts[k], sched.displs[k]), rtype],
                [recv, (g.counts, g.displs) if g else (zero, zero), rtype],
            )
            if g is None or err is not None:
                continue
            buf = scratch(g.items.size * size, "items-group")
            rec = records(buf, size)
            if sched.shared:
                sel, at = g.winners()
                rec[at] = records(recv, size)[sel]
            else:
                rec[g.pos] = records(recv, size)
            try:
                plan = g.write_plan(size, threshold, sched.buffer_size)
                plan.run(driver, buf)
                moved += plan.moved
            except (OSError, StrataError) as exc:
                err = exc if isinstance(exc, StrataError) else BackendError(f"{path}: {exc}")
    finally:
        rtype.Free()
    agree(comm, err)
    return ItemsIO(sched.unique.size, moved)
