"""Large reads copied out of a mapping of the file (strataio.storage.mapped): the same bytes
as preadv, only where the kernel's copy would alias or the copy is large enough to stream,
and never a crash when the file is cut shorter during the copy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strataio.collective.driver import PosixDriver
from strataio.errors import ConfigError
from strataio.storage import mapped
from strataio.storage.mapped import ALIAS_BYTES, MAPPED_READ_BYTES, PAGE, aliases, read_cached
from strataio.storage.vectored import VectoredPlan

needs_helper = pytest.mark.skipif(mapped._mapcopy is None, reason="_mapcopy not built")

FILE_BYTES = 3 * MAPPED_READ_BYTES + 12345


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    path = tmp_path_factory.mktemp("mapped") / "data.bin"
    data = np.random.default_rng(7).integers(0, 256, FILE_BYTES, dtype=np.uint8)
    data.tofile(path)
    with open(path, "rb") as f:  # in the page cache
        f.read()
    return path, data


def _buffer_at(size: int, page_offset: int) -> np.ndarray:
    """A writable uint8 buffer of ``size`` bytes starting ``page_offset`` bytes into a page."""
    raw = np.empty(size + 2 * PAGE, dtype=np.uint8)
    start = (page_offset - raw.ctypes.data) % PAGE
    out = raw[start : start + size]
    out[:] = 0xA5
    return out


def _address(a: np.ndarray) -> int:
    return int(a.ctypes.data)


def test_aliasing_is_a_destination_a_little_ahead_within_its_page() -> None:
    assert aliases(16, 0) and aliases(PAGE + 16, 0) and aliases(70, 7)
    assert aliases(ALIAS_BYTES - 1, 0)
    assert not aliases(0, 0) and not aliases(ALIAS_BYTES, 0) and not aliases(0, 16)
    assert not aliases(PAGE - 16, 0)  # behind


@needs_helper
@settings(max_examples=40, deadline=None)
@given(
    offset=st.one_of(st.integers(0, FILE_BYTES + 10), st.sampled_from([0, PAGE, FILE_BYTES - 1])),
    size=st.integers(MAPPED_READ_BYTES, 2 * MAPPED_READ_BYTES + 999),
    ahead=st.integers(1, ALIAS_BYTES - 1),
)
def test_a_mapped_read_copies_what_the_file_holds(
    data_file: tuple[Path, np.ndarray], offset: int, size: int, ahead: int
) -> None:
    path, data = data_file
    out = _buffer_at(size, (offset + ahead) % PAGE)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = read_cached(fd, offset, memoryview(out), _address(out))
    finally:
        os.close(fd)
    want = data[offset : offset + size]
    assert got == len(want)
    assert np.array_equal(out[:got], want)
    assert (out[got:] == 0xA5).all()  # past the end: left as it was


@needs_helper
def test_reads_that_would_not_alias_or_are_small_are_left_to_the_caller(
    data_file: tuple[Path, np.ndarray],
) -> None:
    path, _ = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        for size, page_offset in [
            (MAPPED_READ_BYTES, 0),  # aligned alike
            (MAPPED_READ_BYTES, ALIAS_BYTES),
            (MAPPED_READ_BYTES, PAGE - 8),  # behind
            (MAPPED_READ_BYTES - 1, 16),  # too small to pay for a mapping
        ]:
            out = _buffer_at(size, page_offset)
            assert read_cached(fd, 0, memoryview(out), _address(out)) is None
            assert (out == 0xA5).all()
    finally:
        os.close(fd)


@needs_helper
@settings(max_examples=60, deadline=None)
@given(
    offset=st.integers(0, FILE_BYTES + 10),
    size=st.one_of(st.integers(0, 300), st.integers(0, 3 * PAGE), st.integers(0, 1 << 20)),
    dst_offset=st.integers(0, 127),
    stream=st.sampled_from([1, 2]),
)
def test_a_streamed_copy_copies_what_the_file_holds(
    data_file: tuple[Path, np.ndarray], offset: int, size: int, dst_offset: int, stream: int
) -> None:
    """Non-temporal stores (the head up to an aligned destination, whole steps, the tail;
    AVX2's where the processor has them, and SSE2's): the file's bytes at any size and
    destination alignment, nothing written past them."""
    path, data = data_file
    raw = np.full(size + 256, 0xA5, dtype=np.uint8)
    out = raw[dst_offset : dst_offset + size]
    fd = os.open(path, os.O_RDONLY)
    try:
        got = mapped._mapcopy.read_cached(fd, offset, out, stream)
    finally:
        os.close(fd)
    want = data[offset : offset + size]
    assert got == len(want)
    assert np.array_equal(out[:got], want)
    assert (raw[:dst_offset] == 0xA5).all() and (raw[dst_offset + got :] == 0xA5).all()


@needs_helper
def test_copies_large_enough_to_stream_are_mapped_even_where_they_would_not_alias(
    data_file: tuple[Path, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data = data_file
    monkeypatch.setattr(mapped, "STREAM_COPY_BYTES", MAPPED_READ_BYTES + PAGE)
    fd = os.open(path, os.O_RDONLY)
    try:
        for size, taken in [(MAPPED_READ_BYTES, False), (MAPPED_READ_BYTES + PAGE, True)]:
            out = _buffer_at(size, 0)  # aligned alike: no aliasing
            got = read_cached(fd, 0, memoryview(out), _address(out))
            if taken:
                assert got == size and np.array_equal(out, data[:size])
            else:
                assert got is None and (out == 0xA5).all()
    finally:
        os.close(fd)


def test_the_streaming_threshold_follows_the_cache_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STRATAIO_STREAM_COPY_BYTES", raising=False)
    assert mapped._stream_copy_bytes() == max(4 << 20, mapped.last_level_cache_bytes() // 2)
    assert mapped.last_level_cache_bytes() >= 1 << 10
    monkeypatch.setenv("STRATAIO_STREAM_COPY_BYTES", str(8 << 20))
    assert mapped._stream_copy_bytes() == 8 << 20
    monkeypatch.setenv("STRATAIO_STREAM_COPY_BYTES", "24MiB")
    assert mapped._stream_copy_bytes() == 24 << 20
    for never in ("0", "none"):
        monkeypatch.setenv("STRATAIO_STREAM_COPY_BYTES", never)
        assert mapped._stream_copy_bytes() > 1 << 60
    monkeypatch.setenv("STRATAIO_STREAM_COPY_BYTES", "16 apples")
    with pytest.raises(ConfigError, match="STRATAIO_STREAM_COPY_BYTES"):
        mapped._stream_copy_bytes()


@needs_helper
def test_pages_not_cached_are_left_to_the_caller(tmp_path: Path) -> None:
    """A mapping would fault uncached pages in with less read-ahead than read() gets."""
    path = tmp_path / "cold.bin"
    np.arange(2 * MAPPED_READ_BYTES, dtype=np.uint8).tofile(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        probe = bytearray(PAGE)
        try:
            os.preadv(fd, [probe], MAPPED_READ_BYTES // 2, os.RWF_NOWAIT)
        except BlockingIOError:
            pass
        else:
            pytest.skip("this file system keeps the file's pages (tmpfs)")
        out = _buffer_at(MAPPED_READ_BYTES, 16)
        assert mapped._mapcopy.read_cached(fd, 0, out) == -1
        assert read_cached(fd, 0, memoryview(out), _address(out)) is None
    finally:
        os.close(fd)


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@needs_helper
def test_a_copy_from_pages_past_the_end_fails_instead_of_killing(tmp_path: Path) -> None:
    """SIGBUS from a mapped page past the file's end ends the guarded copy, and only it: a
    SIGBUS elsewhere still kills the process, with faulthandler's report where it is on."""
    path = tmp_path / "cut.bin"
    code = f"""
        import faulthandler, mmap, os, sys
        import numpy as np
        from strataio.storage import _mapcopy
        if sys.argv[-1] == "faulthandler":
            faulthandler.enable()
        fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)
        os.ftruncate(fd, 1 << 20)
        m = mmap.mmap(fd, 1 << 20, prot=mmap.PROT_READ)
        src = np.frombuffer(m, np.uint8)
        os.ftruncate(fd, 4096)  # the mapping now reaches past the end
        out = np.zeros(1 << 20, np.uint8)
        for stream in (0, 1, 2):
            print(_mapcopy.copy_guarded(src.ctypes.data, out, stream))
            print(_mapcopy.copy_guarded(src.ctypes.data, out[:4096], stream))
            print(_mapcopy.copy_guarded(src.ctypes.data + 8192, out[:10], stream))
        assert (out[:4096] == src[:4096]).all()
        sys.stdout.flush()
        int(src[8192:].sum())  # unguarded: SIGBUS as ever
        print("not reached")
    """
    for mode in ("plain", "faulthandler"):
        run = _run_python(code.replace("sys.argv[-1]", repr(mode)))
        assert run.stdout.split() == ["-1", "0", "-1"] * 3, (run.stdout, run.stderr)
        assert run.returncode == -signal.SIGBUS, (run.returncode, run.stderr)
        if mode == "faulthandler":
            assert "Bus error" in run.stderr


@needs_helper
def test_a_file_cut_during_mapped_reads_never_kills_the_reader(tmp_path: Path) -> None:
    """One thread cuts the file and writes it back while another reads it through mappings,
    whole and as a gather of pieces: each read gives the file's bytes, a shorter read, or
    declines (the caller then reads); the process lives."""
    path = tmp_path / "race.bin"
    code = f"""
        import os, threading, time
        import numpy as np
        from strataio.storage import _mapcopy
        n = 4 << 20
        data = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
        data.tofile({str(path)!r})
        stop = time.monotonic() + 2.0
        def cutter():
            fd = os.open({str(path)!r}, os.O_RDWR)
            while time.monotonic() < stop:
                os.ftruncate(fd, 8192)
                os.pwrite(fd, data[8192:].tobytes(), 8192)
            os.close(fd)
        t = threading.Thread(target=cutter)
        t.start()
        fd = os.open({str(path)!r}, os.O_RDONLY)
        outcomes = set()
        out = np.empty(n, np.uint8)
        pieces = n // 8192  # every other 4 KiB of the file, gathered
        file = np.arange(pieces, dtype=np.int64) * 8192 + 4096
        lengths = np.full(pieces, 4096, dtype=np.int64)
        mem = np.arange(pieces, dtype=np.int64) * 4096
        calls = 0
        while time.monotonic() < stop:
            calls += 1
            if calls % 2:
                got = _mapcopy.read_cached(fd, 0, out, calls % 3)
                if got > 0:
                    assert np.array_equal(out[:8192], data[:8192])
                outcomes.add("declined" if got < 0 else "short" if got < n else "whole")
            else:
                got = _mapcopy.gather_cached(fd, out, file, lengths, mem, calls % 3)
                if got >= 0:
                    assert got == pieces * 4096
                    assert np.array_equal(out[:4096], data[4096:8192])
                outcomes.add("gather declined" if got < 0 else "gathered")
        t.join()
        print(sorted(outcomes))
    """
    run = _run_python(code)
    assert run.returncode == 0, run.stderr
    assert "gather" in run.stdout and ("whole" in run.stdout or "short" in run.stdout)


@pytest.mark.parametrize("helper", ["built", "streamed", "absent"])
def test_large_driver_reads_agree_with_numpy_either_way(
    data_file: tuple[Path, np.ndarray], helper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PosixDriver.pread and a contiguous VectoredPlan read, into buffers that alias and that
    do not, past the end of the file too: the same bytes with the mapped copy, with every
    mapped copy streamed, and without (where the helper is not built)."""
    if helper == "absent":
        monkeypatch.setattr(mapped, "_mapcopy", None)
    elif helper == "streamed":
        if mapped._mapcopy is None:
            pytest.skip("_mapcopy not built")
        monkeypatch.setattr(mapped, "STREAM_COPY_BYTES", MAPPED_READ_BYTES)
    elif mapped._mapcopy is None:
        pytest.skip("_mapcopy not built")
    path, data = data_file
    drv = PosixDriver.open(str(path), os.O_RDONLY)
    try:
        for offset, size, page_offset in [
            (0, 2 * MAPPED_READ_BYTES, 16),
            (PAGE, 2 * MAPPED_READ_BYTES, PAGE // 2),
            (1000, MAPPED_READ_BYTES + 7, 1000 + 40),
            (FILE_BYTES - MAPPED_READ_BYTES // 2, MAPPED_READ_BYTES, 16),  # past the end
        ]:
            want = np.zeros(size, np.uint8)
            have = data[offset : offset + size]
            want[: len(have)] = have
            out = _buffer_at(size, page_offset)
            got = drv.pread(out, offset)
            assert got == len(have) and np.array_equal(out[:got], have)
            out = _buffer_at(size, page_offset)
            plan = VectoredPlan(np.array([offset]), np.array([size]), np.array([0]))
            plan.read(drv.fd, out)
            assert np.array_equal(out, want)  # (zeros past the end)
    finally:
        drv.close()


@needs_helper
def test_a_gather_is_taken_where_it_is_large_dense_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pieces of a quarter or more of the bytes they span, moving MAPPED_READ_BYTES or more,
    are copied out of a mapping; fewer bytes, a sparser span, or a span past the end of the
    file are left to the caller. (Every piece counts as small here: aliasing is the next
    test's.)"""
    monkeypatch.setattr(mapped, "GATHER_PIECE_BYTES", 1 << 40)
    piece, n = 4096, MAPPED_READ_BYTES // 4096
    size = (mapped.GATHER_SPAN_RATIO + 2) * MAPPED_READ_BYTES
    path = tmp_path / "gather.bin"
    data = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8)
    data.tofile(path)
    path.read_bytes()  # (cached)
    lengths = np.full(n, piece, dtype=np.int64)
    mem = np.arange(n, dtype=np.int64) * piece
    fd = os.open(path, os.O_RDONLY)
    try:
        for stride, count, taken in [
            (piece + 128, n, True),  # dense
            (piece * mapped.GATHER_SPAN_RATIO, n, True),  # a quarter of its span
            (piece * mapped.GATHER_SPAN_RATIO + PAGE, n // 2, False),  # too few bytes
            (piece * (mapped.GATHER_SPAN_RATIO + 1), n, False),  # too sparse
        ]:
            file = np.arange(count, dtype=np.int64) * stride
            out = np.full(n * piece, 0xA5, dtype=np.uint8)
            got = mapped.gather_cached(
                fd, memoryview(out), _address(out), file, lengths[:count], mem[:count]
            )
            assert got == taken
            if taken:
                for f, m in zip(file.tolist(), mem[:count].tolist()):
                    assert np.array_equal(out[m : m + piece], data[f : f + piece])
            else:
                assert (out == 0xA5).all()
        past = np.array([size - MAPPED_READ_BYTES // 2], dtype=np.int64)
        out = np.full(MAPPED_READ_BYTES, 0xA5, dtype=np.uint8)
        whole = np.array([MAPPED_READ_BYTES], dtype=np.int64)
        assert not mapped.gather_cached(
            fd, memoryview(out), _address(out), past, whole, np.zeros(1, np.int64)
        )
    finally:
        os.close(fd)


@needs_helper
def test_a_gather_of_large_pieces_is_taken_where_they_alias_or_stream(
    data_file: tuple[Path, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data = data_file
    piece, n = 4096, MAPPED_READ_BYTES // 4096
    file = np.arange(n, dtype=np.int64) * piece  # (page-aligned, as the buffer places are)
    lengths = np.full(n, piece, dtype=np.int64)
    mem = file.copy()
    fd = os.open(path, os.O_RDONLY)
    try:
        for page_offset, stream_from, taken in [
            (16, 1 << 62, True),  # every piece aliases
            (0, 1 << 62, False),  # none does, too few bytes to stream
            (0, MAPPED_READ_BYTES, True),  # none does, enough to stream
        ]:
            monkeypatch.setattr(mapped, "STREAM_COPY_BYTES", stream_from)
            out = _buffer_at(n * piece, page_offset)
            assert (
                mapped.gather_cached(fd, memoryview(out), _address(out), file, lengths, mem)
                == taken
            )
            if taken:
                assert np.array_equal(out, data[: n * piece])
            else:
                assert (out == 0xA5).all()
    finally:
        os.close(fd)
