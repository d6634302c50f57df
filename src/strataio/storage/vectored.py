"""Vectored file I/O from numpy iovec tables: no Python work per piece.

``os.preadv`` takes a Python list of buffers, and building one memoryview per piece costs about
0.2 us, so a read of 8192 small pieces spends more time in Python than in the kernel. A
:class:`VectoredPlan` keeps the iovec table of a set of sorted, disjoint file pieces as numpy
arrays relative to the buffer's first byte; a transfer adds the buffer's address (one
vectorized add) and calls libc's ``preadv`` / ``pwritev`` through :mod:`ctypes` (which releases
the GIL) once per group of at most ``IOV_MAX`` iovecs.

A read may also *skip* short holes between pieces inside one call: each hole gets an iovec into
a per-thread scratch area (data sieving without the staging copy: the wanted bytes go from the
page cache straight into the caller's buffer). Writes never cross a hole.

Where libc has no ``preadv`` (or ``STRATAIO_NO_CTYPES_IO`` is set), the same plan runs through
``os.preadv`` / ``os.pwritev`` with memoryview lists.
"""

from __future__ import annotations

import ctypes
import errno
import os

import numpy as np

from strataio.layout.pieces import scratch
from strataio.storage.mapped import MAPPED_READ_BYTES, gather_cached, read_cached

IOV_MAX = (os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 0) or 1024
if IOV_MAX < 0:  # "no limit" from sysconf: keep calls bounded anyway
    IOV_MAX = 1024
_I64_MAX = np.iinfo(np.int64).max

__all__ = ["IOV_MAX", "VectoredPlan"]


def _libc_calls() -> tuple[object, object] | None:
    if os.environ.get("STRATAIO_NO_CTYPES_IO", "").strip() not in ("", "0"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        calls = []
        for name in ("preadv", "pwritev"):
            fn = getattr(libc, name)
            fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
            fn.restype = ctypes.c_ssize_t
            calls.append(fn)
    except (OSError, AttributeError):
        return None
    return calls[0], calls[1]


_LIBC = _libc_calls()
_SMALL = 4  # entries up to which os.preadv with memoryviews beats building a table


def _address(buf: np.ndarray) -> int:
    return int(buf.__array_interface__["data"][0])


class VectoredPlan:
    """The iovec table of file pieces ``offsets``/``lengths`` whose bytes sit at ``mem`` in a
    flat ``uint8`` buffer. Pieces in ascending file order share calls; a piece that starts
    below its predecessor's end starts a call of its own (pieces are moved in list order).

    ``max_hole`` > 0 lets a read cross holes of at most that many bytes inside one call (the
    hole's bytes land in scratch memory); writes need ``max_hole == 0``. A plan holds no
    buffer: run it on any buffer of at least :attr:`need` bytes.
    """

    __slots__ = (
        "_bounds",
        "_entries",
        "_filepos",
        "_gather",
        "_hole_idx",
        "_hole_max",
        "_lens",
        "_mem",
        "_one",
        "_pos",
        "_small",
        "_splits",
        "_table0",
        "_want",
        "moved",
        "need",
        "span",
    )

    def __init__(
        self, offsets: np.ndarray, lengths: np.ndarray, mem: np.ndarray, max_hole: int = 0
    ) -> None:
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        mem = np.asarray(mem, dtype=np.int64)
        keep = lengths > 0
        if not keep.all():
            offsets, lengths, mem = offsets[keep], lengths[keep], mem[keep]
        n = offsets.size
        if n and (int(mem.min()) < 0 or int(offsets.min()) < 0):
            raise ValueError("vectored I/O: a piece starts before its buffer or its file")
        # The kernel writes wherever the table points: no end may wrap around int64.
        if n and bool(((lengths > _I64_MAX - mem) | (lengths > _I64_MAX - offsets)).any()):
            raise ValueError("vectored I/O: a piece's end overflows 64 bits")
        self.need = int((mem + lengths).max()) if n else 0
        ends = offsets + lengths
        self.span = (int(offsets.min()), int(ends.max())) if n else (0, 0)
        """The file bytes ``[first, end)`` the pieces lie in."""
        holes = offsets[1:] - ends[:-1]  # < 0: the next piece starts a call of its own
        crossed = (holes > 0) & (holes <= max_hole)  # read through inside one call
        # Entry table: each piece, preceded by an entry for the hole before it when crossed.
        slot = np.ones(n, dtype=np.int64)
        slot[1:] += crossed
        at = np.cumsum(slot) - 1  # entry index of each piece
        total = int(at[-1]) + 1 if n else 0
        self._mem = np.zeros(total, dtype=np.int64)
        self._lens = np.zeros(total, dtype=np.uintp)
        self._filepos = np.zeros(total, dtype=np.int64)
        self._mem[at], self._lens[at], self._filepos[at] = mem, lengths, offsets
        hole_at = at[1:][crossed] - 1
        self._hole_idx = hole_at
        self._lens[hole_at] = holes[crossed]
        self._filepos[hole_at] = ends[:-1][crossed]
        self._hole_max = int(holes[crossed].max()) if hole_at.size else 0
        # A call ends where a hole is not crossed, and after IOV_MAX entries.
        brk = np.zeros(total, dtype=bool)
        if total:
            brk[0] = True
            brk[at[1:][(holes != 0) & ~crossed]] = True
            run = np.cumsum(brk) - 1
            first = np.flatnonzero(brk)
            brk[(np.arange(total) - first[run]) % IOV_MAX == 0] = True
        starts = np.flatnonzero(brk)
        self._bounds = np.append(starts, total).tolist()
        self._want = np.add.reduceat(self._lens.astype(np.int64), starts).tolist() if total else []
        self.moved = int(sum(self._want))
        """Bytes one transfer moves: the pieces' and the holes a read crosses."""
        self._pos = self._filepos[starts].tolist()
        # struct iovec per entry, relative to the buffer (built by the first libc call: a
        # plan that only ever gathers out of a mapping never needs it)
        self._table0: np.ndarray | None = None
        # A few entries are cheaper as a memoryview list than as a table (no numpy per call).
        self._small = total <= _SMALL and self._hole_idx.size == 0
        self._entries: list[tuple[int, int, bool]] | None = None
        # one piece (a contiguous access): (buffer position, length, file position)
        self._one = (int(mem[0]), int(lengths[0]), int(offsets[0])) if total == 1 else None
        # many pieces moving enough bytes for a mapped copy: the pieces (set on first use)
        self._gather: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._splits: dict[int, list[VectoredPlan]] = {}  # split's answers, kept

    def pieces(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The planned pieces (holes a read crosses left out): file offsets, lengths, buffer
        positions."""
        data = np.ones(self._filepos.size, dtype=bool)
        data[self._hole_idx] = False
        lens = self._lens[data].astype(np.int64)
        return self._filepos[data], lens, self._mem[data]

    def split(self, parts: int) -> list[VectoredPlan]:
        """This plan as at most ``parts`` plans of about equal bytes, pieces cut where a
        share ends, for reads run at once on separate threads (the bytes are the same
        whichever plan moves them). A plan that crosses holes is returned whole. Kept: a plan
        run again splits at once."""
        if parts <= 1 or self._hole_idx.size or not self.moved:
            return [self]
        got = self._splits.get(parts)
        if got is None:
            got = self._splits[parts] = self._split(parts)
        return got

    def _split(self, parts: int) -> list[VectoredPlan]:
        """:meth:`split`, worked out."""
        off, lens, mem = self.pieces()
        first = np.cumsum(lens) - lens  # each piece's first byte among all the plan moves
        cuts = np.arange(1, parts, dtype=np.int64) * self.moved // parts
        at = np.union1d(first, cuts)
        at = at[at < self.moved]
        piece = np.searchsorted(first, at, side="right") - 1
        delta = at - first[piece]
        length = np.append(at[1:], self.moved) - at
        share = np.searchsorted(cuts, at, side="right")
        out = []
        for k in range(parts):
            mine = share == k
            if mine.any():
                out.append(
                    VectoredPlan(
                        off[piece[mine]] + delta[mine], length[mine], mem[piece[mine]] + delta[mine]
                    )
                )
        return out

    @property
    def calls(self) -> int:
        """System calls one transfer makes (without short reads)."""
        return len(self._bounds) - 1

    def read(self, fd: int, buf: np.ndarray) -> None:
        """Fill the pieces of ``buf`` from ``fd``; bytes past end-of-file read as zeros."""
        self._run(fd, buf, write=False)

    def write(self, fd: int, buf: np.ndarray) -> None:
        """Write the pieces of ``buf`` to ``fd`` (holes untouched)."""
        if self._hole_max:
            raise ValueError("vectored I/O: a write cannot cross holes")
        self._run(fd, buf, write=True)

    def _run(self, fd: int, buf: np.ndarray, write: bool) -> None:
        if not self._bounds[-1]:  # no entries
            return
        if _LIBC is None or self._small:
            self._run_os(fd, buf, write)
            return
        # The kernel writes wherever the table points: the buffer must hold every piece.
        _check_flat(buf, self.need, write)
        if not write and self.moved >= MAPPED_READ_BYTES and self._read_mapped(fd, buf):
            return
        if self._table0 is None:
            self._table0 = np.empty((self._mem.size, 2), dtype=np.uintp)
            self._table0[:, 0] = self._mem
            self._table0[:, 1] = self._lens
        iov = self._table0.copy()
        iov[:, 0] += _address(buf)
        hole = None  # the hole buffer must outlive the calls (scratch may not keep it)
        if self._hole_idx.size:
            hole = scratch(self._hole_max, "hole")
            iov[self._hole_idx, 0] = _address(hole)
        call = _LIBC[1] if write else _LIBC[0]
        addr, step = _address(iov), iov.strides[0]
        bounds, want, pos = self._bounds, self._want, self._pos
        for g in range(len(bounds) - 1):
            s = bounds[g]
            done = _call(call, fd, addr + s * step, bounds[g + 1] - s, pos[g])
            if done != want[g]:
                self._finish(fd, buf, g, done, write)

    def read_mapped(self, fd: int, buf: np.ndarray, staged: bool = False) -> bool:
        """The planned pieces (holes left out) copied into ``buf`` out of a mapping of the
        file's cached pages where :func:`~strataio.storage.mapped.gather_cached` takes them
        (``staged``: the caller would otherwise stage them); False where the caller must read
        them its own way (``buf`` may then hold some already)."""
        _check_flat(buf, self.need, False)
        return self.moved >= MAPPED_READ_BYTES and self._read_mapped(fd, buf, staged)

    def _read_mapped(self, fd: int, buf: np.ndarray, staged: bool = False) -> bool:
        """:meth:`read_mapped` of a checked buffer."""
        if self._gather is None:
            self._gather = self.pieces()  # (contiguous int64 vectors, as the gather needs)
        return gather_cached(
            fd, memoryview(buf), _address(buf), *self._gather, self.span, staged=staged
        )

    def _run_os(self, fd: int, buf: np.ndarray, write: bool) -> None:
        """The same calls through ``os.preadv`` / ``os.pwritev`` (no ctypes). The buffer is
        checked through the memoryview the calls need anyway: a plan of a few pieces serves
        the calls of one large piece, where a numpy attribute read costs microseconds once a
        large copy has flushed the caches."""
        mv = memoryview(buf)
        if mv.ndim != 1 or mv.itemsize != 1 or not mv.c_contiguous:
            raise ValueError(_NOT_FLAT)
        _check_bounds(self.need, mv.nbytes, write, mv.readonly)
        call = os.pwritev if write else os.preadv
        if self._one is not None:
            m, n, pos = self._one
            done = None
            if not write and n >= MAPPED_READ_BYTES:
                done = read_cached(fd, pos, mv[m : m + n], _address(buf) + m)
            if done is None:
                done = call(fd, [mv[m : m + n]], pos)
            if done != n:
                self._finish(fd, buf, 0, done, write)
            return
        if not write and self.moved >= MAPPED_READ_BYTES and self._read_mapped(fd, buf):
            return
        if self._entries is None:  # (mem, length, is_hole) per entry, kept for the next call
            is_hole = np.zeros(self._mem.size, dtype=bool)
            is_hole[self._hole_idx] = True
            self._entries = list(zip(self._mem.tolist(), self._lens.tolist(), is_hole.tolist()))
        hole = memoryview(scratch(self._hole_max, "hole")) if self._hole_max else mv
        for g in range(len(self._bounds) - 1):
            entries = self._entries[self._bounds[g] : self._bounds[g + 1]]
            views = [hole[:n] if h else mv[m : m + n] for m, n, h in entries]
            done = call(fd, views, self._pos[g])
            if done != self._want[g]:
                self._finish(fd, buf, g, done, write)

    def _finish(self, fd: int, buf: np.ndarray, g: int, done: int, write: bool) -> None:
        """Complete group ``g`` after a short call that moved ``done`` bytes: the remaining
        pieces one at a time; a read past end-of-file zero-fills."""
        s, e = self._bounds[g], self._bounds[g + 1]
        is_hole = np.zeros(e - s, dtype=bool)
        is_hole[self._hole_idx[(self._hole_idx >= s) & (self._hole_idx < e)] - s] = True
        for k in range(s, e):
            n = int(self._lens[k])
            if done >= n:
                done -= n
                continue
            skip, done = done, 0
            if is_hole[k - s]:
                continue
            m, pos = int(self._mem[k]) + skip, int(self._filepos[k]) + skip
            rest = memoryview(buf)[m : m + n - skip]
            while len(rest):
                moved = os.pwrite(fd, rest, pos) if write else os.preadv(fd, [rest], pos)
                if moved == 0:
                    if write:
                        raise OSError(errno.EIO, "write made no progress")
                    rest[:] = bytes(len(rest))  # end of file: reads as zeros
                    break
                rest = rest[moved:]
                pos += moved


_NOT_FLAT = "vectored I/O needs a flat, contiguous uint8 buffer"


def _check_flat(buf: np.ndarray, need: int, write: bool) -> None:
    """Refuse a buffer that is not a flat, contiguous ``uint8`` array, or that
    :func:`_check_bounds` refuses."""
    flags = buf.flags
    if buf.dtype != np.uint8 or buf.ndim != 1 or not flags.c_contiguous:
        raise ValueError(_NOT_FLAT)
    _check_bounds(need, buf.size, write, not flags.writeable)


def _check_bounds(need: int, size: int, write: bool, readonly: bool) -> None:
    """The kernel writes wherever the iovecs point: refuse a buffer too small for the pieces,
    and a read into a read-only one."""
    if size < need:
        raise ValueError(f"vectored I/O: pieces reach byte {need} of a {size}-byte buffer")
    if not write and readonly:
        raise ValueError("vectored I/O: cannot read into a read-only buffer")


def _call(fn: object, fd: int, iov: int, count: int, pos: int) -> int:
    while True:
        got = fn(fd, iov, count, pos)  # type: ignore[operator]
        if got >= 0:
            return int(got)
        err = ctypes.get_errno()
        if err != errno.EINTR:
            raise OSError(err, os.strerror(err))
