"""Storage drivers of strataio.File: the POSIX driver and the shaped one (a cost model around it).

Oracles: a bytearray model of the file (both drivers, a stateful property test), the cost
model's own formula (the shaped driver's accounted time), the wall clock with generous bounds,
and the bytes a POSIX-driven File writes.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from mpi4py import MPI

import strataio
from strataio.collective import driver as driver_module
from strataio.collective.driver import Driver, PosixDriver, ShapedDriver, open_driver
from strataio.collective.hints import PER_RANK, parse_hints
from strataio.errors import HintError
from strataio.storage import preallocate
from strataio.storage.vectored import VectoredPlan

SIZE = 4096


class DriverMachine(RuleBasedStateMachine):
    """Any sequence of driver calls leaves the file as a bytearray model says."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.model = bytearray()
        self.driver: Driver | None = None

    @initialize(shaped=st.booleans(), threads=st.integers(1, 3), prealloc=st.booleans())
    def open(self, shaped: bool, threads: int, prealloc: bool) -> None:
        path = os.path.join(self.dir.name, "f")
        posix = PosixDriver.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        # reads of any size shared among ``threads`` threads (a rank with spare cores), and
        # with ``prealloc`` every extending write that fills its span preallocated first
        self._split_bytes = driver_module.SPLIT_READ_BYTES
        self._prealloc_bytes = driver_module.PREALLOCATE_BYTES
        driver_module.SPLIT_READ_BYTES = driver_module.PREALLOCATE_BYTES = 1
        posix.threads = threads
        posix.preallocate(prealloc)
        self.driver = ShapedDriver.with_rate(posix, 1e6, 0.01, time_scale=0) if shaped else posix

    @rule(data=st.data(), n=st.integers(1, 6))
    def writev(self, data: st.DataObject, n: int) -> None:
        cuts = sorted(data.draw(st.sets(st.integers(0, SIZE), min_size=2 * n, max_size=2 * n)))
        off = np.array(cuts[0::2], dtype=np.int64)
        lens = np.array(cuts[1::2], dtype=np.int64) - off
        mem = np.cumsum(lens) - lens
        buf = np.frombuffer(
            data.draw(st.binary(min_size=int(lens.sum()), max_size=int(lens.sum()))), np.uint8
        )
        self.driver.writev(VectoredPlan(off, lens, mem), buf)
        for o, n_, m in zip(off.tolist(), lens.tolist(), mem.tolist()):
            self._put(o, bytes(buf[m : m + n_]))

    @rule(offset=st.integers(0, SIZE), payload=st.binary(max_size=300))
    def pwrite(self, offset: int, payload: bytes) -> None:
        self.driver.pwrite(np.frombuffer(payload, np.uint8), offset)
        self._put(offset, payload)

    @rule(size=st.integers(0, SIZE + 100))
    def truncate(self, size: int) -> None:
        self.driver.truncate(size)
        self.model = self.model[:size] + bytes(max(0, size - len(self.model)))

    @rule(offset=st.integers(0, SIZE + 100), n=st.integers(1, 400), hole=st.integers(0, 64))
    def readv(self, offset: int, n: int, hole: int) -> None:
        # two pieces with a hole between them, read through when short enough
        off = np.array([offset, offset + n + hole], dtype=np.int64)
        lens = np.array([n, n], dtype=np.int64)
        buf = np.full(2 * n, 7, np.uint8)
        self.driver.readv(VectoredPlan(off, lens, np.array([0, n]), max_hole=hole), buf)
        want = self._get(offset, n) + self._get(offset + n + hole, n)
        assert buf.tobytes() == want

    @rule(data=st.data(), n=st.integers(1, 6))
    def readv_pieces(self, data: st.DataObject, n: int) -> None:
        # pieces in any file order, past the end too, into a buffer in another order
        off = np.array(data.draw(st.lists(st.integers(0, SIZE + 100), min_size=n, max_size=n)))
        lens = np.array(data.draw(st.lists(st.integers(1, 300), min_size=n, max_size=n)))
        mem = np.cumsum(lens[::-1])[::-1] - lens
        buf = np.full(int(lens.sum()), 7, np.uint8)
        self.driver.readv(VectoredPlan(off, lens, mem), buf)
        for o, n_, m in zip(off.tolist(), lens.tolist(), mem.tolist()):
            assert buf[m : m + n_].tobytes() == self._get(o, n_)

    @rule(offset=st.integers(0, SIZE + 100), n=st.integers(1, 400))
    def pread(self, offset: int, n: int) -> None:
        buf = np.zeros(n, np.uint8)
        got = self.driver.pread(buf, offset)
        assert got == max(0, min(n, len(self.model) - offset))
        assert buf[:got].tobytes() == bytes(self.model[offset : offset + got])

    @rule(lo=st.integers(0, SIZE), n=st.integers(1, 100), shared=st.booleans())
    def lock(self, lo: int, n: int, shared: bool) -> None:
        self.driver.lock(lo, n, shared)
        self.driver.unlock(lo, n)

    @invariant()
    def file_agrees(self) -> None:
        if self.driver is not None:
            assert self.driver.size() == len(self.model)
            with open(os.path.join(self.dir.name, "f"), "rb") as f:
                assert f.read() == bytes(self.model)

    def _put(self, offset: int, payload: bytes) -> None:
        if not payload:
            return
        if len(self.model) < offset:
            self.model += bytes(offset - len(self.model))
        self.model[offset : offset + len(payload)] = payload

    def _get(self, offset: int, n: int) -> bytes:
        part = bytes(self.model[offset : offset + n])
        return part + bytes(n - len(part))  # zeros past end-of-file

    def teardown(self) -> None:
        if self.driver is not None:
            self.driver.sync()
            self.driver.close()
            driver_module.SPLIT_READ_BYTES = self._split_bytes
            driver_module.PREALLOCATE_BYTES = self._prealloc_bytes
        self.dir.cleanup()


TestDriverMachine = DriverMachine.TestCase
TestDriverMachine.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


def test_shaped_driver_accounts_the_model(tmp_path: Path) -> None:
    """Each data call costs latency x system calls + bytes / bandwidth, by the model's clock."""
    posix = PosixDriver.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT)
    d = ShapedDriver.with_rate(posix, bandwidth=1e6, latency=0.002, time_scale=0)
    d.pwrite(np.ones(5000, np.uint8), 0)  # 1 call, 5000 bytes
    assert d.accounted == pytest.approx(0.002 + 0.005)
    plan = VectoredPlan(np.array([0, 3000]), np.array([1000, 1000]), np.array([0, 1000]))
    assert plan.calls == 2
    d.readv(plan, np.empty(2000, np.uint8))  # 2 calls, 2000 bytes
    assert d.accounted == pytest.approx(0.007 + 2 * 0.002 + 0.002)
    crossing = VectoredPlan(np.array([0, 3000]), np.array([1000, 1000]), np.array([0, 1000]), 2000)
    d.readv(crossing, np.empty(2000, np.uint8))  # 1 call through the 2000-byte hole
    assert d.accounted == pytest.approx(0.013 + 0.002 + 0.004)
    assert (d.calls, d.bytes) == (3, 5000 + 2000 + 4000)
    d.close()


def test_shaped_driver_takes_the_models_time(tmp_path: Path) -> None:
    posix = PosixDriver.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT)
    d = ShapedDriver.with_rate(posix, bandwidth=20e6, latency=0.01)  # 1 MB: 50 ms + 10 ms
    t0 = time.perf_counter()
    d.pwrite(np.ones(1_000_000, np.uint8), 0)
    took = time.perf_counter() - t0
    assert d.accounted == pytest.approx(0.06)
    assert 0.06 <= took < 0.06 + 1.0  # (generous: a loaded machine only adds time)
    d.close()


@pytest.mark.parametrize(("concurrency", "serial"), [(1, True), (None, False)])
def test_shaped_driver_concurrency(tmp_path: Path, concurrency: int | None, serial: bool) -> None:
    """With concurrency 1 two threads' calls queue; without a limit they overlap."""
    (tmp_path / "f").write_bytes(bytes(100))
    posix = PosixDriver.open(str(tmp_path / "f"), os.O_RDWR)
    d = ShapedDriver.with_rate(posix, bandwidth=1e9, latency=0.25, concurrency=concurrency)
    threads = [threading.Thread(target=d.pread, args=(np.empty(10, np.uint8), 0)) for _ in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    assert d.accounted == pytest.approx(0.5, rel=1e-6)
    assert took >= 0.5 if serial else 0.25 <= took < 0.45  # (generous: load only adds time)
    d.close()


def test_open_driver_by_hint(tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    flags = os.O_RDWR | os.O_CREAT
    plain = open_driver(path, flags, hints=parse_hints(None))
    assert type(plain) is PosixDriver and plain.read_write
    plain.close()
    hints = parse_hints(
        {
            "strataio_driver": "shaped",
            "strataio_driver_bandwidth": "1000",
            "strataio_driver_concurrency": "2",
        }
    )
    shaped = open_driver(path, flags, hints=hints)
    assert isinstance(shaped, ShapedDriver) and shaped.time_scale == 1.0
    assert shaped.model.read.bandwidth == 1000
    shaped.close()
    with pytest.raises(HintError, match="bandwidth"):
        ShapedDriver.with_rate(PosixDriver.open(path, os.O_RDONLY), 0)


def _fs_magic(path: Path) -> int | None:
    """The file system type of ``path`` as ``stat -f`` reports it (an oracle independent of
    strataio's ``fstatfs``), or None without GNU stat."""
    try:
        out = subprocess.run(["stat", "-f", "-c", "%t", str(path)], capture_output=True, text=True)
    except OSError:
        return None
    return int(out.stdout, 16) if out.returncode == 0 else None


def test_preallocation_follows_the_hint(tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    flags = os.O_RDWR | os.O_CREAT
    for value, want in (("enable", True), ("disable", False)):
        d = open_driver(path, flags, hints=parse_hints({"strataio_preallocate": value}))
        assert d.preallocates is want
        d.close()
    d = open_driver(path, flags, hints=parse_hints(None))  # automatic: by file system
    assert d.preallocates is preallocate.file_system_preallocates(d.fd)
    if _fs_magic(tmp_path) is not None:
        assert d.preallocates is (_fs_magic(tmp_path) == 0xEF53)
    d.close()
    # a file opened to read only never allocates; a shaped driver shows its file's setting
    d = open_driver(path, os.O_RDONLY, hints=parse_hints({"strataio_preallocate": "enable"}))
    assert d.preallocates is False
    d.close()
    hints = {"strataio_preallocate": "enable", "strataio_driver": "shaped"}
    d = open_driver(path, flags, hints=parse_hints(hints))
    assert d.preallocates is True
    d.close()
    with pytest.raises(HintError, match="strataio_preallocate"):
        parse_hints({"strataio_preallocate": "sometimes"})
    # (it shapes one rank's own writes: ranks may differ, and a view cannot change it)
    assert "strataio_preallocate" in PER_RANK
    base = parse_hints({"strataio_preallocate": "disable"})
    assert parse_hints({"strataio_preallocate": "enable"}, base=base).strataio_preallocate == (
        "disable"
    )


def test_preallocation_of_extending_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which writes allocate first, and what: the part past the known end of a write that
    fills its span and is large enough; never a rewrite, a small write or a sparse one."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(
        driver_module, "allocate", lambda fd, off, n: calls.append((off, n)) or True
    )
    big = driver_module.PREALLOCATE_BYTES
    d = PosixDriver.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT)
    d.preallocate()
    data = np.arange(4 * big, dtype=np.uint64).view(np.uint8)[: 4 * big]
    d.pwrite(data[:big], 0)  # a new file: all of it
    d.pwrite(data[:big], 0)  # a rewrite: nothing
    d.pwrite(data[: big // 2], big)  # too small
    d.pwrite(data[: 2 * big], big)  # only what lies past the end known (1.5 big)
    assert calls == [(0, big), (big + big // 2, big + big // 2)]
    calls.clear()
    # vectored: pieces filling 3/4 of their span are allocated with the hole between them ...
    off = np.array([4 * big, 7 * big], dtype=np.int64)
    lens = np.array([2 * big, big], dtype=np.int64)
    d.writev(VectoredPlan(off, lens, np.array([0, 2 * big])), data)
    assert calls == [(4 * big, 4 * big)]
    calls.clear()
    # ... pieces filling less are not (the holes would be allocated too)
    off = np.array([9 * big, 11 * big], dtype=np.int64)
    lens = np.array([big, big + big // 2], dtype=np.int64)
    d.writev(VectoredPlan(off, lens, np.array([0, big])), data)
    off = np.array([16 * big, 24 * big], dtype=np.int64)
    lens = np.array([big, big], dtype=np.int64)
    d.writev(VectoredPlan(off, lens, np.array([0, big])), data)
    assert calls == []
    # after a cut, writes past the new end allocate again
    d.truncate(big)
    d.pwrite(data[:big], big)
    assert calls == [(big, big)]
    d.close()
    with open(tmp_path / "f", "rb") as f:
        assert f.read() == data[:big].tobytes() * 2


def test_preallocation_starts_at_the_files_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes another writer put in the file since are not allocated again, however far
    behind this driver's own record of the end is."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(
        driver_module, "allocate", lambda fd, off, n: calls.append((off, n)) or True
    )
    big = driver_module.PREALLOCATE_BYTES
    path = tmp_path / "f"
    d = PosixDriver.open(str(path), os.O_RDWR | os.O_CREAT)
    d.preallocate()
    other = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(other, bytes(2 * big), 0)  # (another rank's write)
        d.pwrite(np.ones(3 * big, np.uint8), 0)
        assert calls == [(2 * big, big)]
        os.pwrite(other, bytes(big), 5 * big)
        d.pwrite(np.ones(2 * big, np.uint8), 3 * big)  # all below the file's end now
        assert calls == [(2 * big, big)]
    finally:
        os.close(other)
        d.close()
    assert path.read_bytes() == bytes([1]) * 5 * big + bytes(big)


def test_a_refusal_turns_preallocation_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(driver_module, "allocate", lambda fd, off, n: calls.append(off) and False)
    big = driver_module.PREALLOCATE_BYTES
    d = PosixDriver.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT)
    d.preallocate()
    data = np.full(big, 5, np.uint8)
    d.pwrite(data, 0)
    d.pwrite(data, big)
    assert calls == [0] and not d.preallocates
    assert d.size() == 2 * big
    d.close()


def test_allocate_keeps_the_size(tmp_path: Path) -> None:
    """The real call: space allocated (as ``st_blocks`` shows) past the end, size unchanged,
    and the bytes already there kept."""
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    fd = os.open(path, os.O_RDWR)
    try:
        if not preallocate.allocate(fd, 0, 1 << 20):
            pytest.skip("this file system does not preallocate")
        st_ = os.fstat(fd)
        assert st_.st_size == 3 and st_.st_blocks * 512 >= 1 << 20
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abc"
    shm = Path("/dev/shm")
    if _fs_magic(shm) == 0x01021994:  # tmpfs: measured slower, never automatic
        with tempfile.NamedTemporaryFile(dir=shm) as f:
            assert not preallocate.file_system_preallocates(f.fileno())


def test_file_on_a_200_mb_per_s_tier(tmp_path: Path) -> None:
    """strataio.File on the shaped driver: the bytes a POSIX-driven File writes, and the time
    the model gives for them (8 MiB at 200 MB/s, 1 ms per call: about 43 ms)."""
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 8 << 20, dtype=np.uint8)
    hints = {
        "strataio_driver": "shaped",
        "strataio_driver_bandwidth": "200000000",
        "strataio_driver_latency": "0.001",
        "strataio_driver_time_scale": "0",
    }
    with strataio.File.open(None, tmp_path / "shaped.bin", "w", hints=hints) as f:
        assert isinstance(f.driver, ShapedDriver)
        assert f.hints["strataio_driver"] == "shaped"
        f.write_all(data)
        written = f.driver.accounted
        assert written == pytest.approx(0.001 * f.driver.calls + data.size / 200e6)
        view = MPI.BYTE.Create_vector(1024, 1024, 2048).Commit()  # every other KiB
        f.set_view(0, MPI.BYTE, view)
        back = np.zeros(1 << 20, np.uint8)
        f.read_all(back)
        view.Free()
        assert f.driver.accounted > written
    with strataio.File.open(None, tmp_path / "posix.bin", "w") as f:
        assert type(f.driver) is PosixDriver
        f.write_all(data)
    assert (tmp_path / "shaped.bin").read_bytes() == (tmp_path / "posix.bin").read_bytes()
    want = data[: 2 << 20].reshape(1024, 2048)[:, :1024].ravel()
    assert np.array_equal(back, want)


def test_work_shared_from_a_read_thread_runs_there() -> None:
    """Shares that share their work again (a staged batch whose read is large enough to be
    split) finish: the read threads never wait for one another. The first error is raised
    once every share is done."""
    done: list[tuple[int, int]] = []
    lock = threading.Lock()

    def share(i: int) -> None:
        def part(j: int) -> None:
            time.sleep(0.01)
            with lock:
                done.append((i, j))

        driver_module.run_shared([lambda j=j: part(j) for j in range(3)])

    outer = threading.Thread(
        target=driver_module.run_shared, args=([lambda i=i: share(i) for i in range(4)],)
    )
    outer.start()
    outer.join(timeout=30)
    assert not outer.is_alive(), "shared reads waited for each other"
    assert sorted(done) == [(i, j) for i in range(4) for j in range(3)]

    def fail(k: int) -> None:
        with lock:
            done.append((k, -1))
        raise ValueError(f"share {k}")

    done.clear()
    with pytest.raises(ValueError, match="share 0"):
        driver_module.run_shared([lambda k=k: fail(k) for k in range(4)])
    assert sorted(done) == [(k, -1) for k in range(4)]
