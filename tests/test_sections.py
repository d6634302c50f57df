"""Property tests of layout.sections against numpy's own basic indexing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strataio.errors import SelectionError
from strataio.layout.sections import Section

GEOMETRY = settings(max_examples=80, deadline=None)

shapes = st.lists(st.integers(0, 6), min_size=1, max_size=4).map(tuple)


@st.composite
def index_for(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple:
    """A valid basic index of ``shape``: ints, step-1 slices with in-range bounds, one '...'."""
    nd = len(shape)
    k = draw(st.integers(0, nd))  # how many axes are indexed explicitly
    items: list = []
    for n in shape[:k]:
        kinds = ["slice"] + (["int"] if n > 0 else [])
        if draw(st.sampled_from(kinds)) == "int":
            items.append(draw(st.integers(-n, n - 1)))
        else:
            bound = st.none() | st.integers(-n, n)
            step = draw(st.sampled_from([None, 1]))
            items.append(slice(draw(bound), draw(bound), step))
    if draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), Ellipsis)
        # an ellipsis stands for the axes not indexed: move the tail after it to the end
        pos = items.index(Ellipsis)
        tail = len(items) - pos - 1
        if tail:
            head = items[:pos]
            rest = items[pos + 1 :]
            # explicit items after '...' index the last axes: regenerate them for those axes
            rest = [
                draw(st.integers(-n, n - 1)) if isinstance(x, int) and n > 0 else slice(None)
                for x, n in zip(rest, shape[nd - tail :])
            ]
            items = [*head, Ellipsis, *rest]
    if len(items) == 1 and draw(st.booleans()):
        return items[0]  # a bare index, not a tuple
    return tuple(items)


@GEOMETRY
@given(st.data())
def test_from_index_matches_numpy(data: st.DataObject) -> None:
    shape = data.draw(shapes)
    index = data.draw(index_for(shape))
    a = np.arange(int(np.prod(shape))).reshape(shape)
    expect = a[index]
    sec = Section.from_index(index, shape)
    assert sec.ndim == len(shape)
    assert sec.result_shape == np.shape(expect)
    got = a[sec.to_slices()]
    assert got.shape == sec.shape
    assert np.array_equal(got.reshape(sec.result_shape), expect)
    assert sec.size == got.size
    assert sec.is_empty == (got.size == 0)


def test_from_index_numpy_integers_and_negative() -> None:
    sec = Section.from_index((np.int64(-1), slice(np.int32(1), -1)), (4, 5))
    assert (sec.start, sec.stop, sec.squeeze) == ((3, 1), (4, 4), (0,))
    assert sec.result_shape == (3,)
    assert Section.from_index(..., (2, 3)) == Section((0, 0), (2, 3))
    assert Section.from_index((), (2, 3)) == Section((0, 0), (2, 3))
    # reversed bounds select nothing, as in numpy
    assert Section.from_index(slice(4, 2), (6,)).shape == (0,)


@pytest.mark.parametrize(
    "index",
    [
        slice(0, 4, 2),  # stepped
        slice(None, None, -1),  # reversed
        (slice(None), slice(1, 3, 3)),
        5,  # int out of bounds
        -6,
        (0, 5),
        slice(0, 6),  # slice bound beyond the array
        slice(-6, None),
        (0, 0, 0),  # too many indices
        (Ellipsis, 0, Ellipsis),  # two ellipses
        (Ellipsis, Ellipsis),
        None,  # newaxis
        1.5,
        [0, 1],  # fancy index
        np.array([0, 1]),
        True,  # a boolean is a mask in numpy, not the integer 1
        (0, False),
        slice(0.5, 2),
        slice(0, 2, 1.0),  # a float step, though it equals 1 (numpy refuses it)
        slice(0, 2, np.float64(1)),
        (0, slice(None, None, "1")),
    ],
)
def test_from_index_errors(index) -> None:
    with pytest.raises(SelectionError):
        Section.from_index(index, (5, 5))


def test_selection_error_is_index_error() -> None:
    with pytest.raises(IndexError):
        Section.from_index(9, (5,))


@st.composite
def two_sections(draw: st.DrawFn) -> tuple[tuple[int, ...], Section, Section]:
    shape = draw(st.lists(st.integers(1, 7), min_size=1, max_size=3).map(tuple))

    def box() -> Section:
        a, b = [], []
        for n in shape:
            x = draw(st.integers(0, n))
            a.append(x)
            b.append(draw(st.integers(x, n)))
        return Section.from_bounds(a, b, shape)

    return shape, box(), box()


def box_mask(shape: tuple[int, ...], s: Section) -> np.ndarray:
    m = np.zeros(shape, dtype=bool)
    m[s.to_slices()] = True
    return m


@GEOMETRY
@given(two_sections())
def test_intersect_contains_relative(arg) -> None:
    shape, s, t = arg
    ms, mt = box_mask(shape, s), box_mask(shape, t)
    both = ms & mt
    r = s.intersect(t)
    if both.any():
        assert r is not None
        assert np.array_equal(box_mask(shape, r), both)
    else:
        assert r is None
    if not t.is_empty:  # an empty box is a corner position, not an element set
        assert s.contains(t) == bool(np.all(ms[mt]))
    rel = t.relative_to(s.start) if s.contains(t) and not t.is_empty else None
    if rel is not None:
        a = np.arange(int(np.prod(shape))).reshape(shape)
        assert np.array_equal(a[s.to_slices()][rel.to_slices()], a[t.to_slices()])


def test_from_bounds_and_constructor_errors() -> None:
    assert Section.from_bounds((1, 2), (3, 4), (5, 5)).shape == (2, 2)
    with pytest.raises(SelectionError):
        Section.from_bounds((0, 0), (6, 1), (5, 5))  # beyond the array
    with pytest.raises(SelectionError):
        Section.from_bounds((2,), (1,), (5,))  # stop before start
    with pytest.raises(SelectionError):
        Section.from_bounds((0,), (1,), (5, 5))  # rank mismatch
    with pytest.raises(SelectionError):
        Section.from_bounds((0.5,), (1,))
    with pytest.raises(SelectionError):
        Section((0, 0), (1,))
    with pytest.raises(SelectionError):
        Section((-1,), (1,))
    with pytest.raises(SelectionError):
        Section((0,), (1,)).intersect(Section((0, 0), (1, 1)))
    assert Section.full((3, 4)) == Section((0, 0), (3, 4))
    assert str(Section((1, 2), (3, 4))) == "[1:3, 2:4]"
