"""Property tests of layout.extents against brute-force oracles (byte masks, stream maps)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from strataio.errors import StrataError
from strataio.layout.extents import Extents, section_extents

SPACE = 160  # byte space of the generated extents: offsets + lengths stay below it

GEOMETRY = settings(max_examples=60, deadline=None)


@st.composite
def extents(draw: st.DrawFn, max_pieces: int = 12, packed: bool | None = None) -> Extents:
    """Pieces anywhere in ``[0, SPACE)``, possibly overlapping, zero-length or unsorted.

    The stream positions are packed in a random order of the pieces (``packed`` forces the
    default running sum), so operations must carry ``mem`` rather than recompute it.
    """
    n = draw(st.integers(0, max_pieces))
    offs = draw(st.lists(st.integers(0, SPACE - 20), min_size=n, max_size=n))
    lens = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    if packed is None:
        packed = draw(st.booleans())
    if packed:
        return Extents(offs, lens)
    order = draw(st.permutations(range(n)))
    mem = np.zeros(n, dtype=np.int64)
    pos = 0
    for i in order:
        mem[i] = pos
        pos += lens[i]
    return Extents(offs, lens, mem)


def pairs(e: Extents) -> list[tuple[int, int]]:
    """Oracle: (stream position, byte position) for every byte moved, in piece order."""
    out = []
    for o, n, m in zip(e.offsets.tolist(), e.lengths.tolist(), e.mem.tolist()):
        out.extend((m + k, o + k) for k in range(n))
    return out


def mask(e: Extents, size: int = SPACE) -> np.ndarray:
    """Oracle: boolean mask of the bytes touched."""
    m = np.zeros(size, dtype=bool)
    for o, n in zip(e.offsets.tolist(), e.lengths.tolist()):
        m[o : o + n] = True
    return m


def assert_disjoint_sorted(e: Extents) -> None:
    assert np.all(e.lengths > 0)
    assert np.all(e.offsets[1:] > e.ends[:-1]), "pieces must be sorted with gaps between them"


# --------------------------------------------------------------------------- construction
def test_construction_errors() -> None:
    with pytest.raises(StrataError):
        Extents([0, 1], [1])
    with pytest.raises(StrataError):
        Extents([0], [-1])
    with pytest.raises(StrataError):
        Extents([0, 4], [1, 1], mem=[0])


def test_empty_and_single() -> None:
    e = Extents.empty()
    assert len(e) == 0 and e.nbytes == 0 and e.first == 0 and e.last == 0
    assert e.byte_indices().size == 0
    s = Extents.single(7, 5)
    assert s.byte_indices().tolist() == [7, 8, 9, 10, 11]
    assert (s.first, s.last, s.nbytes) == (7, 12, 5)


@GEOMETRY
@given(extents())
def test_properties_match_oracle(e: Extents) -> None:
    m = mask(e)
    assert e.nbytes == sum(e.lengths.tolist())
    if m.any():
        assert e.first == int(np.flatnonzero(m)[0])
        assert e.last == int(np.flatnonzero(m)[-1]) + 1
    else:
        assert (e.first, e.last) == (0, 0)
    # byte_indices: every byte in piece order
    assert e.byte_indices().tolist() == [f for _, f in pairs(Extents(e.offsets, e.lengths))]
    packed = np.array_equal(e.mem, np.concatenate(([0], np.cumsum(e.lengths)[:-1]))[: len(e)])
    assert e.mem_is_packed() == packed
    ends = e.ends
    assert e.is_sorted() == all(e.offsets[i + 1] >= ends[i] for i in range(len(e) - 1))


@GEOMETRY
@given(extents(), st.integers(-50, 50))
def test_shift(e: Extents, delta: int) -> None:
    assert pairs(e.shift(delta)) == [(m, f + delta) for m, f in pairs(e)]


@GEOMETRY
@given(extents(), st.data())
def test_take(e: Extents, data: st.DataObject) -> None:
    keep = data.draw(hnp.arrays(bool, len(e)))
    t = e.take(keep)
    assert pairs(t) == [p for i in np.flatnonzero(keep) for p in pairs(e.take([i]))]


@GEOMETRY
@given(extents())
def test_compact(e: Extents) -> None:
    c = e.compact()
    assert np.all(c.lengths > 0)
    assert pairs(c) == pairs(e)


@GEOMETRY
@given(extents())
def test_sort(e: Extents) -> None:
    s = e.sort()
    assert np.all(np.diff(s.offsets) >= 0)
    assert sorted(pairs(s)) == sorted(pairs(e))


@GEOMETRY
@given(extents())
def test_coalesce(e: Extents) -> None:
    c = e.coalesce()
    # same bytes to the same stream positions, in the same order
    assert pairs(c) == pairs(e)
    assert np.all(c.lengths > 0)
    # nothing left to merge
    joinable = (c.ends[:-1] == c.offsets[1:]) & (c.mem[:-1] + c.lengths[:-1] == c.mem[1:])
    assert not joinable.any()


def test_coalesce_merges_runs() -> None:
    e = Extents([0, 4, 8, 20, 24], [4, 4, 4, 4, 4])
    assert e.coalesce() == Extents([0, 20], [12, 8], [0, 12])
    # adjacent in the file but not in the stream: kept apart
    e = Extents([0, 4], [4, 4], [4, 0])
    assert len(e.coalesce()) == 2


@GEOMETRY
@given(extents())
def test_union(e: Extents) -> None:
    u = e.union()
    assert np.array_equal(mask(u), mask(e))
    assert_disjoint_sorted(u)
    assert u.mem_is_packed()


@GEOMETRY
@given(extents(), st.integers(-10, SPACE + 10), st.integers(-10, SPACE + 10))
def test_clip(e: Extents, lo: int, hi: int) -> None:
    c = e.clip(lo, hi)
    assert pairs(c) == [(m, f) for m, f in pairs(e) if lo <= f < hi]
    assert np.all(c.lengths > 0)


@GEOMETRY
@given(extents(), st.lists(st.integers(-5, SPACE + 5), max_size=10))
def test_split(e: Extents, boundaries: list[int]) -> None:
    s = e.split(boundaries)
    assert pairs(s) == pairs(e)
    assert np.all(s.lengths > 0)
    b = np.array(sorted(set(boundaries)), dtype=np.int64)
    for o, end in zip(s.offsets.tolist(), s.ends.tolist()):
        assert not np.any((b > o) & (b < end)), "a boundary falls inside a piece"
    # minimal: one cut per boundary strictly inside an original piece
    c = e.compact()
    cuts = sum(int(np.sum((b > o) & (b < end))) for o, end in zip(c.offsets, c.ends))
    assert len(s) == len(c) + cuts


@st.composite
def many_sorted(draw: st.DrawFn) -> Extents:
    """Many sorted disjoint pieces (possibly adjacent), stream order possibly shuffled: the
    shape of access for which split and bin_by take their few-boundaries fast paths."""
    n = draw(st.integers(17, 90))
    gaps = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    lens = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
    offs = np.cumsum(gaps) + np.concatenate(([0], np.cumsum(lens)[:-1]))
    if draw(st.booleans()):
        return Extents(offs, lens)
    order = np.array(draw(st.permutations(range(n))))
    mem = np.empty(n, dtype=np.int64)
    mem[order] = np.concatenate(([0], np.cumsum(np.asarray(lens)[order])[:-1]))
    return Extents(offs, lens, mem)


@GEOMETRY
@given(many_sorted(), st.lists(st.integers(-5, 1300), min_size=1, max_size=4))
def test_split_and_bin_by_few_boundaries(e: Extents, boundaries: list[int]) -> None:
    s = e.split(boundaries)
    assert pairs(s) == pairs(e)
    b = np.array(sorted(set(boundaries)), dtype=np.int64)
    for o, end in zip(s.offsets.tolist(), s.ends.tolist()):
        assert not np.any((b > o) & (b < end)), "a boundary falls inside a piece"
    cuts = sum(int(np.sum((b > o) & (b < end))) for o, end in zip(e.offsets, e.ends))
    assert len(s) == len(e) + cuts
    got = e.bin_by(b).tolist()
    for o, j in zip(e.offsets.tolist(), got):
        assert j == max((i for i, x in enumerate(b.tolist()) if x <= o), default=-1)
    # intersect cuts at the region's edges: one region piece is the same fast path
    lo, hi = int(b[0]), int(b[-1]) + 7
    region = np.zeros(1400, dtype=bool)
    region[max(lo, 0) : max(hi, 0)] = True
    r = e.intersect(Extents.single(lo, hi - lo))
    assert pairs(r) == [(m, f) for m, f in pairs(e) if region[f]]


@GEOMETRY
@given(extents(), extents())
def test_intersect(e: Extents, other: Extents) -> None:
    r = e.intersect(other)
    region = mask(other)
    assert pairs(r) == [(m, f) for m, f in pairs(e) if region[f]]
    assert np.all(r.lengths > 0)


@GEOMETRY
@given(extents(max_pieces=5), st.integers(0, 4), st.integers(-30, 60))
def test_tile(e: Extents, count: int, stride: int) -> None:
    t = e.tile(count, stride)
    span = int((e.mem + e.lengths).max(initial=0))
    expect = [(m + k * span, f + k * stride) for k in range(count) for m, f in pairs(e)]
    assert pairs(t) == expect
    assert len(t) == (len(e) * count if len(e) else 0)


@GEOMETRY
@given(st.lists(extents(max_pieces=4), max_size=4), st.booleans())
def test_concat(parts: list[Extents], repack: bool) -> None:
    c = Extents.concat(parts, repack=repack)
    flat = [f for p in parts for _, f in pairs(Extents(p.offsets, p.lengths))]
    assert c.byte_indices().tolist() == flat
    if repack:
        assert c.mem_is_packed()
    else:
        assert pairs(c) == [x for p in parts for x in pairs(p)]


@GEOMETRY
@given(extents(), st.lists(st.integers(0, SPACE), min_size=1, max_size=6, unique=True))
def test_bin_by(e: Extents, bounds: list[int]) -> None:
    b = sorted(bounds)
    got = e.bin_by(b).tolist()
    for o, j in zip(e.offsets.tolist(), got):
        expect = max((i for i, x in enumerate(b) if x <= o), default=-1)
        assert j == expect


def test_million_pieces_cost_milliseconds() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    offs = np.sort(rng.choice(50 * n, n, replace=False)).astype(np.int64) * 4
    e = Extents(offs, np.full(n, 4))
    t0 = time.perf_counter()
    e.split(np.arange(0, 200 * n, 4096)).coalesce().union().clip(1000, 100 * n)
    assert time.perf_counter() - t0 < 3.0  # vectorized: ~0.1 s; a Python loop takes minutes


# --------------------------------------------------------------------------- section_extents
@st.composite
def boxes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    nd = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=nd, max_size=nd)))
    start, stop = [], []
    for n in shape:
        a = draw(st.integers(0, n))
        b = draw(st.integers(a, n))
        start.append(a)
        stop.append(b)
    return shape, tuple(start), tuple(stop)


@GEOMETRY
@given(boxes(), st.sampled_from([1, 2, 4, 8]), st.integers(0, 100))
def test_section_extents_match_numpy(box, itemsize: int, base: int) -> None:
    shape, start, stop = box
    e = section_extents(shape, itemsize, start, stop, base=base)
    nbytes = int(np.prod(shape)) * itemsize
    # every byte of the array, viewed as the array with a trailing byte axis
    byte_pos = np.arange(nbytes, dtype=np.int64).reshape(*shape, itemsize)
    sel = tuple(slice(a, b) for a, b in zip(start, stop))
    expect = byte_pos[sel].ravel() + base
    assert np.array_equal(e.byte_indices(), expect)
    assert e.mem_is_packed()
    # minimal piece count: no two consecutive pieces could have been one
    assert len(e.coalesce()) == len(e)


def test_section_extents_whole_rows_are_one_piece() -> None:
    e = section_extents((10, 20, 30), 4, (2, 0, 0), (5, 20, 30))
    assert e == Extents([2 * 20 * 30 * 4], [3 * 20 * 30 * 4])
    assert len(section_extents((8, 8), 4, (0, 1), (8, 3))) == 8
    assert len(section_extents((8, 8), 4, (3, 3), (3, 8))) == 0
    assert section_extents((), 8, (), (), base=16) == Extents([16], [8])
