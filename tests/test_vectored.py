"""Vectored I/O from iovec tables (storage/vectored.py) and reusable copy plans, against
brute-force numpy oracles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strataio.layout.pieces import plan_copy
from strataio.storage import mapped, vectored
from strataio.storage.vectored import IOV_MAX, VectoredPlan


def _pieces(rng: np.random.Generator, n: int, ordered: bool) -> tuple[np.ndarray, ...]:
    lens = rng.integers(0, 300, n)
    gaps = rng.integers(0, 200, n) * (rng.random(n) < 0.5)
    offs = np.cumsum(gaps + np.concatenate(([0], lens[:-1])))
    if not ordered:  # some pieces out of order, overlapping their neighbours in the file
        swap = rng.random(n) < 0.1
        offs = np.where(swap, np.maximum(offs - rng.integers(0, 500, n), 0), offs)
    perm = rng.permutation(n)
    mem = np.empty(n, dtype=np.int64)
    mem[perm] = np.cumsum(lens[perm]) - lens[perm]
    return offs, lens, mem


@pytest.fixture(params=["ctypes", "os", "mapped", "streamed"])
def io_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How reads run: the iovec table through libc, memoryview lists through ``os``, or
    (where the copy helper is built) every read of more than one byte copied out of a
    mapping, with ``memcpy`` or with non-temporal stores."""
    if request.param == "os":
        monkeypatch.setattr(vectored, "_LIBC", None)
    elif vectored._LIBC is None:
        pytest.skip("libc has no preadv")
    if request.param in ("mapped", "streamed"):
        if mapped._mapcopy is None:
            pytest.skip("_mapcopy not built")
        monkeypatch.setattr(vectored, "MAPPED_READ_BYTES", 2)
        monkeypatch.setattr(mapped, "MAPPED_READ_BYTES", 2)
        streamed = request.param == "streamed"
        monkeypatch.setattr(mapped, "STREAM_COPY_BYTES", 2 if streamed else 1 << 62)
        monkeypatch.setattr(mapped, "GATHER_PIECE_BYTES", 0 if streamed else 1 << 40)
    return str(request.param)


def test_reads_match_numpy(tmp_path: Path, io_path: str) -> None:
    rng = np.random.default_rng(3)
    path = tmp_path / "f"
    data = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    padded = np.concatenate((data, np.zeros(1 << 20, dtype=np.uint8)))  # zeros past EOF
    fd = os.open(path, os.O_RDONLY)
    try:
        for trial in range(60):
            n = int(rng.integers(1, 3 * IOV_MAX))
            offs, lens, mem = _pieces(rng, n, ordered=trial % 3 != 0)
            if trial % 5 == 0:
                offs = offs + (1 << 20) - 3000  # the last pieces lie past end-of-file
            plan = VectoredPlan(offs, lens, mem, int(rng.choice([0, 50, 1000])))
            for _ in range(2):  # a plan runs again on a fresh buffer
                buf = np.full(int(lens.sum()) + 5, 7, dtype=np.uint8)
                plan.read(fd, buf)
                for o, n_, m in zip(offs.tolist(), lens.tolist(), mem.tolist()):
                    assert np.array_equal(buf[m : m + n_], padded[o : o + n_])
                assert (buf[-5:] == 7).all()  # nothing outside the pieces is touched
    finally:
        os.close(fd)


@pytest.mark.skipif(mapped._mapcopy is None, reason="_mapcopy not built")
@pytest.mark.parametrize("stream", [0, 1, 2])
def test_a_gather_from_a_mapping_copies_the_pieces_or_declines(tmp_path: Path, stream: int) -> None:
    """Pieces in any order, overlapping in the file, at odd buffer places: the file's bytes
    and nothing else written; declined (nothing claimed) where the file ends before the
    pieces do, and refused where a piece lies outside the buffer."""
    rng = np.random.default_rng(11)
    path = tmp_path / "f"
    data = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 1 << 20, 0)  # (cached)
        for trial in range(30):
            n = int(rng.integers(1, 400))
            offs, lens, mem = _pieces(rng, n, ordered=trial % 2 == 0)
            mem = mem + int(rng.integers(0, 64))
            buf = np.full(int((mem + lens).max()) + 64, 7, dtype=np.uint8)
            want = buf.copy()
            for o, n_, m in zip(offs.tolist(), lens.tolist(), mem.tolist()):
                want[m : m + n_] = data[o : o + n_]
            got = mapped._mapcopy.gather_cached(fd, buf, offs, lens, mem, stream)
            assert got == int(lens.sum())
            assert np.array_equal(buf, want)
        past = np.array([(1 << 20) - 10], dtype=np.int64)
        ten = np.array([20], dtype=np.int64)
        buf = np.full(64, 7, dtype=np.uint8)
        at0 = np.array([0], dtype=np.int64)
        assert mapped._mapcopy.gather_cached(fd, buf, past, ten, at0, stream) == -1
        with pytest.raises(ValueError, match="outside"):
            mapped._mapcopy.gather_cached(fd, buf, at0, ten, np.array([50]), stream)
        with pytest.raises(ValueError, match="int64"):
            mapped._mapcopy.gather_cached(fd, buf, at0, ten, np.array([0, 1]), stream)
    finally:
        os.close(fd)


def test_writes_match_numpy(tmp_path: Path, io_path: str) -> None:
    rng = np.random.default_rng(4)
    path = tmp_path / "f"
    path.write_bytes(bytes(1000))
    fd = os.open(path, os.O_RDWR)
    try:
        for _ in range(40):
            n = int(rng.integers(1, 3 * IOV_MAX))
            offs, lens, mem = _pieces(rng, n, ordered=True)
            src = rng.integers(0, 256, int(lens.sum()), dtype=np.uint8)
            before = np.fromfile(path, dtype=np.uint8)
            VectoredPlan(offs, lens, mem).write(fd, src)
            after = np.fromfile(path, dtype=np.uint8)
            expect = np.zeros(max(after.size, before.size), dtype=np.uint8)
            expect[: before.size] = before
            for o, n_, m in zip(offs.tolist(), lens.tolist(), mem.tolist()):
                expect[o : o + n_] = src[m : m + n_]
            assert np.array_equal(after, expect[: after.size])
    finally:
        os.close(fd)


def test_bad_buffers_are_refused_before_io(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(100))
    fd = os.open(path, os.O_RDWR)
    try:
        plan = VectoredPlan(np.array([0, 50]), np.array([10, 10]), np.array([0, 30]))
        assert plan.need == 40
        with pytest.raises(ValueError, match="reach byte 40"):
            plan.read(fd, np.zeros(39, dtype=np.uint8))
        with pytest.raises(ValueError, match="read-only"):
            ro = np.zeros(40, dtype=np.uint8)
            ro.flags.writeable = False
            plan.read(fd, ro)
        with pytest.raises(ValueError, match="contiguous"):
            plan.read(fd, np.zeros(80, dtype=np.uint8)[::2])
        with pytest.raises(ValueError, match="cannot cross holes"):
            VectoredPlan(np.array([0, 50]), np.array([10, 10]), np.array([0, 10]), 64).write(
                fd, np.zeros(20, dtype=np.uint8)
            )
        with pytest.raises(ValueError, match="before its buffer"):
            VectoredPlan(np.array([0]), np.array([4]), np.array([-1]))
    finally:
        os.close(fd)


def test_calls_cross_short_holes_and_respect_iov_max() -> None:
    n = IOV_MAX + 10
    offs = np.arange(n, dtype=np.int64) * 10
    lens = np.full(n, 8)
    mem = np.arange(n, dtype=np.int64) * 8
    # holes of 2 bytes crossed: 2n - 1 iovecs in ceil((2n - 1) / IOV_MAX) calls
    assert VectoredPlan(offs, lens, mem, max_hole=2).calls == -(-(2 * n - 1) // IOV_MAX)
    assert VectoredPlan(offs, lens, mem, max_hole=1).calls == n  # not crossed: one per piece
    adjacent = VectoredPlan(np.arange(n) * 8, lens, mem)
    assert adjacent.calls == -(-n // IOV_MAX)


def test_copy_plans_rerun_on_new_buffers() -> None:
    rng = np.random.default_rng(5)
    for kind in ("strided", "grid", "segments", "senders", "mixed"):
        if kind == "strided":
            n, length = 300, 24
            dst_off, src_off = np.arange(n) * 40, np.arange(n) * 30
            lens = np.full(n, length)
        elif kind == "grid":  # rows of 5 pieces with a gap after each row
            g = np.arange(60).reshape(12, 5)
            dst_off = (g // 5 * 64 + g % 5 * 8).ravel()
            src_off = np.arange(60) * 8
            lens = np.full(60, 8)
        elif kind == "segments":  # staged spans back to back: the spacing changes twice
            src_off = np.concatenate((np.arange(50) * 384, 20000 + np.arange(70) * 384))
            dst_off = np.concatenate((np.arange(50) * 64, 3200 + np.arange(70) * 64))
            dst_off[60] += 7  # and one piece off the grid
            lens = np.full(120, 48)
        elif kind == "senders":  # an aggregator's window: each sender's pieces interleave
            # with the others' (a stride of 4 pieces), the next sender's from the start again,
            # and the window's edge leaves the senders unequal counts (no grid)
            counts = (30, 29, 30, 31)
            src_off = np.arange(sum(counts)) * 48
            dst_off = np.concatenate([k * 64 + np.arange(c) * 256 for k, c in enumerate(counts)])
            lens = np.full(sum(counts), 48)
        else:
            lens = rng.integers(1, 50, 200)
            src_off = np.cumsum(lens) - lens
            dst_off = rng.permutation(200) * 64
        plan = plan_copy(dst_off, src_off, lens)
        if kind in ("strided", "grid", "senders"):  # (no piece-by-piece copy for these)
            assert {step[0] for step in plan.steps} == {1}, kind
        for _ in range(3):
            src = rng.integers(0, 256, int((src_off + lens).max()), dtype=np.uint8)
            dst = np.zeros(int((dst_off + lens).max()) + 3, dtype=np.uint8)
            plan.run(dst, src)
            expect = np.zeros_like(dst)
            for d, s, n_ in zip(dst_off.tolist(), src_off.tolist(), lens.tolist()):
                expect[d : d + n_] = src[s : s + n_]
            assert np.array_equal(dst, expect)


def test_reads_cross_a_hole_larger_than_the_kept_scratch(tmp_path: Path) -> None:
    """A crossed hole bigger than the scratch buffers kept between calls (64 MiB) reads into a
    buffer that lives until the call is done."""
    path = tmp_path / "sparse"
    with open(path, "wb") as fh:
        fh.truncate(80 << 20)  # sparse: reads as zeros, costs no disk
        fh.write(b"head")
        fh.seek(70 << 20)
        fh.write(b"tail")
    fd = os.open(path, os.O_RDONLY)
    try:
        plan = VectoredPlan(np.array([0, 70 << 20]), np.array([4, 4]), np.array([0, 4]), 80 << 20)
        assert plan.calls == 1
        buf = np.zeros(8, dtype=np.uint8)
        plan.read(fd, buf)
        assert buf.tobytes() == b"headtail"
    finally:
        os.close(fd)


def test_piece_ends_that_overflow_are_refused() -> None:
    big = np.iinfo(np.int64).max - 2
    with pytest.raises(ValueError, match="overflows"):
        VectoredPlan(np.array([0, 10]), np.array([4, big]), np.array([0, 4]))
    with pytest.raises(ValueError, match="overflows"):
        VectoredPlan(np.array([0, 10]), np.array([4, 8]), np.array([0, big]))


@settings(max_examples=80, deadline=None)
@given(
    lens=st.lists(st.integers(1, 500), min_size=1, max_size=12),
    gaps=st.lists(st.integers(0, 40), min_size=12, max_size=12),
    parts=st.integers(1, 5),
)
def test_a_split_plan_moves_the_same_bytes_in_balanced_shares(lens, gaps, parts) -> None:
    """The plans :meth:`VectoredPlan.split` makes move exactly the bytes of the plan, each
    (file byte, buffer byte) once, in shares that differ by at most one byte."""
    lengths = np.array(lens, dtype=np.int64)
    offsets = np.cumsum(lengths + np.array(gaps[: len(lens)])) - lengths
    mem = np.cumsum(lengths[::-1])[::-1] - lengths  # the buffer in another order
    plan = VectoredPlan(offsets, lengths, mem)
    shares = plan.split(parts)
    assert 1 <= len(shares) <= parts
    assert sum(s.moved for s in shares) == plan.moved
    assert max(s.moved for s in shares) - min(s.moved for s in shares) <= 1

    def pairs(p: VectoredPlan) -> set[tuple[int, int]]:
        o, n, m = p.pieces()
        return {
            (a + k, b + k) for a, c, b in zip(o.tolist(), n.tolist(), m.tolist()) for k in range(c)
        }

    assert set().union(*map(pairs, shares)) == pairs(plan)
    crossing = VectoredPlan(np.array([0, 50]), np.array([10, 10]), np.array([0, 10]), max_hole=64)
    assert crossing.split(3) == [crossing]  # a plan reading through holes stays whole


@pytest.mark.parametrize(
    ("value", "off"), [("", False), (" ", False), ("0", False), ("1", True), ("yes", True)]
)
def test_the_switches_of_the_environment_read_alike(monkeypatch, value, off):
    """STRATAIO_NO_CTYPES_IO and STRATAIO_NO_MAPPED_READS are off unset, empty or 0, and on
    for any other value."""
    monkeypatch.setenv("STRATAIO_NO_CTYPES_IO", value)
    assert (vectored._libc_calls() is None) is off
    code = "from strataio.storage import mapped; print(mapped._off)"
    env = {**os.environ, "STRATAIO_NO_MAPPED_READS": value}
    src = str(Path(vectored.__file__).parents[2])
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    got = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert got.stdout.strip() == str(off)
