"""Two-phase collective I/O, and the per-call choice between it and independent I/O.

Every rank brings one :class:`Access`: its file pieces (offsets and lengths, with ``mem`` the
byte position of each piece in the rank's buffer — the caller's own memory, or a packed copy
when the memory layout is much finer than the file's) and that buffer. A collective call then
runs:

1. **Agreement** — one ``Allgather`` (persistent, :class:`Agreement`) of five integers per
   rank (error code, first and last byte touched, bytes, pieces). An error anywhere is known
   everywhere before any byte moves, and the same numbers drive the choice below, so every
   rank takes the same path.
2. **Choice** (``romio_cb_read`` / ``romio_cb_write`` = enable / disable / automatic). ROMIO's
   own heuristic only asks "do the ranks' ranges interleave?". On a node-local file system with
   a page cache the exchange costs as much as the I/O it saves, so *automatic* also goes
   independent unless pieces are tiny (mean piece < ``LARGE_PIECE`` bytes, where sieving
   drags ``1/density`` times the data through every rank) or, for writes, the ranks would
   write thousands of small pieces one system call each (``PIECEWISE_WRITES``: the kernel
   serializes them) and every rank has a core of its own, and whenever one rank does all the
   I/O; it aggregates when ranges interleave and one of those holds.
3. **Two-phase** — realms from a :class:`~strataio.collective.realms.RealmPolicy` over the
   aggregate access region; each realm is walked in windows of ``cb_buffer_size`` bytes, one
   window per aggregator per iteration. The pieces' descriptors (offset, length) are sent to
   their aggregators once, up front (``Alltoall`` of counts + ``Alltoallv`` of descriptors), so
   each iteration needs a single ``Alltoallw`` of data whose counts both sides derive locally
   (:mod:`strataio.collective.exchange`: pieces of 1 KiB and more move through derived
   datatypes straight between the caller's memory and the aggregator's realm buffer, smaller
   ones are packed; an aggregator's own pieces are copied without MPI). The realm buffer is
   laid out like the file: aggregators access each window's covering span, or its runs, by the
   cost model of :mod:`strataio.collective.fileio` (conditional data sieving); a write window
   with holes is read-modify-written, which is safe because the aggregator owns its realm.
"""

from __future__ import annotations

import struct
import sys
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from strataio.collective import fileio, sieving
from strataio.collective.exchange import ExchangeSide, alltoallw
from strataio.collective.node import NodeLayout
from strataio.collective.realms import RealmPolicy, select_aggregators
from strataio.errors import StrataError
from strataio.layout.extents import Extents, exclusive_cumsum
from strataio.layout.pieces import copy_pieces, scratch, zeros

_I64 = np.int64

# Mean piece size from which automatic mode stays independent. Measured with
# ``strataio bench collective`` on a node-local page-cached file system at 2 and 4 ranks:
# independent sieving beat two-phase for every HPIO size down to 64-byte regions (reads and
# writes), because the exchange costs as much as the copies it saves and all ranks sieve in
# parallel; only pieces smaller than this are worth aggregating.
LARGE_PIECE = 64

# Pieces written one system call each (see _piecewise_writes) from which automatic mode
# aggregates a write whose ranges interleave: concurrent writes to one file are serialized by
# the kernel (ext4 takes the inode lock for every buffered write), so thousands of small writes
# from several ranks cost more than moving their bytes to one aggregator that writes large
# spans. Measured on a 16-core node (strataio bench collective, HPIO 4 KiB regions, 4096 per
# rank), MB/s independent -> two-phase: 8 ranks (29 KiB gaps, wider than sieving crosses)
# 899-1225 -> 1670-2177, 16 ranks (62 KiB) 841-964 -> 1566-1910; at 2 and 4 ranks the gaps
# (4.3 and 12.5 KiB) are sieved, one call per 512 KiB, and independent wins (2 ranks 2591-3474
# against 1461-1627, 4 ranks 2362 against 1590). Not on a crowded node (more ranks than cores):
# there the polling ranks slow the aggregator down (HPIO 4 KiB regions written one call each at
# 4 ranks on 2 cores: independent 756, two-phase 566 MB/s).
PIECEWISE_WRITES = 1024

# Columns of the agreement row.
ERR, FIRST, LAST, NBYTES, NPIECES = range(5)


class AccessPlan:
    """What one rank's access looks like apart from its bytes: the file pieces (``mem`` =
    positions in the rank's buffer), the agreement numbers, and the independent read and write
    plans built for it. A :class:`~strataio.collective.file.File` memoizes these across calls, so a
    call that repeats a view, a buffer type and an offset skips all of the planning."""

    __slots__ = ("file", "reads", "row", "summary", "writes")

    def __init__(self, file: Extents) -> None:
        self.file = file
        n = len(file)
        self.summary = (file.first, file.last, file.nbytes, n) if n else (0, 0, 0, 0)
        self.row = _ROW.pack(0, *self.summary)  # agreement row of a valid call
        self.reads: dict[tuple[int, int], fileio.ReadPlan | None] = {}
        self.writes: dict[tuple[int, int | None], sieving.SievePlan] = {}


@dataclass(slots=True)
class Access:
    """One rank's part of a transfer: file pieces ``file`` and the caller's buffer ``stream``
    (flat ``uint8``; source for writes, destination for reads); ``file.mem`` are byte offsets
    into ``stream``, so data moves between file and caller memory without a packed copy.
    ``plan`` carries what was planned for this layout in earlier calls."""

    file: Extents
    stream: np.ndarray
    plan: AccessPlan | None = None


#: an agreement row as the persistent Allgather sends it: five native int64
_ROW = struct.Struct("5q")


def agreement_row(access: Access | None, err: int) -> bytes:
    """This rank's five agreement numbers (see the module docstring), packed."""
    if access is None:
        return _ROW.pack(err, 0, 0, 0, 0)
    plan = access.plan if access.plan is not None else AccessPlan(access.file)
    if err == 0:
        return plan.row
    return _ROW.pack(err, *plan.summary)


class Agreement:
    """The agreement of one file's collective calls: a persistent (MPI-4) ``Allgather`` of the
    ranks' rows, set up once when the file opens (collective) and only started and waited for
    per call. After a multi-megabyte copy has flushed the caches, as in every benchmark call,
    that costs 21-24 us against 60-62 us for a plain ``Allgather`` (2 ranks); inside a
    collective read of 2 MB per rank the agreement took 25-42 us instead of 41-54. Without
    persistent collectives in the MPI library, a plain ``Allgather`` per call.

    A call's own work stays in plain Python (its rows in, lists out): with cold caches every
    numpy call costs 10-30 us, more than the whole choice it serves."""

    __slots__ = ("_comm", "_request", "_rows", "_send", "_send_row", "_sent", "errors", "table")

    def __init__(self, comm: MPI.Comm) -> None:
        self._comm = comm
        nprocs = comm.Get_size()
        self.table = np.zeros((nprocs, 5), dtype=_I64)
        """Every rank's row of the last call, ``(nprocs, 5)`` (overwritten by the next)."""
        self._rows = memoryview(self.table)
        self.errors = self._rows.cast("B").cast("q")[ERR::5]
        """Every rank's error code of the last call (a view of :attr:`table`)."""
        send = self.table[0] if nprocs == 1 else np.zeros(5, dtype=_I64)
        self._send_row = send  # (what MPI is given: five int64, the type of the table's rows)
        self._send = memoryview(send).cast("B")
        self._sent: bytes | None = None  # the row in the send buffer (an AccessPlan's, often)
        self._request: MPI.Prequest | None = None
        if nprocs > 1:
            try:
                self._request = comm.Allgather_init(send, self.table)
            except NotImplementedError:  # an MPI before 4.0
                self._request = None

    def __call__(self, row: bytes) -> list[list[int]]:
        """All ranks' rows (see :func:`agreement_row`), as lists; also in :attr:`table`. With
        one rank no communication happens."""
        if row is not self._sent:  # a call repeating a layout sends the same row object
            self._send[:] = row
            self._sent = row
        if self._request is not None:
            self._request.Start()
            self._request.Wait()
        elif self.table.shape[0] > 1:
            self._comm.Allgather(self._send_row, self.table)
        return self._rows.tolist()

    def free(self) -> None:
        """Release the persistent request (local)."""
        if self._request is not None:
            self._request.Free()
            self._request = None


def use_two_phase(
    stats: np.ndarray | list[list[int]], mode: str, write: bool = False, crowded: bool = False
) -> bool:
    """Whether a collective call aggregates, from the agreed ``stats`` (an ``(nprocs, 5)``
    array or its rows as lists), the hint ``mode``, the direction and whether some node has more
    ranks than cores (:attr:`strataio.collective.node.NodeLayout.crowded`).

    ``"enable"`` and ``"disable"`` force the answer (the values :class:`Hints` holds, lower
    case); ``"automatic"`` follows the module docstring. Every rank computes the same answer
    from the same numbers.
    """
    if mode == "disable":
        return False
    active, nbytes, pieces = _totals(stats)
    if active == 0:
        return False
    if mode == "enable":
        return True
    if active < 2:
        return False
    if nbytes >= LARGE_PIECE * max(pieces, 1) and not (
        write
        and not crowded
        and pieces >= PIECEWISE_WRITES
        and _piecewise_writes(stats) >= PIECEWISE_WRITES
    ):
        return False
    return not ranges_disjoint(np.asarray(stats, dtype=_I64))


def _piecewise_writes(stats: np.ndarray | list[list[int]]) -> int:
    """How many pieces the ranks would write one system call each on the independent path:
    those of ranks whose pieces lie further apart (on average) than automatic sieving crosses
    and are shorter than ``SYSCALL_BYTES`` (the agreed numbers alone decide, so every rank
    gets the same count whatever its own sieving hints)."""
    hole = sieving.hole_limit("automatic", write=True)
    total = 0
    for _, first, last, nbytes, npieces in _as_rows(stats):
        small = nbytes < fileio.SYSCALL_BYTES * npieces
        if npieces > 1 and small and last - first - nbytes > hole * (npieces - 1):
            total += npieces
    return total


def _as_rows(stats: np.ndarray | list[list[int]]) -> list[list[int]]:
    return stats.tolist() if type(stats) is np.ndarray else stats  # type: ignore[return-value]


def _totals(stats: np.ndarray | list[list[int]]) -> tuple[int, int, int]:
    """(ranks with bytes to move, bytes, pieces) of the agreed ``stats``."""
    active = nbytes = pieces = 0
    for row in _as_rows(stats):
        if row[NBYTES]:
            active += 1
            nbytes += row[NBYTES]
            pieces += row[NPIECES]
    return active, nbytes, pieces


# ---------------------------------------------------------------------------- planning
@dataclass(slots=True)
class _Plan:
    """The schedule of one two-phase call, identical in shape on every rank."""

    ntimes: int
    win_lo: np.ndarray  # (A, ntimes) window start of each aggregator per iteration
    win_hi: np.ndarray
    aggs: np.ndarray  # aggregator ranks
    # client side: my pieces in (iteration, aggregator, offset) order
    c_off: np.ndarray
    c_len: np.ndarray
    c_mem: np.ndarray
    c_dest: np.ndarray  # destination rank of each piece
    c_iter_bounds: np.ndarray  # piece index range of each iteration
    # aggregator side: received pieces in (iteration, source, client) order
    a_off: np.ndarray
    a_len: np.ndarray
    a_src: np.ndarray
    a_iter_bounds: np.ndarray
    my_agg: int  # my index among the aggregators, -1 if none
    nprocs: int
    rank: int
    background: bool  # aggregators access windows in the background I/O thread (_overlap)
    buffers: tuple[np.ndarray, ...]  # realm buffers (two with background I/O), aggregators only

    def client_side(self, i: int, stream: np.ndarray, send: bool) -> ExchangeSide:
        """My pieces of iteration ``i`` in the caller's buffer, to or from the aggregators."""
        c0, c1 = self.c_iter_bounds[i], self.c_iter_bounds[i + 1]
        mem, lens, dest = self.c_mem[c0:c1], self.c_len[c0:c1], self.c_dest[c0:c1]
        return ExchangeSide(stream, mem, lens, dest, self.nprocs, self.rank, send)

    def window(self, i: int, write: bool, sieve: bool, double: bool) -> _Window | None:
        """My window of iteration ``i`` as an aggregator (None: no pieces in it); with
        ``double`` consecutive iterations use two realm buffers in turn."""
        a0, a1 = self.a_iter_bounds[i], self.a_iter_bounds[i + 1]
        if a1 == a0:
            return None
        span = int(self.win_hi[self.my_agg, i] - self.win_lo[self.my_agg, i])
        buf = self.buffers[i % 2 if double else 0]
        return _Window(self.a_off[a0:a1], self.a_len[a0:a1], write, sieve, span, buf)

    def aggregator_side(self, i: int, window: _Window | None, send: bool) -> ExchangeSide:
        """The clients' pieces of iteration ``i`` in my realm buffer, at their file positions."""
        if window is None:
            return ExchangeSide(_BYTES, _NONE, _NONE, _NONE, self.nprocs, self.rank, send)
        a0, a1 = self.a_iter_bounds[i], self.a_iter_bounds[i + 1]
        at, lens, src = self.a_off[a0:a1] - window.base, self.a_len[a0:a1], self.a_src[a0:a1]
        return ExchangeSide(window.buf, at, lens, src, self.nprocs, self.rank, send)


class PeerFailure(StrataError):
    """Another rank failed while planning a two-phase call; every rank learned it in the
    planning's first collective, so none is left waiting. The failing rank raises its own
    exception; the caller agrees on it (``File`` re-raises that rank's error everywhere)."""


def _plan(
    comm: MPI.Comm,
    ext: Extents,
    stats: np.ndarray,
    hints: Any,
    policy: RealmPolicy,
    nodes: NodeLayout | None = None,
    prepare: Callable[[], None] | None = None,
) -> _Plan:
    """The schedule of a two-phase call (collective). Everything that can fail before the data
    moves — ``prepare()``, the realm policy, the cutting of this rank's pieces, the realm
    buffers — runs before the first collective, whose counts carry the failure: -1 from a rank
    that failed, so every rank learns it there and raises (:class:`PeerFailure` on the
    others)."""
    nprocs, rank = comm.Get_size(), comm.Get_rank()
    failure: Exception | None = None
    try:
        if prepare is not None:
            prepare()
        local = _plan_locally(ext, stats, hints, policy, nodes, nprocs, rank)
        scount = local.scount
    except Exception as exc:  # any failure here must reach the other ranks
        failure, scount = exc, np.full(nprocs, -1, dtype=_I64)
    rcount = np.empty(nprocs, dtype=_I64)
    comm.Alltoall(scount, rcount)
    if failure is not None:
        raise failure
    if int(rcount.min()) < 0:
        failed = np.flatnonzero(rcount < 0).tolist()
        raise PeerFailure(f"rank(s) {failed} failed while planning the two-phase call")
    try:
        return _plan_aggregators(comm, local, scount, rcount)
    except Exception as exc:  # the other ranks are in the descriptor exchange or past it
        if nprocs == 1:
            raise
        _abort(comm, exc)


def _plan_aggregators(
    comm: MPI.Comm, local: _LocalPlan, scount: np.ndarray, rcount: np.ndarray
) -> _Plan:
    """The rest of :func:`_plan` once every rank's planning succeeded: the descriptors of the
    pieces go to their aggregators, which order them by iteration."""
    nprocs, rank = comm.Get_size(), comm.Get_rank()
    # Descriptors to aggregators, once: grouped by destination, each in (iteration, offset).
    rdesc = np.empty((int(rcount.sum()), 2), dtype=_I64)
    sd = exclusive_cumsum(scount) * 2
    rd = exclusive_cumsum(rcount) * 2
    comm.Alltoallv(
        [local.desc, (scount * 2, sd), MPI.INT64_T], [rdesc, (rcount * 2, rd), MPI.INT64_T]
    )
    my_agg, realms, cb = local.my_agg, local.realms, local.cb
    a_off, a_len = rdesc[:, 0], rdesc[:, 1]
    a_src = np.repeat(np.arange(nprocs, dtype=_I64), rcount)
    if my_agg >= 0 and a_off.size:
        a_iter = (a_off - realms[my_agg, 0]) // cb
        aorder = np.argsort(a_iter, kind="stable")  # keeps (source, client order) inside
        a_off, a_len, a_src, a_iter = a_off[aorder], a_len[aorder], a_src[aorder], a_iter[aorder]
    else:
        a_iter = np.zeros(0, dtype=_I64)
    a_iter_bounds = np.searchsorted(a_iter, np.arange(local.ntimes + 1))
    return _Plan(
        local.ntimes, local.win_lo, local.win_hi, local.aggs, *local.client,
        a_off, a_len, a_src, a_iter_bounds, my_agg, nprocs, rank, local.background,
        local.buffers,
    )  # fmt: skip


@dataclass(slots=True)
class _LocalPlan:
    """The part of a :class:`_Plan` a rank computes alone, before any communication."""

    ntimes: int
    win_lo: np.ndarray
    win_hi: np.ndarray
    aggs: np.ndarray
    realms: np.ndarray
    cb: int
    my_agg: int
    background: bool
    buffers: tuple[np.ndarray, ...]  # realm buffers
    client: tuple[np.ndarray, ...]  # c_off, c_len, c_mem, c_dest, c_iter_bounds
    scount: np.ndarray  # descriptors for each rank
    desc: np.ndarray  # (offset, length) rows grouped by destination


def _plan_locally(
    ext: Extents,
    stats: np.ndarray,
    hints: Any,
    policy: RealmPolicy,
    nodes: NodeLayout | None,
    nprocs: int,
    rank: int,
) -> _LocalPlan:
    active = stats[stats[:, NBYTES] > 0]
    lo, hi = int(active[:, FIRST].min()), int(active[:, LAST].max())
    aggs = select_aggregators(nprocs, int(hints.cb_nodes))
    realms = np.asarray(policy.realms(lo, hi, aggs.size, hints), dtype=_I64)
    cb = max(int(hints.cb_buffer_size), 1)
    rlen = realms[:, 1] - realms[:, 0]
    nwin = -(-rlen // cb)
    ntimes = int(nwin.max()) if nwin.size else 0
    it = np.arange(ntimes, dtype=_I64)
    win_lo = np.minimum(realms[:, :1] + it[None, :] * cb, realms[:, 1:])
    win_hi = np.minimum(win_lo + cb, realms[:, 1:])
    background = _overlap(ntimes, aggs.size, hints, nodes)
    my_agg = int(np.searchsorted(aggs, rank)) if rank in set(aggs.tolist()) else -1
    buffers: tuple[np.ndarray, ...] = ()
    if my_agg >= 0 and ntimes:  # the realm buffers, now rather than in the middle of the exchange
        span = int((win_hi[my_agg] - win_lo[my_agg]).max())
        buffers = tuple(scratch(span, f"realm{slot}") for slot in range(2 if background else 1))

    # Client: cut my pieces at every window boundary, then label each with its window.
    ext = ext.compact()
    valid = win_hi > win_lo
    starts = win_lo[valid]  # row-major = ascending offsets: realm by realm, window by window
    agg_of = np.nonzero(valid)[0]
    iter_of = np.nonzero(valid)[1]
    if len(ext):
        cut = ext.sort().split(np.concatenate((starts, win_hi[valid])))
        w = np.searchsorted(starts, cut.offsets, side="right") - 1
        d_iter, d_agg = iter_of[w], agg_of[w]
    else:
        cut = Extents.empty()
        d_iter = d_agg = np.zeros(0, dtype=_I64)
    # In offset order the pieces are already grouped by aggregator (realms ascend) and, inside
    # one, by iteration: exactly the descriptor order. The per-iteration order (iteration,
    # aggregator, offset) is then one stable sort on the iteration number.
    d_off, d_len, d_dest = cut.offsets, cut.lengths, aggs[d_agg]
    if ntimes > 1:
        key = d_iter.astype(np.int32) if ntimes < 2**31 else d_iter
        order = np.argsort(key, kind="stable")
        c_off, c_len, c_mem = d_off[order], d_len[order], cut.mem[order]
        c_iter, c_dest = d_iter[order], d_dest[order]
    else:
        c_off, c_len, c_mem, c_iter, c_dest = d_off, d_len, cut.mem, d_iter, d_dest
    c_iter_bounds = np.searchsorted(c_iter, np.arange(ntimes + 1))
    scount = np.bincount(d_dest, minlength=nprocs).astype(_I64)
    desc = np.empty((d_off.size, 2), dtype=_I64)
    desc[:, 0], desc[:, 1] = d_off, d_len
    return _LocalPlan(
        ntimes, win_lo, win_hi, aggs, realms, cb, my_agg, background, buffers,
        (c_off, c_len, c_mem, c_dest, c_iter_bounds), scount, desc,
    )  # fmt: skip


def _window_runs(
    off: np.ndarray, length: np.ndarray, write: bool, max_span: int, sieve: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The runs of bytes an aggregator moves in one window, the spans it accesses, and which
    of the spans have holes (without ``sieve`` the spans are the runs, none with a hole)."""
    run_off, run_len = fileio.union_runs(off, length)
    if not sieve:
        return run_off, run_len, run_off, run_len, np.zeros(run_off.size, dtype=bool)
    sp_off, sp_len = fileio.plan_spans(run_off, run_len, max_span, write)
    holes = fileio.span_holes(run_off, run_len, sp_off, sp_len)
    return run_off, run_len, sp_off, sp_len, holes


# ---------------------------------------------------------------------------- the two phases
_NONE = np.zeros(0, dtype=_I64)
_BYTES = np.zeros(0, dtype=np.uint8)


class _Window:
    """An aggregator's file access in one iteration: the spans it reads or writes (by the cost
    model of :mod:`strataio.collective.fileio`; without ``sieve`` the runs of bytes themselves)
    and a realm buffer laid out like the file from the first span on, which the exchange fills
    (writes) or drains (reads) at the pieces' file positions."""

    __slots__ = ("base", "buf", "runs", "spans")

    def __init__(
        self,
        off: np.ndarray,
        length: np.ndarray,
        write: bool,
        sieve: bool,
        span: int,
        buffer: np.ndarray,
    ) -> None:
        run_off, run_len, sp_off, sp_len, holes = _window_runs(off, length, write, span, sieve)
        self.base = int(sp_off[0])
        self.buf = buffer[: int(sp_off[-1] + sp_len[-1]) - self.base]
        self.runs = (run_off - self.base, run_len)
        at = (sp_off - self.base).tolist()
        self.spans = list(zip(at, sp_off.tolist(), sp_len.tolist(), holes.tolist()))

    def read(self, fd: int) -> None:
        """Fill the spans from the file (past end-of-file with zeros)."""
        for at, off, n, _ in self.spans:
            fileio.pread_into(fd, self.buf[at : at + n], off)

    def read_holes(self, fd: int) -> None:
        """The read of a read-modify-write (safe because the aggregator owns its realm): the
        file's bytes into the spans with holes. Past end-of-file only the holes are zeroed:
        the exchange overwrites every other byte."""
        for at, off, n, hole in self.spans:
            if hole:
                got = fileio.pread_upto(fd, self.buf[at : at + n], off)
                if got < n:
                    self._zero_holes(at + got, at + n)

    def _zero_holes(self, lo: int, hi: int) -> None:
        """Zero the bytes of ``buf[lo:hi]`` that no run covers."""
        run_at, run_len = self.runs
        ends = run_at + run_len
        gap_at = np.concatenate(([lo], np.clip(ends, lo, hi)))
        gap_end = np.concatenate((np.clip(run_at, lo, hi), [hi]))
        keep = gap_end > gap_at
        gap_at, gap_len = gap_at[keep], (gap_end - gap_at)[keep]
        if gap_at.size:
            source = zeros(int(gap_len.max()))
            copy_pieces(self.buf, gap_at, source, np.zeros_like(gap_at), gap_len)

    def write(self, fd: int) -> None:
        for at, off, n, _ in self.spans:
            fileio.pwrite_from(fd, self.buf[at : at + n], off)


def two_phase(
    comm: MPI.Comm,
    fd: int,
    access: Access,
    stats: np.ndarray,
    hints: Any,
    policy: RealmPolicy,
    write: bool,
    nodes: NodeLayout | None = None,
    prepare: Callable[[], None] | None = None,
) -> None:
    """Collective write (read) of every rank's access: aggregators write (read) their realms,
    each window while the next (previous) one is exchanged when :func:`_overlap` says so.
    ``nodes``: where the ranks run (:func:`strataio.collective.node.layout`); ``prepare``:
    this rank's own work before any data moves (packing ``access.stream``), run as part of
    the planning, so that its failure reaches every rank like a planning failure.

    Failures reach every rank: one in a rank's own planning (realm buffers included) is known
    everywhere before any byte moves (:class:`PeerFailure` on the other ranks); an
    aggregator's I/O failure is raised once the exchange is over (the caller agrees on it).
    Anything else that breaks off the descriptor or data exchange on one rank — a buffer that
    cannot be allocated, an MPI error — leaves the others waiting in it for good, so it aborts
    the job (``MPI_Abort``) after printing what failed, as MPI's default error handler would,
    rather than hang.
    """
    plan = _plan(comm, access.file, stats, hints, policy, nodes, prepare)
    sieving_hint = getattr(hints, "romio_ds_write" if write else "romio_ds_read", "automatic")
    ds = str(sieving_hint).lower() != "disable"
    try:
        failure = (_write if write else _read)(comm, fd, access.stream, plan, ds)
    except Exception as exc:
        if comm.Get_size() == 1:
            raise
        _abort(comm, exc)
    if failure is not None:
        raise failure


def _abort(comm: MPI.Comm, exc: BaseException) -> NoReturn:
    """End the job: ``exc`` broke off a two-phase exchange that the other ranks are inside."""
    rank = comm.Get_rank()
    sys.stderr.write(
        f"strataio: rank {rank}: a two-phase exchange broke off "
        f"({type(exc).__name__}: {exc}); the other ranks would wait for it forever, "
        "so the job is aborted\n"
    )
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()
    comm.Abort(1)
    raise exc  # (MPI_Abort does not return)


def _write(
    comm: MPI.Comm, fd: int, stream: np.ndarray, plan: _Plan, ds: bool
) -> BaseException | None:
    """The windows of a collective write; an aggregator's I/O failure is returned once the
    exchange is over."""
    background = plan.background
    failure: BaseException | None = None
    writing: _Pending | None = None
    try:
        for i in range(plan.ntimes):
            send = plan.client_side(i, stream, True)
            try:
                window = plan.window(i, True, ds, background)
                recv = plan.aggregator_side(i, window, False)
            except BaseException:  # (free the side already built, whatever failed)
                send.free()
                raise
            if window is not None and failure is None:
                failure = _attempt(window.read_holes, fd)
            alltoallw(comm, send, recv)
            failure, writing = _settle(failure, writing), None
            if window is not None and failure is None:
                writing = _Pending(background, window.write, fd)
    finally:
        # the realm buffer must not be reused while it is written, even after a failure
        failure = _settle(failure, writing)
    return failure


def _read(
    comm: MPI.Comm, fd: int, stream: np.ndarray, plan: _Plan, ds: bool
) -> BaseException | None:
    """The windows of a collective read; an aggregator's I/O failure is returned once the
    exchange is over."""
    background = plan.background
    failure: BaseException | None = None

    def start(i: int) -> tuple[_Window | None, _Pending | None]:
        window = plan.window(i, False, ds, background) if i < plan.ntimes else None
        if window is None or failure is not None:  # (after a failure: exchange, read nothing)
            return window, None
        return window, _Pending(background, window.read, fd)

    upcoming = start(0)
    try:
        for i in range(plan.ntimes):
            (window, reading), upcoming = upcoming, (None, None)
            failure = _settle(failure, reading)
            if background:  # into the other realm buffer, during the exchange
                upcoming = start(i + 1)
            send = plan.aggregator_side(i, window, True)  # (a packing side packs here)
            try:
                recv = plan.client_side(i, stream, False)
            except BaseException:
                send.free()
                raise
            alltoallw(comm, send, recv)
            if not background:  # into the same realm buffer, now drained
                upcoming = start(i + 1)
    finally:
        # the realm buffer must not be reused while it is read, even after a failure
        failure = _settle(failure, upcoming[1])
    return failure


def _settle(failure: BaseException | None, pending: _Pending | None) -> BaseException | None:
    """Wait for ``pending`` (always: its realm buffer is about to be reused) and keep the first
    failure."""
    late = pending.wait() if pending is not None else None
    return failure if failure is not None else late


def _overlap(ntimes: int, naggs: int, hints: Any, nodes: NodeLayout | None) -> bool:
    """Whether aggregators access their windows in a background I/O thread: with more than one
    iteration, by the ``strataio_cb_overlap`` hint; *automatic* when every node has a spare
    core (:class:`~strataio.collective.node.NodeLayout`) for each of its aggregators' threads
    (aggregators are spread evenly over the ranks, so over the nodes when ranks fill the nodes
    in turn). Without one the thread competes with the ranks (HPIO
    4 KiB regions, forced two-phase write at 2 ranks on 2 cores: 30-35 ms with it, 35 ms
    without; setting up each exchange took 6-8 ms instead of 1 while the thread held the
    interpreter lock)."""
    mode = str(getattr(hints, "strataio_cb_overlap", "automatic")).lower()
    if ntimes < 2 or mode == "disable":
        return False
    if mode == "enable":
        return True
    if nodes is None:
        return False
    return nodes.spare_cores >= -(-naggs // max(nodes.nodes, 1))


def _attempt(io: Any, *args: Any) -> BaseException | None:
    """Run an aggregator's file access; a failure is returned, not raised, so the aggregator
    keeps exchanging (the other ranks are waiting) and raises once the call is over."""
    try:
        io(*args)
    except (OSError, StrataError) as exc:
        return exc
    return None


_io_thread: ThreadPoolExecutor | None = None


class _Pending:
    """An aggregator's file access of one window, run in the background I/O thread (which
    releases the GIL in its system calls, so it overlaps the next exchange) or, without
    ``background``, at once."""

    __slots__ = ("_failure", "_future")

    def __init__(self, background: bool, io: Any, *args: Any) -> None:
        global _io_thread
        self._future: Future[BaseException | None] | None = None
        self._failure: BaseException | None = None
        if not background:
            self._failure = _attempt(io, *args)
            return
        if _io_thread is None:
            _io_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strataio-io")
        self._future = _io_thread.submit(_attempt, io, *args)

    def wait(self) -> BaseException | None:
        """Wait for the access; its failure, if any."""
        if self._future is not None:
            self._failure, self._future = self._future.result(), None
        return self._failure


# ---------------------------------------------------------------------------- independent
class IndependentIO:
    """A rank's own reads and writes under one file's hints (data sieving by ``romio_ds_read``
    / ``romio_ds_write`` and the ``ind_*_buffer_size`` hints), with what the hints imply worked
    out once, when the file's hints are set, rather than on every call. The plans themselves
    are remembered per layout in the :class:`AccessPlan`."""

    __slots__ = ("hints", "read_key", "write_key", "write_sieves")

    def __init__(self, hints: Any) -> None:
        self.hints = hints
        ds = str(getattr(hints, "romio_ds_read", "automatic")).lower()
        size = int(getattr(hints, "ind_rd_buffer_size", sieving.DEFAULT_RD_BUFFER))
        hole = 0 if ds == "disable" else size if ds == "enable" else fileio.SYSCALL_BYTES
        self.read_key = (size, hole)
        """(span, longest hole read through) of independent reads."""
        ds = str(getattr(hints, "romio_ds_write", "automatic")).lower()
        size = int(getattr(hints, "ind_wr_buffer_size", sieving.DEFAULT_WR_BUFFER))
        self.write_sieves = ds != "disable"
        self.write_key = (size, sieving.hole_limit(ds, write=True))
        """(span, longest hole written through or None for any) of sieving writes."""

    def write(self, fd: int, access: Access, fd_readable: bool | None = None) -> None:
        """This rank's pieces written by itself: sieving under byte-range locks
        (:mod:`strataio.collective.sieving`), planned once per layout. ``fd_readable`` says
        whether ``fd`` is open read-write (None: ask the system)."""
        if fd_readable is None:
            fd_readable = sieving.readable(fd)
        if not (self.write_sieves and fd_readable):
            sieving.write_independent(fd, access.file, access.stream, self.hints)
            return
        key = self.write_key
        plans = access.plan.writes if access.plan is not None else {}
        plan = plans.get(key)
        if plan is None:
            plan = sieving.SievePlan(access.file.compact().sort(), key[0], key[1], True)
            plans[key] = plan
        plan.run(fd, access.stream, fd_readable)

    def read(self, fd: int, access: Access) -> None:
        """This rank's pieces read by itself. Disjoint pieces are read by a
        :class:`~strataio.collective.fileio.ReadPlan` (remembered in ``access.plan``): large
        pieces straight into the caller's buffer, small ones sieved through a staging buffer.
        Overlapping pieces go through :mod:`strataio.collective.sieving`."""
        key = self.read_key
        plans = access.plan.reads if access.plan is not None else {}
        plan = plans.get(key, False)
        if plan is False:
            ext = access.file.compact().sort()
            plan = fileio.ReadPlan(ext, *key) if ext.is_sorted() else None
            plans[key] = plan
        if plan is None:  # pieces overlap
            sieving.read_independent(fd, access.file, access.stream, self.hints)
        else:
            plan.run(fd, access.stream)


def ranges_disjoint(stats: np.ndarray) -> bool:
    """True when no two active ranks' ``[first, last)`` ranges overlap."""
    active = stats[stats[:, NBYTES] > 0]
    if active.shape[0] < 2:
        return True
    order = np.argsort(active[:, FIRST], kind="stable")
    first, last = active[order, FIRST], active[order, LAST]
    return bool(np.all(first[1:] >= np.maximum.accumulate(last)[:-1]))
