"""The aggregator realm cache alone (strataio.collective.realm_cache): pages, LRU eviction,
write-back, invalidation and truncation against a bytearray oracle of the file."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from mpi4py import MPI

import strataio
from mpirun import run_mpi
from strataio.collective.driver import LayeredDriver, PosixDriver
from strataio.collective.realm_cache import PageGrid, RealmCache
from strataio.errors import HintError, StrataError
from strataio.layout.extents import Extents
from strataio.storage.vectored import VectoredPlan

SPACE = 20_000  # bytes the machine's accesses stay within


def _file_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class FailingDriver(LayeredDriver):
    """``inner`` whose data calls all fail, as a disk with an I/O error."""

    def readv(self, plan: VectoredPlan, buf: np.ndarray) -> None:
        raise OSError(5, "injected I/O error")

    writev = readv

    def pread(self, buf: np.ndarray, offset: int) -> int:
        raise OSError(5, "injected I/O error")

    def pwrite(self, buf: np.ndarray, offset: int) -> None:
        raise OSError(5, "injected I/O error")


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
        self.cache = self._cache(page, stripe)
        self.oracle = bytearray()
        self.rng = np.random.default_rng(seed)

    def _cache(self, page: int, stripe: int) -> RealmCache:
        """The cache under test, of :attr:`capacity` bytes over :attr:`driver`."""
        return RealmCache(self.driver, self.capacity, page=page, stripe=stripe)

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
    def write_failing(self, off: int, n: int) -> None:
        """A write while the file fails every read and write (pages it needs read in, or
        evicted): each byte of the range is then its old or its new value, every other byte
        as it was."""
        old = self._expect(off, n)
        data = self.rng.integers(0, 256, n, dtype=np.uint8)
        self.cache.inner = FailingDriver(self.driver)
        try:
            self.cache.pwrite(data, off)
        except OSError:
            pass
        finally:
            self.cache.inner = self.driver
        got = np.frombuffer(self._over_file(off + n)[off : off + n], dtype=np.uint8)
        assert ((got == data) | (got == np.frombuffer(old, dtype=np.uint8))).all()
        if len(self.oracle) < off + n:
            self.oracle.extend(bytes(off + n - len(self.oracle)))
        self.oracle[off : off + n] = got.tobytes()

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

    @rule(off=st.integers(0, SPACE), n=st.integers(1, 5000))
    def another_writer_after_a_sync(self, off: int, n: int) -> None:
        """``File.sync``'s step (every page written back and forgotten), then another
        process's write to the file: what the cache reads next is that write."""
        self.cache.invalidate()
        assert not (self.cache.mem.slot_page >= 0).any()
        data = self.rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        with open(self.path, "r+b") as f:
            f.seek(off)
            f.write(data)
        if len(self.oracle) < off + n:
            self.oracle.extend(bytes(off + n - len(self.oracle)))
        self.oracle[off : off + n] = data

    @rule(size=st.integers(0, SPACE + 5000))
    def truncate(self, size: int) -> None:
        self.cache.truncate(size)
        del self.oracle[size:]
        self.oracle.extend(bytes(size - len(self.oracle)))

    def _over_file(self, least: int = 0) -> bytearray:
        """The file overlaid with the cached pages (at least ``least`` bytes, zeros past the
        file's end)."""
        mem = self.cache.mem
        view = bytearray(_file_bytes(self.path))
        held = np.flatnonzero(mem.slot_page >= 0)
        assert np.unique(mem.slot_page[held]).size == held.size  # a page in one slot only
        start, plen = self.cache.grid.bounds(mem.slot_page[held])
        top = max([len(view), len(self.oracle), least] + (start + plen).tolist())
        view.extend(bytes(top - len(view)))
        for s, o, n in zip(held.tolist(), start.tolist(), plen.tolist()):
            lo, hi = int(mem.dirty_lo[s]), int(mem.dirty_hi[s])
            assert 0 <= lo <= hi <= n
            view[o : o + n] = mem.arena[s * mem.slot : s * mem.slot + n].tobytes()
        return view

    @invariant()
    def cache_over_file_is_the_oracle(self) -> None:
        if self.driver is None:
            return
        cache = self.cache
        mem = cache.mem
        assert mem.buffer.size <= self.capacity  # (page table included)
        assert cache.cached <= mem.slot_page.size
        view = self._over_file()
        want = bytes(self.oracle) + bytes(len(view) - len(self.oracle))
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
    cache = RealmCache(driver, 16 * (1024 + 24) + 80, page=1024)  # (+ the page table)
    assert (cache.mem.slot, cache.mem.slot_page.size) == (1024, 16)
    data = np.arange(20 * 1024, dtype=np.int64).astype(np.uint8)
    cache.pwrite(data[: 16 * 1024], 0)  # sixteen whole pages: nothing read, nothing written
    assert (cache.bytes_read, cache.bytes_written) == (0, 0)
    assert os.path.getsize(path) == 0
    buf = np.zeros(1024, dtype=np.uint8)
    cache.pread(buf, 1024)  # a hit: page 1 is now more recent than page 0
    assert cache.bytes_read == 0 and (buf == data[1024:2048]).all()
    cache.pwrite(data[16 * 1024 : 17 * 1024], 16 * 1024)  # evicts page 0, the least recent
    assert cache.bytes_written == 1024
    assert _file_bytes(path) == data[:1024].tobytes()
    cache.pwrite(data[17 * 1024 : 17 * 1024 + 10], 17 * 1024)  # a partial page: read first
    assert cache.bytes_read == 1024 and cache.bytes_written == 2048  # (page 2 went)
    cache.close()
    assert _file_bytes(path) == data[: 17 * 1024 + 10].tobytes()


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_realm_cache_matches_romio(nprocs: int, tmp_path) -> None:
    """Every persistent realm policy with cache sizes 0, small (evicting) and large, on random
    sequences of collective and independent calls, against ROMIO's default path; Figure 3.1;
    and the cache really holding writes until sync and serving reads."""
    out = run_mpi(nprocs, "realm_cache_vs_romio.py", "--dir", tmp_path, "--cases", 2, timeout=240)
    assert "ok 24 cases" in out, out


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_sync_forgets_cached_pages_so_other_writers_are_seen(nprocs: int, tmp_path) -> None:
    """Bytes another process writes between two syncs are read back afterwards, and a later
    collective write into the same pages leaves them in the file (no stale page written back);
    a file another process cuts between two syncs shows its new size, and reads end there."""
    out = run_mpi(nprocs, "realm_cache_sync.py", tmp_path, timeout=120)
    assert json.loads(out.strip().splitlines()[-1]) == {
        "stale": [0] * nprocs,
        "lost": 0,
        "size": [2048] * nprocs,
        "counts": [2048] + [0] * (nprocs - 1),
    }


def test_realm_cache_hint() -> None:
    from strataio.collective.hints import PLANNED, parse_hints

    assert "strataio_cache" not in PLANNED
    assert parse_hints({"strataio_realm_cache": "4096"}).strataio_realm_cache == 4096
    for bad in ("-1", "100"):
        with pytest.raises(HintError):
            parse_hints({"strataio_realm_cache": bad})
    # chosen at open (its window is made then): a view's hints leave it as it is
    later = parse_hints({"strataio_realm_cache": "4096"}, base=parse_hints({}))
    assert later.strataio_realm_cache == parse_hints({}).strataio_realm_cache


def test_realm_cache_only_with_persistent_realms(tmp_path) -> None:
    path = tmp_path / "f"
    with strataio.File.open(None, path, "w", {"strataio_realm_cache": "4096"}) as f:
        assert f.hints["strataio_realm_cache"] == "0"
        f.write_at_all(0, np.ones(100, np.uint8))
        assert f.realm_cache is None
    hints = {"romio_cb_pfr": "enable", "strataio_realm_cache": "4096", "romio_cb_write": "enable"}
    with strataio.File.open(None, path, "r+", hints) as f:
        assert f.hints["strataio_realm_cache"] == "4096"
        f.write_at_all(0, np.full(100, 7, np.uint8))
        assert f.realm_cache is not None and f.realm_cache.cached
        assert os.path.getsize(path) == 100 and _file_bytes(str(path))[:1] == b"\x01"
        f.sync()
        assert _file_bytes(str(path)) == bytes([7]) * 100


@pytest.mark.mpi
def test_write_back_waits_for_a_sieving_write_over_it(tmp_path):
    """Cached bytes written back while another rank's sieving write spans them (read, not yet
    written) survive it: the write-back takes the span's lock."""
    assert run_mpi(2, "realm_cache_sieving_race.py", tmp_path).strip().endswith("ok")


def test_realms_retired_keep_a_cache_that_failed_to_write_back(tmp_path) -> None:
    """Dynamic realms retire at a new view, writing their cache back first: when that fails
    the call raises and the cache keeps its dirty pages, written at the next retirement
    (here the next collective call) instead of forgotten."""
    path = tmp_path / "f"
    hints = {"romio_cb_pfr": "enable", "romio_cb_fr_types": "4096", "strataio_realms": "dynamic",
             "romio_cb_write": "enable", "strataio_realm_cache": "65536"}  # fmt: skip
    with strataio.File.open(None, path, "w", hints) as f:
        f.write_at_all(0, np.full(4096, 7, np.uint8))  # cached, dirty
        cache = f.realm_cache
        assert cache is not None and not cache.bytes_written
        every_other = MPI.BYTE.Create_vector(2, 1, 2).Commit()
        f.set_view(0, MPI.BYTE, every_other)
        cache.inner = FailingDriver(f.driver)
        with pytest.raises(StrataError, match="injected"):
            f.write_at_all(10_000, np.full(2, 9, np.uint8))
        cache.inner = f.driver
        f.set_view(0, MPI.BYTE, MPI.BYTE)
        f.write_at_all(20_000, np.full(2, 9, np.uint8))
        every_other.Free()
    got = np.fromfile(path, np.uint8)
    assert (got[:4096] == 7).all()
    assert (got[20_000:20_002] == 9).all()


def test_set_size_that_fails_to_write_back_loses_no_cached_byte(tmp_path) -> None:
    """A set_size whose write-back of the realm cache fails raises and leaves the file as it
    was: the cached bytes past the size asked for are still written at close."""
    path = tmp_path / "f"
    hints = {"romio_cb_pfr": "enable", "romio_cb_fr_types": "4096", "romio_cb_write": "enable",
             "romio_cb_read": "enable", "strataio_realm_cache": "65536"}  # fmt: skip
    with strataio.File.open(None, path, "w", hints) as f:
        f.write_at_all(0, np.full(8192, 7, np.uint8))  # cached, dirty
        cache = f.realm_cache
        assert cache is not None and not cache.bytes_written
        cache.inner = FailingDriver(f.driver)
        with pytest.raises(StrataError, match="injected"):
            f.set_size(4096)
        cache.inner = f.driver
        assert f.get_size() == 8192
        back = np.zeros(8192, np.uint8)
        f.read_at_all(0, back)
        assert (back == 7).all()
    assert _file_bytes(str(path)) == bytes([7]) * 8192
