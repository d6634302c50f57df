"""Collective Datasets (APRIL Figure 3b): ``read_all`` / ``write_all`` against a numpy oracle at
1, 2 and 4 ranks, and the chunk planning they share."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from mpi4py import MPI

import strataio
from mpirun import run_mpi
from strataio.arrays.collective import Sections, plan_pairs
from strataio.arrays.dataset import Dataset
from strataio.arrays.store import CountingChunkStore
from strataio.errors import ArgumentError
from strataio.layout.chunks import ChunkGrid


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_read_all_write_all_against_numpy(tmp_path, nprocs):
    out = run_mpi(nprocs, "collective_dataset.py", tmp_path, nprocs, 6, timeout=180)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_read_all_write_all_long(tmp_path, seed):
    out = run_mpi(4, "collective_dataset.py", tmp_path, 100 + seed, 60, timeout=600)
    assert out.strip().splitlines()[-1] == "ok"


def _random_sections(rng, shape, nprocs):
    start = np.zeros((nprocs, len(shape)), dtype=np.int64)
    stop = np.zeros_like(start)
    for r, (d, n) in itertools.product(range(nprocs), enumerate(shape)):
        start[r, d] = rng.integers(0, n + 1)
        stop[r, d] = rng.integers(start[r, d], n + 1)
    wants = (rng.random(nprocs) < 0.8) & np.all(stop > start, axis=1)
    return Sections(start, stop, wants)


@pytest.mark.parametrize("seed", range(40))
def test_plan_pairs_against_brute_force(seed):
    """Every (chunk, rank) pair whose chunk the rank's section touches, once, with the piece
    being the section inside the chunk; each chunk's owner is one of its wanters; shared
    chunks are spread over the ranks."""
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(0, 4))
    shape = tuple(int(x) for x in rng.integers(1, 10, size=nd))
    chunks = tuple(int(x) for x in rng.integers(1, 5, size=nd))
    grid = ChunkGrid(shape, chunks)
    nprocs = int(rng.integers(1, 6))
    secs = _random_sections(rng, shape, nprocs)
    pairs = plan_pairs(grid, secs)
    want = {}
    for c in itertools.product(*[range(g) for g in grid.grid_shape]):
        lo = np.asarray(c, dtype=np.int64) * chunks
        hi = np.minimum(lo + chunks, shape)
        for r in np.flatnonzero(secs.wants):
            a, b = np.maximum(lo, secs.start[r]), np.minimum(hi, secs.stop[r])
            if np.all(b > a):
                want[(c, int(r))] = (tuple(a.tolist()), tuple(b.tolist()))
    got = {
        (tuple(pairs.coords[k].tolist()), int(r)): (tuple(a), tuple(b))
        for k, r, a, b in zip(pairs.chunk, pairs.rank, pairs.lo.tolist(), pairs.hi.tolist())
    }
    assert got == want and len(pairs) == len(want)
    for k in range(len(pairs.first)):
        f, n = pairs.first[k], pairs.count[k]
        wanters = pairs.rank[f : f + n]
        assert np.all(np.diff(wanters) > 0)  # rank order within a chunk
        assert pairs.chunk_owner[k] in wanters
    assert np.array_equal(pairs.owner, pairs.chunk_owner[pairs.chunk])


def test_shared_chunks_spread_over_their_wanters():
    """Four ranks reading four thin columns of one column of chunks: each reads a quarter."""
    grid = ChunkGrid((64, 64), (8, 64))
    start = np.array([[0, 16 * r] for r in range(4)])
    stop = start + [64, 16]
    pairs = plan_pairs(grid, Sections(start, stop, np.ones(4, dtype=bool)))
    assert np.bincount(pairs.chunk_owner, minlength=4).tolist() == [2, 2, 2, 2]


def test_single_process_comm(tmp_path):
    """On COMM_SELF the collective calls are the plain ones; without a communicator too."""
    a = np.arange(60, dtype="<i2").reshape(6, 10)
    for comm in (MPI.COMM_SELF, None):
        ds = strataio.create_dataset(tmp_path / str(comm), a.shape, a.dtype, (4, 4), comm=comm)
        ds.write_all(np.s_[1:], a[1:])
        ds.write_all(None)
        assert ds.read_all(None) is None
        assert ds.read_all(np.s_[2, 3]) == a[2, 3]
        want = a.copy()
        want[0] = 0
        assert np.array_equal(ds.read_all(...), want)
        counted = Dataset(CountingChunkStore(ds.store), ds.meta, comm=comm)
        counted.clear_cache()
        counted.read_all(np.s_[0:5, 0:5])
        assert counted.store.reads == 4


@pytest.mark.parametrize("comm", [MPI.COMM_SELF, None])
def test_write_all_of_data_with_no_selection_is_an_error(tmp_path, comm):
    """A rank with nothing to write passes None (or an empty array) as data; data with
    values and no selection would be dropped, and raises before anything is written."""
    ds = strataio.create_dataset(tmp_path / "a", (4, 4), "f8", (2, 2), comm=comm)
    for data in (np.ones((2, 2)), 1.0, [[1.0]]):
        with pytest.raises(ArgumentError, match="no selection"):
            ds.write_all(None, data)
    ds.write_all(None, None)
    ds.write_all(None, np.zeros((0, 4)))
    assert not (tmp_path / "a" / "c").exists()
    assert np.array_equal(ds.read_all(...), np.zeros((4, 4)))


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_random_collective_steps_against_numpy_serial_and_zarr(tmp_path, nprocs):
    """Random datasets (dtypes, fill values, plain and sharded codecs, a Session's tiers),
    random overlapping, empty and None selections written and read collectively: after each
    step the whole array read collectively, serially on every rank and by zarr-python is the
    numpy oracle's (tests/mpi_scripts/collective_random.py)."""
    out = run_mpi(nprocs, "collective_random.py", tmp_path, 40 + nprocs, 8, 4, timeout=120)
    assert out.strip().splitlines()[-1] == "ok"
