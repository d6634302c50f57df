"""Index schedules (``strataio.IndexSchedule``, ``File.read_items`` / ``write_items``): random
index sets against a numpy oracle in process and at 1, 2 and 4 ranks, errors agreed on every
rank, and the memory and reuse properties of a schedule."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import strataio
from mpirun import run_mpi
from strataio.collective.hints import parse_hints
from strataio.collective.irregular import IndexSchedule
from strataio.errors import HintError, SelectionError, ShapeMismatchError, StrataError


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_index_schedules_match_a_numpy_oracle_under_mpiexec(tmp_path, nprocs):
    out = json.loads(run_mpi(nprocs, "irregular_oracle.py", tmp_path, timeout=240).splitlines()[-1])
    assert out["failures"] == []
    for key, value in out.items():
        if key.startswith(("out_of_range", "wrong_count", "duplicate", "io_failure", "mismatch")):
            assert value == "raised", (key, value)
    assert "io_failure_read" in out and "io_failure_write" in out
    if nprocs > 1:
        assert "duplicate_32" in out and "mismatched_itemsize_32" in out
        assert "mismatched_huge_nitems_32" in out and "mismatched_huge_buffer_32" in out
    for trial in range(3):  # caching reads fewer items than reading every loop in full
        assert out[f"cache_items_read_{trial}"] < out[f"plain_items_read_{trial}"]


@settings(max_examples=40, deadline=None)
@given(
    itemsize=st.sampled_from([1, 3, 8, 32]),
    nitems=st.integers(1, 200),
    picks=st.lists(st.floats(0, 1, exclude_max=True), max_size=120),
    buffer_items=st.sampled_from([1, 2, 7, 1000]),
    data=st.data(),
)
def test_read_and_write_items_agree_with_numpy(
    tmp_path_factory, itemsize, nitems, picks, buffer_items, data
):
    path = tmp_path_factory.mktemp("items") / "a.bin"
    rng = np.random.default_rng(len(picks))
    start = rng.integers(0, 256, (nitems, itemsize), dtype=np.uint8)
    start.tofile(path)
    idx = (np.array(picks) * nitems).astype(np.int64)
    sched = IndexSchedule(_self(), idx, nitems, itemsize, buffer_size=buffer_items * itemsize)
    with strataio.File.open(
        None, path, "r+", {"romio_ds_read": data.draw(st.sampled_from(["automatic", "disable"]))}
    ) as f:
        got = np.empty((idx.size, itemsize), np.uint8)
        f.read_items(sched, got)
        assert np.array_equal(got, start[idx])
        vals = rng.integers(0, 256, (idx.size, itemsize), dtype=np.uint8)
        f.write_items(sched, vals)
    expect = start.copy()
    for i, v in zip(idx.tolist(), vals):  # one by one: the last occurrence wins
        expect[i] = v
    assert np.array_equal(np.fromfile(path, dtype=np.uint8).reshape(nitems, itemsize), expect)


def eof_oracle(start: np.ndarray, nbytes: int, idx: np.ndarray):
    """What a read of items ``idx`` gives from a file holding the first ``nbytes`` bytes of
    ``start``: the records (bytes past the end zeros), the whole items the file holds, and the
    count of distinct indices read."""
    nitems, itemsize = start.shape
    flat = np.zeros(nitems * itemsize, np.uint8)
    flat[:nbytes] = start.reshape(-1)[:nbytes]
    whole = min(nbytes // itemsize, nitems)
    return flat.reshape(nitems, itemsize)[idx], whole, np.unique(idx[idx < whole]).size


@settings(max_examples=40, deadline=None)
@given(
    itemsize=st.sampled_from([1, 3, 8, 32]),
    nitems=st.integers(1, 200),
    picks=st.lists(st.floats(0, 1, exclude_max=True), max_size=120),
    buffer_items=st.sampled_from([1, 2, 7, 1000]),
    cut=st.floats(0, 1.2),
    data=st.data(),
)
def test_read_items_past_the_end_of_the_file_counts_only_what_it_read(
    tmp_path_factory, itemsize, nitems, picks, buffer_items, cut, data
):
    """A file shorter than its items: the items wholly before its end are read and counted,
    ``file_items`` says where it ends, the rest read as zeros (an item the end cuts keeps its
    bytes before the end), as a read past the end does in every read of a File."""
    path = tmp_path_factory.mktemp("short") / "a.bin"
    rng = np.random.default_rng(len(picks))
    start = rng.integers(1, 256, (nitems, itemsize), dtype=np.uint8)  # (no zero bytes)
    nbytes = int(cut * nitems * itemsize)
    if data.draw(st.booleans()) and nbytes % itemsize == 0 and 0 < nbytes < start.size:
        nbytes += data.draw(st.integers(1, itemsize - 1)) if itemsize > 1 else 0  # straddle
    path.write_bytes(start.reshape(-1)[:nbytes].tobytes() + b"\7" * (nbytes - start.size))
    idx = (np.array(picks) * nitems).astype(np.int64)
    sched = IndexSchedule(_self(), idx, nitems, itemsize, buffer_size=buffer_items * itemsize)
    hints = {"romio_ds_read": data.draw(st.sampled_from(["automatic", "disable", "enable"]))}
    with strataio.File.open(None, path, "r", hints) as f:
        got = np.full((idx.size, itemsize), 0xEE, np.uint8)
        io = f.read_items(sched, got)
    expect, whole, count = eof_oracle(start, min(nbytes, start.size), idx)
    assert np.array_equal(got, expect)
    assert (io.file_items, io.items) == (whole, count)
    assert np.array_equal(sched.indices < io.file_items, idx < whole)


def test_read_items_of_an_empty_file_reads_nothing(tmp_path):
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    with strataio.File.open(None, path, "r") as f:
        for idx in ([3, 0, 3], []):
            sched = IndexSchedule(_self(), idx, 10, 8)
            got = np.full((len(idx), 8), 0xEE, np.uint8)
            io = f.read_items(sched, got)
            assert (io.items, io.file_items) == (0, 0) and not got.any()
    with strataio.File.open(None, path, "r+") as f:  # a write's result has no end to report
        io = f.write_items(IndexSchedule(_self(), [2], 10, 8), np.ones(8, np.uint8))
        assert (io.items, io.file_items) == (1, None)
        io = f.read_items(IndexSchedule(_self(), [0, 2, 3, 9], 10, 8), np.empty(32, np.uint8))
        assert (io.items, io.file_items) == (2, 3)


def _self():
    from mpi4py import MPI

    return MPI.COMM_SELF


def test_a_schedule_is_reused_without_rebuilding(tmp_path):
    nitems, itemsize = 5000, 32
    idx = np.random.default_rng(1).integers(0, nitems, 3000)
    sched = IndexSchedule(_self(), idx, nitems, itemsize)
    built = sched.build_seconds
    for name in ("a.bin", "b.bin"):  # across calls and across files of the same item count
        with strataio.File.open(None, tmp_path / name, "w") as f:
            vals = np.arange(idx.size * 4, dtype=np.float64).reshape(-1, 4)
            vals[:] = idx[:, None]  # a repeated index gets the same value everywhere
            f.write_items(sched, vals)
            back = np.empty_like(vals)
            f.read_items(sched, back)
            f.read_items(sched, back)
            assert np.array_equal(back, vals)
            assert f.last_path == "irregular"
    assert sched.build_seconds == built
    assert sched.iterations == 1 and np.array_equal(sched.indices, idx)


def test_schedule_memory_follows_the_rank_not_the_array():
    small = IndexSchedule(_self(), [5, 3, 5, 9], 10, 8)
    huge = IndexSchedule(_self(), [5, 3, 5, 9], 10**15, 8)
    assert small.nbytes == huge.nbytes < 1024


def test_iterations_are_bounded_by_the_buffer():
    sched = IndexSchedule(_self(), np.arange(100), 100, 8, buffer_size=8 * 30)
    assert sched.iterations == 4 and max(g.items.size for g in sched.groups) == 30


def test_bad_arguments_raise_strata_errors(tmp_path):
    with pytest.raises(SelectionError, match="out of range"):
        IndexSchedule(_self(), [0, 10], 10, 4)
    with pytest.raises(SelectionError, match="out of range"):
        IndexSchedule(_self(), [-1], 10, 4)
    with pytest.raises(SelectionError, match="integers"):
        IndexSchedule(_self(), [0.5], 10, 4)
    for big in (2**63, 2**64 - 1):  # (unsigned: named as given, not wrapped negative)
        with pytest.raises(SelectionError, match=f"^index {big} is out of range"):
            IndexSchedule(_self(), np.array([3, big], np.uint64), 10, 4)
    with pytest.raises(StrataError, match="buffer_size"):
        IndexSchedule(_self(), [0], 10, 4, buffer_size=2)
    # each names the argument that is wrong, not a condition that holds
    with pytest.raises(StrataError, match=r"itemsize 0 is not at least 1 byte$"):
        IndexSchedule(_self(), [0], 10, 0)
    with pytest.raises(StrataError, match=r"nitems -5 is negative$"):
        IndexSchedule(_self(), [], -5, 4)
    sched = IndexSchedule(_self(), [1, 2], 10, 4)
    path = tmp_path / "e.bin"
    path.write_bytes(bytes(range(40)))
    with strataio.File.open(None, path, "r+") as f:
        with pytest.raises(ShapeMismatchError, match="need 8"):
            f.write_items(sched, np.zeros(3, np.int32))
        with pytest.raises(ShapeMismatchError):
            f.read_items(sched, np.zeros(2, np.int64))
    assert path.read_bytes() == bytes(range(40))  # nothing written
    with strataio.File.open(None, path, "r") as f, pytest.raises(strataio.StrataError):
        f.write_items(sched, np.zeros(2, np.int32))


def test_schedule_sizes_that_are_not_integers_are_refused():
    # (int() truncated them: nitems=10.7 built a schedule of 10 items without a word)
    for kw in ({"nitems": 10.7}, {"itemsize": 4.5}, {"buffer_size": 64.5}, {"nitems": "10"}):
        args = {"nitems": 10, "itemsize": 4, **kw}
        buf = {"buffer_size": args.pop("buffer_size")} if "buffer_size" in args else {}
        name = next(iter(kw))
        with pytest.raises(StrataError, match=f"{name} must be an integer"):
            IndexSchedule(_self(), [1], args["nitems"], args["itemsize"], **buf)
    with pytest.raises(StrataError, match="aggregators must be ranks"):
        IndexSchedule(_self(), [1], 10, 4, aggregators=[0.5])
    sched = IndexSchedule(_self(), [1], np.int32(10), np.uint8(4), buffer_size=np.int64(64))
    assert (sched.nitems, sched.itemsize, sched.buffer_size) == (10, 4, 64)


def test_duplicate_writes_hint():
    assert parse_hints({"strataio_duplicate_writes": "Last-Rank"}).strataio_duplicate_writes == (
        "last-rank"
    )
    assert parse_hints(None).as_dict()["strataio_duplicate_writes"] == "error"
    with pytest.raises(HintError, match="strataio_duplicate_writes"):
        parse_hints({"strataio_duplicate_writes": "first"})


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2])
def test_items_see_and_survive_the_aggregators_realm_caches(tmp_path, nprocs):
    """read_items / write_items go to the driver directly: the realm caches of persistent
    realms are written back before them (and forgotten before a write)."""
    assert run_mpi(nprocs, "items_through_realm_cache.py", tmp_path).strip().endswith("ok")


@pytest.mark.mpi
def test_ranks_passing_different_aggregators_all_raise(tmp_path):
    """Aggregator sets that agree in count, sum and sum of squares are still told apart."""
    out = run_mpi(7, "irregular_aggregators_differ.py", timeout=120)
    assert json.loads(out.splitlines()[-1]) == ["raised"]


def test_arrays_of_python_objects_are_refused_as_bad_shapes(tmp_path):
    # (numpy's own TypeError said only "Cannot change data-type for array of references")
    path = tmp_path / "o.bin"
    path.write_bytes(bytes(range(80)))
    sched = IndexSchedule(_self(), [1, 2], 10, 8)
    objects = np.array([object(), object()])
    with strataio.File.open(None, path, "r+") as f:
        with pytest.raises(ShapeMismatchError, match="Python objects"):
            f.write_items(sched, objects)
        with pytest.raises(ShapeMismatchError, match="Python objects"):
            f.read_items(sched, objects)
        cache = strataio.LoopCache(f, sched, dtype=np.int64)
        with pytest.raises(ShapeMismatchError, match="Python objects"):
            cache.advance(sched, objects)
        with pytest.raises(ShapeMismatchError, match="Python objects"):
            cache.flush(objects)
    assert path.read_bytes() == bytes(range(80))
