"""``strataio.LoopCache`` as a state machine: random loops (overlapping index sets, values
changed by each loop, repeats) through a cache on one file and through plain
``read_items`` / ``write_items`` on another; after every step the cache's values equal the
plain sequence's, it holds exactly the current loop's items and only O(those items) memory,
and after a flush both files hold the same bytes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from mpi4py import MPI

import strataio
from strataio.errors import ShapeMismatchError

NITEMS, ITEMSIZE = 64, 8


class LoopCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="loopcache-sm-")
        d = self.dir
        self.paths = [os.path.join(d, "cached.bin"), os.path.join(d, "plain.bin")]
        self.cache: strataio.LoopCache | None = None
        self.flushed = False

    def _sched(self, idx: list[int]) -> strataio.IndexSchedule:
        return strataio.IndexSchedule(
            MPI.COMM_SELF, np.array(idx, dtype=np.int64), NITEMS, ITEMSIZE,
            buffer_size=self.buffer,
        )  # fmt: skip

    @initialize(
        idx=st.lists(st.integers(0, NITEMS - 1), max_size=40),
        buffer=st.sampled_from([ITEMSIZE, 5 * ITEMSIZE, 1 << 20]),
    )
    def start(self, idx: list[int], buffer: int) -> None:
        self.buffer = buffer
        start = np.arange(NITEMS, dtype=np.int64) * 1000
        for p in self.paths:
            start.tofile(p)
        self.fc = strataio.File.open(None, self.paths[0], "r+")
        self.fp = strataio.File.open(None, self.paths[1], "r+")
        self.idx = np.array(idx, dtype=np.int64)
        self.sched = self._sched(idx)
        self.cache = strataio.LoopCache(self.fc, self.sched, dtype=np.int64)
        self.plain = np.empty(self.idx.size, np.int64)
        self.fp.read_items(self.sched, self.plain)
        self.vals = self.cache.values

    @precondition(lambda self: not self.flushed)
    @rule(add=st.integers(1, 9))
    def loop_body(self, add: int) -> None:
        """The loop changes its values (repeats of an index get one value: its last)."""
        for arr in (self.vals, self.plain):
            arr += add + self.idx
            if arr.size:
                arr[:] = arr[self.sched.last[self.sched.inverse]]

    @precondition(lambda self: not self.flushed)
    @rule(
        keep=st.floats(0, 1),
        more=st.lists(st.integers(0, NITEMS - 1), max_size=20),
        seed=st.integers(0, 1000),
    )
    def advance(self, keep: float, more: list[int], seed: int) -> None:
        rng = np.random.default_rng(seed)
        kept = self.idx[rng.random(self.idx.size) < keep]
        nxt = np.concatenate([kept, np.array(more, dtype=np.int64)])
        rng.shuffle(nxt)
        nsched = self._sched(nxt.tolist())
        self.fp.write_items(self.sched, self.plain)  # the sequence without caching
        self.plain = np.empty(nxt.size, np.int64)
        self.fp.read_items(nsched, self.plain)
        self.vals = self.cache.advance(nsched, self.vals)
        self.idx, self.sched = nxt, nsched

    @precondition(lambda self: not self.flushed)
    @rule()
    def flush(self) -> None:
        self.cache.flush(self.vals)
        self.fp.write_items(self.sched, self.plain)
        self.flushed = True
        with open(self.paths[0], "rb") as a, open(self.paths[1], "rb") as b:
            assert a.read() == b.read()

    @rule()
    def wrong_count(self) -> None:
        with pytest.raises(ShapeMismatchError):
            self.cache.advance(self.sched, np.zeros(self.idx.size + 1, np.int64))

    @invariant()
    def same_values_as_without_cache(self) -> None:
        if self.cache is not None:
            assert np.array_equal(self.vals, self.plain)
            assert self.cache.schedule is self.sched
            assert np.array_equal(self.cache.values, self.vals)
            bound = 64 * (self.cache.schedule.n + 8) * ITEMSIZE + 8 * 1024
            assert self.cache.stats.peak_bytes < 4 * bound

    def teardown(self) -> None:
        if self.cache is not None:
            self.fc.close()
            self.fp.close()
        shutil.rmtree(self.dir, ignore_errors=True)


LoopCacheMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=12, deadline=None
)
test_loop_cache_equals_the_uncached_sequence = LoopCacheMachine.TestCase


def test_cache_moves_only_released_and_new_items(tmp_path):
    path = tmp_path / "f.bin"
    np.arange(1000, dtype=np.int64).tofile(path)
    with strataio.File.open(None, path, "r+") as f:
        a = strataio.IndexSchedule(MPI.COMM_SELF, np.arange(0, 800), 1000, 8)
        b = strataio.IndexSchedule(MPI.COMM_SELF, np.arange(100, 900), 1000, 8)
        cache = strataio.LoopCache(f, a, dtype=np.int64)
        assert cache.stats.items_read == 800
        vals = cache.advance(b, cache.values + 1)
        assert cache.stats.items_written == 100 and cache.stats.items_read == 900
        assert np.array_equal(vals[:700], np.arange(100, 800) + 1)
        assert np.array_equal(vals[700:], np.arange(800, 900))
        cache.flush(vals)
        assert cache.stats.items_written == 900
        tot = cache.totals()
        assert tot.storage_bytes_read == 900 * 8 and tot.storage_bytes_written == 900 * 8
    got = np.fromfile(path, dtype=np.int64)
    expect = np.arange(1000)
    expect[:800] += 1
    assert np.array_equal(got, expect)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_bad_input_on_one_rank_raises_on_every_rank(tmp_path, nprocs):
    """A bad dtype or schedule on one rank, or a next schedule built on another
    communicator (whose duplicates the cache's ranks never counted), raises a StrataError
    on every rank (no rank left waiting) before any byte is written."""
    from mpirun import run_mpi

    out = json.loads(run_mpi(nprocs, "loopcache_one_bad_rank.py", tmp_path).splitlines()[-1])
    assert out.pop("unchanged") is True
    assert out == {name: ["raised"] for name in out}
