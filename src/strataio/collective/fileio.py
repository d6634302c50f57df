"""Moving byte pieces between a file descriptor and memory, choosing spans by a cost model.

Two ways to satisfy a set of file pieces: one system call per file-contiguous run, or one call
for a covering *span* that includes the holes between runs (data sieving: read the span and pick
the pieces out; for writes, read-modify-write the span). On a node-local file system with a page
cache a system call from Python costs about as much as moving ``SYSCALL_BYTES`` bytes, so a
hole is worth reading through when it is shorter than that; a hole in a write span costs twice
(it is read and written back). Spans are further capped at a buffer size.

Read-modify-write is only safe when nobody else writes the holes concurrently: two-phase
aggregators use write spans only inside their own realm; independent sieving
(:mod:`strataio.collective.sieving`) takes byte-range locks.
"""

from __future__ import annotations

import os

import numpy as np

from strataio.errors import BackendError
from strataio.layout.extents import Extents
from strataio.layout.pieces import copy_pieces, scratch

# Bytes of page-cache copying that cost as much as one extra pread/pwrite issued from Python
# (~1.5 us at ~6 GB/s, measured on the project machine).
SYSCALL_BYTES = 8192

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def union_runs(offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted disjoint runs covering the pieces (any order, overlaps allowed)."""
    u = Extents(offsets, lengths).union()
    return u.offsets, u.lengths


def plan_spans(
    run_off: np.ndarray,
    run_len: np.ndarray,
    max_span: int,
    write: bool,
    max_hole: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Group sorted disjoint runs into spans worth one system call each.

    Adjacent runs join when the hole between them is at most ``SYSCALL_BYTES`` (half that for
    writes, whose holes are read and written back; ``max_hole`` overrides) and the span stays
    within ``max_span`` bytes (a single run longer than that stays one span).
    """
    n = run_off.size
    if n == 0:
        return run_off, run_len
    ends = run_off + run_len
    limit = (SYSCALL_BYTES // 2 if write else SYSCALL_BYTES) if max_hole is None else max_hole
    brk = np.ones(n, dtype=bool)
    brk[1:] = (run_off[1:] - ends[:-1]) > limit
    if max_span > 0:
        gid = np.cumsum(brk) - 1
        gstart = run_off[np.flatnonzero(brk)][gid]
        # a new span whenever a run's end crosses a multiple of max_span from its group start
        chunk = (ends - 1 - gstart) // max_span
        brk[1:] |= chunk[1:] != chunk[:-1]
    idx = np.flatnonzero(brk)
    span_end = np.maximum.reduceat(ends, idx)
    return run_off[idx], span_end - run_off[idx]


def pread_into(fd: int, buf: np.ndarray, offset: int) -> None:
    """Fill ``buf`` from ``offset``; bytes past end-of-file read as zeros (holes)."""
    mv = memoryview(buf)
    pos = offset
    while len(mv):
        try:
            n = os.preadv(fd, [mv], pos)
        except OSError as exc:
            raise BackendError(f"read of {len(mv)} bytes at {pos} failed: {exc}") from exc
        if n == 0:
            buf[len(buf) - len(mv) :] = 0
            return
        mv = mv[n:]
        pos += n


def pwrite_from(fd: int, buf: np.ndarray, offset: int) -> None:
    """Write all of ``buf`` at ``offset``."""
    mv = memoryview(buf)
    pos = offset
    while len(mv):
        try:
            n = os.pwrite(fd, mv, pos)
        except OSError as exc:
            raise BackendError(f"write of {len(mv)} bytes at {pos} failed: {exc}") from exc
        mv = mv[n:]
        pos += n


def _groups(ext: Extents, max_hole: int) -> list[tuple[int, int]]:
    """Index ranges of sorted disjoint pieces that one vectored call serves: holes between
    neighbours at most ``max_hole`` bytes, at most ``IOV_MAX`` iovecs (pieces + holes)."""
    n = len(ext)
    brk = np.zeros(n, dtype=bool)
    brk[0] = True
    brk[1:] = (ext.offsets[1:] - ext.ends[:-1]) > max_hole
    gid = np.cumsum(brk) - 1
    first = np.flatnonzero(brk)
    within = np.arange(n) - first[gid]
    brk |= (within % (IOV_MAX // 2)) == 0
    starts = np.flatnonzero(brk)
    return list(zip(starts.tolist(), np.append(starts[1:], n).tolist()))


def _iovecs(
    ext: Extents, i: int, j: int, mv: memoryview, scratch: memoryview
) -> tuple[list[memoryview], int]:
    offs = ext.offsets[i:j].tolist()
    lens = ext.lengths[i:j].tolist()
    mems = ext.mem[i:j].tolist()
    holes = (ext.offsets[i + 1 : j] - ext.ends[i : j - 1]).tolist()
    iov = [mv[mems[0] : mems[0] + lens[0]]]
    for m, n, h in zip(mems[1:], lens[1:], holes):
        if h:
            iov.append(scratch[:h])
        iov.append(mv[m : m + n])
    return iov, offs[0] + sum(lens) + sum(holes)


def read_scatter(fd: int, ext: Extents, buf: np.ndarray, max_hole: int) -> None:
    """Read sorted, disjoint file pieces ``ext`` into ``buf`` at ``ext.mem`` with one ``preadv``
    per group: holes of at most ``max_hole`` bytes between pieces are read into a scratch
    iovec and discarded, so data goes from the page cache straight to the caller's memory
    (data sieving without the staging copy). Bytes past end-of-file read as zeros."""
    ext = ext.compact()
    if len(ext) <= 1:
        if len(ext):
            o, n, m = int(ext.offsets[0]), int(ext.lengths[0]), int(ext.mem[0])
            pread_into(fd, buf[m : m + n], o)
        return
    mv = memoryview(buf).cast("B")
    hole_max = int((ext.offsets[1:] - ext.ends[:-1]).max()) if len(ext) > 1 else 0
    scratch = memoryview(np.empty(max(min(hole_max, max_hole), 1), dtype=np.uint8))
    for i, j in _groups(ext, max_hole):
        iov, end = _iovecs(ext, i, j, mv, scratch)
        start = int(ext.offsets[i])
        try:
            got = os.preadv(fd, iov, start)
        except OSError as exc:
            raise BackendError(f"read of [{start}, {end}) failed: {exc}") from exc
        if got < end - start:  # end of file inside the group: finish piece by piece
            for k in range(i, j):
                o, n, m = int(ext.offsets[k]), int(ext.lengths[k]), int(ext.mem[k])
                pread_into(fd, buf[m : m + n], o)


def read_spans(fd: int, ext: Extents, buf: np.ndarray, max_span: int, max_hole: int) -> None:
    """Data-sieving read of sorted, disjoint pieces ``ext`` into ``buf`` at ``ext.mem``.

    Pieces are grouped into spans (holes of at most ``max_hole`` bytes, spans of at most
    ``max_span``); each batch of about ``max_span`` bytes of spans is read into one staging
    buffer (one ``pread`` per span) and the pieces leave it in one vectorized copy.
    """
    ext = ext.compact()
    if len(ext) == 0:
        return
    sp_off, sp_len = plan_spans(ext.offsets, ext.lengths, max_span, False, max_hole)
    csum = np.cumsum(sp_len)
    start = csum - sp_len
    bid = start // max(int(max_span), 1)
    cuts = np.flatnonzero(bid[1:] != bid[:-1]) + 1
    bounds = np.concatenate(([0], cuts, [sp_off.size])).tolist()
    span_of = np.searchsorted(sp_off, ext.offsets, side="right") - 1
    piece_bounds = np.searchsorted(span_of, bounds).tolist()
    for k in range(len(bounds) - 1):
        b0, b1 = bounds[k], bounds[k + 1]
        base = int(start[b0])
        stage = scratch(int(csum[b1 - 1]) - base, "sieve")
        for o, n, p in zip(sp_off[b0:b1].tolist(), sp_len[b0:b1].tolist(), start[b0:b1].tolist()):
            pread_into(fd, stage[p - base : p - base + n], o)
        p0, p1 = piece_bounds[k], piece_bounds[k + 1]
        s = span_of[p0:p1]
        at = (start[s] - base) + (ext.offsets[p0:p1] - sp_off[s])
        copy_pieces(buf, ext.mem[p0:p1], stage, at, ext.lengths[p0:p1])
