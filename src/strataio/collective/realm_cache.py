"""The aggregator realm cache: an aggregator's realm bytes kept in memory across collective calls.

With persistent file realms (``romio_cb_pfr=enable``) an aggregator is the only process that
reads or writes its realm through two-phase I/O, so it may keep the realm's bytes between calls
(the thesis's §3.4, with the cache in strataio rather than in the file system's client).
A :class:`RealmCache` holds ``nslots`` pages in a fixed arena, replaced least recently used
first, with the dirty bytes of each page as one range; it is written back on eviction, by
:meth:`RealmCache.flush` (``File.close``, ``set_size``) and by :meth:`RealmCache.invalidate`
(``File.sync``, which forgets the pages too: another process may write the file). Pages follow a
:class:`PageGrid`: ``page`` bytes inside each realm stripe, so no page straddles two owners.

The cache is a :class:`~strataio.collective.driver.Driver` over the file's own driver: two-phase
windows read and write through it unchanged. Reads are served from it (misses fetch whole pages,
past end-of-file as zeros); writes fetch only the pages they cover partly. A read returns full
counts: the file's logical end is the caller's business (``File`` tracks it).

The page table lives in a flat byte buffer (:class:`CacheMemory`: a header, then per slot its
page number and dirty range, then the arena) so that another process can read and edit it
through MPI RMA (:mod:`strataio.collective.cache_window`); :func:`dirty_pieces` is the one
computation both sides share. Everything is vectorized over pages: no Python work per page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from strataio.collective.driver import Driver, LayeredDriver
from strataio.collective.fileio import SYSCALL_BYTES
from strataio.errors import StrataError
from strataio.layout.extents import Extents, exclusive_cumsum
from strataio.layout.pieces import copy_pieces
from strataio.storage.vectored import VectoredPlan

__all__ = ["DEFAULT_PAGE", "CacheMemory", "PageGrid", "RealmCache", "dirty_pieces", "write_dirty"]

_I64 = np.int64

#: page size of the cache arena in bytes (a page is smaller only where a realm stripe is)
DEFAULT_PAGE = 64 * 1024

_HEADER = 2  # int64 words: generation (bumped by every remote edit), slot count


class PageGrid:
    """Pages of ``page`` bytes laid inside stripes of ``stripe`` bytes anchored at byte 0 (the
    last page of a stripe may be shorter); ``stripe`` 0: one plain grid of ``page`` bytes.
    Page numbers ascend with file offsets."""

    __slots__ = ("page", "per_stripe", "stripe")

    def __init__(self, page: int, stripe: int = 0) -> None:
        if page < 1 or stripe < 0:
            raise StrataError(f"page grid needs page >= 1 and stripe >= 0, got {page}, {stripe}")
        self.stripe = int(stripe)
        self.page = min(int(page), self.stripe) if self.stripe else int(page)
        self.per_stripe = -(-self.stripe // self.page) if self.stripe else 0

    def page_of(self, offsets: np.ndarray) -> np.ndarray:
        """The page number holding each byte offset."""
        offsets = np.asarray(offsets, dtype=_I64)
        if not self.stripe:
            return offsets // self.page
        k, r = np.divmod(offsets, self.stripe)
        return k * self.per_stripe + r // self.page

    def bounds(self, pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First byte and length of each page."""
        pages = np.asarray(pages, dtype=_I64)
        if not self.stripe:
            return pages * self.page, np.full(pages.shape, self.page, dtype=_I64)
        k, j = np.divmod(pages, self.per_stripe)
        start = k * self.stripe + j * self.page
        return start, np.minimum(self.page, self.stripe - j * self.page)

    def cut(self, off: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, ...]:
        """Pieces ``(off, length)`` (non-empty) cut at page boundaries: for each part its page,
        file offset, length and the index of the piece it came from."""
        off = np.asarray(off, dtype=_I64)
        length = np.asarray(length, dtype=_I64)
        p0, p1 = self.page_of(off), self.page_of(off + length - 1)
        count = p1 - p0 + 1
        src = np.repeat(np.arange(off.size, dtype=_I64), count)
        pages = p0[src] + (
            np.arange(src.size, dtype=_I64) - np.repeat(exclusive_cumsum(count), count)
        )
        start, plen = self.bounds(pages)
        lo = np.maximum(off[src], start)
        hi = np.minimum((off + length)[src], start + plen)
        return pages, lo, hi - lo, src


class CacheMemory:
    """Views of one flat byte buffer holding a cache: ``header`` (generation, slot count), per
    slot ``slot_page`` (-1: free) and the dirty byte range ``[dirty_lo, dirty_hi)`` within the
    page (empty: clean), then the ``arena`` of ``nslots`` slots of ``slot`` bytes. The layout
    depends on ``(nslots, slot)`` only, so a process that knows them can address another's."""

    __slots__ = ("arena", "buffer", "dirty_hi", "dirty_lo", "header", "slot", "slot_page")

    def __init__(self, nslots: int, slot: int, buffer: np.ndarray | None = None) -> None:
        size = self.nbytes(nslots, slot)
        if buffer is None:
            buffer = np.zeros(size, dtype=np.uint8)
        if buffer.size < self.meta_bytes(nslots):  # (a page table alone has no arena)
            raise StrataError(f"cache memory of {buffer.size} bytes, {size} needed")
        self.buffer = buffer
        self.slot = int(slot)
        words = buffer[: self.meta_bytes(nslots)].view(_I64)
        self.header = words[:_HEADER]
        self.slot_page = words[_HEADER : _HEADER + nslots]
        self.dirty_lo = words[_HEADER + nslots : _HEADER + 2 * nslots]
        self.dirty_hi = words[_HEADER + 2 * nslots : _HEADER + 3 * nslots]
        self.arena = buffer[self.meta_bytes(nslots) : size]

    @staticmethod
    def meta_bytes(nslots: int) -> int:
        """Bytes of the header and page table (the part another process reads first)."""
        return -(-(_HEADER + 3 * nslots) * 8 // 64) * 64

    @classmethod
    def nbytes(cls, nslots: int, slot: int) -> int:
        """Bytes of the whole cache memory."""
        return cls.meta_bytes(nslots) + nslots * slot

    def reset(self) -> None:
        """Every slot free and clean (the memory may come from an unzeroed MPI window)."""
        self.header[0] = 0
        self.header[1] = self.slot_page.size
        self.slot_page[:] = -1
        self.dirty_lo[:] = 0
        self.dirty_hi[:] = 0


def overlapping(grid: PageGrid, pages: np.ndarray, runs: Extents | None) -> np.ndarray:
    """Which of ``pages`` (page numbers, -1 for none) hold bytes of ``runs`` (sorted disjoint
    pieces; None: every byte)."""
    held = pages >= 0
    if runs is None:
        return held
    start, plen = grid.bounds(np.where(held, pages, 0))
    ends = runs.ends
    k = np.searchsorted(ends, start, side="right")  # first run ending after the page start
    hit = k < ends.size
    hit[hit] &= runs.offsets[k[hit]] < (start + plen)[hit]
    return held & hit


def dirty_pieces(
    grid: PageGrid, mem: CacheMemory, slots: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The dirty bytes of ``slots``, sorted by file offset: file offsets, lengths and positions
    in the arena (adjacent pages make adjacent pieces, which one ``pwritev`` call writes)."""
    lo, hi = mem.dirty_lo[slots], mem.dirty_hi[slots]
    keep = hi > lo
    slots, lo, hi = slots[keep], lo[keep], hi[keep]
    start, _ = grid.bounds(mem.slot_page[slots])
    off = start + lo
    order = np.argsort(off, kind="stable")
    return off[order], (hi - lo)[order], (slots * mem.slot + lo)[order]


def write_dirty(
    driver: Driver, off: np.ndarray, length: np.ndarray, at: np.ndarray, buf: np.ndarray
) -> None:
    """Write dirty pieces (sorted, at ``at`` in ``buf``) to ``driver`` under an exclusive lock
    on the bytes they span, as independent writes take (:mod:`strataio.collective.sieving`):
    another rank's sieving write, between reading and writing a span over them, cannot undo
    them (a write-back may run while other ranks are in independent calls)."""
    lo, hi = int(off[0]), int(off[-1] + length[-1])
    driver.lock(lo, hi - lo)
    try:
        driver.writev(VectoredPlan(off, length, at), buf)
    finally:
        driver.unlock(lo, hi - lo)


class RealmCache(LayeredDriver):
    """An aggregator's realm cache in at most ``capacity`` bytes of memory (LRU, write-back) over
    ``driver``, the file (see the module docs). ``page``: bytes per page and arena slot;
    ``stripe``: the realm stripe pages stay inside (0: none); ``memory``: the buffer to keep
    the cache in (``capacity`` bytes; e.g. an MPI window's), else one of its own. Slots and
    pages: :meth:`shape`.

    Counters: :attr:`bytes_read` / :attr:`bytes_written` to and from ``driver``."""

    def __init__(
        self,
        driver: Driver,
        capacity: int,  # bytes of memory, page table included
        page: int = DEFAULT_PAGE,
        stripe: int = 0,
        memory: np.ndarray | None = None,
    ) -> None:
        slot, nslots = self.shape(capacity, page, stripe)
        if nslots < 1:
            raise StrataError(f"realm cache of {capacity} bytes holds no page")
        super().__init__(driver)
        self.grid = PageGrid(slot, stripe)
        self.mem = CacheMemory(nslots, slot, memory)
        self.mem.reset()
        self._tick = np.zeros(nslots, dtype=_I64)  # last use of each slot (LRU)
        self._clock = 0
        self._seen = -1  # the generation the index below was built at
        self._keys = self._slots = np.zeros(0, dtype=_I64)  # sorted page numbers -> slots
        self.bytes_read = 0
        self.bytes_written = 0
        self.guard: Callable[[], None] | None = None
        """Called before every use of the cache (the owner's lock on a shared cache)."""

    @staticmethod
    def shape(capacity: int, page: int = DEFAULT_PAGE, stripe: int = 0) -> tuple[int, int]:
        """``(slot bytes, slots)`` of a cache of ``capacity`` bytes, its page table included:
        pages of ``page`` bytes, or of ``stripe`` bytes when that is smaller, or smaller still
        in a small cache, which keeps at least 16 pages."""
        slot = min(int(page), int(capacity) // 16, int(stripe) or int(page))
        slot = max(slot, 1)
        # (the table: 24 bytes per slot, a 16-byte header, rounded up to 64 bytes)
        return slot, max((int(capacity) - 80) // (slot + 24), 0)

    @property
    def capacity(self) -> int:
        return self.mem.arena.size

    @property
    def cached(self) -> int:
        """Pages held."""
        return int((self.mem.slot_page >= 0).sum())

    # ------------------------------------------------------------------ the page table
    def _touched(self) -> None:
        """The page table changed here: rebuild the index at the next lookup."""
        self._seen = -1

    def _lookup(self, pages: np.ndarray) -> np.ndarray:
        """The slot of each page, -1 where not cached."""
        mem = self.mem
        gen = int(mem.header[0])
        if gen != self._seen:  # (after a change here or an edit by another process)
            held = np.flatnonzero(mem.slot_page >= 0)
            order = np.argsort(mem.slot_page[held])
            self._keys, self._slots = mem.slot_page[held][order], held[order]
            self._seen = gen
        k = np.searchsorted(self._keys, pages)
        k = np.minimum(k, max(self._keys.size - 1, 0))
        if not self._keys.size:
            return np.full(pages.shape, -1, dtype=_I64)
        return np.where(self._keys[k] == pages, self._slots[k], -1)

    def _write_back(self, slots: np.ndarray) -> None:
        """Write the dirty bytes of ``slots`` to the file and mark them clean."""
        off, length, at = dirty_pieces(self.grid, self.mem, slots)
        if off.size:
            write_dirty(self.inner, off, length, at, self.mem.arena)
            self.bytes_written += int(length.sum())
        self.mem.dirty_lo[slots] = 0
        self.mem.dirty_hi[slots] = 0

    def _pin(self, pages: np.ndarray, fill: np.ndarray) -> np.ndarray:
        """Slots holding ``pages`` (unique, ascending, at most ``nslots``): misses take free
        slots, then the least recently used ones (written back first); misses with ``fill``
        are read from the file."""
        mem = self.mem
        slots = self._lookup(pages)
        self._clock += 1
        hit = slots >= 0
        self._tick[slots[hit]] = self._clock
        miss = np.flatnonzero(~hit)
        if miss.size:
            free = np.flatnonzero(mem.slot_page < 0)
            if free.size < miss.size:
                used = np.flatnonzero((mem.slot_page >= 0) & (self._tick < self._clock))
                victims = used[np.argsort(self._tick[used], kind="stable")[: miss.size - free.size]]
                self._write_back(victims)
                mem.slot_page[victims] = -1
                free = np.concatenate((free, victims))
            got = free[: miss.size]
            slots[miss] = got
            mem.slot_page[got] = pages[miss]
            mem.dirty_lo[got] = mem.dirty_hi[got] = 0
            self._tick[got] = self._clock
            self._touched()
            want = miss[fill[miss]]
            if want.size:
                start, plen = self.grid.bounds(pages[want])
                # (one call across short holes, by the cost model of fileio)
                plan = VectoredPlan(start, plen, slots[want] * mem.slot, SYSCALL_BYTES)
                try:
                    self.inner.readv(plan, mem.arena)
                except BaseException:  # (no slot taken holds its page after all: not those
                    mem.slot_page[got] = -1  # read, nor those a write was yet to fill)
                    raise
                self.bytes_read += int(plen.sum())
        return slots

    def _parts(
        self, off: np.ndarray, length: np.ndarray, at: np.ndarray
    ) -> Iterator[tuple[np.ndarray, ...]]:
        """Pieces (sorted, disjoint, non-empty) cut at pages, grouped in batches of at most
        ``nslots`` pages: per batch the unique pages, and per part its page index in the
        batch, offset within the page, length and buffer position."""
        pages, lo, plen, src = self.grid.cut(off, length)
        bufpos = at[src] + (lo - off[src])
        start, _ = self.grid.bounds(pages)
        inpage = lo - start
        first = np.ones(pages.size, dtype=bool)
        first[1:] = pages[1:] != pages[:-1]
        uniq_at = np.flatnonzero(first)
        group = np.cumsum(first) - 1
        n = self.mem.slot_page.size
        for b0 in range(0, uniq_at.size, n):
            u = uniq_at[b0 : b0 + n]
            p0 = int(u[0])
            p1 = int(uniq_at[b0 + n]) if b0 + n < uniq_at.size else pages.size
            yield (pages[u], group[p0:p1] - b0, inpage[p0:p1], plen[p0:p1], bufpos[p0:p1])

    def read_pieces(
        self, off: np.ndarray, length: np.ndarray, buf: np.ndarray, at: np.ndarray
    ) -> None:
        """Fill ``buf[at : at + length]`` with the file bytes at ``off`` (sorted, disjoint
        pieces; past end-of-file zeros), through the cache."""
        if self.guard is not None:
            self.guard()
        keep = length > 0
        off, length, at = off[keep], length[keep], at[keep]
        slot = self.mem.slot
        for pages, idx, inpage, plen, bufpos in self._parts(off, length, at):
            slots = self._pin(pages, np.ones(pages.size, dtype=bool))
            copy_pieces(buf, bufpos, self.mem.arena, slots[idx] * slot + inpage, plen)

    def write_pieces(
        self, off: np.ndarray, length: np.ndarray, buf: np.ndarray, at: np.ndarray
    ) -> None:
        """Write ``buf[at : at + length]`` at file offsets ``off`` (sorted, disjoint pieces)
        into the cache, dirty until written back."""
        if self.guard is not None:
            self.guard()
        keep = length > 0
        off, length, at = off[keep], length[keep], at[keep]
        mem, slot = self.mem, self.mem.slot
        for pages, idx, inpage, plen, bufpos in self._parts(off, length, at):
            _, page_len = self.grid.bounds(pages)
            covered = np.bincount(idx, weights=plen, minlength=pages.size).astype(_I64)
            slots = self._pin(pages, covered < page_len)
            copy_pieces(mem.arena, slots[idx] * slot + inpage, buf, bufpos, plen)
            first = np.ones(idx.size, dtype=bool)
            first[1:] = idx[1:] != idx[:-1]
            starts = np.flatnonzero(first)
            lo = np.minimum.reduceat(inpage, starts)
            hi = np.maximum.reduceat(inpage + plen, starts)
            s = slots[idx[starts]]
            clean = mem.dirty_hi[s] <= mem.dirty_lo[s]
            mem.dirty_lo[s] = np.where(clean, lo, np.minimum(mem.dirty_lo[s], lo))
            mem.dirty_hi[s] = np.where(clean, hi, np.maximum(mem.dirty_hi[s], hi))

    # ------------------------------------------------------------------ whole-cache operations
    def flush(self, runs: Extents | None = None) -> None:
        """Write back the dirty pages holding bytes of ``runs`` (sorted disjoint; None: all);
        they stay cached, clean."""
        if self.guard is not None:
            self.guard()
        self._write_back(np.flatnonzero(overlapping(self.grid, self.mem.slot_page, runs)))

    def invalidate(self, runs: Extents | None = None) -> None:
        """Write back and drop the pages holding bytes of ``runs`` (None: all)."""
        if self.guard is not None:
            self.guard()
        slots = np.flatnonzero(overlapping(self.grid, self.mem.slot_page, runs))
        self._write_back(slots)
        self.mem.slot_page[slots] = -1
        self._touched()

    def discard_from(self, size: int) -> None:
        """Forget every cached byte from ``size`` on, as a file cut to ``size`` bytes would:
        pages past it are dropped, dirty or not; the page across it keeps only the bytes below
        (the rest read as zeros). The file itself is left as it is."""
        if self.guard is not None:
            self.guard()
        mem = self.mem
        held = np.flatnonzero(mem.slot_page >= 0)
        start, plen = self.grid.bounds(mem.slot_page[held])
        gone = held[start >= size]
        mem.slot_page[gone] = -1
        across = (start < size) & (start + plen > size)
        for s, cut, n in zip(
            held[across].tolist(), (size - start[across]).tolist(), plen[across].tolist()
        ):
            mem.arena[s * mem.slot + cut : s * mem.slot + n] = 0  # (one page at most per stripe)
        cuts = held[across]
        mem.dirty_hi[cuts] = np.minimum(mem.dirty_hi[cuts], size - start[across])
        mem.dirty_lo[cuts] = np.minimum(mem.dirty_lo[cuts], mem.dirty_hi[cuts])
        self._touched()

    # ------------------------------------------------------------------ the Driver interface
    def pread(self, buf: np.ndarray, offset: int) -> int:
        """Fill ``buf`` from ``offset`` through the cache; always the whole count (past
        end-of-file zeros)."""
        if buf.size:
            self.read_pieces(_one(offset), _one(buf.size), buf, _ZERO)
        return int(buf.size)

    def pwrite(self, buf: np.ndarray, offset: int) -> None:
        if buf.size:
            self.write_pieces(_one(offset), _one(buf.size), buf, _ZERO)

    def readv(self, plan: VectoredPlan, buf: np.ndarray) -> None:
        off, length, at = plan.pieces()
        self.read_pieces(off, length, buf, at)

    def writev(self, plan: VectoredPlan, buf: np.ndarray) -> None:
        off, length, at = plan.pieces()
        self.write_pieces(off, length, buf, at)

    def size(self) -> int:
        """The file's size on storage (cached writes past it not counted)."""
        return self.inner.size()

    def truncate(self, size: int) -> None:
        """Cut or extend the file to ``size`` bytes, the cache with it."""
        self.discard_from(size)
        self.inner.truncate(size)

    def sync(self) -> None:
        """Write back every dirty page, then sync the file."""
        self.flush()
        self.inner.sync()

    def close(self) -> None:
        """Write back every dirty page, then close the file."""
        self.flush()
        self.inner.close()


_ZERO = np.zeros(1, dtype=_I64)


def _one(value: int) -> np.ndarray:
    return np.array((value,), dtype=_I64)
