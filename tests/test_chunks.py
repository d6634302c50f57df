"""Property tests of layout.chunks: section covers against per-element chunk assignment."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strataio.errors import SelectionError, StrataError
from strataio.layout.chunks import ChunkGrid
from strataio.layout.sections import Section

GEOMETRY = settings(max_examples=80, deadline=None)


@st.composite
def grid_and_section(draw: st.DrawFn) -> tuple[ChunkGrid, Section]:
    nd = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 12), min_size=nd, max_size=nd)))
    chunks = tuple(draw(st.lists(st.integers(1, 5), min_size=nd, max_size=nd)))
    a, b = [], []
    for n in shape:
        x = draw(st.integers(0, n))
        a.append(x)
        b.append(draw(st.integers(x, n)))
    return ChunkGrid(shape, chunks), Section(tuple(a), tuple(b))


@GEOMETRY
@given(grid_and_section())
def test_cover_matches_per_element_assignment(arg) -> None:
    grid, sec = arg
    cover = grid.cover(sec)
    # oracle: the chunk of every element of the section, unique, in C order
    idx = np.indices(sec.shape).reshape(sec.ndim, -1).T + np.asarray(sec.start, dtype=np.int64)
    owner = idx // np.asarray(grid.chunks)
    expect = sorted({tuple(c) for c in owner.tolist()})
    assert [tuple(c) for c in cover.coords.tolist()] == expect
    assert len(cover) == len(expect)

    # each chunk's two sub-boxes name the same elements; together they tile the section once
    a = np.arange(int(np.prod(grid.shape))).reshape(grid.shape)
    want = a[sec.to_slices()]
    seen = np.zeros(sec.shape, dtype=np.int64)
    for coords, local, out in cover:
        box = grid.chunk_section(coords)
        chunk = a[box.to_slices()]
        assert np.array_equal(chunk[local], want[out])
        seen[out] += 1
    assert np.all(seen == 1)

    # full_mask: the section covers the chunk's whole in-array part
    full = cover.full_mask(grid)
    for i, c in enumerate(cover.coords.tolist()):
        assert full[i] == sec.contains(grid.chunk_section(c))


@GEOMETRY
@given(
    st.lists(st.integers(0, 9), min_size=1, max_size=3).flatmap(
        lambda shape: st.tuples(
            st.just(tuple(shape)),
            st.lists(st.integers(1, 4), min_size=len(shape), max_size=len(shape)).map(tuple),
        )
    )
)
def test_grid_geometry(arg) -> None:
    shape, chunks = arg
    g = ChunkGrid(shape, chunks)
    assert g.grid_shape == tuple(int(np.ceil(n / c)) for n, c in zip(shape, chunks))
    assert g.nchunks == int(np.prod(g.grid_shape))
    coords = list(itertools.product(*(range(k) for k in g.grid_shape)))
    assert [tuple(c) for c in g.all_coords().tolist()] == coords
    owner = np.zeros(shape, dtype=np.int64) - 1
    for i, c in enumerate(coords):
        box = g.chunk_section(c)
        assert np.all(owner[box.to_slices()] == -1)  # chunks do not overlap
        owner[box.to_slices()] = i
        assert box.shape == tuple(g.chunk_shapes(np.array([c]))[0].tolist())
    assert np.all(owner >= 0)  # and cover the array


def test_cover_errors_and_edges() -> None:
    g = ChunkGrid((10, 7), (4, 3))
    with pytest.raises(SelectionError):
        g.cover(Section((0, 0), (11, 7)))
    with pytest.raises(SelectionError):
        g.cover(Section((0,), (1,)))
    with pytest.raises(SelectionError):
        g.chunk_section((3, 0))
    with pytest.raises(SelectionError):
        g.chunk_section((0,))
    with pytest.raises(StrataError):
        ChunkGrid((4, 4), (2,))
    with pytest.raises(StrataError):
        ChunkGrid((4,), (0,))
    with pytest.raises(StrataError):
        ChunkGrid((-1,), (2,))
    empty = g.cover(Section((3, 3), (3, 7)))
    assert len(empty) == 0 and empty.coords.shape == (0, 2)
    # the edge chunk is logically full size but holds only what lies in the array
    assert g.chunk_section((2, 2)) == Section((8, 6), (10, 7))


def test_zero_dimensional_grid() -> None:
    g = ChunkGrid((), ())
    assert g.nchunks == 1
    cover = g.cover(Section((), ()))
    assert len(cover) == 1 and cover.coords.shape == (1, 0)
    assert list(cover) == [((), (), ())]
    assert cover.full_mask(g).tolist() == [True]
