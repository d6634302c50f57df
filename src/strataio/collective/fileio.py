"""Moving byte pieces between a file (a :class:`~strataio.collective.driver.Driver`) and memory,
choosing spans by a cost model.

Two ways to satisfy a set of file pieces: one system call per file-contiguous run, or one call
for a covering *span* that includes the holes between runs (data sieving: read the span and pick
the pieces out; for writes, read-modify-write the span). On a node-local file system with a page
cache a system call from Python costs about as much as moving ``SYSCALL_BYTES`` bytes, so a
hole is worth reading through when it is shorter than that; a hole in a write span costs twice
(it is read and written back). Spans are further capped at a buffer size.

Inside two-phase I/O the one rule is the same cost model with its threshold measured for an
aggregator's window by a sweep (``SIEVE_READ_BYTES`` / ``SIEVE_WRITE_BYTES``, conditional
data sieving: :func:`window_spans`); ``romio_cb_ds_threshold`` replaces it with ROMIO's density rule.

Read-modify-write is only safe when nobody else writes the holes concurrently: two-phase
aggregators use write spans only inside their own realm; independent sieving
(:mod:`strataio.collective.sieving`) takes byte-range locks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strataio.collective.driver import SPLIT_READ_BYTES, Driver, run_shared
from strataio.errors import BackendError
from strataio.layout.extents import Extents
from strataio.layout.pieces import CopyPlan, plan_copy, scratch
from strataio.storage.mapped import ALIAS_BYTES, MAPPED_READ_BYTES, PAGE, aliases
from strataio.storage.vectored import VectoredPlan

# Bytes of page-cache copying that cost as much as one extra pread/pwrite issued from Python.
# One process alone measures ~1.5 us per call, ~8 KiB at ~6 GB/s; with several ranks calling on
# one file at once a call costs more, and 16 KiB fits both machines measured (strataio bench
# collective, 8 KiB -> 16 KiB): HPIO 4 KiB regions at 4 ranks (12.5 KiB holes) on 2 cores,
# read 1646-1831 -> 2433-2952 MB/s and write 628-650 -> 826-886; on a 16-core node HPIO
# 512-byte regions at 16 ranks (9.5 KiB holes), read 2562 -> 4412, and 4 KiB regions at 4
# ranks, read 4959 -> 6341 and write 1590 -> 2362.
SYSCALL_BYTES = 16384

# Conditional data sieving inside two-phase I/O (thesis ch. 4.3.3, which found a crossover
# near a 16 KB datatype extent on Lustre). Sieving a window saves a system call per piece and
# moves bytes the pieces do not need: for a read, each hole; for a write (read-modify-write of
# the covering span), each piece read back plus each hole read and written. A window is
# sieved across a hole while those bytes stay within what one call is worth: for a window of
# one datatype (extent E, density d) that is one covering span when (1 - d) E (reads) or
# (2 - d) E = E + hole (writes) is at most the threshold, one call per piece above it.
# Measured with ``strataio bench sieving --sweep`` (16 MiB window, page-cached, extents 1 KiB
# - 1 MiB at densities 1/4, 1/2, 3/4; BENCHMARKS.md): these two quantities, not the extent
# alone, stay put across densities at the crossover.
SIEVE_READ_BYTES = 36864
SIEVE_WRITE_BYTES = 98304


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

    Adjacent runs join when the hole between them is at most ``SIEVE_READ_BYTES``, for writes
    when the run after it plus twice the hole (read back, then written) is at most
    ``SIEVE_WRITE_BYTES`` (``max_hole`` instead: holes of at most that many bytes join), and
    the span stays within ``max_span`` bytes (a single run longer than that stays one span).
    """
    n = run_off.size
    if n == 0:
        return run_off, run_len
    ends = run_off + run_len
    holes = run_off[1:] - ends[:-1]
    brk = np.ones(n, dtype=bool)
    if max_hole is not None:
        brk[1:] = holes > max_hole
    elif write:
        brk[1:] = run_len[1:] + 2 * holes > SIEVE_WRITE_BYTES
    else:
        brk[1:] = holes > SIEVE_READ_BYTES
    if max_span > 0:
        gid = np.cumsum(brk) - 1
        gstart = run_off[np.flatnonzero(brk)][gid]
        # a new span whenever a run's end crosses a multiple of max_span from its group start
        chunk = (ends - 1 - gstart) // max_span
        brk[1:] |= chunk[1:] != chunk[:-1]
    idx = np.flatnonzero(brk)
    span_end = np.maximum.reduceat(ends, idx)
    return run_off[idx], span_end - run_off[idx]


# ``romio_cb_ds_threshold`` when not given: the measured rule of :func:`plan_spans`.
AUTO_THRESHOLD = -1


def window_spans(
    run_off: np.ndarray,
    run_len: np.ndarray,
    max_span: int,
    write: bool,
    threshold: int = AUTO_THRESHOLD,
) -> tuple[np.ndarray, np.ndarray]:
    """The spans a two-phase aggregator accesses for one window's sorted disjoint runs:
    conditional data sieving.

    The window is read (read-modify-written) through its holes or accessed one call per run.
    With ``threshold`` = :data:`AUTO_THRESHOLD` the measured rule decides, hole by hole
    (:func:`plan_spans`): for a window of one datatype's repetitions (extent ``E``, density
    ``d``) that is one covering span when ``(1 - d) E`` is at most ``SIEVE_READ_BYTES``
    (writes: ``(2 - d) E`` at most ``SIEVE_WRITE_BYTES``) and one call per piece otherwise;
    an irregular window is sieved where its holes are small and split where they are not. A
    ``threshold`` of 0-100 is ROMIO's ``romio_cb_ds_threshold``: the window is sieved whole
    when ``100 * data // extent`` (integer percent of the covering extent that is data)
    reaches it, else accessed one call per run.
    """
    if threshold == AUTO_THRESHOLD:
        return plan_spans(run_off, run_len, max_span, write)
    if run_off.size < 2:
        return run_off, run_len
    extent = int(run_off[-1] + run_len[-1] - run_off[0])
    if 100 * int(run_len.sum()) // extent >= threshold:
        return plan_spans(run_off, run_len, max_span, write, np.iinfo(np.int64).max)
    return run_off, run_len


def sieve_threshold(hints: Any, write: bool) -> int | None:
    """How two-phase aggregators sieve their windows (:func:`window_spans`): the
    ``romio_cb_ds_threshold`` percent when given; else :data:`AUTO_THRESHOLD` (the measured
    rule), or None (one call per run) when ``romio_ds_write`` (``romio_ds_read``) is
    ``disable``."""
    given = str(getattr(hints, "romio_cb_ds_threshold", "automatic"))
    if given != "automatic":
        return int(given)
    ds = str(getattr(hints, "romio_ds_write" if write else "romio_ds_read", "automatic"))
    return None if ds.lower() == "disable" else AUTO_THRESHOLD


def span_holes(
    run_off: np.ndarray, run_len: np.ndarray, sp_off: np.ndarray, sp_len: np.ndarray
) -> np.ndarray:
    """For spans of :func:`plan_spans` over sorted disjoint runs: whether each span contains
    bytes that no run covers."""
    first = np.searchsorted(run_off, sp_off)  # every span starts with a run
    if first.size == 0:
        return np.zeros(0, dtype=bool)
    return np.add.reduceat(run_len, first) < sp_len


def _failed(
    driver: Driver, what: str, nbytes: int, offset: int, exc: OSError, rank: int | None
) -> BackendError:
    """The error of a failed ``what`` ("read", "write") of ``nbytes`` at ``offset``, naming the
    file (as every other BackendError of a File does) and, given one, the rank that failed
    (an aggregator of two-phase I/O moves other ranks' bytes: they learn which one failed)."""
    by = "" if rank is None else f" by rank {rank}"
    return BackendError(
        f"{driver.path or 'file'}: {what} of {nbytes} bytes at {offset}{by} failed: {exc}"
    )


def pread_upto(driver: Driver, buf: np.ndarray, offset: int, rank: int | None = None) -> int:
    """Read into ``buf`` from ``offset`` until it is full or end-of-file; the bytes read (the
    rest of ``buf`` is left as it was). A failure is a :class:`BackendError` naming the file
    and ``rank`` (when given)."""
    try:
        return driver.pread(buf, offset)
    except OSError as exc:
        raise _failed(driver, "read", len(buf), offset, exc, rank) from exc


def pread_into(driver: Driver, buf: np.ndarray, offset: int, rank: int | None = None) -> None:
    """Fill ``buf`` from ``offset``; bytes past end-of-file read as zeros (holes)."""
    n = pread_upto(driver, buf, offset, rank)
    if n < len(buf):
        buf[n:] = 0


def pwrite_from(driver: Driver, buf: np.ndarray, offset: int, rank: int | None = None) -> None:
    """Write all of ``buf`` at ``offset``; a failure is a :class:`BackendError` naming the file
    and ``rank`` (when given)."""
    try:
        driver.pwrite(buf, offset)
    except OSError as exc:
        raise _failed(driver, "write", len(buf), offset, exc, rank) from exc


# When an independent read goes straight into the caller's buffer (holes read through into
# scratch iovecs) rather than through a staging buffer and one planned copy. A kernel iovec
# costs ~60-70 ns, a piece scattered costs two (itself and the hole after it); staging costs a
# second copy of every piece and drags the holes through the staging buffer instead of one
# cache-hot scratch iovec. Measured on page-cached files (one process, 32 MiB of pieces, median
# ms scattered / staged): 512-byte pieces with 128-byte holes 12.9 / 4.5, 768-byte holes 9.2 /
# 7.3, 2 KiB holes 12.2 / 12.5, 4 KiB holes 11.5 / 14.9; 1 KiB pieces with 768-byte holes 5.9 /
# 6.2, 2 KiB holes 7.4 / 10.2; 4 KiB pieces with 128-byte holes 5.8 / 3.7, 768-byte holes 3.6 /
# 3.9. So pieces are staged when they are small (mean below SCATTER_PIECE), when pieces and
# holes together repeat at most every STAGE_STRIDE bytes, or when the holes are short next to
# the pieces (mean hole at most 1/8 of the mean piece); otherwise scattered. Pieces larger
# than STAGE_PIECE on average (beyond what was measured) are always scattered: staging them
# saves no calls and copies every byte twice.
SCATTER_PIECE = 512
STAGE_STRIDE = 1536
STAGE_PIECE = 4096


def _scatters(ext: Extents) -> bool:
    """Whether a :class:`ReadPlan` of sorted disjoint pieces ``ext`` reads them straight into
    the caller's buffer (see ``SCATTER_PIECE``)."""
    n, nbytes = len(ext), ext.nbytes
    if n == 1:
        return True  # (staging one piece would only add a copy)
    if nbytes > STAGE_PIECE * n:
        return True
    if nbytes < SCATTER_PIECE * n:
        return False
    span = int(ext.offsets[-1] + ext.lengths[-1] - ext.offsets[0])
    holes = span - nbytes
    return span > STAGE_STRIDE * n and 8 * holes > nbytes


class ReadPlan:
    """One rank's read of sorted, disjoint file pieces ``ext`` (``mem``: positions in the
    caller's buffer), planned once and run on any buffer of the same layout.

    Pieces that are large and far apart (see ``SCATTER_PIECE``) are read straight into the
    buffer by vectored reads that cross holes of at most ``max_hole`` bytes through a scratch iovec
    (:class:`~strataio.storage.vectored.VectoredPlan`). Others are sieved: covering spans
    (holes of at most ``max_hole``, spans of at most ``max_span`` bytes) are read into a staging
    buffer in batches of about ``max_span`` bytes and the pieces leave it in one planned
    vectorized copy per batch. Bytes past end-of-file read as zeros. ``scatter`` forces one
    way or the other.
    """

    __slots__ = ("_batches", "_direct", "_mapped", "_shared")

    def __init__(
        self, ext: Extents, max_span: int, max_hole: int, scatter: bool | None = None
    ) -> None:
        ext = ext.compact()
        self._direct: VectoredPlan | None = None
        self._mapped: VectoredPlan | None = None
        self._batches: list[tuple[int, VectoredPlan, CopyPlan, int]] = []
        self._shared = False  # see run
        if len(ext) == 0:
            return
        if scatter is None:
            scatter = max_hole <= 0 or _scatters(ext)
        if scatter:
            self._direct = VectoredPlan(ext.offsets, ext.lengths, ext.mem, max_hole)
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
            spans = VectoredPlan(sp_off[b0:b1], sp_len[b0:b1], start[b0:b1] - base)
            p0, p1 = piece_bounds[k], piece_bounds[k + 1]
            s = span_of[p0:p1]
            at = (start[s] - base) + (ext.offsets[p0:p1] - sp_off[s])
            copy = plan_copy(ext.mem[p0:p1], at, ext.lengths[p0:p1])
            lead = int(ext.mem[p0]) - int(at[0])  # the first piece: buffer minus stage position
            self._batches.append((int(csum[b1 - 1]) - base, spans, copy, lead))
        # enough bytes staged to be worth a hand-off, as for one large read
        self._shared = sum(b[0] for b in self._batches) >= SPLIT_READ_BYTES
        if ext.nbytes >= MAPPED_READ_BYTES:
            # the pieces as one plan, for a copy straight out of the file's cached pages
            self._mapped = VectoredPlan(ext.offsets, ext.lengths, ext.mem)

    def run(self, driver: Driver, buf: np.ndarray) -> None:
        """Read the planned pieces through ``driver`` into ``buf`` (flat ``uint8``). Staged
        batches are shared among the driver's read threads where it has more than one
        (:attr:`PosixDriver.threads`), each thread reading and copying out its own."""
        if self._direct is not None:
            driver.readv(self._direct, buf)
        if self._mapped is not None and driver.read_mapped(self._mapped, buf):
            return
        batches = self._batches
        threads = min(getattr(driver, "threads", 1), len(batches))
        if threads > 1 and self._shared:
            cut = [len(batches) * k // threads for k in range(threads + 1)]
            run_shared(
                [
                    lambda lo=lo, hi=hi: _run_batches(driver, batches[lo:hi], buf)
                    for lo, hi in zip(cut, cut[1:])
                ]
            )
            return
        _run_batches(driver, batches, buf)


def _run_batches(
    driver: Driver, batches: list[tuple[int, VectoredPlan, CopyPlan, int]], buf: np.ndarray
) -> None:
    """Read staged ``batches`` (staging bytes, spans, copy out, first piece's buffer minus
    stage position) into ``buf``, in this thread's staging buffer placed by
    :func:`_stage_at`."""
    addr = int(buf.__array_interface__["data"][0])
    for size, spans, copy, lead in batches:
        raw = scratch(size + PAGE, "sieve")
        at = _stage_at(int(raw.__array_interface__["data"][0]), spans.span[0], addr + lead)
        stage = raw[at : at + size]
        driver.readv(spans, stage)
        copy.run(buf, stage)


def _stage_at(raw: int, file_offset: int, first_dst: int) -> int:
    """Where a staging buffer starts in scratch memory at address ``raw``: at the page offset
    of the file bytes it receives (the kernel's copy then runs page-aligned on both sides),
    moved on by ``ALIAS_BYTES`` if the copy out to the caller's buffer (the first piece
    going to address ``first_dst`` less its stage position) would then alias
    (:func:`~strataio.storage.mapped.aliases`)."""
    want = file_offset % PAGE
    if aliases(first_dst, want):
        want += ALIAS_BYTES
    return (want - raw) % PAGE
