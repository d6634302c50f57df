"""Packed transfers in cache-sized blocks (strataio.collective.packed) against numpy."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import strataio
from strataio.collective import packed
from strataio.collective.bufspec import parse_buffer
from strataio.collective.driver import PosixDriver
from strataio.collective.hints import parse_hints
from strataio.collective.independent import IndependentIO
from strataio.layout.extents import Extents, exclusive_cumsum


def _stream_pieces(draw: st.DrawFn, nbytes: int, max_gap: int, shuffle: bool) -> Extents:
    """Pieces covering a ``nbytes`` stream in order (``mem`` = stream positions), placed with
    gaps (in stream order, or in a shuffled order when ``shuffle``)."""
    cuts = sorted(draw(st.sets(st.integers(1, nbytes - 1), max_size=24)))
    lengths = np.diff([0, *cuts, nbytes]).astype(np.int64)
    gaps = np.array(
        draw(st.lists(st.integers(0, max_gap), min_size=lengths.size, max_size=lengths.size))
    )
    order = np.arange(lengths.size)
    if shuffle:
        order = np.array(draw(st.permutations(list(order))))
    offsets = np.empty_like(lengths)
    offsets[order] = exclusive_cumsum(lengths[order] + gaps) + gaps[0]
    return Extents(offsets, lengths, exclusive_cumsum(lengths))


def _grid_pieces(draw: st.DrawFn) -> Extents:
    """The interior of a padded N-D array (1 to 3 axes of equal pieces): a subarray with
    ghost cells, in stream order."""
    shape = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    piece = draw(st.integers(1, 24))
    pad = draw(st.lists(st.integers(0, 3), min_size=len(shape), max_size=len(shape)))
    strides, step = [], piece + pad[-1] * piece
    for n, p in zip(shape[::-1], pad[::-1]):
        strides.insert(0, step)
        step *= n + p
    grid = np.indices(shape).reshape(len(shape), -1)
    offsets = piece + sum(grid[k] * strides[k] for k in range(len(shape)))
    lengths = np.full(offsets.size, piece, dtype=np.int64)
    return Extents(offsets, lengths, exclusive_cumsum(lengths))


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_packed_blocks_move_the_stream_like_numpy(data: st.DataObject, tmp_path_factory) -> None:
    """Any memory layout (N-D grids included), any file layout, blocks smaller than the
    stream: the file gets the stream's bytes at the file pieces (holes zero), and reading
    back restores the buffer."""
    if data.draw(st.booleans()):
        mem = _grid_pieces(data.draw)
        nbytes = mem.nbytes
        assume(nbytes >= 2)
    else:
        nbytes = data.draw(st.integers(2, 3000))
        mem = _stream_pieces(data.draw, nbytes, 40, shuffle=data.draw(st.booleans()))
    file = _stream_pieces(data.draw, nbytes, 300, shuffle=False)  # views are monotone
    block = data.draw(st.integers(1, 700))
    blocks = packed.PackedBlocks(mem, file, nbytes, block)
    assert sum(n for n, *_ in blocks.blocks) == nbytes
    rng = np.random.default_rng(nbytes)
    buf = rng.integers(0, 256, int(mem.ends.max()) + 7, dtype=np.uint8)
    stream = np.concatenate([buf[o : o + n] for o, n in zip(mem.offsets, mem.lengths)])
    expect = np.zeros(int(file.ends.max()), dtype=np.uint8)
    for o, n, s in zip(file.offsets, file.lengths, file.mem):
        expect[o : o + n] = stream[s : s + n]
    path = tmp_path_factory.mktemp("packed") / "f.bin"
    io = IndependentIO(
        parse_hints(
            {"romio_ds_write": data.draw(st.sampled_from(["enable", "disable", "automatic"]))}
        )
    )
    driver = PosixDriver.open(str(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        blocks.write(io, driver, buf)
        assert np.array_equal(np.fromfile(path, dtype=np.uint8), expect)
        back = np.zeros_like(buf)
        blocks.read(io, driver, back)
    finally:
        driver.close()
    touched = np.zeros(buf.size, dtype=bool)
    for o, n in zip(mem.offsets, mem.lengths):
        touched[o : o + n] = True
    assert np.array_equal(back[touched], buf[touched])
    assert not back[~touched].any()  # bytes between the pieces are left alone


def _ghost_cells(n: int, g: int) -> tuple[np.ndarray, MPI.Datatype]:
    """A solver's local ``n``³ block of doubles with ``g`` ghost cells on each side."""
    m = n + 2 * g
    arr = np.random.default_rng(n).random((m, m, m))
    return arr, MPI.DOUBLE.Create_subarray([m] * 3, [n] * 3, [g] * 3).Commit()


def test_grid_layouts_are_cut_into_whole_rows_and_spread_ones_are_not_cut() -> None:
    """A ghost-cell block packs one strided copy per block, each block whole planes of the
    block; interleaved variables (FLASH), spread over the whole buffer, stay one block."""
    arr, mt = _ghost_cells(32, 2)
    try:
        spec = parse_buffer([arr, 1, mt], writable=False)
        file = Extents.single(0, spec.nbytes)
        blocks = packed.PackedBlocks(spec.mem, file, spec.nbytes, 3 * 32 * 32 * 8 + 5)
        sizes = [n for n, *_ in blocks.blocks]
        assert sizes == [3 * 32 * 32 * 8] * 10 + [2 * 32 * 32 * 8]  # 3 planes, then the rest
        assert all(
            len(pack.steps) == 1 and len(unpack.steps) == 1 for _, pack, unpack, _ in blocks.blocks
        )
        # a plane larger than a block: blocks of whole rows inside each plane
        blocks = packed.PackedBlocks(spec.mem, file, spec.nbytes, 20 * 32 * 8)
        assert [n for n, *_ in blocks.blocks] == [20 * 32 * 8, 12 * 32 * 8] * 32
        assert all(
            len(pack.steps) == 1 and len(unpack.steps) == 1 for _, pack, unpack, _ in blocks.blocks
        )
    finally:
        mt.Free()
    # 8 variables interleaved in memory, one after the other in the stream
    nvar, cells = 8, 4096
    var = MPI.DOUBLE.Create_vector(cells, 1, nvar)
    mt = MPI.Datatype.Create_struct([1] * nvar, [8 * v for v in range(nvar)], [var] * nvar).Commit()
    try:
        spec = parse_buffer([np.zeros(nvar * cells), 1, mt], writable=False)
        file = Extents.single(0, spec.nbytes)
        blocks = packed.PackedBlocks(spec.mem, file, spec.nbytes, 8 * cells)
        assert [n for n, *_ in blocks.blocks] == [spec.nbytes]
    finally:
        mt.Free()
        var.Free()


@pytest.mark.parametrize("cb", ["automatic", "enable"])
def test_file_moves_ghost_cell_blocks_in_many_pack_blocks(
    cb: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through File: a ghost-cell array written and read in blocks of a few planes (the
    independent path) or packed whole (two-phase) leaves the interior in the file."""
    monkeypatch.setattr(packed, "PACK_BLOCK", 3 * 20 * 20 * 8)
    arr, mt = _ghost_cells(20, 3)
    interior = arr[3:-3, 3:-3, 3:-3]
    hints = {"romio_cb_write": cb, "romio_cb_read": cb}
    path = tmp_path / "g.bin"
    try:
        with strataio.File.open(None, path, "w", hints=hints) as f:
            f.set_view(8 * 1000, MPI.DOUBLE)
            f.write_all([arr, 1, mt])
            assert f.last_path == ("two-phase" if cb == "enable" else "independent")
            back = np.zeros_like(arr)
            f.read_at_all(0, [back, 1, mt])
        on_disk = np.fromfile(path, dtype=np.float64)
        assert np.array_equal(on_disk[:1000], np.zeros(1000))
        assert np.array_equal(on_disk[1000:], interior.ravel())
        assert np.array_equal(back[3:-3, 3:-3, 3:-3], interior)
        back[3:-3, 3:-3, 3:-3] = 0
        assert not back.any()  # ghost cells untouched
    finally:
        mt.Free()
