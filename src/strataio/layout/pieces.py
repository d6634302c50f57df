"""Vectorized byte-piece copies: gather pieces into a packed buffer and scatter them back.

The memory side of Extents: backends (S3, memory) and the collective engines alike move bytes as ``(dst_offsets, src_offsets, lengths)`` triples between two flat
``uint8`` arrays. A Python loop per piece costs ~1 us, so a million 64-byte pieces would take a
second; instead pieces are grouped by length and each group is one numpy fancy-index copy
through a "window" view whose element ``o`` is the ``L`` bytes at ``o`` (a void dtype).
Regularly spaced pieces (vector-like types) are one strided copy.
"""

from __future__ import annotations

import threading

import numpy as np

# A length shared by only a few pieces this long is copied slice by slice (a slice copy of
# >= 4 KiB runs at memcpy speed; a grouped copy would first have to sort).
_LONG = 4096


_U8 = np.dtype(np.uint8)


def as_bytes(buf: object, writable: bool = False) -> np.ndarray:
    """A flat ``uint8`` view of any buffer-protocol object (no copy). Objects that hold Python
    object references (numpy object arrays) are refused: their bytes are pointers."""
    if type(buf) is np.ndarray:
        # (every I/O call comes here, usually with caches a large copy has just flushed, where
        # each numpy attribute read costs microseconds: the common case reads few of them)
        dtype, flags = buf.dtype, buf.flags
        if dtype is not _U8 and dtype.hasobject:
            raise ValueError("an array of Python objects holds references, not data")
        if flags.c_contiguous:
            if writable and not flags.writeable:
                raise ValueError("buffer is read-only")
            return buf if dtype is _U8 and buf.ndim == 1 else buf.reshape(-1).view(_U8)
        if flags.f_contiguous:  # (Fortran order: its bytes in memory order, as MPI takes them)
            if writable and not flags.writeable:
                raise ValueError("buffer is read-only")
            return buf.T.reshape(-1).view(_U8)
    elif isinstance(buf, np.ndarray) and buf.dtype.hasobject:
        raise ValueError("an array of Python objects holds references, not data")
    mv = memoryview(buf)  # type: ignore[arg-type]
    if "O" in mv.format:
        raise ValueError("a buffer of Python objects holds references, not data")
    if not mv.contiguous:
        raise ValueError("buffer is not contiguous")
    if not mv.c_contiguous:
        raise ValueError("buffer is contiguous in Fortran order only (a numpy array would do)")
    if writable and mv.readonly:
        raise ValueError("buffer is read-only")
    arr = np.frombuffer(mv.cast("B"), dtype=np.uint8) if mv.nbytes else np.zeros(0, np.uint8)
    if writable and mv.nbytes:
        arr = np.ndarray(arr.shape, np.uint8, buffer=mv.cast("B"))
    return arr


_zero_bytes = np.zeros(0, dtype=np.uint8)


def zeros(nbytes: int) -> np.ndarray:
    """At least ``nbytes`` zero bytes, shared and read-only: a source to copy zeros from."""
    global _zero_bytes
    if _zero_bytes.size < nbytes:
        fresh = np.zeros(max(nbytes, 4096), dtype=np.uint8)
        fresh.flags.writeable = False
        _zero_bytes = fresh
    return _zero_bytes


#: scratch buffers above this size are not kept between calls
_SCRATCH_KEEP = 64 << 20
_local = threading.local()


def scratch(nbytes: int, slot: str = "") -> np.ndarray:
    """A ``uint8`` buffer of ``nbytes`` owned by this thread and ``slot``: its contents are
    undefined and it is valid until the next call for the same slot on this thread.

    Reuse matters on hot paths: a fresh multi-megabyte buffer costs a page fault per 4 KiB
    (above glibc's mmap threshold a fresh mapping per call), often more than the copy into it.
    """
    bufs: dict[str, np.ndarray] = _local.__dict__.setdefault("bufs", {})
    buf = bufs.get(slot)
    if buf is None or buf.size < nbytes:
        buf = np.empty(nbytes, dtype=np.uint8)
        if nbytes <= _SCRATCH_KEEP:
            bufs[slot] = buf
    return buf[:nbytes]


def _piece_dtype(length: int) -> np.dtype:
    """One piece as one numpy element: an unsigned integer for 1/2/4/8 bytes (numpy copies
    those fastest), else a void of ``length`` bytes (one memcpy per element)."""
    return np.dtype(_INT_OF.get(length, ("V", length)))


_INT_OF = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _windows(a: np.ndarray, length: int) -> np.ndarray:
    """Element ``o`` of the result is the ``length`` bytes of ``a`` starting at ``o``."""
    n = max(a.size - length + 1, 0)
    return np.ndarray(shape=(n,), dtype=_piece_dtype(length), buffer=a, strides=(1,))


def copy_pieces(
    dst: np.ndarray,
    dst_off: np.ndarray,
    src: np.ndarray,
    src_off: np.ndarray,
    lengths: np.ndarray,
) -> None:
    """``dst[dst_off[i] : dst_off[i] + lengths[i]] = src[src_off[i] : ...]`` for every ``i``.

    ``dst`` and ``src`` are flat ``uint8`` arrays (distinct memory); destination pieces must not
    overlap each other. Cost is one numpy copy per distinct length (a strided N-D copy when
    both sides are regularly spaced), plus one slice copy per piece of a rare long length.
    A caller that repeats the same copy keeps its :func:`plan_copy` instead.
    """
    plan_copy(dst_off, src_off, lengths).run(dst, src)


# Steps of a CopyPlan: (kind, ...) tuples.
_SLICE, _STRIDED, _FANCY = range(3)
# Equal-length pieces whose spacing changes at most this often are copied segment by segment.
_SEGMENTS = 64


class CopyPlan:
    """A piece copy planned once and run on any pair of buffers (see :func:`plan_copy`).

    Finding the cheapest numpy copy for a piece list (contiguous, strided, N-D grid, grouped
    by length) takes several passes over the offsets; layouts that repeat call after call (an
    MPI datatype, a dataset's chunk section) keep the plan and pay only the copies.
    """

    __slots__ = ("steps",)

    def __init__(self, steps: list[tuple]) -> None:  # type: ignore[type-arg]
        self.steps = steps

    def run(self, dst: np.ndarray, src: np.ndarray) -> None:
        """Copy the planned pieces from ``src`` into ``dst`` (flat ``uint8`` arrays)."""
        for step in self.steps:
            kind = step[0]
            if kind == _SLICE:
                _, d, s, n = step
                dst[d : d + n] = src[s : s + n]
            elif kind == _STRIDED:
                _, shape, dt, d0, dstr, s0, sstr = step
                # the ndarray constructor checks that every piece lies inside its buffer
                dv = np.ndarray(shape, dt, buffer=dst, offset=d0, strides=dstr)
                np.copyto(dv, np.ndarray(shape, dt, buffer=src, offset=s0, strides=sstr))
            else:
                _, length, d_idx, s_idx = step
                _windows(dst, length)[d_idx] = _windows(src, length)[s_idx]


def plan_copy(dst_off: np.ndarray, src_off: np.ndarray, lengths: np.ndarray) -> CopyPlan:
    """The :class:`CopyPlan` of ``copy_pieces(dst, dst_off, src, src_off, lengths)``.

    The plan may keep references to the offset arrays: do not modify them while it lives.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return CopyPlan([])
    dst_off = np.asarray(dst_off, dtype=np.int64)
    src_off = np.asarray(src_off, dtype=np.int64)
    if lengths.size == 1:
        return CopyPlan([(_SLICE, int(dst_off[0]), int(src_off[0]), int(lengths[0]))])
    # Both sides contiguous and in order: one copy.
    total = int(lengths.sum())
    d0, s0 = int(dst_off[0]), int(src_off[0])
    run = np.empty_like(lengths)
    run[0] = 0
    np.cumsum(lengths[:-1], out=run[1:])
    if np.array_equal(dst_off - d0, run) and np.array_equal(src_off - s0, run):
        return CopyPlan([(_SLICE, d0, s0, total)])
    if int(lengths.min()) == int(lengths.max()):
        return CopyPlan(_plan_group(dst_off, src_off, int(lengths[0])))
    # Group pieces by length (stable, so each group keeps its order). Lengths below 32 KiB fit
    # in int16, for which numpy's stable sort is a linear radix sort.
    key = lengths.astype(np.int16) if int(lengths.max()) < 32768 else lengths
    order = np.argsort(key, kind="stable")
    sorted_len = lengths[order]
    cuts = np.flatnonzero(sorted_len[1:] != sorted_len[:-1]) + 1
    starts = np.concatenate(([0], cuts)).tolist()
    ends = np.concatenate((cuts, [order.size])).tolist()
    steps: list[tuple] = []  # type: ignore[type-arg]
    for a, b in zip(starts, ends):
        length = int(sorted_len[a])
        sel = order[a:b]
        if length == 0:
            continue
        if b - a <= 4 and length >= _LONG:  # a rare long length: slices are cheapest
            for d, s_ in zip(dst_off[sel].tolist(), src_off[sel].tolist()):
                steps.append((_SLICE, d, s_, length))
        else:
            steps.extend(_plan_group(dst_off[sel], src_off[sel], length))
    return CopyPlan(steps)


def _stride(off: np.ndarray, zero: bool = False) -> int | None:
    """The common difference of ``off`` when it is an arithmetic progression, else None; a
    difference of 0 (every piece at one place: a source of zeros, say) only with ``zero``."""
    if off.size < 2:
        return 0
    step = int(off[1] - off[0])
    if step < 0 or (step == 0 and not zero):
        return None
    return step if bool(np.all(np.diff(off) == step)) else None


def _plan_group(dst_off: np.ndarray, src_off: np.ndarray, length: int) -> list[tuple]:  # type: ignore[type-arg]
    """The steps copying equal-length pieces: one strided copy of piece-sized elements when both
    sides are regularly spaced (vector-like types) or form N-D grids of one shape (the rows of
    a subarray, a 3-D block with ghost cells, FLASH's interleaved variables); a few strided
    copies when the spacing changes only a few times (spans staged back to back); else one
    fancy-index copy through windows."""
    n = dst_off.size
    dt = _piece_dtype(length)
    ds, ss = _stride(dst_off), _stride(src_off, zero=True)
    if ds is not None and ss is not None and ds >= length:
        return [(_STRIDED, (n,), dt, int(dst_off[0]), (ds,), int(src_off[0]), (ss,))]
    shape = _grid_shape(src_off if ds is not None else dst_off)
    if shape is not None:
        dg, sg = _grid_strides(dst_off, shape), _grid_strides(src_off, shape)
        if dg is not None and sg is not None:
            return [(_STRIDED, shape, dt, int(dst_off[0]), dg, int(src_off[0]), sg)]
    dd, sd = np.diff(dst_off), np.diff(src_off)
    cuts = np.flatnonzero((dd[1:] != dd[:-1]) | (sd[1:] != sd[:-1])) + 2
    if cuts.size <= _SEGMENTS:
        bounds = np.concatenate(([0], cuts, [n])).tolist()
        d0, s0 = dst_off[bounds[:-1]].tolist(), src_off[bounds[:-1]].tolist()
        dstep = np.append(dd, 0)[bounds[:-1]].tolist()
        sstep = np.append(sd, 0)[bounds[:-1]].tolist()
        # (only a segment's own step must clear a piece; the jumps between segments may go
        # anywhere, back to the start of an aggregator's window for the next sender, say)
        if all(st >= length for a, b, st in zip(bounds[:-1], bounds[1:], dstep) if b - a > 1):
            return [
                (_STRIDED, (b - a,), dt, d, (dst,), s_, (sst,))
                for a, b, d, s_, dst, sst in zip(bounds[:-1], bounds[1:], d0, s0, dstep, sstep)
            ]
    return [(_FANCY, length, dst_off, src_off)]


def _grid_shape(off: np.ndarray) -> tuple[int, ...] | None:
    """The shape of the row-major grid whose points are ``off`` (innermost axis first found
    where the step changes), or None when ``off`` has fewer than 2 levels or no such shape."""
    shape: list[int] = []
    cur = off
    while cur.size > 1:
        step = cur[1] - cur[0]
        bad = np.flatnonzero(np.diff(cur) != step)
        n = int(bad[0]) + 1 if bad.size else cur.size
        if cur.size % n:
            return None
        shape.append(n)
        cur = cur[::n]
    if len(shape) < 2:
        return None
    return tuple(reversed(shape))


def _grid_strides(off: np.ndarray, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Byte strides with ``off == off[0] + sum(i_k * strides[k])`` over ``shape``, or None."""
    g = off.reshape(shape)
    strides = []
    want = np.full(shape, int(off[0]), dtype=np.int64)
    for k, n in enumerate(shape):
        idx = [0] * len(shape)
        idx[k] = 1 if n > 1 else 0
        stride = int(g[tuple(idx)] - g.flat[0])
        strides.append(stride)
        axis = [1] * len(shape)
        axis[k] = n
        want = want + stride * np.arange(n, dtype=np.int64).reshape(axis)
    return tuple(strides) if bool(np.array_equal(g, want)) else None


def grid_strides(off: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(shape, byte strides) of the row-major N-D grid (2 axes or more) whose points are
    ``off``, or None when they form none."""
    shape = _grid_shape(off)
    if shape is None:
        return None
    strides = _grid_strides(off, shape)
    return None if strides is None else (shape, strides)


def gather(src: np.ndarray, src_off: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The pieces of ``src`` packed back to back into a new ``uint8`` array."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    if lengths.size:
        pos = np.empty_like(lengths)
        pos[0] = 0
        np.cumsum(lengths[:-1], out=pos[1:])
        copy_pieces(out, pos, src, src_off, lengths)
    return out
