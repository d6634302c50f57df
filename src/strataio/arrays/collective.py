"""Collective section I/O of a Dataset (APRIL, Figure 3b): every rank of a communicator reads
or writes its own section of one dataset in one call, and each chunk is touched once.

Every rank plans the same way from the same numbers: one ``Allgather`` gives every rank's
section (and whether its arguments were good: an error anywhere raises everywhere before any
byte moves). The sections' chunk covers become *pairs* (chunk, rank), sorted by chunk; each
chunk gets one *owner* among the ranks that want it -- the only wanter, or for a shared chunk
the ``k``-th wanter with ``k`` counting the shared chunks round-robin, which spreads them over
the ranks. Planning is numpy over the pairs; only the copies of pieces loop in Python, one
numpy assignment each (as a Dataset's own read copies one box per chunk).

A read: each owner reads its chunks once (a private chunk straight into the rank's result,
a shared one -- the bounding box of what its wanters want -- into a staging array), then the
pieces for other ranks travel in one ``Alltoallv``. A write: the pieces travel to the chunks'
owners in one ``Alltoallv``; an owner assembles each chunk from them in rank order (the
highest rank wins where sections overlap), reads the old chunk only when the pieces leave
part of it uncovered, and writes it once. Failures while reading or writing are agreed on
every rank too.

The exchange counts bytes in C ints (MPI's counts), so one rank sends another at most 2 GiB
per call; a call that would exceed that raises :class:`StrataError` on every rank before
anything moves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from strataio.agreed import agree, raise_agreed
from strataio.errors import StrataError
from strataio.layout.chunks import ChunkGrid, chunk_key
from strataio.layout.sections import Section

if TYPE_CHECKING:
    from strataio.arrays.dataset import Dataset

_I64 = np.int64
#: the most bytes one MPI count can say
_MAX_COUNT = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Sections:
    """Every rank's section of one collective call: ``start``/``stop`` ``(nprocs, ndim)``
    element corners; ``wants`` marks ranks with a non-empty section."""

    start: np.ndarray
    stop: np.ndarray
    wants: np.ndarray


@dataclass(frozen=True, slots=True)
class ChunkPairs:
    """The (chunk, rank) pairs of a collective call, sorted by chunk then rank.

    Per pair: ``chunk`` its index into the per-chunk arrays, ``rank`` whose section it is,
    ``owner`` the rank that reads or writes the chunk, ``lo``/``hi`` ``(npairs, ndim)`` the
    piece (the section inside the chunk) in array element coordinates. Per chunk: ``coords``
    its grid coordinates, ``first`` its first pair, ``count`` its pairs, ``owner``.
    """

    chunk: np.ndarray
    rank: np.ndarray
    owner: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    coords: np.ndarray
    first: np.ndarray
    count: np.ndarray
    chunk_owner: np.ndarray

    def __len__(self) -> int:
        return len(self.rank)


def gather_sections(
    comm: MPI.Comm, ndim: int, section: Section | None, err: BaseException | None
) -> Sections:
    """Every rank's section, known to every rank (one ``Allgather`` of a row each); raises
    on every rank if ``err`` is set on any."""
    nprocs = comm.Get_size()
    row = np.zeros(2 + 2 * ndim, dtype=_I64)
    row[0] = err is not None
    if section is not None and err is None:
        row[1] = 1
        row[2 : 2 + ndim] = section.start
        row[2 + ndim :] = section.stop
    table = np.empty((nprocs, row.size), dtype=_I64)
    if nprocs == 1:
        table[0] = row
    else:
        comm.Allgather(row, table)
    if table[:, 0].any():
        raise_agreed(comm, err)
    start, stop = table[:, 2 : 2 + ndim], table[:, 2 + ndim :]
    wants = (table[:, 1] == 1) & np.all(stop > start, axis=1)
    return Sections(start, stop, wants)


def plan_pairs(grid: ChunkGrid, sections: Sections) -> ChunkPairs:
    """The chunk pairs of ``sections`` and each chunk's owner (see the module docstring)."""
    nd = grid.ndim
    ch = np.asarray(grid.chunks, dtype=_I64)
    ranks = np.flatnonzero(sections.wants)
    start, stop = sections.start[ranks], sections.stop[ranks]
    clo = start // ch
    ext = (stop - 1) // ch + 1 - clo
    counts = np.prod(ext, axis=1, dtype=_I64)
    total = int(counts.sum())
    rank = np.repeat(ranks, counts)
    # each rank's covered chunks, its box of the grid unravelled in C order
    rem = np.arange(total, dtype=_I64) - np.repeat(np.cumsum(counts) - counts, counts)
    coords = np.empty((total, nd), dtype=_I64)
    for d in reversed(range(nd)):
        e = np.repeat(ext[:, d], counts)
        coords[:, d] = np.repeat(clo[:, d], counts) + rem % e
        rem //= e
    gshape = np.asarray(grid.grid_shape, dtype=_I64)
    gstrides = np.ones(nd, dtype=_I64)
    if nd:
        gstrides[:-1] = np.cumprod(gshape[::-1])[::-1][1:]
    linear = coords @ gstrides if nd else np.zeros(total, dtype=_I64)
    order = np.lexsort((rank, linear))
    rank, coords, linear = rank[order], coords[order], linear[order]
    _, first, count = np.unique(linear, return_index=True, return_counts=True)
    shared = count > 1
    pick = np.where(shared, (np.cumsum(shared) - 1) % count, 0)
    chunk_owner = rank[first + pick] if total else np.zeros(0, dtype=_I64)
    chunk = np.repeat(np.arange(len(first), dtype=_I64), count)
    origin = coords * ch
    return ChunkPairs(
        chunk=chunk,
        rank=rank,
        owner=chunk_owner[chunk],
        lo=np.maximum(sections.start[rank], origin),
        hi=np.minimum(sections.stop[rank], origin + ch),
        coords=coords[first],
        first=first,
        count=count,
        chunk_owner=chunk_owner,
    )


def box(lo: list[int], hi: list[int]) -> tuple[Any, ...]:
    """The numpy index of box ``[lo, hi)`` (a view also for a 0-d array)."""
    return tuple(map(slice, lo, hi)) or (Ellipsis,)


class PieceExchange:
    """The pieces one collective call moves between ranks: per rank the pairs it sends and
    receives, in the order both sides agree on (by peer, then chunk), and one ``Alltoallv``.
    ``src`` / ``dst`` name the sending and the receiving rank of each pair.

    Each rank's message to each rank (itself included) starts with one byte saying whether
    the sender failed before the exchange, so the exchange also agrees on failures: no
    separate ``allreduce``."""

    def __init__(
        self, comm: MPI.Comm, pairs: ChunkPairs, src: np.ndarray, dst: np.ndarray, itemsize: int
    ) -> None:
        self.comm = comm
        nprocs, me = comm.Get_size(), comm.Get_rank()
        nbytes = np.prod(pairs.hi - pairs.lo, axis=1, dtype=_I64) * itemsize
        remote = src != dst
        if remote.any():
            # the same on every rank: all raise, before anything moves
            # every count, and every displacement (a rank's running total over its peers,
            # a flag byte each), must fit one MPI int
            w = nbytes[remote]
            worst = max(
                np.bincount(src[remote] * nprocs + dst[remote], weights=w).max(),
                np.bincount(src[remote], weights=w, minlength=nprocs).max(),
                np.bincount(dst[remote], weights=w, minlength=nprocs).max(),
            )
            if worst + nprocs > _MAX_COUNT:
                raise StrataError(
                    f"a collective dataset call would move {int(worst)} bytes to or from one "
                    f"rank, more than one MPI count holds ({_MAX_COUNT}); split it"
                )
        send = np.flatnonzero(remote & (src == me))
        self.send = send[np.argsort(dst[send], kind="stable")]
        recv = np.flatnonzero(remote & (dst == me))
        self.recv = recv[np.argsort(src[recv], kind="stable")]
        # a flag byte, then the pieces, per peer
        self.send_counts = np.bincount(dst[self.send], nbytes[self.send], nprocs).astype(_I64) + 1
        self.recv_counts = np.bincount(src[self.recv], nbytes[self.recv], nprocs).astype(_I64) + 1
        self.send_at = np.cumsum(nbytes[self.send]) - nbytes[self.send] + dst[self.send] + 1
        self.recv_at = np.cumsum(nbytes[self.recv]) - nbytes[self.recv] + src[self.recv] + 1
        self.sendbuf = np.empty(int(self.send_counts.sum()), dtype=np.uint8)
        self.recvbuf = np.empty(int(self.recv_counts.sum()), dtype=np.uint8)

    @staticmethod
    def slot(buf: np.ndarray, at: int, shape: list[int], dtype: np.dtype) -> np.ndarray:
        """The piece of ``shape`` at byte ``at`` of ``buf``."""
        n = int(np.prod(shape, dtype=_I64)) * dtype.itemsize
        return buf[at : at + n].view(dtype).reshape(shape)

    def run(self, failed: BaseException | None) -> None:
        """The one ``Alltoallv`` (called on every rank); raises on every rank if ``failed``
        is set on any (the pieces are then worthless)."""
        sdispl = np.cumsum(self.send_counts) - self.send_counts
        rdispl = np.cumsum(self.recv_counts) - self.recv_counts
        self.sendbuf[sdispl] = failed is not None
        if self.comm.Get_size() == 1:
            self.recvbuf[:] = self.sendbuf
        else:
            self.comm.Alltoallv(
                [self.sendbuf, (self.send_counts.astype(np.int32), sdispl.astype(np.int32)), MPI.BYTE],
                [self.recvbuf, (self.recv_counts.astype(np.int32), rdispl.astype(np.int32)), MPI.BYTE],
            )  # fmt: skip
        if self.recvbuf[rdispl].any():
            raise_agreed(self.comm, failed)


#: ``read_chunks(coords, lo, hi, out, at)``: as :meth:`Dataset.read_chunks`, for a grid's chunks
ChunkReader = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


def read_sections(
    ds: Dataset, comm: MPI.Comm, section: Section | None, err: BaseException | None
) -> np.ndarray:
    """Collective: this rank's ``section`` of ``ds`` as an array of ``section.shape`` (an
    empty array for None); ``err`` is this rank's failure so far, raised on every rank."""
    sections = gather_sections(comm, ds.ndim, section, err)
    pairs = plan_pairs(ds.grid, sections)
    return read_pieces(comm, ds.grid, ds.dtype, sections, pairs, section, ds.read_chunks)


def read_pieces(
    comm: MPI.Comm,
    grid: ChunkGrid,
    dtype: np.dtype,
    sections: Sections,
    pairs: ChunkPairs,
    section: Section | None,
    read_chunks: ChunkReader,
) -> np.ndarray:
    """Collective: the chunks of ``grid`` this rank owns in ``pairs`` read by
    ``read_chunks``, and every rank's pieces of them sent where they are wanted; this rank's
    ``section`` as an array (an empty one for None)."""
    me = comm.Get_rank()
    ndim = grid.ndim
    out = np.empty(section.shape if section is not None else (0,) * ndim, dtype=dtype)
    ch = np.asarray(grid.chunks, dtype=_I64)
    mine = pairs.chunk_owner == me
    private = np.flatnonzero(mine & (pairs.count == 1))
    shared = np.flatnonzero(mine & (pairs.count > 1))
    rows = ch[0] if ndim else 1  # staging rows per shared chunk
    staging = np.empty((len(shared) * rows, *grid.chunks[1:]) if ndim else (), dtype=dtype)
    slot = np.full(len(pairs.first), -1, dtype=_I64)
    slot[shared] = np.arange(len(shared), dtype=_I64)
    exchange = PieceExchange(comm, pairs, pairs.owner, pairs.rank, dtype.itemsize)
    failed: BaseException | None = None
    try:
        p = pairs.first[private]
        origin = pairs.coords[private] * ch
        here = sections.start[me]
        read_chunks(
            pairs.coords[private],
            pairs.lo[p] - origin,
            pairs.hi[p] - origin,
            out,
            pairs.lo[p] - here,
        )
        if len(shared):
            lo = np.minimum.reduceat(pairs.lo, pairs.first, axis=0)[shared]
            hi = np.maximum.reduceat(pairs.hi, pairs.first, axis=0)[shared]
            origin = pairs.coords[shared] * ch
            at = lo - origin
            if ndim:
                at[:, 0] += np.arange(len(shared), dtype=_I64) * rows
            read_chunks(pairs.coords[shared], lo - origin, hi - origin, staging, at)
    except Exception as exc:  # a chunk another rank waits for could not be read
        failed = exc

    # where each pair's piece lies in the staging array
    stage_lo = pairs.lo - pairs.coords[pairs.chunk] * ch
    if ndim:
        stage_lo[:, 0] += slot[pairs.chunk] * rows
    stage_hi = stage_lo + (pairs.hi - pairs.lo)
    out_lo = pairs.lo - sections.start[pairs.rank]
    out_hi = pairs.hi - sections.start[pairs.rank]
    slo, shi, olo, ohi = stage_lo.tolist(), stage_hi.tolist(), out_lo.tolist(), out_hi.tolist()
    shapes = (pairs.hi - pairs.lo).tolist()
    if failed is None:
        for p in np.flatnonzero(
            (pairs.owner == me) & (pairs.rank == me) & (slot[pairs.chunk] >= 0)
        ):
            out[box(olo[p], ohi[p])] = staging[box(slo[p], shi[p])]
        for p, at in zip(exchange.send.tolist(), exchange.send_at.tolist()):
            piece = staging[box(slo[p], shi[p])]
            exchange.slot(exchange.sendbuf, at, shapes[p], dtype)[...] = piece
    exchange.run(failed)
    for p, at in zip(exchange.recv.tolist(), exchange.recv_at.tolist()):
        out[box(olo[p], ohi[p])] = exchange.slot(exchange.recvbuf, at, shapes[p], dtype)
    return out


def write_sections(
    ds: Dataset,
    comm: MPI.Comm,
    section: Section | None,
    data: np.ndarray | None,
    err: BaseException | None,
) -> None:
    """Collective: write ``data`` (of ``section.shape``) to this rank's ``section`` of
    ``ds`` (nothing for None); ``err`` is this rank's failure so far, raised on every rank
    before any byte is written."""
    sections = gather_sections(comm, ds.ndim, section, err)
    pairs = plan_pairs(ds.grid, sections)
    pieces = gather_pieces(comm, ds.grid, ds.dtype, ds.fill_value, sections, pairs, data)
    owned = pieces.owned
    failed: BaseException | None = None
    try:
        sep = ds.meta.separator
        keys = [chunk_key(c, sep) for c in pairs.coords[owned].tolist()]
        ds.write_chunks(
            keys, (~pieces.covered[owned]).tolist(), lambda i, old: pieces.make(owned[i], old)
        )
    except Exception as exc:  # an owner's failure concerns the data of every rank
        failed = exc
    agree(comm, failed)


class OwnedChunks:
    """The chunks of a grid this rank owns in a collective write, with every rank's pieces
    of them at hand (after :func:`gather_pieces`): :meth:`make` assembles one.

    ``owned``: the owned chunks' indices into ``pairs``' per-chunk arrays, ascending;
    ``covered`` / ``interior`` per chunk: whether the pieces cover the part of it inside the
    array, and whether it lies entirely inside the array."""

    def __init__(
        self,
        me: int,
        grid: ChunkGrid,
        dtype: np.dtype,
        fill_value: Any,
        pairs: ChunkPairs,
        exchange: PieceExchange,
        data: np.ndarray | None,
        data_lo: list[list[int]],
        data_hi: list[list[int]],
    ) -> None:
        self.owned = np.flatnonzero(pairs.chunk_owner == me).tolist()
        self.covered, self.interior = coverage(grid, pairs)
        self._me, self._grid, self._dtype, self._fill = me, grid, dtype, fill_value
        self._pairs, self._exchange, self._data = pairs, exchange, data
        self._data_lo, self._data_hi = data_lo, data_hi
        origin = pairs.coords * np.asarray(grid.chunks, dtype=_I64)
        self._chunk_lo = (pairs.lo - origin[pairs.chunk]).tolist()
        self._chunk_hi = (pairs.hi - origin[pairs.chunk]).tolist()
        self._shapes = (pairs.hi - pairs.lo).tolist()
        self._first, self._count = pairs.first.tolist(), pairs.count.tolist()
        self._received = dict(zip(exchange.recv.tolist(), exchange.recv_at.tolist()))

    def _piece(self, p: int) -> np.ndarray:
        if int(self._pairs.rank[p]) == self._me:
            assert self._data is not None
            return self._data[box(self._data_lo[p], self._data_hi[p])]
        return self._exchange.slot(
            self._exchange.recvbuf, self._received[p], self._shapes[p], self._dtype
        )

    def make(self, c: int, old: np.ndarray | None) -> np.ndarray:
        """Chunk ``c`` (an owned chunk's index) assembled from its pieces over ``old`` (its
        current values; None where the pieces cover it)."""
        shape = self._grid.chunks
        first, count = self._first[c], self._count[c]
        if old is None:
            if count == 1 and self.interior[c] and self._shapes[first] == list(shape):
                return self._piece(first)  # one rank's piece is the whole chunk: no copy
            if self.interior[c]:
                old = np.empty(shape, dtype=self._dtype)
            else:  # the part beyond the array's edge holds the fill value
                old = np.full(shape, self._fill, dtype=self._dtype)
        for p in range(first, first + count):
            # in rank order: the highest rank's value wins where pieces overlap
            old[box(self._chunk_lo[p], self._chunk_hi[p])] = self._piece(p)
        return old


def gather_pieces(
    comm: MPI.Comm,
    grid: ChunkGrid,
    dtype: np.dtype,
    fill_value: Any,
    sections: Sections,
    pairs: ChunkPairs,
    data: np.ndarray | None,
) -> OwnedChunks:
    """Collective: every rank's pieces of the chunks of ``grid`` sent to the chunks' owners
    (one ``Alltoallv``); this rank's owned chunks, ready to assemble."""
    me = comm.Get_rank()
    exchange = PieceExchange(comm, pairs, pairs.rank, pairs.owner, dtype.itemsize)
    data_lo = (pairs.lo - sections.start[pairs.rank]).tolist()
    data_hi = (pairs.hi - sections.start[pairs.rank]).tolist()
    shapes = (pairs.hi - pairs.lo).tolist()
    for p, at in zip(exchange.send.tolist(), exchange.send_at.tolist()):
        assert data is not None
        exchange.slot(exchange.sendbuf, at, shapes[p], dtype)[...] = data[
            box(data_lo[p], data_hi[p])
        ]
    exchange.run(None)
    return OwnedChunks(me, grid, dtype, fill_value, pairs, exchange, data, data_lo, data_hi)


def coverage(grid: ChunkGrid, pairs: ChunkPairs) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk: whether its pieces together cover the part of it inside the array, and
    whether it lies entirely inside the array."""
    nchunks = len(pairs.first)
    if nchunks == 0:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    inside = grid.chunk_shapes(pairs.coords)
    interior = np.all(inside == np.asarray(grid.chunks, dtype=_I64), axis=1)
    volume = np.prod(inside, axis=1, dtype=_I64)
    pvol = np.prod(pairs.hi - pairs.lo, axis=1, dtype=_I64)
    covered = np.maximum.reduceat(pvol, pairs.first) == volume  # one piece covers it
    # pieces that could cover it together (they may overlap): look at the elements
    for c in np.flatnonzero(~covered & (np.add.reduceat(pvol, pairs.first) >= volume)):
        mask = np.zeros(tuple(inside[c]), dtype=bool)
        origin = pairs.coords[c] * np.asarray(grid.chunks, dtype=_I64)
        f = int(pairs.first[c])
        for p in range(f, f + int(pairs.count[c])):
            mask[box((pairs.lo[p] - origin).tolist(), (pairs.hi[p] - origin).tolist())] = True
        covered[c] = bool(mask.all())
    return covered, interior
