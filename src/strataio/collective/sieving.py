"""Independent noncontiguous I/O through a driver: direct (list I/O) or data sieving.

Every function moves the file pieces of an :class:`~strataio.layout.extents.Extents` between
a file (a :class:`~strataio.collective.driver.Driver`) and ``buf`` — piece ``i`` is file bytes ``offsets[i] : offsets[i] + lengths[i]``
and buffer bytes ``mem[i] : mem[i] + lengths[i]``. Pieces may come in any order; for writes,
pieces must not overlap in the file (as MPI requires of one access).

- :func:`read_direct` / :func:`write_direct`: one ``preadv`` / ``pwritev`` per run of
  file-adjacent pieces, holes untouched.
- :func:`read_sieved` / :func:`write_sieved`: data sieving (ROMIO's algorithm, Thakur et al.):
  the sorted pieces are grouped into covering *spans* of at most about ``buffer_size`` bytes;
  a span with holes is read whole into a staging buffer and the pieces are picked out (reads),
  or read, patched and written back whole (writes). Spans without holes are moved directly.
  Copies between the staging buffer and ``buf`` are vectorized (``layout.pieces.plan_copy``).

The choice between them by the ``romio_ds_read`` / ``romio_ds_write`` hints is made in one
place, :class:`strataio.collective.independent.IndependentIO`.

Locking. A sieving write rewrites the holes of its spans, so a concurrent writer of those holes
could be undone. :func:`write_sieved` therefore holds an exclusive POSIX byte-range lock
(the driver's :meth:`~strataio.collective.driver.Driver.lock`) on each span across its read, modify and write, and also locks the
hole-free spans it writes directly (one lock per batch of them, covering the gaps between
them too), so that any number of processes writing interleaved bytes through
:func:`write_sieved` leave a correct file. The locks of direct writes are *shared* (on a
file open for reading; exclusive otherwise, as POSIX wants): a direct write only has to
exclude read-modify-writes, not other direct writes of other bytes, so interleaving writers
that sieve nothing never wait for each other's locks (they still meet in the kernel, which
serializes buffered writes to one file). A process that writes the same file without
sieving concurrently must pass ``lock=True`` to :func:`write_direct`. POSIX locks belong to the process: threads of one
process do not exclude each other, and closing any descriptor of the file releases the
process's locks on it.

Sieving policy (``automatic``, the default of both hints). Reading or writing through a hole
costs its bytes; a separate system call per run costs about as much as copying
``SYSCALL_BYTES`` bytes (measured: see :mod:`strataio.collective.fileio`). ``automatic``
therefore joins two neighbouring runs into one span when the hole between them is at most
``SYSCALL_BYTES`` for reads. A write that skips a hole pays three system calls for the run
after it (lock, write, unlock), a write through it pays the hole's bytes twice (read, then
written back), so writes join runs across holes of up to ``3/2 * SYSCALL_BYTES`` (measured:
HPIO's 4 KiB regions with 4224-byte holes at 2 ranks write in 16 ms sieved, 35 ms direct).
``enable`` sieves every hole that fits in a buffer (ROMIO's behaviour); ``disable`` never
sieves. A contiguous access is never sieved; a contiguous write is still locked, since a
concurrent sieving writer's span may cover it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strataio.collective import fileio
from strataio.collective.driver import Driver
from strataio.collective.fileio import SYSCALL_BYTES, pread_into, pread_upto, pwrite_from
from strataio.collective.hints import ENABLE
from strataio.errors import BackendError, ShapeMismatchError, StrataError
from strataio.layout.extents import Extents
from strataio.layout.pieces import CopyPlan, as_bytes, plan_copy, scratch, zeros
from strataio.storage.vectored import VectoredPlan

__all__ = [
    "plan_spans",
    "read_direct",
    "read_sieved",
    "write_direct",
    "write_sieved",
]

DEFAULT_RD_BUFFER = 4194304
DEFAULT_WR_BUFFER = 1048576  # (strataio's default ind_wr_buffer_size; ROMIO's is 512 KiB)


# --------------------------------------------------------------------------- planning
def _prepare(ext: Extents, buf: Any, writable: bool) -> tuple[Extents, np.ndarray]:
    """Validate before any byte moves: non-negative file offsets, pieces inside ``buf``."""
    data = as_bytes(buf, writable=writable)
    ext = ext.compact()
    if len(ext):
        if int(ext.offsets.min()) < 0:
            raise StrataError(f"negative file offset {int(ext.offsets.min())}")
        if int(ext.mem.min()) < 0 or bool((ext.lengths > data.size - ext.mem).any()):
            raise ShapeMismatchError(f"pieces reach past the end of a {data.size}-byte buffer")
    return ext, data


def plan_spans(
    ext: Extents, buffer_size: int, max_hole: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Covering spans of the (sorted) pieces for sieving.

    Neighbouring runs of bytes join while the hole between them is at most ``max_hole``
    (``None``: any hole) and the span stays within about ``buffer_size`` bytes (a span breaks
    where a run's end crosses a multiple of ``buffer_size`` from the start of its group; a
    single run longer than that is its own span). Returns ``(span_offsets, span_lengths,
    holey)``, ``holey[j]`` telling whether span ``j`` contains bytes no piece wants.
    """
    runs = _runs(ext)
    hole = np.iinfo(np.int64).max if max_hole is None else max_hole
    r_off, r_len = runs.offsets, runs.lengths
    sp_off, sp_len = fileio.plan_spans(r_off, r_len, max(int(buffer_size), 1), True, hole)
    return sp_off, sp_len, fileio.span_holes(r_off, r_len, sp_off, sp_len)


def _runs(ext: Extents) -> Extents:
    """Sorted disjoint runs of the bytes ``ext`` touches."""
    if ext.is_sorted():  # the common case (a flattened view): merging neighbours suffices
        ext = ext.compact()
        if len(ext) < 2:
            return ext
        brk = np.flatnonzero(ext.offsets[1:] != ext.ends[:-1]) + 1
        idx = np.concatenate(([0], brk))
        return Extents(ext.offsets[idx], np.add.reduceat(ext.lengths, idx))
    return ext.union()


def hole_limit(mode: str, write: bool) -> int | None:
    """The longest hole a sieved span crosses under ``mode`` (``None``: any)."""
    if mode == ENABLE:
        return None
    return 3 * SYSCALL_BYTES // 2 if write else SYSCALL_BYTES  # see the module docstring


# --------------------------------------------------------------------------- direct
def read_direct(driver: Driver, extents: Extents, buf: Any) -> None:
    """Read each piece of ``extents`` from the file into ``buf`` (at ``mem``), no sieving.

    Bytes past end-of-file read as zeros.
    """
    ext, data = _prepare(extents, buf, writable=True)
    _io(driver, ext.sort(), data, write=False)


def write_direct(driver: Driver, extents: Extents, buf: Any, *, lock: bool = False) -> None:
    """Write each piece of ``extents`` from ``buf`` (at ``mem``) to the file; holes untouched.

    With ``lock`` each run is written under an exclusive byte-range lock, so that a concurrent
    :func:`write_sieved` on the same file cannot undo it.
    """
    ext, data = _prepare(extents, buf, writable=False)
    ext = ext.sort()
    if not lock or len(ext) == 0:
        _io(driver, ext, data, write=True)
        return
    runs = ext.union()
    with _LockSet(driver, [(runs.first, runs.last)]):
        _io(driver, ext, data, write=True)


def _io(driver: Driver, ext: Extents, data: np.ndarray, write: bool) -> None:
    if len(ext) == 0:
        return
    try:
        plan = VectoredPlan(ext.offsets, ext.lengths, ext.mem)
        (driver.writev if write else driver.readv)(plan, data)
    except ValueError as exc:  # pieces outside the buffer or the file: refused before any I/O
        raise ShapeMismatchError(str(exc)) from None
    except OSError as exc:
        what = "write" if write else "read"
        raise BackendError(f"{driver.path or 'file'}: {what} of {len(ext)} pieces: {exc}") from exc


class _LockSet:
    """POSIX locks on byte ranges ``(lo, hi)``, exclusive or ``shared`` (the descriptor must
    then be open for reading), taken in the given (ascending) order for the ``with`` block; on
    a failure the locks already taken are released."""

    __slots__ = ("driver", "locks", "shared", "taken")

    def __init__(self, driver: Driver, locks: list[tuple[int, int]], shared: bool = False) -> None:
        # an empty range must not reach a lock: length 0 there means "to the end of the file"
        self.driver, self.locks, self.taken = driver, [r for r in locks if r[1] > r[0]], 0
        self.shared = shared

    def __enter__(self) -> None:
        lock, shared = self.driver.lock, self.shared
        try:
            for lo, hi in self.locks:
                lock(lo, hi - lo, shared)
                self.taken += 1
        except BaseException:  # an interrupt while waiting must not leave locks held
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        taken, self.taken = self.locks[: self.taken], 0
        self._release(taken)

    def _release(self, locks: list[tuple[int, int]]) -> None:
        """Release ``locks``; every one is tried even when one release fails."""
        for k, (lo, hi) in enumerate(locks):
            try:
                self.driver.unlock(lo, hi - lo)
            except BaseException:
                self._release(locks[k + 1 :])
                raise


# --------------------------------------------------------------------------- sieving
def _batches(sp_len: np.ndarray, buffer_size: int) -> list[int]:
    """Boundaries of consecutive span groups of about ``buffer_size`` staged bytes each."""
    csum = np.cumsum(sp_len)
    bid = (csum - sp_len) // max(int(buffer_size), 1)
    cuts = np.flatnonzero(np.diff(bid)) + 1
    return np.concatenate(([0], cuts, [sp_len.size])).tolist()


class SievePlan:
    """A data-sieving transfer of sorted pieces ``ext`` planned once (see the module docs):
    spans, batches, lock ranges and the copies between staging buffer and caller's buffer.
    :meth:`run` moves the bytes of any buffer of the same layout."""

    __slots__ = ("_contiguous", "_direct", "_holey", "_plain", "needs_read", "write")

    def __init__(self, ext: Extents, buffer_size: int, max_hole: int | None, write: bool) -> None:
        self.write = write
        self._direct: VectoredPlan | None = None
        self._plain: list[tuple[int, int, VectoredPlan]] = []  # (lock start, length, writes)
        # (stage size, spans (offset, length, stage position), copy, zeroing of the holes)
        self._holey: list[
            tuple[int, list[tuple[int, int, int]], CopyPlan, tuple[CopyPlan, int] | None]
        ] = []
        self.needs_read = False
        ext = ext.compact()  # (an empty piece must not become a lock: length 0 is "to the end")
        self._contiguous = len(ext) <= 1
        if self._contiguous:  # a contiguous access is never sieved
            vec = VectoredPlan(ext.offsets, ext.lengths, ext.mem)
            if write and len(ext):  # but locked: a sieving writer must not undo it
                self._plain.append((ext.first, ext.last - ext.first, vec))
            else:
                self._direct = vec
            return
        sp_off, sp_len, holey = plan_spans(ext, buffer_size, max_hole)
        self.needs_read = bool(write and holey.any())
        span_of = np.searchsorted(sp_off, ext.offsets, side="right") - 1
        in_holey = holey[span_of]
        plain = ext.take(~in_holey)
        # Hole-free spans are moved in place. For writes, each batch of about buffer_size bytes
        # of them is written in one batched call under one lock from its first byte to its
        # last. The lock also covers the gaps between the spans, stalling their writers for
        # one batch, but costs two fcntl calls per batch instead of two per span (HPIO 4 KiB
        # regions at 4 ranks: 0.56-0.64 -> 1.20-1.31 times ROMIO, paired runs).
        if len(plain) and not write:
            self._direct = VectoredPlan(plain.offsets, plain.lengths, plain.mem)
        elif len(plain):
            ok = np.flatnonzero(~holey)
            o_off, o_end = sp_off[ok], sp_off[ok] + sp_len[ok]
            cut = np.searchsorted(plain.offsets, o_off).tolist() + [len(plain)]
            bounds = _batches(sp_len[ok], buffer_size)
            for g0, g1 in zip(bounds[:-1], bounds[1:]):
                part = plain.take(slice(cut[g0], cut[g1]))
                lo, hi = int(o_off[g0]), int(o_end[g1 - 1])
                self._plain.append(
                    (lo, hi - lo, VectoredPlan(part.offsets, part.lengths, part.mem))
                )
        # Spans with holes go through a staging buffer, in batches of about buffer_size bytes.
        hs = np.flatnonzero(holey)
        if hs.size == 0:
            return
        sv = ext.take(in_holey)
        sv_span = span_of[in_holey]  # sorted, since pieces and spans both are
        h_off, h_len = sp_off[hs], sp_len[hs]
        bounds = _batches(h_len, buffer_size)
        csum = np.cumsum(h_len) - h_len  # position of each holey span in its batch's stage
        for b0, b1 in zip(bounds[:-1], bounds[1:]):
            base = int(csum[b0])
            size = int(csum[b1 - 1] + h_len[b1 - 1]) - base
            p0, p1 = np.searchsorted(sv_span, [hs[b0], hs[b1 - 1] + 1])
            part = sv.take(slice(int(p0), int(p1)))
            j = np.searchsorted(hs, sv_span[p0:p1])  # index among holey spans
            at = (csum[j] - base) + (part.offsets - h_off[j])
            spans = list(
                zip(h_off[b0:b1].tolist(), h_len[b0:b1].tolist(), (csum[b0:b1] - base).tolist())
            )
            if write:
                copy = plan_copy(at, part.mem, part.lengths)
                holes = _holes(at, part.lengths, j, size)
            else:
                copy, holes = plan_copy(part.mem, at, part.lengths), None
            self._holey.append((size, spans, copy, holes))

    def run(self, driver: Driver, data: np.ndarray) -> None:
        """Move the planned pieces between the file and ``data`` (flat ``uint8``)."""
        if self.needs_read and not driver.read_write:
            raise BackendError(
                f"{driver.path or 'file'}: a sieving write reads its spans back: the file must "
                "be open read-write (or use romio_ds_write=disable)"
            )
        doing = ["the transfer"]  # (what _run is doing: what failed)
        try:
            self._run(driver, data, doing)
        except BackendError:  # (a failed read or write of a span: it names the file)
            raise
        except OSError as exc:
            raise BackendError(f"{driver.path or 'file'}: {doing[0]} failed: {exc}") from exc

    def _run(self, driver: Driver, data: np.ndarray, doing: list[str]) -> None:
        """:meth:`run`, saying in ``doing[0]`` what it is doing (for the error of a failure)."""
        what = "write" if self.write else "read"
        if self._direct is not None:
            doing[0] = f"{what} of {self._direct.moved} bytes in place (not sieved)"
            (driver.writev if self.write else driver.readv)(self._direct, data)
        # Direct writes exclude read-modify-writes only (one range each: locked without a
        # _LockSet, whose generality costs tens of microseconds on every contiguous write).
        shared = driver.read_write
        for lo, n, vec in self._plain:
            kind = "contiguous write" if self._contiguous else "write in place (not sieved)"
            doing[0] = f"{kind} of bytes {lo}-{lo + n} under a lock of them"
            driver.lock(lo, n, shared)
            try:
                driver.writev(vec, data)
            finally:
                driver.unlock(lo, n)
        for size, spans, copy, holes in self._holey:
            first, (last, n_last, _) = spans[0][0], spans[-1]
            many = f"{len(spans)} span" + ("s" if len(spans) > 1 else "")
            how = ", each read, patched and written back under a lock" if self.write else ""
            doing[0] = f"sieving {what} of bytes {first}-{last + n_last} ({many}{how})"
            stage = scratch(size, "sieve")
            if not self.write:
                for o, n, p in spans:
                    pread_into(driver, stage[p : p + n], o)
                copy.run(data, stage)
                continue
            # Every span is locked before it is read and stays locked until written back. Locks
            # are taken in ascending offset order by every writer, so no two wait on each other.
            if len(spans) == 1:
                o, n, _ = spans[0]
                driver.lock(o, n)
                try:
                    _read_modify_write(driver, data, stage, spans, copy, holes)
                finally:
                    driver.unlock(o, n)
            else:
                with _LockSet(driver, [(o, o + n) for o, n, _ in spans]):
                    _read_modify_write(driver, data, stage, spans, copy, holes)


# Bytes of memset that cost as much as zeroing one more hole by a strided copy (measured, 512 KiB
# stage: 128-byte holes every 4 KiB 6 us against a 9 us memset; every 192 bytes 23 us).
_HOLE_BYTES = 256


def _holes(
    at: np.ndarray, lengths: np.ndarray, span: np.ndarray, size: int
) -> tuple[CopyPlan, int] | None:
    """The zeroing of a staged batch's holes (the gaps between consecutive pieces at stage
    positions ``at`` of the same ``span``) and the longest hole; None when there are none or
    when zeroing the whole ``size``-byte stage costs less."""
    ends = at[:-1] + lengths[:-1]
    gap = at[1:] - ends
    keep = (span[1:] == span[:-1]) & (gap > 0)
    gap_at, gap = ends[keep], gap[keep]
    if gap.size == 0 or gap.size * _HOLE_BYTES + int(gap.sum()) >= size:
        return None
    return plan_copy(gap_at, np.zeros_like(gap_at), gap), int(gap.max())


def _read_modify_write(
    driver: Driver,
    data: np.ndarray,
    stage: np.ndarray,
    spans: list[tuple[int, int, int]],
    copy: CopyPlan,
    holes: tuple[CopyPlan, int] | None,
) -> None:
    """Read the (locked) spans into ``stage``, patch the pieces in, write the spans back.
    Bytes past end-of-file are zeros; when the whole batch lies there (a new file) only the
    holes are zeroed, since the pieces overwrite the rest."""
    got = [pread_upto(driver, stage[p : p + n], o) for o, n, p in spans]
    if holes is not None and not any(got):
        holes[0].run(stage, zeros(holes[1]))
    else:
        for (_, n, p), g in zip(spans, got):
            if g < n:
                stage[p + g : p + n] = 0
    copy.run(stage, data)
    for o, n, p in spans:
        pwrite_from(driver, stage[p : p + n], o)


def read_sieved(
    driver: Driver,
    extents: Extents,
    buf: Any,
    buffer_size: int = DEFAULT_RD_BUFFER,
    *,
    max_hole: int | None = None,
) -> None:
    """Read the pieces of ``extents`` into ``buf`` by data sieving.

    Spans of about ``buffer_size`` bytes (``ind_rd_buffer_size``) are read whole; holes
    longer than ``max_hole`` bytes split spans (``None``: ROMIO's behaviour, never). Bytes
    past end-of-file read as zeros.
    """
    ext, data = _prepare(extents, buf, writable=True)
    if len(ext) == 0:
        return
    SievePlan(ext.sort(), buffer_size, max_hole, write=False).run(driver, data)


def write_sieved(
    driver: Driver,
    extents: Extents,
    buf: Any,
    buffer_size: int = DEFAULT_WR_BUFFER,
    *,
    max_hole: int | None = None,
) -> None:
    """Write the pieces of ``extents`` from ``buf`` by data sieving (read-modify-write).

    Spans of about ``buffer_size`` bytes (``ind_wr_buffer_size``) with holes are read, patched
    and written back under an exclusive ``fcntl`` lock; see the module docs for the locking
    contract. A contiguous access is written directly, under one lock. The file must be open
    for reading and writing.
    """
    ext, data = _prepare(extents, buf, writable=False)
    if len(ext) == 0:
        return
    SievePlan(ext.sort(), buffer_size, max_hole, write=True).run(driver, data)
