"""Extents: which bytes, as two int64 arrays — the lingua franca of every engine.

An :class:`Extents` is an ordered list of byte pieces ``[offsets[i], offsets[i] + lengths[i])``
in some byte space (a file, an object), each paired with its position ``mem[i]`` in a packed
data stream (the caller's buffer). ``mem`` defaults to the running sum of ``lengths``: piece
``i`` of the data is bytes ``mem[i] : mem[i] + lengths[i]`` of the buffer. Every operation is
vectorized numpy: an access with a million pieces costs milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from strataio.errors import StrataError

_I64 = np.int64


def _as_i64(a: Any) -> np.ndarray:
    arr = np.asarray(a, dtype=_I64)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    return arr


def exclusive_cumsum(lengths: np.ndarray) -> np.ndarray:
    """Start of each piece when pieces of ``lengths`` lie back to back (int64)."""
    out = np.empty(lengths.size, dtype=_I64)
    if lengths.size:
        out[0] = 0
        np.cumsum(lengths[:-1], out=out[1:])
    return out


class Extents:
    """Byte pieces ``(offsets, lengths)`` with their positions ``mem`` in a packed stream.

    Zero-length pieces are allowed on construction and removed by :meth:`compact`. Pieces may
    be unsorted or overlap; the operations that need order say so.
    """

    __slots__ = ("lengths", "mem", "offsets")

    def __init__(self, offsets: Any, lengths: Any, mem: Any | None = None) -> None:
        self.offsets = _as_i64(offsets)
        self.lengths = _as_i64(lengths)
        if self.offsets.shape != self.lengths.shape:
            raise StrataError(
                f"Extents: {self.offsets.size} offsets but {self.lengths.size} lengths"
            )
        if self.lengths.size and self.lengths.min() < 0:
            raise StrataError("Extents: negative length")
        self.mem = exclusive_cumsum(self.lengths) if mem is None else _as_i64(mem)
        if self.mem.shape != self.offsets.shape:
            raise StrataError("Extents: mem positions do not match the pieces")

    # ----------------------------------------------------------------- construction
    @classmethod
    def empty(cls) -> Extents:
        z = np.zeros(0, dtype=_I64)
        return cls(z, z, z)

    @classmethod
    def single(cls, offset: int, length: int) -> Extents:
        """One piece of ``length`` bytes at ``offset`` (a hot path: no generic validation)."""
        if length < 0:
            raise StrataError("Extents: negative length")
        ext = cls.__new__(cls)
        ext.offsets = np.array((offset,), dtype=_I64)
        ext.lengths = np.array((length,), dtype=_I64)
        ext.mem = np.zeros(1, dtype=_I64)
        return ext

    @classmethod
    def concat(cls, parts: Sequence[Extents], repack: bool = True) -> Extents:
        """Join pieces in order; with ``repack`` the stream positions restart as one stream."""
        if not parts:
            return cls.empty()
        offs = np.concatenate([p.offsets for p in parts])
        lens = np.concatenate([p.lengths for p in parts])
        if repack:
            return cls(offs, lens)
        return cls(offs, lens, np.concatenate([p.mem for p in parts]))

    # ----------------------------------------------------------------- properties
    def __len__(self) -> int:
        return int(self.offsets.size)

    def __repr__(self) -> str:
        n = len(self)
        head = ", ".join(
            f"[{o}+{ln}]" for o, ln in zip(self.offsets[:4].tolist(), self.lengths[:4].tolist())
        )
        more = f", ... ({n} pieces)" if n > 4 else ""
        return f"Extents({head}{more}; {self.nbytes} bytes)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Extents):
            return NotImplemented
        return (
            np.array_equal(self.offsets, other.offsets)
            and np.array_equal(self.lengths, other.lengths)
            and np.array_equal(self.mem, other.mem)
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def nbytes(self) -> int:
        """Total bytes over all pieces (overlaps counted each time)."""
        return int(self.lengths.sum())

    @property
    def ends(self) -> np.ndarray:
        return self.offsets + self.lengths

    @property
    def first(self) -> int:
        """Lowest byte touched; 0 when empty."""
        nz = self.lengths > 0
        return int(self.offsets[nz].min()) if nz.any() else 0

    @property
    def last(self) -> int:
        """One past the highest byte touched; 0 when empty."""
        nz = self.lengths > 0
        return int(self.ends[nz].max()) if nz.any() else 0

    def is_sorted(self) -> bool:
        """True when pieces are in offset order and do not overlap."""
        if len(self) < 2:
            return True
        return bool(np.all(self.offsets[1:] >= self.ends[:-1]))

    def mem_is_packed(self) -> bool:
        """True when ``mem`` is the running sum of ``lengths`` (the default stream layout)."""
        return bool(np.array_equal(self.mem, exclusive_cumsum(self.lengths)))

    # ----------------------------------------------------------------- transformations
    def take(self, index: np.ndarray) -> Extents:
        """The pieces selected by an index or boolean mask, ``mem`` kept."""
        return Extents(self.offsets[index], self.lengths[index], self.mem[index])

    def compact(self) -> Extents:
        """Drop zero-length pieces."""
        keep = self.lengths > 0
        return self if keep.all() else self.take(keep)

    def shift(self, delta: int) -> Extents:
        """Move every piece by ``delta`` bytes in the byte space."""
        return Extents(self.offsets + _I64(delta), self.lengths, self.mem)

    def sort(self) -> Extents:
        """Pieces in offset order (stable), each keeping its stream position."""
        if len(self) < 2 or bool(np.all(self.offsets[1:] >= self.offsets[:-1])):
            return self
        order = np.argsort(self.offsets, kind="stable")
        return self.take(order)

    def coalesce(self) -> Extents:
        """Merge neighbours adjacent both in the byte space and in the stream.

        Order is kept; only piece ``i`` and ``i+1`` with ``end[i] == offset[i+1]`` and
        ``mem[i] + len[i] == mem[i+1]`` merge, so the result moves the same bytes to the
        same places with fewer pieces.
        """
        ext = self.compact()
        n = len(ext)
        if n < 2:
            return ext
        joins = (ext.ends[:-1] == ext.offsets[1:]) & (
            ext.mem[:-1] + ext.lengths[:-1] == ext.mem[1:]
        )
        if not joins.any():
            return ext
        starts = np.concatenate(([True], ~joins))
        idx = np.flatnonzero(starts)
        lens = np.add.reduceat(ext.lengths, idx)
        return Extents(ext.offsets[idx], lens, ext.mem[idx])

    def union(self) -> Extents:
        """The set of bytes touched, as sorted disjoint pieces (stream positions repacked)."""
        ext = self.compact().sort()
        n = len(ext)
        if n < 2:
            return Extents(ext.offsets, ext.lengths)
        ends = ext.ends
        run_end = np.maximum.accumulate(ends)
        starts = np.concatenate(([True], ext.offsets[1:] > run_end[:-1]))
        idx = np.flatnonzero(starts)
        group_end = np.maximum.reduceat(ends, idx)
        offs = ext.offsets[idx]
        return Extents(offs, group_end - offs)

    def clip(self, lo: int, hi: int) -> Extents:
        """The parts of the pieces inside ``[lo, hi)``, with their stream positions."""
        starts = np.maximum(self.offsets, _I64(lo))
        ends = np.minimum(self.ends, _I64(hi))
        keep = ends > starts
        s = starts[keep]
        return Extents(s, ends[keep] - s, self.mem[keep] + (s - self.offsets[keep]))

    def split(self, boundaries: Any) -> Extents:
        """Cut pieces at every byte position in ``boundaries`` (any order) that falls inside one.

        The result covers the same bytes in the same order; each resulting piece lies between
        two consecutive boundaries.
        """
        b = np.unique(_as_i64(boundaries))
        ext = self.compact()
        if b.size == 0 or len(ext) == 0:
            return ext
        if 16 * b.size < len(ext) and ext.is_sorted():
            return ext._split_sorted(b)
        # boundaries strictly inside (offset, end)
        lo = np.searchsorted(b, ext.offsets, side="right")
        hi = np.searchsorted(b, ext.ends, side="left")
        ncuts = np.maximum(hi - lo, 0)
        if not ncuts.any():
            return ext
        counts = ncuts + 1
        total = int(counts.sum())
        piece = np.repeat(np.arange(len(ext)), counts)
        first_of_piece = exclusive_cumsum(counts)
        k = np.arange(total, dtype=_I64) - first_of_piece[piece]  # 0..ncuts within each piece
        # start of sub-piece k: offset if k == 0 else b[lo + k - 1]
        bidx = np.clip(lo[piece] + k - 1, 0, b.size - 1)
        starts = np.where(k == 0, ext.offsets[piece], b[bidx])
        is_last = k == ncuts[piece]
        nidx = np.clip(lo[piece] + k, 0, b.size - 1)
        ends = np.where(is_last, ext.ends[piece], b[nidx])
        mem = ext.mem[piece] + (starts - ext.offsets[piece])
        return Extents(starts, ends - starts, mem)

    def bin_by(self, boundaries: Any) -> np.ndarray:
        """For each piece, the index ``j`` of the bin ``[boundaries[j], boundaries[j+1])`` holding
        its first byte (``-1`` left of the first boundary). ``boundaries`` must be sorted."""
        b = _as_i64(boundaries)
        n = len(self)
        if 16 * b.size < n and bool(np.all(self.offsets[1:] >= self.offsets[:-1])):
            # few bins over offset-sorted pieces: search the bins' edges among the pieces
            edges = np.searchsorted(self.offsets, b, side="left")
            counts = np.diff(np.concatenate(([0], edges, [n])))
            return np.repeat(np.arange(-1, b.size, dtype=np.intp), counts)
        return np.searchsorted(b, self.offsets, side="right") - 1

    def _split_sorted(self, b: np.ndarray) -> Extents:
        """:meth:`split` for sorted disjoint pieces and sorted unique ``b``: each boundary lies
        in at most one piece, so only the pieces it cuts change (O(len(b) log n) search)."""
        i = np.searchsorted(self.offsets, b, side="right") - 1
        ok = i >= 0
        j = np.maximum(i, 0)
        inside = ok & (b > self.offsets[j]) & (b < self.ends[j])
        if not inside.any():
            return self
        cb, ci = b[inside], i[inside]
        offs = np.insert(self.offsets, ci + 1, cb)
        ends = np.insert(self.ends, ci, cb)
        mem = np.insert(self.mem, ci + 1, self.mem[ci] + (cb - self.offsets[ci]))
        return Extents(offs, ends - offs, mem)

    def intersect(self, other: Extents) -> Extents:
        """The parts of these pieces that lie in any piece of ``other``, in this order.

        Stream positions are those of ``self``; ``other`` only acts as a byte set.
        """
        region = other.union()
        if len(region) == 0 or len(self) == 0:
            return Extents.empty()
        cut = self.split(np.concatenate((region.offsets, region.ends)))
        j = np.searchsorted(region.offsets, cut.offsets, side="right") - 1
        inside = (j >= 0) & (cut.offsets < region.ends[np.maximum(j, 0)])
        return cut.take(inside)

    def tile(self, count: int, stride: int) -> Extents:
        """``count`` copies of these pieces, copy ``k`` shifted by ``k * stride`` bytes in the
        byte space and placed after copy ``k-1`` in the stream."""
        n = len(self)
        if count <= 0 or n == 0:
            return Extents.empty()
        k = np.arange(count, dtype=_I64)[:, None]
        offs = (self.offsets[None, :] + k * _I64(stride)).reshape(-1)
        lens = np.broadcast_to(self.lengths, (count, n)).reshape(-1)
        span = int((self.mem + self.lengths).max()) if n else 0
        mem = (self.mem[None, :] + k * _I64(span)).reshape(-1)
        return Extents(offs, lens, mem)

    def byte_indices(self) -> np.ndarray:
        """Every byte position covered, in stream order (for tests and tiny accesses)."""
        if len(self) == 0:
            return np.zeros(0, dtype=_I64)
        piece = np.repeat(np.arange(len(self)), self.lengths)
        within = np.arange(piece.size, dtype=_I64) - exclusive_cumsum(self.lengths)[piece]
        return self.offsets[piece] + within


def section_extents(
    shape: Sequence[int], itemsize: int, start: Sequence[int], stop: Sequence[int], base: int = 0
) -> Extents:
    """Byte extents of the box ``[start, stop)`` of a C-ordered array of ``shape`` at ``base``.

    Pieces come in C order of the box; trailing dimensions the box covers fully merge into one
    piece, so a box of whole rows is a single extent. An empty box gives no pieces.
    """
    shape = [int(s) for s in shape]
    start = [int(s) for s in start]
    stop = [int(s) for s in stop]
    nd = len(shape)
    if nd == 0:
        return Extents.single(base, itemsize)
    counts = [max(b - a, 0) for a, b in zip(start, stop)]
    if 0 in counts:
        return Extents.empty()
    strides = [itemsize] * nd
    for d in range(nd - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    # fold trailing dims the box covers fully into the run
    k = nd - 1
    while k > 0 and counts[k] == shape[k]:
        k -= 1
    run = counts[k] * strides[k]
    origin = base + sum(a * s for a, s in zip(start, strides))
    offs = np.zeros(1, dtype=_I64) + _I64(origin)
    for d in range(k):
        offs = (
            offs[:, None] + np.arange(counts[d], dtype=_I64)[None, :] * _I64(strides[d])
        ).reshape(-1)
    return Extents(offs, np.full(offs.size, run, dtype=_I64))
