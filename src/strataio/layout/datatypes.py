"""MPI datatype flattening: a derived datatype → the byte pieces of its type map.

:func:`flatten` decodes a datatype recursively through ``MPI_Type_get_envelope`` /
``MPI_Type_get_contents`` and returns a :class:`FlatType`: the pieces of one instance as
:class:`~strataio.layout.extents.Extents` relative to the type's origin, **in type-map order**
(the order ``MPI_Pack`` visits them), with ``mem`` the packed position of each piece. Pieces that
are adjacent both in memory and in the packed stream are merged, so a contiguous type is one
piece; pieces are never reordered, so overlapping or descending type maps keep their meaning.
:func:`flatten_count` tiles ``count`` instances (instance ``k`` at ``disp + k * extent``).

Every constructor is handled: named (including the pair types such as ``MPI_DOUBLE_INT``, whose
padding is found from MPI's own packing), dup, contiguous, vector, hvector, indexed, hindexed,
indexed_block, hindexed_block, struct, subarray (C and Fortran order), darray (block, cyclic and
none distributions, decoded from its constructor arguments as the MPI standard defines them),
resized, and the Fortran-90 parameterised types. Work is vectorized numpy over the blocks: a
vector of a million blocks costs a few array operations, not a million Python steps. Bounds
(``lb``, ``extent``, true bounds, ``size``) are MPI's own answers.

Caching. The result for a derived datatype is stored as an MPI *attribute* on the datatype
(a keyval created once per process). MPI deletes attributes when a datatype is freed, so a
handle value reused by a later datatype can never see a stale entry — keying a dictionary on the
handle value could. ``Dup`` does not copy the attribute (the duplicate is flattened anew, cheaply,
since its parent's entry is found during decoding). Named datatypes are permanent and are kept
in a plain dictionary.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from strataio.errors import DatatypeError
from strataio.layout.extents import Extents

__all__ = ["FlatType", "describe", "flatten", "flatten_count", "is_committed"]

_I64 = np.int64


@dataclass(frozen=True, slots=True)
class FlatType:
    """One instance of a datatype, flattened.

    ``extents``: the data pieces in type-map order, offsets in bytes relative to the datatype's
    origin (may be negative), ``mem`` the packed position of each piece. ``lb`` / ``extent``
    are as ``MPI_Type_get_extent``, ``true_lb`` / ``true_extent`` as
    ``MPI_Type_get_true_extent``, and ``size`` (bytes of data per instance) as
    ``MPI_Type_size``; all in bytes.
    """

    extents: Extents
    lb: int
    extent: int
    true_lb: int
    true_extent: int
    size: int

    @property
    def ub(self) -> int:
        return self.lb + self.extent

    @property
    def is_contiguous(self) -> bool:
        """True when one instance is a single piece filling its whole extent, so that
        consecutive instances form one contiguous run."""
        ext = self.extents
        return (
            len(ext) == 1 and int(ext.lengths[0]) == self.extent and int(ext.offsets[0]) == self.lb
        ) or (self.size == 0)


# --------------------------------------------------------------------------- flat pieces
class _Pieces:
    """Type-map pieces (offsets, lengths) of one instance, packed order, merged where adjacent."""

    __slots__ = ("extent", "lengths", "offsets")

    def __init__(self, offsets: np.ndarray, lengths: np.ndarray, extent: int) -> None:
        self.offsets = offsets
        self.lengths = lengths
        self.extent = extent

    def dense(self) -> bool:
        """One piece exactly as long as the extent: ``n`` instances form one run."""
        return self.offsets.size == 1 and int(self.lengths[0]) == self.extent


def _merge(offs: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop empty pieces and merge each piece into its predecessor when they touch in the
    byte space (the stream is packed, so stream adjacency is automatic)."""
    if lens.size and not bool(lens.all()):
        keep = lens > 0
        offs, lens = offs[keep], lens[keep]
    n = offs.size
    if n < 2:
        return offs, lens
    ends = offs + lens
    brk = np.flatnonzero(offs[1:] != ends[:-1])
    if brk.size == n - 1:
        return offs, lens
    # a merged piece runs from its first member's offset to its last member's end
    first = np.empty(brk.size + 1, dtype=np.intp)
    first[0] = 0
    np.add(brk, 1, out=first[1:])
    last = np.empty_like(first)
    last[:-1] = brk
    last[-1] = n - 1
    o = offs[first]
    return o, ends[last] - o


def _blocks(
    child: _Pieces, blocklens: np.ndarray, disps: np.ndarray, with_owner: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Block ``j`` = ``blocklens[j]`` consecutive children starting at byte ``disps[j]``.

    Returns unmerged ``(offsets, lengths, owner)`` in block order, ``owner`` being the block
    index of each piece (``None`` unless ``with_owner``).
    """
    ext = _I64(child.extent)
    if child.dense():
        if blocklens.size and int(blocklens.min()) > 0:
            owner = np.arange(disps.size, dtype=_I64) if with_owner else None
            return disps + child.offsets[0], blocklens * ext, owner
        keep = np.flatnonzero(blocklens > 0)
        return disps[keep] + child.offsets[0], blocklens[keep] * ext, keep
    total = int(blocklens.sum())
    m = child.offsets.size
    if total == 0 or m == 0:
        z = np.zeros(0, dtype=_I64)
        return z, z, z
    blk = np.repeat(np.arange(blocklens.size, dtype=_I64), blocklens)
    starts = np.cumsum(blocklens) - blocklens
    within = np.arange(total, dtype=_I64) - starts[blk]
    elem = disps[blk] + within * ext
    offs = (elem[:, None] + child.offsets[None, :]).reshape(-1)
    lens = np.broadcast_to(child.lengths, (total, m)).reshape(-1)
    owner = (np.repeat(blk, m) if m > 1 else blk) if with_owner else None
    return offs, lens, owner


def _grid(child: _Pieces, indices: list[np.ndarray], strides: list[int]) -> tuple[np.ndarray, ...]:
    """Children at every point of the cartesian product of per-dimension element ``indices``
    (slowest dimension first, each increasing), dimension ``d`` scaled by ``strides[d]``
    bytes: the type map of subarray and darray."""
    if any(ix.size == 0 for ix in indices):
        z = np.zeros(0, dtype=_I64)
        return z, z
    disp = np.zeros(1, dtype=_I64)
    for ix, st in zip(indices[:-1], strides[:-1]):
        disp = (disp[:, None] + ix[None, :] * _I64(st)).reshape(-1)
    fast, fst = indices[-1], _I64(strides[-1])
    if child.dense() and fst == child.extent:
        # runs of consecutive indices along the fastest dimension are contiguous bytes
        brk = np.flatnonzero(np.diff(fast) != 1) + 1
        rstart = np.concatenate(([0], brk))
        rlen = np.diff(np.concatenate((rstart, [fast.size])))
        offs = (disp[:, None] + (fast[rstart] * fst + child.offsets[0])[None, :]).reshape(-1)
        lens = np.broadcast_to(rlen * fst, (disp.size, rlen.size)).reshape(-1)
        return offs, lens
    elem = (disp[:, None] + fast[None, :] * fst).reshape(-1)
    offs, lens, _ = _blocks(child, np.ones(elem.size, dtype=_I64), elem)
    return offs, lens


# --------------------------------------------------------------------------- contents
def _load_get_contents() -> Any:
    """``MPI_Type_get_contents_c`` through ctypes, filling numpy arrays directly.

    mpi4py returns Python lists, which for a million-block indexed type costs ~100 ms; the
    C call into preallocated arrays costs ~1 ms. ``None`` where the symbol is unreachable.
    """
    try:
        fn = ctypes.CDLL(MPI.__file__).MPI_Type_get_contents_c
    except (OSError, AttributeError):
        return None
    hsize = MPI._sizeof(MPI.Datatype)
    if hsize not in (4, 8) or MPI.AINT.Get_size() != 8 or MPI.COUNT.Get_size() != 8:
        return None
    htype = ctypes.c_int32 if hsize == 4 else ctypes.c_int64
    c64, vp = ctypes.c_int64, ctypes.c_void_p
    fn.restype = ctypes.c_int
    fn.argtypes = [htype, c64, c64, c64, c64, vp, vp, vp, vp]
    return fn, hsize


_ctypes_lock = threading.Lock()
_ctypes_fn: list[Any] = []
_BIG_CONTENTS = 4096  # below this, mpi4py's lists are as fast


def _to_c_handle(h: int, hsize: int) -> int:
    mask = (1 << (8 * hsize)) - 1
    h &= mask
    return h - (1 << (8 * hsize)) if h >> (8 * hsize - 1) else h


def _contents(dt: MPI.Datatype) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[MPI.Datatype]]:
    """``(integers, addresses, large_counts, datatypes)`` of a derived datatype."""
    ni, na, nc, nd, _ = dt.Get_envelope()
    if ni + na + nc > _BIG_CONTENTS:
        with _ctypes_lock:
            if not _ctypes_fn:
                _ctypes_fn.append(_load_get_contents())
        loaded = _ctypes_fn[0]
        if loaded is not None:
            fn, hsize = loaded
            ints = np.empty(ni, dtype=np.int32)
            addrs = np.empty(na, dtype=_I64)
            counts = np.empty(nc, dtype=_I64)
            handles = np.empty(nd, dtype=np.int32 if hsize == 4 else _I64)
            rc = fn(
                _to_c_handle(dt.handle, hsize),
                ni,
                na,
                nc,
                nd,
                ints.ctypes.data,
                addrs.ctypes.data,
                counts.ctypes.data,
                handles.ctypes.data,
            )
            if rc == 0:
                mask = (1 << 64) - 1
                types = [MPI.Datatype.fromhandle(int(h) & mask) for h in handles.tolist()]
                return ints.astype(_I64), addrs, counts, types
    i, a, c, d = dt.Get_contents()
    return (
        np.asarray(i, dtype=_I64),
        np.asarray(a, dtype=_I64),
        np.asarray(c, dtype=_I64),
        d,
    )


# --------------------------------------------------------------------------- decoding
_keyval_lock = threading.Lock()
_keyval: list[int] = []
_named: dict[int, FlatType] = {}
# parameterised basic types: small, decoded by probing MPI's packing like the pair types
_BASIC = {
    MPI.COMBINER_F90_REAL,
    MPI.COMBINER_F90_COMPLEX,
    MPI.COMBINER_F90_INTEGER,
    getattr(MPI, "COMBINER_VALUE_INDEX", MPI.COMBINER_F90_REAL),
}


def _cache_key() -> int:
    with _keyval_lock:
        if not _keyval:
            _keyval.append(MPI.Datatype.Create_keyval())
        return _keyval[0]


def _probe(dt: MPI.Datatype) -> tuple[np.ndarray, np.ndarray]:
    """Type map of a small basic type (a named pair type, F90 type) read off MPI's packing:
    pack three byte planes of each byte's own offset and recover the offsets exactly."""
    tlb, text = dt.Get_true_extent()
    lb, ext = dt.Get_extent()
    size = dt.Get_size()
    if tlb < 0 or lb != 0 or ext <= 0 or tlb + text > ext or ext >= 1 << 24:
        raise DatatypeError(f"cannot decode basic datatype {dt.Get_name() or dt.handle!r}")
    pos = np.arange(ext, dtype=_I64)
    got = np.zeros(size, dtype=_I64)
    for shift in (0, 8, 16):
        plane = ((pos >> shift) & 0xFF).astype(np.uint8)
        out = np.empty(size, dtype=np.uint8)
        dt.Pack(plane, out, 0, MPI.COMM_SELF)
        got |= out.astype(_I64) << shift
    brk = np.flatnonzero(np.diff(got) != 1) + 1
    starts = np.concatenate(([0], brk))
    lens = np.diff(np.concatenate((starts, [size])))
    return got[starts], lens.astype(_I64)


def _named_pieces(dt: MPI.Datatype) -> _Pieces:
    size = dt.Get_size()
    _lb, ext = dt.Get_extent()
    tlb, text = dt.Get_true_extent()
    if size == ext == text and tlb == 0:
        return _Pieces(np.zeros(1, dtype=_I64), np.full(1, size, dtype=_I64), ext)
    if size == 0:
        z = np.zeros(0, dtype=_I64)
        return _Pieces(z, z, ext)
    offs, lens = _probe(dt)
    return _Pieces(offs, lens, ext)


def _child(dt: MPI.Datatype) -> _Pieces:
    """Pieces of a constituent type, reusing its cached flattening when it has one."""
    if dt.is_named:
        f = _named.get(dt.handle)
        if f is None:
            return _named_pieces(dt)
        return _Pieces(f.extents.offsets, f.extents.lengths, f.extent)
    cached = dt.Get_attr(_cache_key())
    if isinstance(cached, FlatType):
        return _Pieces(cached.extents.offsets, cached.extents.lengths, cached.extent)
    return _decode(dt)


def _darray_indices(
    rank: int,
    gsizes: list[int],
    distribs: list[int],
    dargs: list[int],
    psizes: list[int],
) -> list[np.ndarray]:
    """Per dimension, the global indices this rank owns. As the MPI standard defines darray,
    the process grid is numbered row-major whatever the array order; a block distribution's
    default block is ``ceil(gsize / psize)``, a cyclic one's is 1."""
    coords = np.unravel_index(rank, psizes) if psizes else ()
    out = []
    for g, dist, darg, p, c in zip(gsizes, distribs, dargs, psizes, coords):
        c = int(c)
        if dist == MPI.DISTRIBUTE_NONE:
            ix = np.arange(g, dtype=_I64)
        elif dist == MPI.DISTRIBUTE_BLOCK:
            b = -(-g // p) if darg == MPI.DISTRIBUTE_DFLT_DARG else darg
            ix = np.arange(min(c * b, g), min((c + 1) * b, g), dtype=_I64)
        elif dist == MPI.DISTRIBUTE_CYCLIC:
            k = 1 if darg == MPI.DISTRIBUTE_DFLT_DARG else darg
            first = np.arange(c * k, g, p * k, dtype=_I64)
            ix = (first[:, None] + np.arange(k, dtype=_I64)[None, :]).reshape(-1)
            ix = ix[ix < g]
        else:
            raise DatatypeError(f"darray: unknown distribution {dist}")
        out.append(ix)
    return out


def _decode(dt: MPI.Datatype) -> _Pieces:
    """Pieces of one instance of ``dt`` (not cached here)."""
    combiner = dt.Get_envelope()[4]
    _lb, extent = dt.Get_extent()
    if combiner == MPI.COMBINER_NAMED:
        return _named_pieces(dt)
    if combiner in _BASIC:
        return _named_pieces(dt)
    ints, addrs, counts, types = _contents(dt)
    try:
        offs, lens = _decode_contents(dt, combiner, ints, addrs, counts, types)
    finally:
        for t in types:
            if not t.is_predefined:
                t.Free()
    offs, lens = _merge(offs.astype(_I64, copy=False), lens.astype(_I64, copy=False))
    if int(lens.sum()) != dt.Get_size():
        raise DatatypeError(
            f"flattening datatype (combiner {combiner}) gave {int(lens.sum())} bytes, "
            f"MPI says {dt.Get_size()}"
        )
    return _Pieces(offs, lens, extent)


def _decode_contents(
    dt: MPI.Datatype,
    combiner: int,
    ints: np.ndarray,
    addrs: np.ndarray,
    counts: np.ndarray,
    types: list[MPI.Datatype],
) -> tuple[np.ndarray, np.ndarray]:
    # With large counts (MPI-4 "_c" constructors, which mpi4py uses) every count and
    # displacement lives in ``counts``; otherwise in ``ints`` and ``addrs``.
    big = counts.size > 0
    if combiner in (MPI.COMBINER_DUP, MPI.COMBINER_RESIZED):
        c = _child(types[0])
        return c.offsets, c.lengths
    if combiner == MPI.COMBINER_CONTIGUOUS:
        n = counts[0] if big else ints[0]
        c = _child(types[0])
        return _blocks(c, np.array([n], dtype=_I64), np.zeros(1, dtype=_I64))[:2]
    if combiner in (MPI.COMBINER_VECTOR, MPI.COMBINER_HVECTOR):
        if big:
            n, bl, stride = (int(x) for x in counts[:3])
        else:
            n, bl = int(ints[0]), int(ints[1])
            stride = int(ints[2]) if combiner == MPI.COMBINER_VECTOR else int(addrs[0])
        c = _child(types[0])
        if combiner == MPI.COMBINER_VECTOR:
            stride *= c.extent
        if c.dense() and n * bl > 0:
            run = bl * c.extent
            if stride == run:
                return c.offsets[:1].copy(), np.array([n * run], dtype=_I64)
            # equal dense blocks never touch unless stride == run: nothing to merge
            offs = np.arange(n, dtype=_I64) * _I64(stride)
            offs += c.offsets[0]
            return offs, np.full(n, run, dtype=_I64)
        disps = np.arange(n, dtype=_I64) * _I64(stride)
        return _blocks(c, np.full(n, bl, dtype=_I64), disps)[:2]
    if combiner in (
        MPI.COMBINER_INDEXED,
        MPI.COMBINER_HINDEXED,
        MPI.COMBINER_INDEXED_BLOCK,
        MPI.COMBINER_HINDEXED_BLOCK,
    ):
        blocklens, disps = _index_args(combiner, ints, addrs, counts)
        c = _child(types[0])
        if combiner in (MPI.COMBINER_INDEXED, MPI.COMBINER_INDEXED_BLOCK):
            disps = disps * _I64(c.extent)
        return _blocks(c, blocklens, disps)[:2]
    if combiner == MPI.COMBINER_STRUCT:
        return _struct(ints, addrs, counts, types)
    if combiner == MPI.COMBINER_SUBARRAY:
        nd = int(ints[0])
        if big:
            sizes, subs, starts = (counts[k * nd : (k + 1) * nd] for k in range(3))
            order = int(ints[1])
        else:
            sizes, subs, starts = (ints[1 + k * nd : 1 + (k + 1) * nd] for k in range(3))
            order = int(ints[3 * nd + 1])
        idx = [np.arange(s, s + n, dtype=_I64) for s, n in zip(starts.tolist(), subs.tolist())]
        return _array_grid(_child(types[0]), sizes.tolist(), idx, order)
    if combiner == MPI.COMBINER_DARRAY:
        rank, nd = int(ints[1]), int(ints[2])
        if big:
            gsizes = counts[:nd].tolist()
            rest = ints[3:]
        else:
            gsizes = ints[3 : 3 + nd].tolist()
            rest = ints[3 + nd :]
        distribs, dargs, psizes = (rest[k * nd : (k + 1) * nd].tolist() for k in range(3))
        order = int(rest[3 * nd])
        idx = _darray_indices(rank, gsizes, distribs, dargs, psizes)
        return _array_grid(_child(types[0]), gsizes, idx, order)
    raise DatatypeError(f"unsupported datatype combiner {combiner}")


def _index_args(
    combiner: int, ints: np.ndarray, addrs: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(blocklengths, displacements)`` of the indexed family, displacements in the
    constructor's units (elements for INDEXED*, bytes for HINDEXED*)."""
    src = counts if counts.size else ints
    n = int(src[0])
    if combiner in (MPI.COMBINER_INDEXED, MPI.COMBINER_HINDEXED):
        bls = src[1 : n + 1]
        if counts.size or combiner == MPI.COMBINER_INDEXED:
            disps = src[n + 1 : 2 * n + 1]
        else:
            disps = addrs[:n]
    else:
        bls = np.full(n, src[1], dtype=_I64)
        if counts.size or combiner == MPI.COMBINER_INDEXED_BLOCK:
            disps = src[2 : n + 2]
        else:
            disps = addrs[:n]
    return bls.astype(_I64, copy=False), disps.astype(_I64, copy=False)


def _struct(
    ints: np.ndarray, addrs: np.ndarray, counts: np.ndarray, types: list[MPI.Datatype]
) -> tuple[np.ndarray, np.ndarray]:
    if counts.size:
        n = int(counts[0])
        bls, disps = counts[1 : n + 1], counts[n + 1 : 2 * n + 1]
    else:
        n = int(ints[0])
        bls, disps = ints[1 : n + 1], addrs[:n]
    # Blocks sharing a constituent type are expanded together, then put back in block order.
    handles = np.array([t.handle for t in types], dtype=np.uint64)
    uniq, first, inverse = np.unique(handles, return_index=True, return_inverse=True)
    parts_o, parts_l, parts_b = [], [], []
    for g in range(uniq.size):
        sel = np.flatnonzero(inverse == g)
        o, ln, owner = _blocks(_child(types[int(first[g])]), bls[sel], disps[sel], True)
        parts_o.append(o)
        parts_l.append(ln)
        parts_b.append(sel[owner])
    offs = np.concatenate(parts_o)
    lens = np.concatenate(parts_l)
    if uniq.size > 1:
        order = np.argsort(np.concatenate(parts_b), kind="stable")
        offs, lens = offs[order], lens[order]
    return offs, lens


def _array_grid(
    child: _Pieces, sizes: list[int], idx: list[np.ndarray], order: int
) -> tuple[np.ndarray, np.ndarray]:
    """Subarray/darray type map: elements of an array of ``sizes`` (in ``order``) at the
    per-dimension indices ``idx``, in array order."""
    nd = len(sizes)
    if order == MPI.ORDER_FORTRAN:
        sizes, idx = sizes[::-1], idx[::-1]
    strides = [child.extent] * nd
    for d in range(nd - 2, -1, -1):
        strides[d] = strides[d + 1] * int(sizes[d + 1])
    return _grid(child, idx, strides)


# --------------------------------------------------------------------------- public API
def flatten(datatype: MPI.Datatype) -> FlatType:
    """The flattened type map of one instance of ``datatype`` (cached; see module docs).

    Raises :class:`~strataio.errors.DatatypeError` for a null or undecodable datatype.
    """
    if datatype == MPI.DATATYPE_NULL:
        raise DatatypeError("cannot flatten MPI.DATATYPE_NULL")
    named = datatype.is_named
    if named:
        hit = _named.get(datatype.handle)
        if hit is not None:
            return hit
    else:
        key = _cache_key()
        hit = datatype.Get_attr(key)
        if isinstance(hit, FlatType):
            return hit
    p = _named_pieces(datatype) if named else _decode(datatype)
    lb, extent = datatype.Get_extent()
    tlb, text = datatype.Get_true_extent()
    flat = FlatType(
        extents=Extents(p.offsets, p.lengths),
        lb=int(lb),
        extent=int(extent),
        true_lb=int(tlb),
        true_extent=int(text),
        size=int(datatype.Get_size()),
    )
    if named:
        _named[datatype.handle] = flat
    else:
        datatype.Set_attr(key, flat)
    return flat


#: a private duplicate of MPI_COMM_SELF whose errors return (made on first use): the probe of
#: :func:`is_committed` raises an error MPI reports through the communicator it names, which
#: must not abort the process whatever handler the application set on MPI_COMM_SELF
_probe_comm: list[MPI.Comm] = []


def is_committed(datatype: MPI.Datatype) -> bool:
    """Whether ``datatype`` may be used where MPI requires a committed datatype (a file
    view's etype and filetype, a buffer in communication): a predefined one always, a
    derived one once ``Commit()`` was called on it (or on the type it was ``Dup()``-ed from).

    MPI has no call that asks this. It is read off ``MPI_Pack_size``, which fails with
    ``MPI_ERR_TYPE`` for a type never committed where the MPI library checks its arguments
    (MPICH does, as built by default and in the ``mpich`` wheel: "Datatype has not been
    committed"). A library built without argument checks does not report it: there every
    datatype reads as committed. ``MPI.DATATYPE_NULL`` reads as not committed."""
    if datatype == MPI.DATATYPE_NULL:
        return False
    if datatype.is_predefined:
        return True
    with _keyval_lock:
        if not _probe_comm:
            comm = MPI.COMM_SELF.Dup()
            comm.Set_errhandler(MPI.ERRORS_RETURN)
            _probe_comm.append(comm)
    try:
        datatype.Pack_size(0, _probe_comm[0])
    except MPI.Exception as exc:
        if exc.Get_error_class() == MPI.ERR_TYPE:
            return False
        raise
    return True


def describe(datatype: MPI.Datatype) -> str:
    """A derived datatype in words (for error messages): its name where it has one, else its
    constructor."""
    name = datatype.Get_name()
    if name:
        return repr(name)
    combiner = datatype.combiner
    kinds = [k for k in dir(MPI) if k.startswith("COMBINER_") and getattr(MPI, k) == combiner]
    return f"a {kinds[0].removeprefix('COMBINER_').lower() if kinds else 'derived'} datatype"


def flatten_count(datatype: MPI.Datatype | FlatType, count: int, disp: int = 0) -> Extents:
    """Pieces of ``count`` consecutive instances, instance ``k`` at byte ``disp + k * extent``.

    Stream order is MPI's pack order (instance by instance, each in type-map order); ``mem`` is
    the packed position. Pieces adjacent in both the byte space and the stream are merged, which
    never changes which byte goes where.
    """
    count = int(count)
    if count < 0:
        raise DatatypeError(f"flatten_count: negative count {count}")
    flat = datatype if isinstance(datatype, FlatType) else flatten(datatype)
    ext = flat.extents
    if count == 0 or len(ext) == 0:
        return Extents.empty()
    if len(ext) == 1 and int(ext.lengths[0]) == flat.extent:
        return Extents.single(disp + int(ext.offsets[0]), count * flat.extent)
    if count == 1:
        return ext.shift(disp) if disp else ext
    return ext.tile(count, flat.extent).shift(disp).coalesce()
