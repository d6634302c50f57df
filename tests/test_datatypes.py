"""Datatype flattening against MPI's own packing (MPICH, in-process, no mpiexec).

Oracle: pack ``count`` instances from a buffer whose bytes hold their own position, one byte
plane at a time (four ``MPI_Pack`` calls recover every packed byte's exact source position);
the flattened pieces must name exactly those positions, in the same order.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from strataio.errors import DatatypeError
from strataio.layout import datatypes as dtmod
from strataio.layout.datatypes import FlatType, flatten, flatten_count, is_committed
from strataio.layout.extents import Extents

NAMED = [MPI.BYTE, MPI.SHORT, MPI.INT, MPI.DOUBLE, MPI.DOUBLE_INT, MPI.SHORT_INT, MPI.FLOAT_INT]
KINDS = [
    "contiguous",
    "vector",
    "hvector",
    "indexed",
    "hindexed",
    "indexed_block",
    "hindexed_block",
    "struct",
    "subarray",
    "darray",
    "resized",
    "dup",
]
MAX_SPAN = 1 << 20


def packed_positions(dt: MPI.Datatype, count: int) -> np.ndarray:
    """Source byte position (relative to the buffer origin) of every byte MPI packs."""
    lb, ext = dt.Get_extent()
    tlb, text = dt.Get_true_extent()
    lo = min(0, tlb, tlb + (count - 1) * ext)
    hi = max(tlb + text + (count - 1) * ext, tlb + text, count * ext) + 1
    base = -lo
    pos = np.arange(base + hi, dtype=np.int64)
    size = dt.Get_size() * count
    got = np.zeros(size, dtype=np.int64)
    for shift in (0, 8, 16, 24):
        plane = ((pos >> shift) & 0xFF).astype(np.uint8)
        out = np.zeros(size, dtype=np.uint8)
        dt.Pack(plane[base : base + count * ext], out, 0, MPI.COMM_SELF)
        got |= out.astype(np.int64) << shift
    return got - base


def assert_matches_mpi(dt: MPI.Datatype, count: int, disp: int = 0) -> FlatType:
    if not dt.is_predefined:
        dt.Commit()
    flat = flatten(dt)
    assert (flat.lb, flat.extent) == tuple(dt.Get_extent())
    assert (flat.true_lb, flat.true_extent) == tuple(dt.Get_true_extent())
    assert flat.size == dt.Get_size() == flat.extents.nbytes
    assert flat.extents.mem_is_packed()
    pieces = flatten_count(dt, count, disp)
    assert pieces.mem_is_packed()
    np.testing.assert_array_equal(pieces.byte_indices() - disp, packed_positions(dt, count))
    return flat


# --------------------------------------------------------------------------- strategies
def _ints(draw: st.DrawFn, n: int, lo: int, hi: int) -> list[int]:
    return draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))


def _darray(draw: st.DrawFn, child: MPI.Datatype) -> MPI.Datatype:
    nd = draw(st.integers(1, 2))
    gsizes = _ints(draw, nd, 1, 7)
    psizes = _ints(draw, nd, 1, 3)
    distribs, dargs = [], []
    for g, p in zip(gsizes, psizes):
        kind = draw(st.sampled_from(["block", "cyclic", "none"] if p == 1 else ["block", "cyclic"]))
        if kind == "none":
            distribs.append(MPI.DISTRIBUTE_NONE)
            dargs.append(MPI.DISTRIBUTE_DFLT_DARG)
        elif kind == "block":
            distribs.append(MPI.DISTRIBUTE_BLOCK)
            least = -(-g // p)
            dargs.append(draw(st.sampled_from([MPI.DISTRIBUTE_DFLT_DARG, least, least + 1])))
        else:
            distribs.append(MPI.DISTRIBUTE_CYCLIC)
            dargs.append(draw(st.sampled_from([MPI.DISTRIBUTE_DFLT_DARG, 1, 2, 3])))
    size = int(np.prod(psizes))
    order = draw(st.sampled_from([MPI.ORDER_C, MPI.ORDER_FORTRAN]))
    rank = draw(st.integers(0, size - 1))
    return child.Create_darray(size, rank, gsizes, distribs, dargs, psizes, order=order)


def _build(draw: st.DrawFn, kind: str, child: MPI.Datatype, other: MPI.Datatype) -> MPI.Datatype:
    if kind == "contiguous":
        return child.Create_contiguous(draw(st.integers(0, 4)))
    if kind in ("vector", "hvector"):
        n, bl = draw(st.integers(0, 4)), draw(st.integers(0, 3))
        if kind == "vector":
            return child.Create_vector(n, bl, draw(st.integers(-5, 5)))
        return child.Create_hvector(n, bl, draw(st.integers(-40, 40)))
    if kind in ("indexed", "hindexed", "indexed_block", "hindexed_block"):
        n = draw(st.integers(0, 4))
        lo, hi = (-4, 6) if kind.startswith("indexed") else (-30, 60)
        displs = _ints(draw, n, lo, hi)
        if kind == "indexed":
            return child.Create_indexed(_ints(draw, n, 0, 3), displs)
        if kind == "hindexed":
            return child.Create_hindexed(_ints(draw, n, 0, 3), displs)
        bl = draw(st.integers(0, 3))
        if kind == "indexed_block":
            return child.Create_indexed_block(bl, displs)
        return child.Create_hindexed_block(bl, displs)
    if kind == "struct":
        n = draw(st.integers(1, 3))
        types = [draw(st.sampled_from([child, other])) for _ in range(n)]
        return MPI.Datatype.Create_struct(_ints(draw, n, 0, 3), _ints(draw, n, -16, 48), types)
    if kind == "subarray":
        nd = draw(st.integers(1, 3))
        sizes = _ints(draw, nd, 1, 4)
        subs = [draw(st.integers(1, s)) for s in sizes]
        starts = [draw(st.integers(0, s - b)) for s, b in zip(sizes, subs)]
        order = draw(st.sampled_from([MPI.ORDER_C, MPI.ORDER_FORTRAN]))
        return child.Create_subarray(sizes, subs, starts, order=order)
    if kind == "darray":
        return _darray(draw, child)
    if kind == "resized":
        return child.Create_resized(draw(st.integers(-8, 8)), draw(st.integers(1, 40)))
    return child.Dup()


@st.composite
def nested_types(draw: st.DrawFn) -> tuple[MPI.Datatype, list[MPI.Datatype]]:
    """A datatype two constructors deep over named types, and every type made (to free)."""
    made: list[MPI.Datatype] = []
    try:
        inner = _build(draw, draw(st.sampled_from(KINDS)), draw(st.sampled_from(NAMED)), MPI.INT)
        made.append(inner)
        outer = _build(draw, draw(st.sampled_from(KINDS)), inner, draw(st.sampled_from(NAMED)))
        made.append(outer)
    except MPI.Exception:
        for t in made:
            t.Free()
        assume(False)
    return outer, made


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(nested_types(), st.integers(1, 3), st.integers(-3, 3))
def test_nested_types_match_mpi_pack(case, count, disp):
    dt, made = case
    try:
        dt.Commit()
        lb, ext = dt.Get_extent()
        tlb, text = dt.Get_true_extent()
        assume(ext > 0 and text < MAX_SPAN and count * ext < MAX_SPAN)
        assert_matches_mpi(dt, count, disp)
    finally:
        for t in made:
            t.Free()


# --------------------------------------------------------------------------- examples
@pytest.mark.parametrize("dt", NAMED + [MPI.LONG_DOUBLE_INT, MPI.C_DOUBLE_COMPLEX, MPI.LONG_INT])
def test_named_types(dt):
    flat = assert_matches_mpi(dt, 3)
    assert flatten(dt) is flat


def test_pair_types_keep_their_padding():
    flat = flatten(MPI.SHORT_INT)
    assert flat.extents.offsets.tolist() == [0, 4] and flat.extents.lengths.tolist() == [2, 4]
    flat = flatten(MPI.DOUBLE_INT)  # 12 data bytes in a 16-byte extent
    assert flat.extents.lengths.tolist() == [12] and flat.extent == 16
    assert not flat.is_contiguous and flatten(MPI.INT).is_contiguous


def test_darray_every_rank_and_order_tiles_the_array():
    gsizes, psizes = [9, 7], [2, 3]
    dist = [MPI.DISTRIBUTE_CYCLIC, MPI.DISTRIBUTE_BLOCK]
    for order in (MPI.ORDER_C, MPI.ORDER_FORTRAN):
        seen = []
        for rank in range(6):
            dt = MPI.INT.Create_darray(
                6, rank, gsizes, dist, [2, MPI.DISTRIBUTE_DFLT_DARG], psizes, order=order
            )
            dt.Commit()
            assert_matches_mpi(dt, 1)
            seen.append(flatten(dt).extents.byte_indices())
            dt.Free()
        allb = np.sort(np.concatenate(seen))
        np.testing.assert_array_equal(allb, np.arange(9 * 7 * 4))


def test_subarray_of_whole_rows_is_one_piece():
    dt = MPI.DOUBLE.Create_subarray([6, 5], [2, 5], [3, 0])
    flat = flatten(dt)
    assert flat.extents.offsets.tolist() == [3 * 5 * 8] and flat.extents.lengths.tolist() == [80]
    dt.Free()


def test_cache_survives_child_use_and_handle_reuse():
    v = MPI.INT.Create_vector(3, 1, 2)
    f1 = flatten(v)
    assert flatten(v) is f1
    outer = v.Create_contiguous(2)
    assert len(flatten(outer).extents) == 5  # [16, 20) and [20, 24) merge
    assert flatten(v) is f1  # decoding ``outer`` released its child reference only
    outer.Free()
    handle = v.handle
    v.Free()
    # a new type very likely reuses the handle; it must not see the old entry
    w = MPI.INT.Create_vector(2, 2, 5)
    if w.handle == handle:
        assert w.Get_attr(dtmod._cache_key()) is None
    w.Commit()
    assert_matches_mpi(w, 2)
    w.Free()


def test_flatten_count_contiguous_fast_path_and_errors():
    ext = flatten_count(MPI.DOUBLE, 1000, disp=16)
    assert ext.offsets.tolist() == [16] and ext.lengths.tolist() == [8000]
    assert len(flatten_count(MPI.INT.Create_vector(2, 1, 2), 0)) == 0
    with pytest.raises(DatatypeError):
        flatten_count(MPI.INT, -1)
    with pytest.raises(DatatypeError):
        flatten(MPI.DATATYPE_NULL)


def test_adjacent_instances_coalesce_without_changing_the_map():
    dt = MPI.INT.Create_resized(0, 4).Create_contiguous(3)  # dense: one run per call
    v = MPI.BYTE.Create_hindexed([2, 2], [2, 0])  # descending: pieces must not be merged
    for t in (dt, v):
        t.Commit()
        assert_matches_mpi(t, 4, 5)
    assert flatten(v).extents.offsets.tolist() == [2, 0]
    assert len(flatten_count(dt, 4)) == 1
    dt.Free()
    v.Free()


def test_large_contents_path_equals_mpi4py_lists(monkeypatch):
    displs = np.random.default_rng(3).permutation(20000)[:6000] * 3
    dt = MPI.SHORT.Create_indexed_block(1, displs.tolist())
    fast = dtmod._decode(dt)
    monkeypatch.setattr(dtmod, "_BIG_CONTENTS", 1 << 40)
    slow = dtmod._decode(dt)
    np.testing.assert_array_equal(fast.offsets, slow.offsets)
    np.testing.assert_array_equal(fast.lengths, slow.lengths)
    np.testing.assert_array_equal(fast.offsets, np.sort(displs)[np.argsort(np.argsort(displs))] * 2)
    dt.Commit()
    assert_matches_mpi(dt, 1)
    dt.Free()


def test_million_blocks_are_vectorized():
    n = 1_000_000
    hv = MPI.DOUBLE.Create_hvector(n, 1, 24)
    idx = MPI.INT.Create_indexed_block(2, (np.arange(n) * 5).tolist())
    t0 = time.perf_counter()
    a, b = flatten(hv), flatten(idx)
    elapsed = time.perf_counter() - t0
    assert len(a.extents) == n and len(b.extents) == n
    assert int(b.extents.offsets[-1]) == (n - 1) * 20
    assert elapsed < 1.0, elapsed  # a Python loop per block takes seconds
    hv.Free()
    idx.Free()


@settings(max_examples=30, deadline=None)
@given(
    st.integers(20, 400),
    st.lists(st.integers(-50, 30000), min_size=1, max_size=12),
    st.integers(0, 2**32 - 1),
)
def test_realm_split_of_sorted_pieces_matches_general_path(n, boundaries, seed):
    """``Extents.split`` / ``bin_by`` take a search-the-boundaries path for many sorted pieces
    and few boundaries; it must agree with the general one and with byte-level truth."""
    rng = np.random.default_rng(seed)
    gaps = rng.integers(0, 40, n)
    lens = rng.integers(1, 90, n)
    offs = np.cumsum(gaps + np.concatenate(([0], lens[:-1])))
    ext = Extents(offs, lens)
    b = np.unique(np.asarray(boundaries, dtype=np.int64))
    fast = ext.split(b)
    general = Extents.concat([ext.take(slice(k, k + 1)).split(b) for k in range(n)], repack=False)
    assert fast == general
    np.testing.assert_array_equal(fast.byte_indices(), ext.byte_indices())
    assert fast.mem_is_packed()
    bins = fast.bin_by(b)
    np.testing.assert_array_equal(bins, np.searchsorted(b, fast.offsets, side="right") - 1)
    last_byte_bin = np.searchsorted(b, fast.ends - 1, side="right") - 1
    np.testing.assert_array_equal(bins, last_byte_bin)  # no piece crosses a boundary


def test_large_struct_through_ctypes_contents():
    n = 3000  # enough arguments for the direct MPI_Type_get_contents_c path
    rng = np.random.default_rng(4)
    types = [[MPI.INT, MPI.SHORT, MPI.DOUBLE_INT][k] for k in rng.integers(0, 3, n)]
    inner = MPI.INT.Create_vector(2, 1, 3)
    types[::7] = [inner] * len(types[::7])
    displs = (np.cumsum(rng.integers(16, 40, n)) - 16).tolist()
    dt = MPI.Datatype.Create_struct(rng.integers(0, 3, n).tolist(), displs, types)
    assert sum(dt.Get_envelope()[:3]) > dtmod._BIG_CONTENTS
    dt.Commit()
    assert_matches_mpi(dt, 2, 3)
    dt.Free()
    dup = inner.Dup()
    assert_matches_mpi(dup, 1)  # the constituent survived its references' release
    dup.Free()
    inner.Free()


def test_parameterised_basic_types():
    for dt in (MPI.Datatype.Create_f90_real(15, 300), MPI.Datatype.Create_f90_complex(6, 30)):
        flat = assert_matches_mpi(dt, 2)
        assert flat.is_contiguous
    pair = MPI.Datatype.Get_value_index(MPI.SHORT, MPI.INT)
    assert_matches_mpi(pair, 3)


def test_is_committed_tells_types_mpi_would_refuse():
    """Predefined types are committed; a derived one after Commit() (and its Dup), not
    before; the null datatype never. A fatal error handler on MPI_COMM_SELF is not used."""
    loose = MPI.INT.Create_vector(2, 1, 3)
    resized = MPI.DOUBLE.Create_resized(0, 16)
    previous = MPI.COMM_SELF.Get_errhandler()
    MPI.COMM_SELF.Set_errhandler(MPI.ERRORS_ARE_FATAL)
    try:
        assert is_committed(MPI.BYTE) and is_committed(MPI.DOUBLE_INT)
        assert not is_committed(loose) and not is_committed(resized)
        assert not is_committed(MPI.DATATYPE_NULL)
        loose.Commit()
        twin = loose.Dup()
        assert is_committed(loose) and is_committed(twin)
        twin.Free()
    finally:
        MPI.COMM_SELF.Set_errhandler(previous)
        previous.Free()
        loose.Free()
        resized.Free()
