"""Two-phase collective I/O: aggregators move the data of every rank's access in large spans.

Every rank brings one :class:`~strataio.collective.access.Access` and the agreed numbers of
the call (:mod:`strataio.collective.agreement`). A
:class:`~strataio.collective.realms.RealmPolicy` gives each aggregator its realm over the
aggregate access region, as :class:`~strataio.layout.extents.Extents` (one range per
aggregator by default; many stripes with persistent realms); the aggregators are chosen by
:func:`~strataio.collective.realms.config_aggregators` (``cb_config_list`` and ``cb_nodes``).
Each realm is walked in windows of ``cb_buffer_size`` of its own bytes, one window per
aggregator per iteration; all realms are cut into windows at once (:func:`_windows`, numpy
over every piece, no loop per stripe). The pieces' descriptors (offset, length) are sent to
their aggregators once, up front (``Alltoall`` of counts + ``Alltoallv`` of descriptors), so
each iteration needs a single ``Alltoallw`` of data whose counts both sides derive locally
(:mod:`strataio.collective.exchange`: pieces of 1 KiB and more move through derived datatypes
straight between the caller's memory and the aggregator's realm buffer, smaller ones are
packed; an aggregator's own pieces are copied without MPI). A window's buffer holds its realm
bytes back to back (laid out like the file for a contiguous realm); aggregators access the
window's spans, or its runs, through their :class:`~strataio.collective.driver.Driver` by the
cost model of :mod:`strataio.collective.fileio` (conditional data sieving), one access per
stripe a span crosses, so a sieving span never touches another aggregator's bytes; a write
window with holes is read-modify-written, which is safe because the aggregator owns its realm.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from strataio.collective import fileio
from strataio.collective.access import FIRST, LAST, NBYTES, Access
from strataio.collective.driver import Driver
from strataio.collective.exchange import ExchangeSide, alltoallw
from strataio.collective.node import NodeLayout
from strataio.collective.pipeline import Groups, pipeline_groups
from strataio.collective.realm_cache import RealmCache
from strataio.collective.realms import RealmPolicy
from strataio.errors import StrataError
from strataio.layout.extents import Extents, exclusive_cumsum
from strataio.layout.pieces import copy_pieces, scratch, zeros

_I64 = np.int64


# ---------------------------------------------------------------------------- planning
@dataclass(slots=True)
class _Plan:
    """The schedule of one two-phase call, identical in shape on every rank."""

    ntimes: int
    # my windows as an aggregator: the pieces of my realm in (iteration, position) order, each
    # at a position in the window's buffer (the realm's bytes back to back) and in the file
    m_pos: np.ndarray
    m_off: np.ndarray
    m_bounds: np.ndarray  # piece index range of each iteration
    m_span: np.ndarray  # realm bytes of each window
    aggs: np.ndarray  # aggregator ranks
    # client side: my pieces in (iteration, aggregator, offset) order
    c_off: np.ndarray
    c_len: np.ndarray
    c_mem: np.ndarray
    c_dest: np.ndarray  # destination rank of each piece
    c_iter_bounds: np.ndarray  # piece index range of each iteration
    # aggregator side: received pieces in (iteration, source, client) order
    a_off: np.ndarray
    a_pos: np.ndarray  # position in the window's buffer
    a_len: np.ndarray
    a_src: np.ndarray
    a_iter_bounds: np.ndarray
    my_agg: int  # my index among the aggregators, -1 if none
    nprocs: int
    rank: int
    background: bool  # aggregators access windows in the background I/O thread (_overlap)
    buffers: tuple[np.ndarray, ...]  # realm buffers (two with background I/O), aggregators only

    def client_side(
        self, i: int, stream: np.ndarray, send: bool, ranks: tuple[int, int] | None = None
    ) -> ExchangeSide:
        """My pieces of iteration ``i`` in the caller's buffer, to or from the aggregators
        (only those of ranks ``[lo, hi)`` when ``ranks`` is given)."""
        c0, c1 = self.c_iter_bounds[i], self.c_iter_bounds[i + 1]
        if ranks is not None:  # (an iteration's pieces are grouped by destination rank)
            c0, c1 = c0 + np.searchsorted(self.c_dest[c0:c1], ranks)
        mem, lens, dest = self.c_mem[c0:c1], self.c_len[c0:c1], self.c_dest[c0:c1]
        return ExchangeSide(stream, mem, lens, dest, self.nprocs, self.rank, send)

    def window(self, i: int, write: bool, sieve: int | None, double: bool) -> _Window | None:
        """My window of iteration ``i`` as an aggregator (None: no pieces in it); with
        ``double`` consecutive iterations use two realm buffers in turn; ``sieve``: see
        :func:`strataio.collective.fileio.sieve_threshold`."""
        a0, a1 = self.a_iter_bounds[i], self.a_iter_bounds[i + 1]
        if a1 == a0:
            return None
        m0, m1 = self.m_bounds[i], self.m_bounds[i + 1]
        realm = (self.m_pos[m0:m1], self.m_off[m0:m1])
        buf = self.buffers[i % 2 if double else 0]
        span = int(self.m_span[i])
        return _Window(
            self.a_pos[a0:a1], self.a_len[a0:a1], write, sieve, span, buf, realm, self.rank
        )

    def aggregator_side(self, i: int, window: _Window | None, send: bool) -> ExchangeSide:
        """The clients' pieces of iteration ``i`` in my realm buffer, at their file positions."""
        if window is None:
            return ExchangeSide(_BYTES, _NONE, _NONE, _NONE, self.nprocs, self.rank, send)
        a0, a1 = self.a_iter_bounds[i], self.a_iter_bounds[i + 1]
        at, lens, src = self.a_pos[a0:a1] - window.base, self.a_len[a0:a1], self.a_src[a0:a1]
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
    aggregators: np.ndarray,
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
        local = _plan_locally(ext, stats, hints, policy, aggregators, nodes, nprocs, rank)
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
    my_agg = local.my_agg
    a_off, a_len = rdesc[:, 0], rdesc[:, 1]
    a_src = np.repeat(np.arange(nprocs, dtype=_I64), rcount)
    if my_agg >= 0 and a_off.size:
        # each piece lies in one piece of my realm's windows (the clients cut them so)
        j = np.searchsorted(local.m_off, a_off, side="right") - 1
        a_iter = local.m_iter[j]
        a_pos = local.m_pos[j] + (a_off - local.m_off[j])
        aorder = np.argsort(a_iter, kind="stable")  # keeps (source, client order) inside
        a_off, a_len, a_src, a_iter = a_off[aorder], a_len[aorder], a_src[aorder], a_iter[aorder]
        a_pos = a_pos[aorder]
    else:
        a_iter = a_pos = np.zeros(0, dtype=_I64)
    a_iter_bounds = np.searchsorted(a_iter, np.arange(local.ntimes + 1))
    return _Plan(
        local.ntimes, local.m_pos, local.m_off, local.m_bounds, local.m_span, local.aggs,
        *local.client, a_off, a_pos, a_len, a_src, a_iter_bounds, my_agg, nprocs, rank,
        local.background, local.buffers,
    )  # fmt: skip


@dataclass(slots=True)
class _LocalPlan:
    """The part of a :class:`_Plan` a rank computes alone, before any communication."""

    ntimes: int
    m_pos: np.ndarray  # my realm's window pieces (aggregators only), see _Plan
    m_off: np.ndarray
    m_iter: np.ndarray
    m_bounds: np.ndarray
    m_span: np.ndarray
    aggs: np.ndarray
    my_agg: int
    background: bool
    buffers: tuple[np.ndarray, ...]  # realm buffers
    client: tuple[np.ndarray, ...]  # c_off, c_len, c_mem, c_dest, c_iter_bounds
    scount: np.ndarray  # descriptors for each rank
    desc: np.ndarray  # (offset, length) rows grouped by destination


@dataclass(slots=True)
class _Windows:
    """Every aggregator's realm cut into windows of at most ``cb_buffer_size`` realm bytes: the
    pieces of all realms in file order, each labelled with its aggregator, its iteration and
    its position in that window's buffer (where the realm's bytes lie back to back)."""

    ntimes: int
    off: np.ndarray
    len: np.ndarray
    agg: np.ndarray
    iter: np.ndarray
    pos: np.ndarray


def _windows(realms: list[Extents], cb: int) -> _Windows:
    """Cut the realms (one :class:`Extents` per aggregator) into windows of ``cb`` realm bytes,
    all at once: every realm's bytes are laid end to end in a stream of its own, ``stride``
    apart, and that stream is split at every multiple of ``cb`` (no loop per stripe)."""
    parts = [r.union() for r in realms]
    counts = np.array([len(p) for p in parts], dtype=_I64)
    total = np.array([p.nbytes for p in parts], dtype=_I64)
    nwin = -(-total // cb)
    ntimes = int(nwin.max()) if nwin.size else 0
    if not counts.sum():
        z = np.zeros(0, dtype=_I64)
        return _Windows(0, z, z, z, z, z)
    stride = _I64(max(ntimes, 1) * cb)
    agg = np.repeat(np.arange(len(parts), dtype=_I64), counts)
    stream = np.concatenate([p.mem for p in parts]) + agg * stride
    flat = Extents(stream, np.concatenate([p.lengths for p in parts]),
                   np.concatenate([p.offsets for p in parts]))  # fmt: skip
    if ntimes > 1:
        flat = flat.split(np.arange(cb, int(stride) * len(parts), cb, dtype=_I64))
    agg = flat.offsets // stride
    local = flat.offsets - agg * stride
    it = local // cb
    order = np.argsort(flat.mem, kind="stable")  # realms are disjoint: file order
    return _Windows(
        ntimes, flat.mem[order], flat.lengths[order], agg[order], it[order],
        (local - it * cb)[order],
    )  # fmt: skip


def _plan_locally(
    ext: Extents,
    stats: np.ndarray,
    hints: Any,
    policy: RealmPolicy,
    aggregators: np.ndarray,
    nodes: NodeLayout | None,
    nprocs: int,
    rank: int,
) -> _LocalPlan:
    active = stats[stats[:, NBYTES] > 0]
    lo, hi = int(active[:, FIRST].min()), int(active[:, LAST].max())
    aggs = aggregators
    cb = max(int(hints.cb_buffer_size), 1)
    win = _windows(policy.realms(lo, hi, aggs.size, hints), cb)
    ntimes = win.ntimes
    background = _overlap(ntimes, aggs.size, hints, nodes)
    mine = np.flatnonzero(aggs == rank)
    my_agg = int(mine[0]) if mine.size else -1
    m = win.agg == my_agg  # (file order is (iteration, position) order within one realm)
    m_pos, m_off, m_iter, m_len = win.pos[m], win.off[m], win.iter[m], win.len[m]
    m_bounds = np.searchsorted(m_iter, np.arange(ntimes + 1))
    m_span = np.bincount(m_iter, weights=m_len, minlength=ntimes).astype(_I64)
    buffers: tuple[np.ndarray, ...] = ()
    if my_agg >= 0 and m_span.size:  # the realm buffers, now rather than mid-exchange
        span = int(m_span.max())
        buffers = tuple(scratch(span, f"realm{slot}") for slot in range(2 if background else 1))

    # Client: cut my pieces at every window piece's bounds, then label each with its window.
    ext = ext.compact()
    if len(ext):
        ext = ext.sort()
        cut = ext.split(_inner(win.off, ext))
        w = np.searchsorted(win.off, cut.offsets, side="right") - 1
        if w.size and (int(w.min()) < 0 or bool(np.any(cut.ends > win.off[w] + win.len[w]))):
            raise StrataError(
                f"realm policy {policy.name!r} leaves bytes of this rank's access in no realm"
            )
        d_iter, d_agg = win.iter[w], win.agg[w]
    else:
        cut = Extents.empty()
        d_iter = d_agg = np.zeros(0, dtype=_I64)
    # The pieces are in offset order. Descriptors go grouped by aggregator rank, each group in
    # (iteration, offset) order; the exchange of each iteration takes them in (aggregator rank,
    # offset) order. Each is one stable sort of the offset order, skipped when already in order
    # (contiguous realms that ascend in rank order, the common case).
    d_off, d_len, d_dest = cut.offsets, cut.lengths, aggs[d_agg]
    c_off, c_len, c_mem, c_iter, c_dest = _stable_by(
        d_iter * nprocs + d_dest, d_off, d_len, cut.mem, d_iter, d_dest
    )
    c_iter_bounds = np.searchsorted(c_iter, np.arange(ntimes + 1))
    scount = np.bincount(d_dest, minlength=nprocs).astype(_I64)
    desc = np.empty((d_off.size, 2), dtype=_I64)
    desc[:, 0], desc[:, 1] = _stable_by(d_dest * max(ntimes, 1) + d_iter, d_off, d_len)
    return _LocalPlan(
        ntimes, m_pos, m_off, m_iter, m_bounds, m_span, aggs, my_agg, background, buffers,
        (c_off, c_len, c_mem, c_dest, c_iter_bounds), scount, desc,
    )  # fmt: skip


def _inner(bounds: np.ndarray, ext: Extents) -> np.ndarray:
    """The sorted ``bounds`` that fall inside a piece of ``ext`` (sorted by offset): the only
    cuts that change it (a realm of many stripes has far more bounds than a rank has pieces).
    The window pieces tile the access region, so their starts are every bound there is."""
    if len(ext) == 0:
        return bounds[:0]
    k = np.searchsorted(ext.offsets, bounds, side="right") - 1
    reach = np.maximum.accumulate(ext.ends)  # (pieces may overlap: the furthest end so far)
    before = np.concatenate(([np.iinfo(_I64).min], reach))  # reach of the pieces before k
    j = np.maximum(k, 0)
    inside = (k >= 0) & (bounds < reach[j]) & ((bounds > ext.offsets[j]) | (bounds < before[j]))
    return bounds[inside]


def _stable_by(key: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """``arrays`` in the stable order of ``key`` (as they are when it already ascends)."""
    if key.size < 2 or bool(np.all(key[1:] >= key[:-1])):
        return arrays
    order = np.argsort(key, kind="stable")
    return tuple(a[order] for a in arrays)


def _window_runs(
    off: np.ndarray,
    length: np.ndarray,
    write: bool,
    max_span: int,
    sieve: int | None = fileio.AUTO_THRESHOLD,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The runs of bytes an aggregator moves in one window, the spans it accesses, and which
    of the spans have holes (``sieve``: :func:`~strataio.collective.fileio.sieve_threshold`;
    with None the spans are the runs, none with a hole)."""
    run_off, run_len = fileio.union_runs(off, length)
    if sieve is None:
        return run_off, run_len, run_off, run_len, np.zeros(run_off.size, dtype=bool)
    sp_off, sp_len = fileio.window_spans(run_off, run_len, max_span, write, sieve)
    holes = fileio.span_holes(run_off, run_len, sp_off, sp_len)
    return run_off, run_len, sp_off, sp_len, holes


def _per_stripe(
    run_at: np.ndarray,
    run_len: np.ndarray,
    sp_at: np.ndarray,
    sp_len: np.ndarray,
    realm_pos: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Runs and spans (window buffer positions) cut where the realm's pieces meet, since each
    piece is its own place in the file; whether each cut span has holes."""
    runs = Extents(run_at, run_len).split(realm_pos)
    spans = Extents(sp_at, sp_len).split(realm_pos)
    r_end = np.concatenate(([0], np.cumsum(runs.lengths)))
    first = np.searchsorted(runs.offsets, spans.offsets, side="left")
    last = np.searchsorted(runs.offsets, spans.ends, side="left")
    holes = (r_end[last] - r_end[first]) < spans.lengths
    return runs.offsets, runs.lengths, spans.offsets, spans.lengths, holes


# ---------------------------------------------------------------------------- the two phases
_NONE = np.zeros(0, dtype=_I64)
_BYTES = np.zeros(0, dtype=np.uint8)


class _Window:
    """An aggregator's file access in one iteration: the spans it reads or writes (by the
    conditional sieving of :func:`strataio.collective.fileio.window_spans`; with ``sieve``
    None the runs of bytes themselves)
    and a realm buffer laid out like the file from the first span on, which the exchange fills
    (writes) or drains (reads) at the pieces' file positions. A failed read or write names the
    file and ``rank``, the aggregator's (:func:`strataio.collective.fileio.pwrite_from`)."""

    __slots__ = ("base", "buf", "rank", "realm", "runs", "spans")

    def __init__(
        self,
        pos: np.ndarray,
        length: np.ndarray,
        write: bool,
        sieve: int | None,
        span: int,
        buffer: np.ndarray,
        realm: tuple[np.ndarray, np.ndarray],
        rank: int | None = None,
    ) -> None:
        """``pos``/``length``: the clients' pieces at their positions in the window's buffer;
        ``realm``: the window's realm pieces, their buffer positions and file offsets (one
        piece for a contiguous realm)."""
        run_at, run_len, sp_at, sp_len, holes = _window_runs(pos, length, write, span, sieve)
        realm_pos, realm_off = realm
        if realm_pos.size > 1:  # a span of realm bytes may cross stripes: one access per stripe
            run_at, run_len, sp_at, sp_len, holes = _per_stripe(
                run_at, run_len, sp_at, sp_len, realm_pos
            )
        self.base = int(sp_at[0])
        self.buf = buffer[: int(sp_at[-1] + sp_len[-1]) - self.base]
        self.runs = (run_at - self.base, run_len)
        self.realm = realm
        self.rank = rank
        j = np.searchsorted(realm_pos, sp_at, side="right") - 1
        sp_off = realm_off[j] + (sp_at - realm_pos[j])
        at = (sp_at - self.base).tolist()
        self.spans = list(zip(at, sp_off.tolist(), sp_len.tolist(), holes.tolist()))

    def _cached_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The runs' file offsets, lengths and buffer positions (for a realm cache, which moves
        exactly the runs' bytes in one vectorized call)."""
        run_at, run_len = self.runs
        realm_pos, realm_off = self.realm
        j = np.searchsorted(realm_pos, run_at + self.base, side="right") - 1
        return realm_off[j] + (run_at + self.base - realm_pos[j]), run_len, run_at

    def read(self, driver: Driver) -> None:
        """Fill the spans from the file (past end-of-file with zeros)."""
        if isinstance(driver, RealmCache):
            off, length, at = self._cached_runs()
            driver.read_pieces(off, length, self.buf, at)
            return
        for at, off, n, _ in self.spans:
            fileio.pread_into(driver, self.buf[at : at + n], off, rank=self.rank)

    def read_holes(self, driver: Driver) -> None:
        """The read of a read-modify-write (safe because the aggregator owns its realm): the
        file's bytes into the spans with holes. Past end-of-file only the holes are zeroed:
        the exchange overwrites every other byte. (A realm cache needs none: it fetches what
        the pages it writes lack.)"""
        if isinstance(driver, RealmCache):
            return
        for at, off, n, hole in self.spans:
            if hole:
                got = fileio.pread_upto(driver, self.buf[at : at + n], off, rank=self.rank)
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

    def write(self, driver: Driver) -> None:
        if isinstance(driver, RealmCache):
            off, length, at = self._cached_runs()
            driver.write_pieces(off, length, self.buf, at)
            return
        for at, off, n, _ in self.spans:
            fileio.pwrite_from(driver, self.buf[at : at + n], off, rank=self.rank)


def two_phase(
    comm: MPI.Comm,
    driver: Driver | None,
    access: Access,
    stats: np.ndarray,
    hints: Any,
    policy: RealmPolicy,
    aggregators: np.ndarray,
    write: bool,
    nodes: NodeLayout | None = None,
    prepare: Callable[[], None] | None = None,
) -> None:
    """Collective write (read) of every rank's access: aggregators write (read) their realms,
    each window while the next (previous) one is exchanged when :func:`_overlap` says so, or
    in pipelined groups (``strataio_pipeline_groups``, :mod:`strataio.collective.pipeline`).
    ``aggregators``: their ranks, in realm order (:func:`strataio.collective.realms.config_aggregators`);
    ``driver``: the file, on aggregators (other ranks may pass None); ``nodes``: where the ranks run (:func:`strataio.collective.node.layout`); ``prepare``:
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
    plan = _plan(comm, access.file, stats, hints, policy, aggregators, nodes, prepare)
    ds = fileio.sieve_threshold(hints, write)
    groups = pipeline_groups(hints, aggregators, comm.Get_rank())
    try:
        if groups is not None:
            pipelined = _pipelined_write if write else _pipelined_read
            failure = pipelined(comm, driver, access.stream, plan, ds, groups)
        else:
            failure = (_write if write else _read)(comm, driver, access.stream, plan, ds)
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
    comm: MPI.Comm, driver: Driver | None, stream: np.ndarray, plan: _Plan, ds: int | None
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
                failure = _attempt(window.read_holes, driver)
            alltoallw(comm, send, recv)
            failure, writing = _settle(failure, writing), None
            if window is not None and failure is None:
                writing = _Pending(background, window.write, driver)
    finally:
        # the realm buffer must not be reused while it is written, even after a failure
        failure = _settle(failure, writing)
    return failure


def _read(
    comm: MPI.Comm, driver: Driver | None, stream: np.ndarray, plan: _Plan, ds: int | None
) -> BaseException | None:
    """The windows of a collective read; an aggregator's I/O failure is returned once the
    exchange is over."""
    background = plan.background
    failure: BaseException | None = None

    def start(i: int) -> tuple[_Window | None, _Pending | None]:
        window = plan.window(i, False, ds, background) if i < plan.ntimes else None
        if window is None or failure is not None:  # (after a failure: exchange, read nothing)
            return window, None
        return window, _Pending(background, window.read, driver)

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


def _pipelined_write(
    comm: MPI.Comm,
    driver: Driver | None,
    stream: np.ndarray,
    plan: _Plan,
    ds: int | None,
    groups: Groups,
) -> BaseException | None:
    """:func:`_write` in pipelined steps (:mod:`strataio.collective.pipeline`): an aggregator
    writes its window in the background while the other groups exchange theirs, and waits for
    that write only when its one realm buffer is needed again."""
    failure: BaseException | None = None
    writing: _Pending | None = None
    try:
        for i, g in groups.steps(plan.ntimes):
            send = plan.client_side(i, stream, True, groups.ranks(g))
            window = None
            try:
                if g == groups.mine:
                    failure, writing = _settle(failure, writing), None
                    window = plan.window(i, True, ds, False)
                recv = plan.aggregator_side(i, window, False)
            except BaseException:
                send.free()
                raise
            if window is not None and failure is None:
                failure = _attempt(window.read_holes, driver)
            alltoallw(comm, send, recv)
            if window is not None and failure is None:
                writing = _Pending(groups.background, window.write, driver)
    finally:
        failure = _settle(failure, writing)
    return failure


def _pipelined_read(
    comm: MPI.Comm,
    driver: Driver | None,
    stream: np.ndarray,
    plan: _Plan,
    ds: int | None,
    groups: Groups,
) -> BaseException | None:
    """:func:`_read` in pipelined steps: an aggregator reads its window in the background
    during the exchange of the step before its own."""
    failure: BaseException | None = None
    steps = groups.steps(plan.ntimes)
    upcoming: tuple[_Window | None, _Pending | None] = (None, None)

    def start(step: int) -> tuple[_Window | None, _Pending | None]:
        i, g = steps[step]
        window = plan.window(i, False, ds, False) if g == groups.mine else None
        if window is None or failure is not None:
            return window, None
        return window, _Pending(groups.background, window.read, driver)

    try:
        upcoming = start(0)
        for step, (i, g) in enumerate(steps):
            window = None
            if g == groups.mine:
                (window, reading), upcoming = upcoming, (None, None)
                failure = _settle(failure, reading)
            elif step + 1 < len(steps) and steps[step + 1][1] == groups.mine:
                upcoming = start(step + 1)  # into my buffer, free since my last step
            send = plan.aggregator_side(i, window, True)
            try:
                recv = plan.client_side(i, stream, False, groups.ranks(g))
            except BaseException:
                send.free()
                raise
            alltoallw(comm, send, recv)
    finally:
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
