"""The aggregator realm cache alone (strataio.collective.realm_cache): pages, LRU eviction,
write-back, invalidation and truncation against a bytearray oracle of the file."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from strataio.collective.driver import PosixDriver
from strataio.collective.realm_cache import PageGrid, RealmCache
from strataio.layout.extents import Extents
from strataio.storage.vectored import VectoredPlan

SPACE = 20_000  # bytes the machine's accesses stay within


def _file_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class CacheMachine(RuleBasedStateMachine):
    """A cache over a real file; the oracle is what the file holds once everything is written
    back. After every step: the file overlaid with the cached pages equals the oracle, and the
    cache holds at most its capacity."""

    def __init__(self) -> None:
        super().__init__()
        self.driver: PosixDriver | None = None

    @initialize(
        page=st.sampled_from([512, 1000, 4096]),
        stripe=st.sampled_from([0, 1536, 3000, 8192]),
        pages=st.sampled_from([1, 3, 64]),
        seed=st.integers(0, 2**16),
    )
    def setup(self, page: int, stripe: int, pages: int, seed: int) -> None:
        import tempfile

        fd, self.path = tempfile.mkstemp(prefix="realm-cache-")
        os.close(fd)
        self.driver = PosixDriver.open(self.path, os.O_RDWR)
        self.capacity = pages * page
        self.cache = RealmCache(self.driver, self.capacity, page=page, stripe=stripe)
        self.oracle = bytearray()
        self.rng = np.random.default_rng(seed)

    def teardown(self) -> None:
        if self.driver is not None:
            self.driver.close()
            os.unlink(self.path)

    def _expect(self, off: int, n: int) -> bytes:
        got = bytes(self.oracle[off : off + n])
        return got + bytes(n - len(got))

    @rule(off=st.integers(0, SPACE), n=st.integers(1, 5000))
    def write(self, off: int, n: int) -> None:
        data = self.rng.integers(0, 256, n, dtype=np.uint8)
        self.cache.pwrite(data, off)
        if len(self.oracle) < off + n:
            self.oracle.extend(bytes(off + n - len(self.oracle)))
        self.oracle[off : off + n] = data.tobytes()

    @rule(off=st.integers(0, SPACE), n=st.integers(1, 5000))
    def read(self, off: int, n: int) -> None:
        buf = np.zeros(n, dtype=np.uint8)
        assert self.cache.pread(buf, off) == n
        assert buf.tobytes() == self._expect(off, n)

    @rule(data=st.data())
    def pieces(self, data: st.DataObject) -> None:
        """Several pieces at once (a vectored write, then a vectored read of other pieces)."""
        cuts = sorted(set(data.draw(st.lists(st.integers(0, SPACE), min_size=2, max_size=12))))
        off = np.array(cuts[:-1:2], dtype=np.int64)
        ends = np.array(cuts[1::2], dtype=np.int64)[: off.size]
        off = off[: ends.size]
        length = ends - off
        if not off.size:
            return
        payload = self.rng.integers(0, 256, int(length.sum()), dtype=np.uint8)
        at = np.concatenate(([0], np.cumsum(length)[:-1]))
        if data.draw(st.booleans()):
            self.cache.writev(VectoredPlan(off, length, at), payload)
            for o, n, a in zip(off.tolist(), length.tolist(), at.tolist()):
                if len(self.oracle) < o + n:
                    self.oracle.extend(bytes(o + n - len(self.oracle)))
                self.oracle[o : o + n] = payload[a : a + n].tobytes()
        else:
            buf = np.zeros(payload.size, dtype=np.uint8)
            self.cache.readv(VectoredPlan(off, length, at), buf)
            for o, n, a in zip(off.tolist(), length.tolist(), at.tolist()):
                assert buf[a : a + n].tobytes() == self._expect(o, n)

    @rule()
    def flush(self) -> None:
        self.cache.flush()
        disk = _file_bytes(self.path)
        assert disk == bytes(self.oracle[: len(disk)])
        assert len(disk) <= len(self.oracle)

    @rule(off=st.integers(0, SPACE), n=st.integers(1, 6000), drop=st.booleans())
    def clean_range(self, off: int, n: int, drop: bool) -> None:
        """What an independent call does to the pages it touches."""
        runs = Extents.single(off, n)
        (self.cache.invalidate if drop else self.cache.flush)(runs)
        disk = _file_bytes(self.path)
        end = min(off + n, len(disk))
        assert disk[off:end] == bytes(self.oracle[off:end])
        if drop:
            grid = self.cache.grid
            pages = self.cache.mem.slot_page
            start, plen = grid.bounds(np.maximum(pages, 0))
            touching = (pages >= 0) & (start < off + n) & (start + plen > off)
            assert not touching.any()

    @rule(size=st.integers(0, SPACE + 5000))
    def truncate(self, size: int) -> None:
        self.cache.truncate(size)
        del self.oracle[size:]
        self.oracle.extend(bytes(size - len(self.oracle)))

    @invariant()
    def cache_over_file_is_the_oracle(self) -> None:
        if self.driver is None:
            return
        cache = self.cache
        mem = cache.mem
        assert mem.arena.size <= self.capacity
        assert cache.cached <= mem.slot_page.size
        view = bytearray(_file_bytes(self.path))
        held = np.flatnonzero(mem.slot_page >= 0)
        assert np.unique(mem.slot_page[held]).size == held.size  # a page in one slot only
        start, plen = cache.grid.bounds(mem.slot_page[held])
        top = max([len(view), len(self.oracle)] + (start + plen).tolist())
        view.extend(bytes(top - len(view)))
        for s, o, n in zip(held.tolist(), start.tolist(), plen.tolist()):
            lo, hi = int(mem.dirty_lo[s]), int(mem.dirty_hi[s])
            assert 0 <= lo <= hi <= n
            view[o : o + n] = mem.arena[s * mem.slot : s * mem.slot + n].tobytes()
        want = bytes(self.oracle) + bytes(top - len(self.oracle))
        assert bytes(view) == want


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("stripe", [0, 3000])
def test_grid_pages_stay_inside_stripes(stripe: int) -> None:
    grid = PageGrid(1024, stripe)
    offsets = np.arange(0, 20_000, dtype=np.int64)
    pages = grid.page_of(offsets)
    start, plen = grid.bounds(pages)
    assert ((start <= offsets) & (offsets < start + plen)).all()
    assert (np.diff(pages) >= 0).all()
    if stripe:
        assert ((start // stripe) == ((start + plen - 1) // stripe)).all()


def test_eviction_writes_back_and_counts(tmp_path) -> None:
    path = str(tmp_path / "f")
    open(path, "wb").close()
    driver = PosixDriver.open(path, os.O_RDWR)
    cache = RealmCache(driver, 2 * 1024, page=1024)
    data = np.arange(4096, dtype=np.int64).astype(np.uint8)
    cache.pwrite(data[:2048], 0)  # two whole pages: nothing read, nothing written
    assert (cache.bytes_read, cache.bytes_written) == (0, 0)
    assert os.path.getsize(path) == 0
    cache.pwrite(data[2048:3072], 2048)  # evicts page 0
    assert cache.bytes_written == 1024
    assert _file_bytes(path) == data[:1024].tobytes()
    buf = np.zeros(1024, dtype=np.uint8)
    cache.pread(buf, 2048)  # a hit
    assert cache.bytes_read == 0 and (buf == data[2048:3072]).all()
    cache.close()
    assert _file_bytes(path) == data[:3072].tobytes()
