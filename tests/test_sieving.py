"""Independent noncontiguous I/O (direct and data sieving) on real files.

Oracles: numpy fancy indexing of the file's bytes; ROMIO's independent I/O through a file view
(mpi4py ``MPI.File``); and, under ``mpiexec -n 4``, concurrent sieving writers compared with
ROMIO's (``tests/mpi_scripts/sieving_concurrent.py``).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from mpirun import run_mpi
from strataio.collective import sieving
from strataio.collective.access import Access
from strataio.collective.driver import PosixDriver
from strataio.collective.hints import parse_hints
from strataio.collective.independent import IndependentIO
from strataio.errors import BackendError, ShapeMismatchError, StrataError
from strataio.layout.datatypes import flatten_count
from strataio.layout.extents import Extents

FILE_BYTES = 6000
MODES = ["direct", "enable", "automatic", "disable", "tight"]


@st.composite
def accesses(draw: st.DrawFn, disjoint: bool) -> Extents:
    """Pieces in random order with a random stream order; disjoint ones for writes, possibly
    overlapping (and reaching past end-of-file) for reads."""
    n = draw(st.integers(1, 40))
    if disjoint:
        cuts = sorted(draw(st.sets(st.integers(1, FILE_BYTES - 1), min_size=n, max_size=n)))
        starts = np.array([0, *cuts])[:-1]
        ends = np.array(cuts)
        lens = np.minimum(ends - starts, draw(st.integers(1, 700)))
        keep = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        keep[0] = True
        offs, lens = starts[keep], lens[keep]
    else:
        offs = np.array(draw(st.lists(st.integers(0, FILE_BYTES + 200), min_size=n, max_size=n)))
        lens = np.array(draw(st.lists(st.integers(0, 300), min_size=n, max_size=n)))
    perm = np.array(draw(st.permutations(range(offs.size))))
    offs, lens = offs[perm], lens[perm]
    order = np.array(draw(st.permutations(range(offs.size))))
    mem = np.zeros(offs.size, dtype=np.int64)
    mem[order] = np.concatenate(([0], np.cumsum(lens[order])[:-1]))
    return Extents(offs, lens, mem)


def _drv(fd: int) -> PosixDriver:
    """A driver over a descriptor the test closes itself."""
    return PosixDriver(fd)


def _independent(fd: int, ext: Extents, buf: np.ndarray, hints: dict, write: bool) -> None:
    """The one independent route (what ``strataio.File`` runs), by the hints."""
    io = IndependentIO(parse_hints(hints))
    (io.write if write else io.read)(_drv(fd), Access(ext, buf))


def _run(mode: str, write: bool, fd: int, ext: Extents, buf: np.ndarray, bs: int) -> None:
    if mode == "direct":
        (sieving.write_direct if write else sieving.read_direct)(_drv(fd), ext, buf)
    elif mode == "tight":  # sieving with a small hole limit
        f = sieving.write_sieved if write else sieving.read_sieved
        f(_drv(fd), ext, buf, bs, max_hole=16)
    else:
        key = "ind_wr_buffer_size" if write else "ind_rd_buffer_size"
        _independent(
            fd, ext, buf, {f"romio_ds_{'write' if write else 'read'}": mode, key: bs}, write
        )


@pytest.fixture
def datafile(tmp_path: Path):
    rng = np.random.default_rng(5)
    initial = rng.integers(0, 256, FILE_BYTES, dtype=np.uint8)
    path = tmp_path / "data.bin"
    path.write_bytes(initial.tobytes())
    fd = os.open(path, os.O_RDWR)
    yield fd, initial, path
    os.close(fd)


def _stream_positions(ext: Extents) -> np.ndarray:
    """Buffer position of every byte of ``ext``, in the order of ``byte_indices``."""
    return Extents(ext.mem, ext.lengths).byte_indices()


def _reset(fd: int, initial: np.ndarray) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, initial.tobytes(), 0)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(accesses(disjoint=False), st.sampled_from(MODES), st.integers(8, 3000))
def test_reads_match_numpy(datafile, ext, mode, bs):
    fd, initial, _ = datafile
    padded = np.concatenate((initial, np.zeros(1000, np.uint8)))  # past EOF reads zeros
    buf = np.full(ext.nbytes + 7, 0xEE, dtype=np.uint8)
    _run(mode, False, fd, ext, buf, bs)
    pos = _stream_positions(ext)
    np.testing.assert_array_equal(buf[pos], padded[ext.byte_indices()])
    untouched = np.ones(buf.size, dtype=bool)
    untouched[pos] = False
    assert (buf[untouched] == 0xEE).all()


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(accesses(disjoint=True), st.sampled_from(MODES), st.integers(8, 3000))
def test_writes_match_numpy(datafile, ext, mode, bs):
    fd, initial, path = datafile
    _reset(fd, initial)
    data = np.random.default_rng(len(ext)).integers(0, 256, ext.nbytes, dtype=np.uint8)
    _run(mode, True, fd, ext, data, bs)
    want = initial.copy()
    want[ext.byte_indices()] = data[_stream_positions(ext)]
    got = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    np.testing.assert_array_equal(got, want)


SPARSE_BYTES = 1 << 17  # data in the first and third quarter, a hole between, EOF at 3/4


def _sparse_file(path: Path) -> np.ndarray:
    """A file whose middle is a hole (no blocks) and that ends before the bytes a test writes;
    returns its contents as they read, zero-extended to ``SPARSE_BYTES``."""
    rng = np.random.default_rng(11)
    quarter = SPARSE_BYTES // 4
    image = np.zeros(SPARSE_BYTES, dtype=np.uint8)
    image[:quarter] = rng.integers(1, 256, quarter, dtype=np.uint8)
    image[2 * quarter : 3 * quarter] = rng.integers(1, 256, quarter, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(image[:quarter].tobytes())
        f.seek(2 * quarter)
        f.write(image[2 * quarter : 3 * quarter].tobytes())
    return image


@st.composite
def wide_pieces(draw: st.DrawFn) -> Extents:
    """Disjoint pieces of 512 B to 4 KiB over the whole sparse file, in random stream order."""
    n = draw(st.integers(2, 60))
    starts = np.array(sorted(draw(st.sets(st.integers(0, SPARSE_BYTES // 512 - 9), min_size=n,
                                          max_size=n)))) * 512  # fmt: skip
    lens = np.minimum(np.diff(starts, append=SPARSE_BYTES), draw(st.integers(512, 4096)))
    order = np.array(draw(st.permutations(range(n))))
    mem = np.zeros(n, dtype=np.int64)
    mem[order] = np.concatenate(([0], np.cumsum(lens[order])[:-1]))
    return Extents(starts, lens, mem)


@settings(max_examples=40, deadline=None)
@given(wide_pieces(), st.sampled_from(["enable", "automatic"]), st.integers(4096, 1 << 16))
def test_sieving_writes_into_holes_and_past_eof_match_numpy(ext, mode, bs):
    """Read-modify-write spans over a file's hole and past its end: the file must read as the
    old bytes (zeros in the hole and past end-of-file) with the pieces applied, and no hole byte
    that a span rewrites may come back as anything but zero."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sparse.bin"
        image = _sparse_file(path)
        data = np.random.default_rng(len(ext)).integers(0, 256, ext.nbytes, dtype=np.uint8)
        fd = os.open(path, os.O_RDWR)
        try:
            _run(mode, True, fd, ext, data, bs)
        finally:
            os.close(fd)
        got = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        want = image.copy()
        want[ext.byte_indices()] = data[_stream_positions(ext)]
        want = want[: max(SPARSE_BYTES * 3 // 4, int(ext.ends.max()))]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("descending", [False, True])
def test_strided_pattern_round_trip(datafile, descending):
    fd, initial, path = datafile
    offs = np.arange(3, FILE_BYTES - 40, 50)
    if descending:
        offs = offs[::-1]
    ext = Extents(offs, np.full(offs.size, 20))
    buf = np.empty(ext.nbytes, np.uint8)
    sieving.read_sieved(_drv(fd), ext, buf, 1000)
    np.testing.assert_array_equal(buf, initial[ext.byte_indices()])
    data = (np.arange(ext.nbytes) % 251).astype(np.uint8)
    sieving.write_sieved(_drv(fd), ext, data, 1000)
    want = initial.copy()
    want[ext.byte_indices()] = data
    np.testing.assert_array_equal(np.frombuffer(path.read_bytes(), np.uint8), want)


def test_bad_access_raises_before_any_byte_moves(datafile):
    fd, initial, path = datafile
    ext = Extents([0, 100], [10, 10])
    with pytest.raises(ShapeMismatchError):
        sieving.write_sieved(_drv(fd), ext, np.zeros(15, np.uint8))
    with pytest.raises(StrataError, match="negative file offset"):
        sieving.write_direct(_drv(fd), Extents([-5, 100], [10, 10]), np.zeros(20, np.uint8))
    with pytest.raises(ValueError):
        sieving.read_sieved(_drv(fd), ext, b"\x00" * 20)  # read into a read-only buffer
    assert path.read_bytes() == initial.tobytes()


def test_automatic_skips_sieving_across_wide_holes(tmp_path):
    # A write-only descriptor cannot serve a read-modify-write, so it tells which path ran:
    # the cost model writes pieces 64 KiB apart directly; forced sieving is refused.
    path = tmp_path / "w.bin"
    path.write_bytes(bytes(1 << 20))
    ext = Extents(np.arange(8) * 65536, np.full(8, 100))
    data = np.arange(800, dtype=np.uint8)
    fd = os.open(path, os.O_WRONLY)
    try:
        _independent(fd, ext, data, {"romio_ds_write": "automatic"}, True)
        before = path.read_bytes()
        with pytest.raises(BackendError, match="read-write"):
            sieving.write_sieved(_drv(fd), ext, data[::-1].copy())
        assert path.read_bytes() == before  # refused before writing anything
        # by the hints, a write-only descriptor falls back to (locked) direct writes
        _independent(fd, ext, data[::-1].copy(), {"romio_ds_write": "enable"}, True)
        _independent(fd, ext, data, {"romio_ds_write": "enable"}, True)
        # a contiguous access is never sieved, whatever the hint
        sieving.write_sieved(_drv(fd), Extents([210, 205], [5, 5]), np.arange(10, dtype=np.uint8))
    finally:
        os.close(fd)
    got = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    np.testing.assert_array_equal(got[ext.byte_indices()], data)
    np.testing.assert_array_equal(got[205:215], np.r_[5:10, 0:5].astype(np.uint8))


@pytest.mark.parametrize("held", ["LOCK_EX", "LOCK_SH"])
def test_sieving_writes_lock_their_holes_and_automatic_skips_wide_ones(tmp_path, held):
    """Another process locks bytes inside a hole. The cost model writes around 64 KiB holes
    (no read-modify-write: the hole's bytes are never read or written back), under one shared
    lock per batch that spans the hole: it waits for an exclusive holder (a read-modify-write
    elsewhere) as forced sieving does, but not for a shared one (another direct writer), which
    forced sieving still waits for. All finish once the holder lets go, and the hole keeps its
    bytes."""
    path = tmp_path / "l.bin"
    path.write_bytes(bytes(1 << 19))
    ext = Extents(np.arange(8) * 65536, np.full(8, 100))
    data = np.arange(800, dtype=np.uint8)
    assert not sieving.SievePlan(
        ext, 1 << 20, sieving.hole_limit("automatic", True), True
    ).needs_read
    assert sieving.SievePlan(ext, 1 << 20, sieving.hole_limit("enable", True), True).needs_read
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(path)!r}, os.O_RDWR)\n"
            f"fcntl.lockf(fd, fcntl.{held}, 1000, 1000)\n"
            "print('locked', flush=True)\n"
            "sys.stdin.readline()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    fd = os.open(path, os.O_RDWR)
    try:
        assert holder.stdout.readline().strip() == "locked"
        done = {"automatic": threading.Event(), "enable": threading.Event()}

        def write(mode: str, payload: np.ndarray) -> None:
            _independent(fd, ext, payload, {"romio_ds_write": mode}, True)
            done[mode].set()

        workers = [
            threading.Thread(target=write, args=("automatic", data)),
            threading.Thread(target=write, args=("enable", data[::-1].copy())),
        ]
        for w in workers:
            w.start()
        if held == "LOCK_EX":  # both wait on the bytes the holder locked
            assert not done["automatic"].wait(0.5)
        else:  # direct writes share their locks; a read-modify-write waits
            assert done["automatic"].wait(20)
            assert not done["enable"].wait(0.5)
        assert not done["enable"].is_set()
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert done["automatic"].wait(20) and done["enable"].wait(20)
        for w in workers:
            w.join()
        back = np.fromfile(path, dtype=np.uint8)
        for k in range(8):  # the pieces hold one writer's bytes, the holes are untouched
            piece = back[k * 65536 : k * 65536 + 100]
            assert np.array_equal(piece, data[k * 100 : k * 100 + 100]) or np.array_equal(
                piece, data[::-1][k * 100 : k * 100 + 100]
            )
            assert not back[k * 65536 + 100 : (k + 1) * 65536].any()
    finally:
        holder.kill()
        holder.wait()
        os.close(fd)


def test_plan_spans_density_rule():
    # runs of 100 bytes; holes of 50 (cheap) and 20000 (dear)
    ext = Extents([0, 150, 300, 20400, 20550], [100] * 5)
    off, ln, holey = sieving.plan_spans(ext, 1 << 20, max_hole=8192)
    assert off.tolist() == [0, 20400] and ln.tolist() == [400, 250]
    assert holey.tolist() == [True, True]
    off, ln, holey = sieving.plan_spans(ext, 200, max_hole=None)  # buffer-bound spans
    assert (ln <= 400).all() and off[0] == 0
    off, ln, holey = sieving.plan_spans(Extents([0, 100], [100, 100]), 4096, None)
    assert off.tolist() == [0] and ln.tolist() == [200] and not holey.any()


def test_reads_match_romio_view(tmp_path):
    """read_sieved of a flattened subarray view returns what ROMIO reads through that view."""
    path = str(tmp_path / "r.bin")
    rng = np.random.default_rng(11)
    rng.integers(0, 256, 2 * 40 * 30 * 8 + 64, dtype=np.uint8).tofile(path)  # both instances
    view = MPI.DOUBLE.Create_subarray([40, 30], [13, 7], [5, 9], order=MPI.ORDER_FORTRAN)
    view.Commit()
    info = MPI.Info.Create()
    info.Set("romio_ds_read", "enable")
    fh = MPI.File.Open(MPI.COMM_SELF, path, MPI.MODE_RDONLY, info)
    fh.Set_view(64, MPI.DOUBLE, view, "native", info)
    romio = np.zeros(2 * 13 * 7, dtype=np.float64)
    fh.Read_at(0, romio)  # two instances of the filetype
    fh.Close()
    info.Free()
    ext = flatten_count(view, 2, disp=64)
    view.Free()
    ours = np.empty_like(romio)
    fd = os.open(path, os.O_RDONLY)
    try:
        sieving.read_sieved(_drv(fd), ext, ours, 512)
    finally:
        os.close(fd)
    np.testing.assert_array_equal(ours.view(np.uint8), romio.view(np.uint8))


@pytest.mark.mpi
def test_concurrent_sieving_writers_match_romio(tmp_path):
    out = run_mpi(4, "sieving_concurrent.py", tmp_path)
    assert out.strip().splitlines()[-1] == "ok"


def test_piece_ends_that_overflow_are_refused(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        big = np.iinfo(np.int64).max - 2
        ext = Extents(np.array([0, 100]), np.array([4, big]), np.array([0, 4]))
        with pytest.raises(ShapeMismatchError):
            sieving.read_direct(_drv(fd), ext, np.zeros(16, dtype=np.uint8))
    finally:
        os.close(fd)


def test_locks_are_released_when_taking_them_is_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt while waiting for the second lock releases the first (a held lock would
    stall every other writer of those bytes until the file is closed)."""
    import fcntl

    calls: list[tuple[int, int, int]] = []
    real = fcntl.lockf

    def lockf(fd: int, cmd: int, length: int = 0, start: int = 0, whence: int = 0) -> None:
        calls.append((cmd, length, start))
        if cmd == fcntl.LOCK_EX and len(calls) == 2:
            raise KeyboardInterrupt
        real(fd, cmd, length, start, whence)

    monkeypatch.setattr(fcntl, "lockf", lockf)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(KeyboardInterrupt), sieving._LockSet(_drv(fd), [(0, 10), (100, 110)]):
            pass
    finally:
        os.close(fd)
    assert calls == [(fcntl.LOCK_EX, 10, 0), (fcntl.LOCK_EX, 10, 100), (fcntl.LOCK_UN, 10, 0)]


def test_contiguous_writes_are_locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-piece write may lie inside another writer's sieving span: it takes a lock too
    (shared, as the descriptor is open for reading)."""
    import fcntl

    calls: list[int] = []
    real = fcntl.lockf

    def lockf(fd: int, cmd: int, length: int = 0, start: int = 0, whence: int = 0) -> None:
        calls.append(cmd)
        real(fd, cmd, length, start, whence)

    monkeypatch.setattr(fcntl, "lockf", lockf)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        one = Extents(np.array([64]), np.array([32]))
        sieving.write_sieved(_drv(fd), one, np.ones(32, dtype=np.uint8))
        sieving.SievePlan(one, 1 << 16, None, write=True).run(_drv(fd), np.ones(32, dtype=np.uint8))
        # an empty piece locks nothing (a lock of length 0 would reach to the end of the file)
        empty = Extents(np.array([64]), np.array([0]))
        sieving.SievePlan(empty, 1 << 16, None, write=True).run(
            _drv(fd), np.ones(1, dtype=np.uint8)
        )
    finally:
        os.close(fd)
    assert calls == [fcntl.LOCK_SH, fcntl.LOCK_UN] * 2


@pytest.mark.mpi
def test_contiguous_write_survives_a_concurrent_sieving_writer(tmp_path: Path) -> None:
    out = run_mpi(2, "contiguous_vs_sieving.py", tmp_path)
    assert out.strip().splitlines()[-1] == "lost 0"


class _FullDriver(PosixDriver):
    """A driver whose writes fail as on a full disk."""

    def writev(self, plan, data):  # noqa: ANN001, ANN201
        raise OSError(errno.ENOSPC, "No space left on device")


class _NoLockDriver(PosixDriver):
    """A driver whose byte-range locks fail."""

    def lock(self, offset, length, shared=False):  # noqa: ANN001, ANN201
        raise OSError(errno.ENOLCK, "No locks available")


def test_a_failed_independent_write_says_what_it_did(tmp_path: Path) -> None:
    """A contiguous write is never sieved: its failure says what was done (not "sieving
    write failed"); a sieving write's says so."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    io = IndependentIO(parse_hints({}))
    one = Extents(np.array([64]), np.array([32]))
    holey = Extents(np.array([0, 40]), np.array([32, 32]))
    try:
        for driver, why in ((_FullDriver, "No space left"), (_NoLockDriver, "No locks")):
            with pytest.raises(BackendError) as got:
                io.write(driver(fd), Access(one, np.ones(32, dtype=np.uint8)))
            said = str(got.value)
            assert "contiguous write of bytes 64-96 under a lock of them failed" in said
            assert why in said and "sieving" not in said
        with pytest.raises(BackendError, match=r"sieving write of bytes 0-72 \(1 span, each"):
            io.write(_NoLockDriver(fd), Access(holey, np.ones(64, dtype=np.uint8)))
    finally:
        os.close(fd)
