"""Independent transfers through a packed stream, one cache-sized block at a time.

A transfer whose memory layout is much finer than its file layout (a solver's array with ghost
cells, FLASH's interleaved variables) moves through a *packed stream*: the data bytes in view
order, so that the file side stays in few large pieces (see ``File._plan_access``). Packing the
whole stream first and writing it afterwards makes every byte travel to memory and back twice:
the stream is larger than the caches, so the system call's copy reads it from memory again.
Here the stream is cut into blocks of ``PACK_BLOCK`` bytes (larger ones when that would make
more than about ``MAX_BLOCKS``), and each block is packed and then written (read and then
unpacked) while it is still in the cache; ROMIO packs through its ``ind_wr_buffer_size`` buffer
the same way. Measured on a 128³ array of doubles with two ghost cells on each side (16 MiB,
one process, new file): packing all then one ``pwrite`` 9.1 ms, in 1 MiB blocks 7.6 ms, in 512
KiB blocks 6.0 ms; reading it back 8.0 ms whole, 6.5 ms in 512 KiB blocks, 6.3 ms in 256 KiB
blocks.

Each block is an ordinary independent transfer of its own file pieces from (into) the block
buffer, through the file's :class:`~strataio.collective.independent.IndependentIO` (data sieving
and locking as usual). Since MPI views are monotone, stream order is file order and the blocks'
file pieces follow each other: no two blocks' sieving spans overlap. Two-phase transfers still
pack the whole stream (every rank's exchange sends from it).
"""

from __future__ import annotations

import numpy as np

from strataio.collective.access import Access, AccessPlan
from strataio.collective.driver import Driver
from strataio.collective.independent import IndependentIO
from strataio.layout.extents import Extents, exclusive_cumsum
from strataio.layout.pieces import CopyPlan, grid_strides, plan_copy, scratch

#: stream bytes packed (unpacked) per block: half of this machine's 1.25 MiB L2 per core, so a
#: block and the sieving stage of its write stay cached together (measured: see module docs)
PACK_BLOCK = 512 * 1024

#: blocks of one transfer, about: a transfer over MAX_BLOCKS * PACK_BLOCK bytes gets larger
#: blocks, which bounds the planning (a copy plan and an I/O plan per block) of a transfer
#: made once (whole grid rows can make up to about twice as many)
MAX_BLOCKS = 64


def block_edges(mem: Extents, nbytes: int, size: int) -> np.ndarray:
    """Stream positions where blocks of about ``size`` bytes start, then ``nbytes``.

    Every ``size`` bytes, unless the memory pieces form one N-D grid of equal pieces (the rows
    of a subarray, a 3-D block with ghost cells, FLASH's interleaved variables): then blocks
    are whole rows of the outermost axis whose rows fit, so that each block is a grid itself
    and packs with one strided copy (a block cut inside a row would break the grid into
    pieces copied one by one: FLASH 4 times slower).
    """
    grid = _grid(mem) if len(mem) > 1 else None
    if grid is None or grid[1] > size:
        return np.append(np.arange(0, nbytes, size, dtype=np.int64), np.int64(nbytes))
    shape, piece = grid
    row = np.cumprod((1, *shape[:0:-1]))[::-1] * piece  # bytes of one row of each axis
    j = int(np.flatnonzero(row <= size)[0])  # (a row of the innermost axis is one piece)
    rows = max(size // int(row[j]), 1)
    outer = np.arange(int(np.prod(shape[:j], dtype=np.int64)), dtype=np.int64)
    steps = np.arange(0, shape[j], rows, dtype=np.int64) * int(row[j])
    starts = (outer[:, None] * (shape[j] * int(row[j])) + steps[None, :]).ravel()
    return np.append(starts, np.int64(nbytes))


def _grid(mem: Extents) -> tuple[tuple[int, ...], int] | None:
    """(shape, piece bytes) when the memory pieces are equal pieces on one row-major N-D grid
    in stream order, packed back to back in the stream; else None."""
    piece = int(mem.lengths[0])
    if not (
        np.all(mem.lengths == piece) and np.array_equal(mem.mem, exclusive_cumsum(mem.lengths))
    ):
        return None
    found = grid_strides(mem.offsets)
    return None if found is None else (found[0], piece)


def _compact_blocks(m: Extents, cut: np.ndarray, nbytes: int) -> bool:
    """Whether the blocks' memory (``m``: pieces by stream position, block ``k`` =
    ``m[cut[k]:cut[k + 1]]``) lies in ranges about as long as the blocks themselves.

    Only then does a block fit in the cache while it is packed. Where each block's pieces are
    spread over the whole buffer (FLASH's variables, interleaved in memory, one after the
    other in the stream) a block's I/O would evict the cache lines the next block's variables
    share, and one pass over the whole stream is faster (FLASH read 1.4-1.6 GB/s whole, 1.0
    in blocks).
    """
    lo = np.minimum.reduceat(m.mem, cut[:-1])
    hi = np.maximum.reduceat(m.mem + m.lengths, cut[:-1])
    return int((hi - lo).sum()) <= 2 * nbytes


def _by_stream(ext: Extents) -> Extents:
    """``ext``'s pieces keyed by their stream positions: ``offsets`` and ``mem`` swapped."""
    return Extents(ext.mem, ext.lengths, ext.offsets)


class PackedBlocks:
    """A packed transfer cut into blocks, planned once per layout (on first use: a layout
    that only ever goes two-phase never needs them): for each block its stream length, the
    copies between the caller's buffer and the block (pack, unpack), and the block's file
    pieces (an :class:`AccessPlan`; ``mem`` = positions in the block).

    ``mem`` are the memory pieces (offsets into the caller's buffer, ``mem`` = stream
    positions) and ``file`` the file pieces (``mem`` = stream positions) of an ``nbytes``-byte
    stream; both in stream order. ``block``: bytes per block (default :data:`PACK_BLOCK`).
    """

    __slots__ = ("_blocks", "_layout", "_size")

    def __init__(self, mem: Extents, file: Extents, nbytes: int, block: int | None = None) -> None:
        self._layout = (mem, file, nbytes, block)
        self._blocks: list[tuple[int, CopyPlan, CopyPlan, AccessPlan]] | None = None
        self._size = 0

    @property
    def blocks(self) -> list[tuple[int, CopyPlan, CopyPlan, AccessPlan]]:
        """(stream bytes, pack copy, unpack copy, file pieces) of each block."""
        return self._blocks if self._blocks is not None else self._plan()

    def _plan(self) -> list[tuple[int, CopyPlan, CopyPlan, AccessPlan]]:
        mem, file, nbytes, block = self._layout
        size = max(int(block or PACK_BLOCK), -(-nbytes // MAX_BLOCKS), 1)
        mem = mem.compact()
        edges = block_edges(mem, nbytes, size)
        m = _by_stream(mem).split(edges[1:-1])
        mcut = np.searchsorted(m.offsets, edges)
        if len(edges) > 2 and not _compact_blocks(m, mcut, nbytes):
            edges, m = np.array([0, nbytes], dtype=np.int64), _by_stream(mem)
            mcut = np.array([0, len(m)])
        f = _by_stream(file.compact()).split(edges[1:-1])
        mcut = mcut.tolist()
        fcut = np.searchsorted(f.offsets, edges).tolist()
        blocks = []
        for k, lo in enumerate(edges[:-1].tolist()):
            mb = m.take(slice(mcut[k], mcut[k + 1]))
            fb = f.take(slice(fcut[k], fcut[k + 1]))
            at = mb.offsets - lo  # positions in the block
            blocks.append(
                (
                    int(edges[k + 1]) - lo,
                    plan_copy(at, mb.mem, mb.lengths),
                    plan_copy(mb.mem, at, mb.lengths),
                    AccessPlan(Extents(fb.mem, fb.lengths, fb.offsets - lo)),
                )
            )
        self._size = int(np.diff(edges).max(initial=0))
        self._blocks = blocks
        return blocks

    def write(self, io: IndependentIO, driver: Driver, data: np.ndarray) -> None:
        """Pack each block from ``data`` (the caller's buffer, flat ``uint8``) and write it."""
        blocks = self.blocks
        buf = scratch(self._size, "packed")
        for n, pack, _, plan in blocks:
            block = buf[:n]
            pack.run(block, data)
            io.write(driver, Access(plan.file, block, plan))

    def read(self, io: IndependentIO, driver: Driver, data: np.ndarray) -> None:
        """Read each block and unpack it into ``data`` (the caller's buffer, flat ``uint8``)."""
        blocks = self.blocks
        buf = scratch(self._size, "packed")
        for n, _, unpack, plan in blocks:
            block = buf[:n]
            io.read(driver, Access(plan.file, block, plan))
            unpack.run(data, block)
