"""Two-phase collective I/O, and the per-call choice between it and independent I/O.

Every rank brings one :class:`Access`: its file pieces (offsets and lengths, with ``mem`` the
byte position of each piece in the rank's buffer — the caller's own memory, or a packed copy
when the memory layout is much finer than the file's) and that buffer. A collective call then
runs:

1. **Agreement** — one ``Allgather`` of five integers per rank (error code, first and last byte
   touched, bytes, pieces). An error anywhere is known everywhere before any byte moves, and
   the same numbers drive the choice below, so every rank takes the same path.
2. **Choice** (``romio_cb_read`` / ``romio_cb_write`` = enable / disable / automatic). ROMIO's
   own heuristic only asks "do the ranks' ranges interleave?". On a node-local file system with
   a page cache the exchange costs as much as the I/O it saves, so *automatic* also goes
   independent unless pieces are tiny (mean piece < ``LARGE_PIECE`` bytes, where sieving
   drags ``1/density`` times the data through every rank), and whenever one rank does all the
   I/O; it aggregates when ranges interleave and pieces are tiny.
3. **Two-phase** — realms from a :class:`~strataio.collective.realms.RealmPolicy` over the
   aggregate access region; each realm is walked in windows of ``cb_buffer_size`` bytes, one
   window per aggregator per iteration. The pieces' descriptors (offset, length) are sent to
   their aggregators once, up front (``Alltoall`` of counts + ``Alltoallv`` of descriptors), so
   each iteration needs a single ``Alltoallv`` of data whose counts both sides derive locally.
   Pieces are packed with vectorized gathers (:mod:`strataio.layout.pieces`), or not at all
   when a rank's pieces for an iteration lie back to back in its buffer (sent from it, or
   received into it, in place); an aggregator whose pieces arrive in file order with no hole
   between them writes (reads) them straight from (into) the exchange buffer. Aggregators
   access each window's covering span, or its runs, by the cost model of
   :mod:`strataio.collective.fileio` (conditional data sieving); a write window with holes is
   read-modify-written, which is safe because the aggregator owns its realm.

Exchange primitive: ``Alltoallv`` over byte buffers packed by numpy. ``Alltoallw`` with an
``hindexed_block`` datatype per peer would skip the pack, but building and committing those
datatypes every iteration costs more than the vectorized pack. Measured (MPICH 5, 4096
64-byte pieces per rank spread over all peers, median of 30, slowest rank, 2-core machine under
load): 4 ranks Alltoallv+pack 5.4 ms vs Alltoallw 10.9 ms; 2 ranks 4.2 ms vs 4.2 ms. So
Alltoallv it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from strataio.collective import fileio, sieving
from strataio.collective.realms import RealmPolicy, select_aggregators
from strataio.errors import StrataError
from strataio.layout.extents import Extents
from strataio.layout.pieces import copy_pieces, scratch

_I64 = np.int64

# Mean piece size from which automatic mode stays independent. Measured with
# ``strataio bench collective`` on a node-local page-cached file system at 2 and 4 ranks:
# independent sieving beat two-phase for every HPIO size down to 64-byte regions (reads and
# writes), because the exchange costs as much as the copies it saves and all ranks sieve in
# parallel; only pieces smaller than this are worth aggregating.
LARGE_PIECE = 64

# Up to this many ranks the agreed numbers are summed in plain Python (2.5 us for 2-4 ranks
# against numpy's 7.7 us; numpy wins from a few dozen rows on).
_FEW_RANKS = 16

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
        self.row = np.array((0, *self.summary), dtype=_I64)  # agreement row of a valid call
        self.row.flags.writeable = False
        self.reads: dict[tuple[int, int], fileio.ReadPlan | None] = {}
        self.writes: dict[tuple[int, int], sieving.SievePlan] = {}


@dataclass(slots=True)
class Access:
    """One rank's part of a transfer: file pieces ``file`` and the caller's buffer ``stream``
    (flat ``uint8``; source for writes, destination for reads); ``file.mem`` are byte offsets
    into ``stream``, so data moves between file and caller memory without a packed copy.
    ``plan`` carries what was planned for this layout in earlier calls."""

    file: Extents
    stream: np.ndarray
    plan: AccessPlan | None = None


def agreement_row(access: Access | None, err: int) -> np.ndarray:
    """This rank's five agreement numbers (see the module docstring)."""
    if access is None:
        return np.array([err, 0, 0, 0, 0], dtype=_I64)
    plan = access.plan if access.plan is not None else AccessPlan(access.file)
    if err == 0:
        return plan.row
    return np.array((err, *plan.summary), dtype=_I64)


def agree(comm: MPI.Comm, row: np.ndarray) -> np.ndarray:
    """All ranks' rows, ``(nprocs, 5)``; with one rank no communication happens."""
    if comm.Get_size() == 1:
        return row[None, :].copy()
    out = np.empty((comm.Get_size(), row.size), dtype=_I64)
    comm.Allgather(row, out)
    return out


def use_two_phase(stats: np.ndarray, mode: str) -> bool:
    """Whether a collective call aggregates, from the agreed ``stats`` and the hint ``mode``.

    ``"enable"`` and ``"disable"`` force the answer; ``"automatic"`` follows the module
    docstring. Every rank computes the same answer from the same numbers.
    """
    mode = str(mode).lower()
    if mode == "disable":
        return False
    active, nbytes, pieces = _totals(stats)
    if active == 0:
        return False
    if mode == "enable":
        return True
    if active < 2:
        return False
    if nbytes >= LARGE_PIECE * max(pieces, 1):  # mean piece of at least LARGE_PIECE bytes
        return False
    return not ranges_disjoint(stats)


def _totals(stats: np.ndarray) -> tuple[int, int, int]:
    """(ranks with bytes to move, bytes, pieces) of the agreed ``stats``."""
    if stats.shape[0] <= _FEW_RANKS:  # plain Python beats numpy's cost per call here
        rows = stats.tolist()
        return (
            sum(1 for r in rows if r[NBYTES]),
            sum(r[NBYTES] for r in rows),
            sum(r[NPIECES] for r in rows),
        )
    nbytes = stats[:, NBYTES]
    return int(np.count_nonzero(nbytes)), int(nbytes.sum()), int(stats[:, NPIECES].sum())


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


def _plan(
    comm: MPI.Comm, ext: Extents, stats: np.ndarray, hints: Any, policy: RealmPolicy
) -> _Plan:
    nprocs, rank = comm.Get_size(), comm.Get_rank()
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

    # Descriptors to aggregators, once: grouped by destination, each in (iteration, offset).
    scount = np.bincount(d_dest, minlength=nprocs).astype(_I64)
    rcount = np.empty(nprocs, dtype=_I64)
    comm.Alltoall(scount, rcount)
    desc = np.empty((d_off.size, 2), dtype=_I64)
    desc[:, 0], desc[:, 1] = d_off, d_len
    rdesc = np.empty((int(rcount.sum()), 2), dtype=_I64)
    sd = np.concatenate(([0], np.cumsum(scount)[:-1])) * 2
    rd = np.concatenate(([0], np.cumsum(rcount)[:-1])) * 2
    comm.Alltoallv([desc, (scount * 2, sd), MPI.INT64_T], [rdesc, (rcount * 2, rd), MPI.INT64_T])
    my_agg = int(np.searchsorted(aggs, rank)) if rank in set(aggs.tolist()) else -1
    a_off, a_len = rdesc[:, 0], rdesc[:, 1]
    a_src = np.repeat(np.arange(nprocs, dtype=_I64), rcount)
    if my_agg >= 0 and a_off.size:
        a_iter = (a_off - realms[my_agg, 0]) // cb
        aorder = np.argsort(a_iter, kind="stable")  # keeps (source, client order) inside
        a_off, a_len, a_src, a_iter = a_off[aorder], a_len[aorder], a_src[aorder], a_iter[aorder]
    else:
        a_iter = np.zeros(0, dtype=_I64)
    a_iter_bounds = np.searchsorted(a_iter, np.arange(ntimes + 1))
    return _Plan(
        ntimes, win_lo, win_hi, aggs, c_off, c_len, c_mem, c_dest, c_iter_bounds,
        a_off, a_len, a_src, a_iter_bounds, my_agg,
    )  # fmt: skip


def _counts(dest: np.ndarray, lengths: np.ndarray, nprocs: int) -> tuple[np.ndarray, np.ndarray]:
    counts = np.bincount(dest, weights=lengths, minlength=nprocs).astype(_I64)
    displs = np.zeros(nprocs, dtype=_I64)
    np.cumsum(counts[:-1], out=displs[1:])
    return counts, displs


def _exclusive(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(lengths.size, dtype=_I64)
    if lengths.size > 1:
        np.cumsum(lengths[:-1], out=out[1:])
    return out


def _window_runs(
    off: np.ndarray, length: np.ndarray, write: bool, max_span: int, sieve: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spans an aggregator accesses for one window, and which of them have holes (without
    ``sieve``: the runs of bytes themselves, none with a hole)."""
    run_off, run_len = fileio.union_runs(off, length)
    if not sieve:
        return run_off, run_len, np.zeros(run_off.size, dtype=bool)
    sp_off, sp_len = fileio.plan_spans(run_off, run_len, max_span, write)
    return sp_off, sp_len, fileio.span_holes(run_off, run_len, sp_off, sp_len)


# ---------------------------------------------------------------------------- the two phases
def write_two_phase(
    comm: MPI.Comm, fd: int, access: Access, stats: np.ndarray, hints: Any, policy: RealmPolicy
) -> None:
    """Collective write of every rank's access; aggregators write their realms."""
    plan = _plan(comm, access.file, stats, hints, policy)
    nprocs = comm.Get_size()
    ds = str(getattr(hints, "romio_ds_write", "automatic")).lower() != "disable"
    failure: BaseException | None = None
    for i in range(plan.ntimes):
        c0, c1 = plan.c_iter_bounds[i], plan.c_iter_bounds[i + 1]
        lens = plan.c_len[c0:c1]
        scount, sdisp = _counts(plan.c_dest[c0:c1], lens, nprocs)
        sendbuf = _back_to_back(access.stream, plan.c_mem[c0:c1], lens)
        if sendbuf is None:
            sendbuf = scratch(int(scount.sum()), "send")
            copy_pieces(sendbuf, _exclusive(lens), access.stream, plan.c_mem[c0:c1], lens)
        a0, a1 = plan.a_iter_bounds[i], plan.a_iter_bounds[i + 1]
        alen = plan.a_len[a0:a1]
        rcount, rdisp = _counts(plan.a_src[a0:a1], alen, nprocs)
        recvbuf = scratch(int(rcount.sum()), "recv")
        comm.Alltoallv([sendbuf, (scount, sdisp), MPI.BYTE], [recvbuf, (rcount, rdisp), MPI.BYTE])
        if a1 > a0 and failure is None:
            aoff = plan.a_off[a0:a1]
            span = int(plan.win_hi[plan.my_agg, i] - plan.win_lo[plan.my_agg, i])
            try:
                _aggregate(fd, aoff, alen, recvbuf, True, ds, span)
            except (OSError, StrataError) as exc:  # keep exchanging: the others are waiting
                failure = exc
    if failure is not None:
        raise failure


def _back_to_back(stream: np.ndarray, mem: np.ndarray, lens: np.ndarray) -> np.ndarray | None:
    """The stream bytes of pieces that follow one another in it, in this order, as one view
    (the packed buffer without packing); None when they do not."""
    if mem.size == 0:
        return stream[:0]
    if mem.size > 1 and not np.array_equal(mem[1:], mem[:-1] + lens[:-1]):
        return None
    return stream[int(mem[0]) : int(mem[0]) + int(lens.sum())]


def _file_ordered_runs(
    off: np.ndarray, length: np.ndarray, sp_off: np.ndarray, sp_len: np.ndarray, holes: np.ndarray
) -> list[tuple[int, int, int]] | None:
    """``(file offset, length, position in the exchanged buffer)`` of each span when the
    exchanged pieces already lie in file order without overlaps and no span has a hole: the
    spans then move straight between the file and that buffer, with no copy. None otherwise."""
    if holes.any() or not bool(np.all(off[1:] >= off[:-1] + length[:-1])):
        return None
    first = np.searchsorted(off, sp_off)  # each span starts with a piece
    pos = _exclusive(length)[first]
    if not np.array_equal(np.diff(pos, append=int(length.sum())), sp_len):
        return None
    return list(zip(sp_off.tolist(), sp_len.tolist(), pos.tolist()))


def _aggregate(
    fd: int,
    off: np.ndarray,
    length: np.ndarray,
    buf: np.ndarray,
    write: bool,
    sieve: bool,
    span: int,
) -> None:
    """An aggregator's access of one window: pieces ``off``/``length`` whose bytes lie back to
    back, in exchange order, in the buffer ``buf`` exchanged with the clients. Spans with holes
    go through a realm buffer (a write reads them first, which is safe: the aggregator owns
    the realm)."""
    sp_off, sp_len, holes = _window_runs(off, length, write, span, sieve)
    move = fileio.pwrite_from if write else fileio.pread_into
    direct = _file_ordered_runs(off, length, sp_off, sp_len, holes)
    if direct is not None:
        for o, n, p in direct:
            move(fd, buf[p : p + n], o)
        return
    base = int(sp_off[0])
    cbuf = scratch(int(sp_off[-1] + sp_len[-1]) - base, "realm")
    spans = list(zip(sp_off.tolist(), sp_len.tolist(), holes.tolist()))
    for o, n, h in spans:
        if h or not write:
            fileio.pread_into(fd, cbuf[o - base : o - base + n], o)
    if not write:
        copy_pieces(buf, _exclusive(length), cbuf, off - base, length)
        return
    copy_pieces(cbuf, off - base, buf, _exclusive(length), length)
    for o, n, _ in spans:
        fileio.pwrite_from(fd, cbuf[o - base : o - base + n], o)


def read_two_phase(
    comm: MPI.Comm, fd: int, access: Access, stats: np.ndarray, hints: Any, policy: RealmPolicy
) -> None:
    """Collective read: aggregators read their realms and scatter the pieces to the ranks."""
    plan = _plan(comm, access.file, stats, hints, policy)
    nprocs = comm.Get_size()
    ds = str(getattr(hints, "romio_ds_read", "automatic")).lower() != "disable"
    failure: BaseException | None = None
    for i in range(plan.ntimes):
        a0, a1 = plan.a_iter_bounds[i], plan.a_iter_bounds[i + 1]
        alen = plan.a_len[a0:a1]
        scount, sdisp = _counts(plan.a_src[a0:a1], alen, nprocs)
        sendbuf = scratch(int(scount.sum()), "send")
        if a1 > a0 and failure is None:
            aoff = plan.a_off[a0:a1]
            span = int(plan.win_hi[plan.my_agg, i] - plan.win_lo[plan.my_agg, i])
            try:
                _aggregate(fd, aoff, alen, sendbuf, False, ds, span)
            except (OSError, StrataError) as exc:  # keep exchanging: the others are waiting
                failure = exc
        c0, c1 = plan.c_iter_bounds[i], plan.c_iter_bounds[i + 1]
        lens = plan.c_len[c0:c1]
        rcount, rdisp = _counts(plan.c_dest[c0:c1], lens, nprocs)
        recvbuf = _back_to_back(access.stream, plan.c_mem[c0:c1], lens)
        direct = recvbuf is not None  # the pieces land in place, with no copy
        if recvbuf is None:
            recvbuf = scratch(int(rcount.sum()), "recv")
        comm.Alltoallv([sendbuf, (scount, sdisp), MPI.BYTE], [recvbuf, (rcount, rdisp), MPI.BYTE])
        if not direct:
            copy_pieces(access.stream, plan.c_mem[c0:c1], recvbuf, _exclusive(lens), lens)
    if failure is not None:
        raise failure


# ---------------------------------------------------------------------------- independent
def write_independent(fd: int, access: Access, hints: Any, fd_readable: bool | None = None) -> None:
    """This rank's pieces written by itself: sieving under byte-range locks by the
    ``romio_ds_write`` hint (:mod:`strataio.collective.sieving`), planned once per layout.
    ``fd_readable`` says whether ``fd`` is open read-write (None: ask the system)."""
    ds = str(getattr(hints, "romio_ds_write", "automatic")).lower()
    if fd_readable is None:
        fd_readable = sieving.readable(fd)
    if ds == "disable" or not fd_readable:
        sieving.write_independent(fd, access.file, access.stream, hints)
        return
    size = int(getattr(hints, "ind_wr_buffer_size", sieving.DEFAULT_WR_BUFFER))
    hole = sieving.hole_limit(ds, write=True)
    plans = access.plan.writes if access.plan is not None else {}
    key = (size, -1 if hole is None else hole)
    plan = plans.get(key)
    if plan is None:
        plan = plans[key] = sieving.SievePlan(access.file.compact().sort(), size, hole, True)
    plan.run(fd, access.stream, fd_readable)


def read_independent(fd: int, access: Access, hints: Any) -> None:
    """This rank's pieces read by itself (data sieving by the ``romio_ds_read`` hint).

    Disjoint pieces are read by a :class:`~strataio.collective.fileio.ReadPlan` (remembered in
    ``access.plan``): large pieces straight into the caller's buffer, small ones sieved through
    a staging buffer. Overlapping pieces go through :mod:`strataio.collective.sieving`.
    """
    ds = str(getattr(hints, "romio_ds_read", "automatic")).lower()
    size = int(getattr(hints, "ind_rd_buffer_size", 4194304))
    hole = 0 if ds == "disable" else size if ds == "enable" else fileio.SYSCALL_BYTES
    plans = access.plan.reads if access.plan is not None else {}
    key = (size, hole)
    if key in plans:
        plan = plans[key]
    else:
        ext = access.file.compact().sort()
        plan = fileio.ReadPlan(ext, size, hole) if ext.is_sorted() else None
        plans[key] = plan
    if plan is None:  # pieces overlap
        sieving.read_independent(fd, access.file, access.stream, hints)
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
