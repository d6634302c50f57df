"""strataio.File: error agreement under mpiexec, serial semantics, exchange primitives."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import strataio
from mpirun import launch_mpi, run_mpi
from strataio.collective.bufspec import parse_buffer
from strataio.collective.choice import use_two_phase
from strataio.collective.realms import EvenRealms, config_aggregators
from strataio.errors import (
    BackendError,
    DatatypeError,
    HintError,
    ReadOnlyError,
    ShapeMismatchError,
    StrataError,
    ViewError,
)
from strataio.layout.pieces import copy_pieces


@pytest.mark.mpi
def test_errors_agree_on_every_rank(tmp_path: Path) -> None:
    out = run_mpi(2, "file_errors.py", tmp_path)
    res = json.loads(out.strip().splitlines()[-1])
    expected = {
        "negative_disp": "ViewError",
        "filetype_not_whole_etypes": "ViewError",
        "etype_sizes_disagree": "ViewError",
        "filetype_misaligned": "ViewError",
        "disp_not_integer": "ViewError",
        "etype_not_datatype": "ViewError",
        "filetype_not_committed": "ViewError",
        "set_size_differs": "StrataError",
        "buffer_not_whole_etypes": "ViewError",
        "buffer_too_small": "ShapeMismatchError",
        "negative_offset": "ViewError",
        "read_into_readonly_buffer": "ReadOnlyError",
        "buffer_not_committed": "DatatypeError",
        "file_unchanged": "ok",
        "closed_read_all": "ClosedError",
        "closed_write_at": "ClosedError",
        "closed_get_view": "ClosedError",
        "closed_hints": "ClosedError",
        "write_all_read_only": "ReadOnlyError",
        "write_at_read_only": "ReadOnlyError",
        "set_size_read_only": "ReadOnlyError",
        "read_only_bad_buffer": "ShapeMismatchError",
        "read_only_data": "ok",
        "mixed_pieces_path": "two-phase",
        "open_modes_differ": "StrataError",
        "open_x_existing": "ExistsError",
        "open_missing": "NotFoundError",
        "open_missing_on_one_rank": "NotFoundError",
        "open_paths_differ": "ArgumentError",
        "open_paths_differ_created_none": "ok",
        "open_path_not_a_path_on_one_rank": "ArgumentError",
        "open_relative_and_absolute": "ok",
        "no_descriptor_left": "ok",
        "bad_hint": "HintError",
        "bad_mode": "StrataError",
        "mode_not_flags": "StrataError",
        "open_w_and_its_flags": "StrataError",
        "open_w_and_its_flags_kept": "ok",
        "mode_sequential": "StrataError",
        "hints_differ": "HintError",
        "view_hints_differ": "HintError",
        "view_hints_apply": "ok",
        "per_rank_hints": "ok",
        "bad_realms": "HintError",
        "realm_cache_too_large": "HintError",
        "realm_caches_too_large_on_a_node": "HintError",
        "realm_cache_too_large_w": "HintError",
        "realm_cache_too_large_x": "HintError",
        "realm_cache_too_large_files_kept": "ok",
        "open_directory": "BackendError",
        "set_view_not_strata": ["StrataError", "RuntimeError"],
        "independent_write_fails_on_one_rank": "BackendError",
        "independent_read_fails_on_one_rank": "BackendError",
        "independent_in_step_after": "independent",
        "close_fails_on_one_rank": ["StrataError", "OSError"],
        "delete_on_close_gone_everywhere": "ok",
        "delete_on_close_fails": "BackendError",
        "round_trip_after_errors": "ok",
    }
    assert res == {k: v if isinstance(v, list) else [v, v] for k, v in expected.items()}


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_two_phase_in_place_and_copying_paths(nprocs: int, tmp_path: Path) -> None:
    out = run_mpi(nprocs, "two_phase_in_place.py", tmp_path)
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_serial_pointer_size_and_modes(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    with strataio.File.open(None, path, "x") as f:
        ft = MPI.INT.Create_vector(4, 1, 2).Create_resized(0, 32).Commit()  # every other int
        f.set_view(8, MPI.INT, ft)
        data = np.arange(10, dtype=np.int32)
        assert f.write(data) == 40
        assert f.get_position() == 10
        f.seek(-3, MPI.SEEK_CUR)
        assert f.get_position() == 7
        f.seek(0, MPI.SEEK_END)
        assert f.get_position() == 10  # the last int written ends the file
        raw = np.fromfile(path, dtype=np.int32)
        assert raw.size == 2 + 2 * 10 - 1
        assert np.array_equal(raw[2::2], data)
        assert f.get_size() == raw.nbytes
        f.set_size(100)
        assert f.get_size() == 100
        assert f.hints["cb_buffer_size"] == "16777216"
        out = np.zeros(10, dtype=np.int32)
        f.read_at(0, out)
        assert np.array_equal(out, data)
    assert f.closed
    with pytest.raises(strataio.errors.ExistsError):
        strataio.File.open(None, path, "x")
    amode = MPI.MODE_RDWR | MPI.MODE_DELETE_ON_CLOSE | MPI.MODE_APPEND
    with strataio.File.open(None, path, amode) as f:
        assert f.get_position() == 100  # MODE_APPEND starts at the end
    assert not path.exists()


@pytest.mark.parametrize("which", ["etype", "filetype"])
def test_set_view_refuses_an_uncommitted_datatype(which: str, tmp_path: Path) -> None:
    """MPI requires a view's etype and filetype committed (ROMIO refuses them too): one never
    committed raises ViewError naming it and leaves the view as it was; once committed, the
    same datatype is taken."""
    loose = MPI.INT.Create_vector(2, 1, 2)  # never committed
    try:
        with strataio.File.open(None, tmp_path / "f.bin", "w") as f:
            f.set_view(4, MPI.INT)
            args = (loose,) if which == "etype" else (MPI.INT, loose)
            with pytest.raises(ViewError, match=f"{which} .*has not been committed"):
                f.set_view(0, *args)
            assert f.get_view() == (4, MPI.INT, MPI.INT)
            loose.Commit()
            f.set_view(0, *args)
            assert f.get_view()[1 if which == "etype" else 2] == loose
    finally:
        loose.Free()


@pytest.mark.parametrize("which", ["etype", "filetype"])
def test_set_view_refuses_the_null_datatype_naming_it(which: str, tmp_path: Path) -> None:
    """MPI.DATATYPE_NULL as etype or filetype is a ViewError naming the argument (as every
    other bad view), not a DatatypeError from deep in the flattening; the view stays."""
    with strataio.File.open(None, tmp_path / "f.bin", "w") as f:
        f.set_view(4, MPI.INT)
        args = (MPI.DATATYPE_NULL,) if which == "etype" else (MPI.INT, MPI.DATATYPE_NULL)
        with pytest.raises(ViewError, match=f"{which} is MPI.DATATYPE_NULL"):
            f.set_view(0, *args)
        assert f.get_view() == (4, MPI.INT, MPI.INT)


@pytest.mark.parametrize(
    "call", ["write_at", "write_at_all", "read_at", "read_at_all", "bottom", "fitting"]
)
def test_buffers_of_an_uncommitted_datatype_are_refused(call: str, tmp_path: Path) -> None:
    """MPI requires a buffer's datatype committed (ROMIO refuses one never committed,
    "Invalid datatype"): a transfer with one raises DatatypeError naming it before any byte
    moves, in every buffer form; once committed, the same datatype is taken."""
    path = tmp_path / "f.bin"
    arr = np.arange(4, dtype=np.int32)
    loose = MPI.INT.Create_contiguous(2)  # never committed
    if call == "bottom":
        loose.Free()
        loose = MPI.Datatype.Create_struct([2], [MPI.Get_address(arr)], [MPI.INT])
    op, spec = {
        "bottom": ("write_at", [MPI.BOTTOM, 1, loose]),
        "fitting": ("write_at", [arr, loose]),  # as many as fit
    }.get(call, (call, [arr, 1, loose]))
    fh = MPI.File.Open(MPI.COMM_SELF, str(tmp_path / "romio.bin"), MPI.MODE_RDWR | MPI.MODE_CREATE)
    try:
        with pytest.raises(MPI.Exception, match="Invalid datatype"):
            getattr(fh, op.capitalize())(0, spec)
    finally:
        fh.Close()
    try:
        with strataio.File.open(None, path, "w") as f:
            f.write_at(0, np.full(4, -1, dtype=np.int32))
            with pytest.raises(DatatypeError, match=r"\(a (contiguous|struct) datatype\) has not"):
                getattr(f, op)(0, spec)
            assert np.array_equal(np.fromfile(path, dtype=np.int32), [-1] * 4)  # untouched
            assert arr.tolist() == [0, 1, 2, 3]
            loose.Commit()
            n = 4 if call == "fitting" else 2  # ints moved
            assert getattr(f, op)(0, spec) == 4 * n
        if op.startswith("write"):
            assert np.fromfile(path, dtype=np.int32).tolist() == [0, 1, 2, 3][:n] + [-1] * (4 - n)
        else:
            assert arr.tolist() == [-1] * n + [2, 3]
    finally:
        loose.Free()


def test_a_rank_with_spare_cores_shares_large_reads(tmp_path: Path, monkeypatch) -> None:
    """A rank alone on its node reads with a thread per spare core (at most
    MAX_READ_THREADS): large contiguous and strided reads, and one past the end of the file,
    give the file's bytes as a single read does."""
    from strataio.collective import driver as driver_module

    monkeypatch.setattr(driver_module, "SPLIT_READ_BYTES", 1 << 16)
    shared = []
    run_shared = driver_module.run_shared
    monkeypatch.setattr(
        driver_module, "run_shared", lambda w: (shared.append(len(w)), run_shared(w))
    )
    cores = len(os.sched_getaffinity(0))
    data = np.random.default_rng(4).integers(0, 1 << 31, 300_000, dtype=np.int32)
    path = tmp_path / "big.bin"
    data.tofile(path)
    with strataio.File.open(None, path, "r") as f:
        assert f.driver.threads == min(driver_module.MAX_READ_THREADS, cores)
        out = np.zeros_like(data)
        f.read_at_all(0, out)
        np.testing.assert_array_equal(out, data)
        past = np.full(200_000, -1, dtype=np.int32)
        f.read_at(150_000 * 4, past)
        np.testing.assert_array_equal(past[:150_000], data[150_000:])
        ft = MPI.INT.Create_vector(1000, 50, 100).Create_resized(0, 400_000).Commit()
        f.set_view(0, MPI.INT, ft)
        every = np.zeros(150_000, dtype=np.int32)
        f.read_all(every)
        want = data.reshape(-1, 100)[:, :50].reshape(-1)[:150_000]
        np.testing.assert_array_equal(every, want)
        ft.Free()
    if cores > 1:  # (every read above was shared among the threads)
        assert len(shared) == 3 and set(shared) == {f.driver.threads}


def _romio_read_then_write(path: Path, etype: MPI.Datatype, ft: MPI.Datatype, n: int) -> int:
    """ROMIO's count of an ``n``-byte read at the file pointer; then 4 bytes of 0xFF written
    at the pointer it left."""
    fh = MPI.File.Open(MPI.COMM_SELF, str(path), MPI.MODE_RDWR)
    fh.Set_view(0, etype, ft)
    status = MPI.Status()
    fh.Read(np.zeros(n, dtype=np.uint8), status)
    fh.Write(np.full(4, 255, dtype=np.uint8))
    fh.Close()
    return status.Get_count(MPI.BYTE)


@pytest.mark.parametrize("etype", ["BYTE", "INT"])
@pytest.mark.parametrize("call", ["read", "read_all", "read_all two-phase"])
def test_reads_past_end_of_file_count_the_bytes_read(etype: str, call: str, tmp_path: Path):
    """A read that reaches past end-of-file returns the bytes before it and moves the pointer
    by the whole etypes among them; a contiguous view leaves the same file as ROMIO after a
    following write."""
    et = getattr(MPI, etype)
    start = np.arange(30, dtype=np.uint8)
    ours, romio = tmp_path / "ours.bin", tmp_path / "romio.bin"
    for p in (ours, romio):
        start.tofile(p)
    hints = {"romio_cb_read": "enable" if "two-phase" in call else "automatic"}
    with strataio.File.open(None, ours, "r+", hints=hints) as f:
        f.set_view(0, et)
        got = np.full(64, 7, dtype=np.uint8)
        n = getattr(f, call.split()[0])(got)
        assert f.last_path == ("two-phase" if "two-phase" in call else "independent")
        assert n == 30 and f.get_position() == 30 // et.Get_size()
        assert np.array_equal(got[:30], start)
        f.write(np.full(4, 255, dtype=np.uint8))
    assert _romio_read_then_write(romio, et, et, 64) == 30
    if etype == "BYTE":
        assert ours.read_bytes() == romio.read_bytes()
    else:  # ROMIO reports position 7 but writes at byte 30 (its pointer counts bytes)
        assert ours.read_bytes() == start[:28].tobytes() + b"\xff" * 4

    # noncontiguous view: 4 bytes of every 8; the count is the data before end-of-file
    with strataio.File.open(None, ours, "r+", hints=hints) as f:
        f.set_view(0, MPI.BYTE, MPI.BYTE.Create_vector(1, 4, 8).Create_resized(0, 8).Commit())
        size = f.get_size()
        before = sum(max(0, min(4, size - o)) for o in range(0, 64 * 2, 8))
        assert getattr(f, call.split()[0])(np.zeros(64, dtype=np.uint8)) == before
        assert f.get_position() == before
        # the file grows (another handle); the next read sees the new end
        with strataio.File.open(None, ours, "r+") as g:
            g.write_at(100, np.zeros(28, dtype=np.uint8))
        f.seek(0)
        assert getattr(f, call.split()[0])(np.zeros(64, dtype=np.uint8)) == 64


@pytest.mark.parametrize("cb", ["disable", "enable"])
def test_bottom_buffers_name_memory_by_address(cb: str, tmp_path: Path) -> None:
    """``[MPI.BOTTOM, count, dt]`` with absolute addresses of two separate arrays: the same file
    as ROMIO's, and a read scatters back to the addresses."""
    a, b = np.arange(8, dtype=np.int32), np.linspace(0, 1, 5)
    addr = [MPI.Get_address(a), MPI.Get_address(b[1:])]
    dt = MPI.Datatype.Create_struct([8, 3], addr, [MPI.INT, MPI.DOUBLE]).Commit()
    ours, romio = tmp_path / "ours.bin", tmp_path / "romio.bin"
    with strataio.File.open(None, ours, "w", hints={"romio_cb_write": cb}) as f:
        assert f.write_at_all(2, [MPI.BOTTOM, 1, dt]) == 56
    fh = MPI.File.Open(MPI.COMM_SELF, str(romio), MPI.MODE_RDWR | MPI.MODE_CREATE)
    fh.Write_at(2, [MPI.BOTTOM, 1, dt])
    fh.Close()
    assert ours.read_bytes() == romio.read_bytes()
    a2, b2 = np.zeros_like(a), np.zeros_like(b)
    dt2 = MPI.Datatype.Create_struct(
        [8, 3], [MPI.Get_address(a2), MPI.Get_address(b2[1:])], [MPI.INT, MPI.DOUBLE]
    ).Commit()
    with strataio.File.open(None, ours, "r", hints={"romio_cb_read": cb}) as f:
        assert f.read_at_all(2, [MPI.BOTTOM, 1, dt2]) == 56
    assert np.array_equal(a2, a) and np.array_equal(b2[1:4], b[1:4]) and b2[0] == b2[4] == 0
    with pytest.raises(StrataError, match="MPI.BOTTOM"):
        parse_buffer([MPI.BOTTOM, dt], writable=False)
    with pytest.raises(ShapeMismatchError, match="absolute addresses"):
        parse_buffer([MPI.BOTTOM, 1, MPI.INT], writable=False)
    dt.Free()
    dt2.Free()


def test_serial_buffer_specs(tmp_path: Path) -> None:
    arr = np.arange(12, dtype=np.float64)
    col = MPI.DOUBLE.Create_vector(4, 1, 3).Commit()  # one column of a 4x3 array
    with strataio.File.open(None, tmp_path / "g.bin", "w") as f:
        f.write_at(0, [arr, 1, col])
        f.write_at(32, [arr, (1, 1), MPI.DOUBLE.Create_resized(0, 8).Commit()])
        f.write_at(40, [arr, 2])
        with pytest.raises(ShapeMismatchError):
            f.write_at(0, [arr, 5, col])
        f.set_view(0, MPI.DOUBLE)
        with pytest.raises(ViewError):
            f.write_at(0, np.zeros(3, dtype=np.uint8))
        overlapping = MPI.BYTE.Create_contiguous(16).Create_resized(0, 8).Commit()
        with pytest.raises(ViewError, match="tiles overlap"):
            f.set_view(0, MPI.BYTE, overlapping)
        overlapping = MPI.BYTE.Create_indexed([2, 2], [0, 1]).Commit()  # bytes 0-1 and 1-2
        with pytest.raises(ViewError, match="must not overlap .* byte 1 starts before"):
            f.set_view(0, MPI.BYTE, overlapping)
        f.set_view(0, MPI.BYTE, MPI.BYTE.Create_contiguous(8).Create_resized(0, 8).Commit())
    raw = np.fromfile(tmp_path / "g.bin", dtype=np.float64)
    assert np.array_equal(raw, [0, 3, 6, 9, 1, 0, 1])


def test_buffer_spec_layouts_follow_buffer_count_and_datatype() -> None:
    """Layouts of buffer specs are remembered per datatype; each call still gets its own."""
    col = MPI.DOUBLE.Create_vector(4, 1, 3).Commit()
    small, big = np.zeros(12), np.zeros(24)
    assert parse_buffer([small, col], writable=True).nbytes == 32  # as many as fit: one
    assert parse_buffer([big, col], writable=True).nbytes == 64  # two
    two = parse_buffer([big, 2, col], writable=True)
    # extent 80: the pieces [72, 80) and [80, 88) of the two instances merge
    assert two.mem.offsets.tolist() == [0, 24, 48, 72, 104, 128, 152]
    with pytest.raises(ShapeMismatchError):
        parse_buffer([small, 2, col], writable=True)
    col.Free()
    row = MPI.DOUBLE.Create_contiguous(3).Commit()  # may reuse the freed handle
    spec = parse_buffer([small, 2, row], writable=True)
    assert spec.contiguous and spec.nbytes == 48
    row.Free()
    grid = np.arange(6, dtype=np.float64).reshape(2, 3)
    spec = parse_buffer(grid, writable=True)
    assert spec.nbytes == 48 and np.shares_memory(spec.data, grid)
    assert spec.data.view(np.float64).tolist() == list(range(6))
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    assert parse_buffer(frozen, writable=False).nbytes == 32
    with pytest.raises(ReadOnlyError):
        parse_buffer(frozen, writable=True)


@pytest.mark.parametrize(
    "spec",
    [
        lambda a: [a, 2.5, MPI.BYTE],
        lambda a: [a, 2.0, MPI.BYTE],
        lambda a: [a, (2.5, 0), MPI.BYTE],
        lambda a: [a, (2, 1.0), MPI.BYTE],
        lambda a: [a, (2,), MPI.BYTE],
    ],
)
def test_buffer_counts_that_are_not_integers_are_refused(spec, tmp_path: Path) -> None:
    """A count worked out with ``/`` is refused (as mpi4py refuses it), not cut to fewer
    items, and nothing is written."""
    with strataio.File.open(None, tmp_path / "c.bin", "w") as f:
        with pytest.raises(StrataError, match="buffer specification"):
            f.write_at(0, spec(np.arange(1, 9, dtype=np.uint8)))
        assert f.get_size() == 0


def test_a_none_buffer_of_no_items_moves_nothing(tmp_path: Path) -> None:
    """``[None, 0, datatype]``, mpi4py's buffer of a rank with nothing to move, takes part in
    a collective call; None with items to move is refused before any byte moves."""
    with strataio.File.open(None, tmp_path / "n.bin", "w") as f:
        assert f.write_at_all(0, [None, 0, MPI.DOUBLE]) == 0
        assert f.read_at_all(0, [None, 0]) == 0
        with pytest.raises(StrataError, match="None but count is 2"):
            f.write_at_all(0, [None, 2, MPI.DOUBLE])
        assert f.get_size() == 0


@pytest.mark.parametrize("name", ["BYTE", "INT", "DOUBLE", "FLOAT_INT", "DOUBLE_INT", "SHORT_INT"])
def test_predefined_datatypes_parse_as_their_flattened_layout(name: str) -> None:
    """Buffers of predefined types take a shortcut past flattening when instances lie back to
    back (BYTE, INT, DOUBLE, FLOAT_INT); the result must equal the flattened layout of the same
    type (a duplicate of it takes the general path), including the refusals."""
    dt = getattr(MPI, name)
    dup = dt.Dup()
    buf = np.zeros(100, dtype=np.uint8)
    try:
        for rest in ([], [3], [(2, 1)], [None], [(0, 4)], [13], [(1, 9)]):
            spec_of = [buf, *rest[:1], dt] if rest else [buf, dt]
            dup_of = [buf, *rest[:1], dup] if rest else [buf, dup]
            try:
                want = parse_buffer(dup_of, writable=True)
            except ShapeMismatchError:
                with pytest.raises(ShapeMismatchError):
                    parse_buffer(spec_of, writable=True)
                continue
            got = parse_buffer(spec_of, writable=True)
            assert (got.nbytes, got.contiguous) == (want.nbytes, want.contiguous), rest
            if got.nbytes:
                assert got.mem.offsets.tolist() == want.mem.offsets.tolist(), rest
                assert got.mem.lengths.tolist() == want.mem.lengths.tolist(), rest
    finally:
        dup.Free()


def test_object_arrays_are_refused_and_failed_opens_leave_nothing_open(tmp_path: Path) -> None:
    path = tmp_path / "o.bin"
    with strataio.File.open(None, path, "w") as f:
        f.write_at(0, np.arange(16, dtype=np.uint8))
        objects = np.array([1.5, "x"], dtype=object)
        for spec in (objects, [objects, 16, MPI.BYTE], memoryview(objects)):
            with pytest.raises(StrataError, match="references"):
                f.read_at(0, spec)
            with pytest.raises(StrataError, match="references"):
                f.write_at(0, spec)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(HintError):
            strataio.File.open(None, path, "r", hints={"strataio_realms": "nope"})
    assert len(os.listdir("/proc/self/fd")) == fds


def test_copy_pieces_matches_brute_force() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(1, 3000))
        lens = rng.integers(0, 6000 if rng.random() < 0.3 else 70, n)
        src_off = np.cumsum(lens + rng.integers(0, 9, n)) - lens
        perm = rng.permutation(n)  # pieces land in the packed buffer in a shuffled order
        dst_off = np.empty(n, dtype=np.int64)
        dst_off[perm] = np.cumsum(lens[perm]) - lens[perm]
        src = rng.integers(0, 256, int(src_off.max() + lens.max() + 1), dtype=np.uint8)
        dst = np.zeros(int(lens.sum()), dtype=np.uint8)
        copy_pieces(dst, dst_off, src, src_off, lens)
        idx_d = (
            np.repeat(dst_off, lens)
            + np.arange(lens.sum())
            - np.repeat(np.cumsum(lens) - lens, lens)
        )
        idx_s = (
            np.repeat(src_off, lens)
            + np.arange(lens.sum())
            - np.repeat(np.cumsum(lens) - lens, lens)
        )
        expect = np.zeros_like(dst)
        expect[idx_d] = src[idx_s]
        assert np.array_equal(dst, expect)


def _brute_copy(dst, dst_off, src, src_off, lens):
    out = dst.copy()
    for d, s_, n in zip(dst_off.tolist(), src_off.tolist(), lens.tolist()):
        out[d : d + n] = src[s_ : s_ + n]
    return out


@settings(max_examples=80, deadline=None)
@given(
    dims=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    length=st.sampled_from([1, 3, 8, 64]),
    gaps=st.lists(st.integers(0, 30), min_size=8, max_size=8),
    packed=st.sampled_from(["dst", "src", "neither"]),
    nudge=st.booleans(),
)
def test_copy_pieces_of_nd_grids_match_brute_force(dims, length, gaps, packed, nudge):
    """Pieces on an N-D grid on either side (one N-D strided copy), or a near-grid that is
    not one (the general path)."""
    n = int(np.prod(dims))

    def grid(gap: list[int]) -> np.ndarray:
        off = np.zeros(1, dtype=np.int64)
        stride = length
        for k, d in enumerate(reversed(dims)):  # innermost axis first
            stride += gap[k]
            off = (np.arange(d)[:, None] * stride + off[None, :]).ravel()
            stride *= d
        return off + 5

    a = grid(gaps[:4])
    b = grid(gaps[4:]) if packed == "neither" else np.arange(n) * length
    src_off, dst_off = (b, a) if packed == "src" else (a, b)
    if nudge and n > 2:  # one piece out of line: the general path must take over
        src_off = src_off.copy()
        src_off[n // 2] += 1
    lens = np.full(n, length, dtype=np.int64)
    rng = np.random.default_rng(n)
    src = rng.integers(0, 256, int(src_off.max()) + length + 3, dtype=np.uint8)
    dst = np.zeros(int(dst_off.max()) + length + 3, dtype=np.uint8)
    want = _brute_copy(dst, dst_off, src, src_off, lens)
    copy_pieces(dst, dst_off.astype(np.int64), src, src_off.astype(np.int64), lens)
    assert np.array_equal(dst, want)


def test_even_realms_and_aggregators() -> None:
    r = EvenRealms().bounds(10, 110, 3)
    assert r.tolist() == [[10, 44], [44, 78], [78, 110]]
    r = EvenRealms(align=16).bounds(10, 110, 3)
    assert r.tolist() == [[10, 32], [32, 64], [64, 110]]
    assert EvenRealms().bounds(5, 7, 4).tolist() == [[5, 6], [6, 7], [7, 7], [7, 7]]
    two_nodes = ["a"] * 4 + ["b"] * 4
    assert config_aggregators("*:1", two_nodes, 8).tolist() == [0, 4]
    assert config_aggregators("*:1", two_nodes, 1).tolist() == [0]
    assert config_aggregators("*:2", two_nodes, 8).tolist() == [0, 1, 4, 5]
    assert config_aggregators("*:*", ["a"] * 4, 9).tolist() == [0, 1, 2, 3]
    assert config_aggregators("b:2,a:1", two_nodes, 8).tolist() == [4, 5, 0]
    assert config_aggregators("b:1,*:2", two_nodes, 8).tolist() == [4, 0, 1]  # b passed by
    assert config_aggregators("b,*", two_nodes, 8).tolist() == [4, 0]
    assert config_aggregators("nosuch:1,*:3", ["a"] * 4, 4).tolist() == [0, 1, 2]
    with pytest.raises(HintError, match="no process matches"):
        config_aggregators("nosuch:2", two_nodes, 8)
    with pytest.raises(HintError, match="no process matches"):
        config_aggregators("*:0", two_nodes, 8)


def test_automatic_choice() -> None:
    # columns: err, first, last, nbytes, npieces
    tiny_interleaved = np.array([[0, 0, 4096, 1024, 64], [0, 16, 4112, 1024, 64]])
    big_pieces = np.array([[0, 0, 1 << 22, 1 << 21, 8], [0, 1 << 18, 1 << 23, 1 << 21, 8]])
    disjoint = np.array([[0, 0, 4096, 1024, 16], [0, 4096, 8192, 1024, 16]])
    assert use_two_phase(tiny_interleaved, "automatic")
    assert not use_two_phase(big_pieces, "automatic")
    assert not use_two_phase(disjoint, "automatic")
    assert use_two_phase(disjoint, "enable")
    assert not use_two_phase(tiny_interleaved, "disable")

    # HPIO, 4096 regions per rank, 128 bytes apart: with 4 KiB regions at 8 ranks a rank's
    # regions lie 29696 bytes apart, wider than sieving crosses, so independent writes would
    # take one call per region; at 2 and 4 ranks (4352 and 12800 bytes apart) they are sieved,
    # dragging 2.1 and 4.1 times the bytes written: the first stays independent, the second
    # drags enough to aggregate (see SIEVE_DRAG_SCORE).
    def hpio(nprocs: int, region: int = 4096, regions: int = 4096) -> np.ndarray:
        slot = nprocs * (region + 128)
        return np.array(
            [
                [0, r * (region + 128), r * (region + 128) + (regions - 1) * slot + region]
                + [regions * region, regions]
                for r in range(nprocs)
            ]
        )

    assert use_two_phase(hpio(8), "automatic", write=True)
    assert not use_two_phase(hpio(8), "automatic", write=True, crowded=True)
    assert not use_two_phase(hpio(8), "automatic", write=False)
    assert use_two_phase(hpio(4), "automatic", write=True)
    assert not use_two_phase(hpio(4), "automatic", write=True, crowded=True)
    assert not use_two_phase(hpio(2), "automatic", write=True)
    # 512-byte regions: sieving drags 1.25 bytes per rank per byte written; two-phase pays
    # per piece, so only 16 ranks aggregate
    assert not use_two_phase(hpio(8, 512, 16384), "automatic", write=True)
    assert use_two_phase(hpio(16, 512, 8192), "automatic", write=True)
    assert not use_two_phase(hpio(16, 512, 8192), "automatic", write=False)

    # mpi-tile-io, 4 x 2 tiles of 1024 x 1024 doubles: each rank's rows are 8 KiB, every other
    # one its own, so sieving drags 2 bytes per byte written in pieces large enough to aggregate
    def tiles(py: int, px: int, t: int) -> np.ndarray:
        rows = []
        for ry in range(py):
            for rx in range(px):
                first = (ry * t * px * t + rx * t) * 8
                rows.append([0, first, first + ((t - 1) * px * t + t) * 8, t * t * 8, t])
        return np.array(rows)

    assert use_two_phase(tiles(4, 2, 1024), "automatic", write=True)
    assert not use_two_phase(tiles(4, 2, 1024), "automatic", write=True, crowded=True)
    assert not use_two_phase(tiles(4, 1, 1024), "automatic", write=True)  # ranges disjoint
    assert not use_two_phase(tiles(1, 2, 1024), "automatic", write=True)  # two ranks only
    few = hpio(8)
    few[:, 4] = 64  # 64 regions of 64 KiB: few calls, each moving much
    few[:, 2] = few[:, 1] + 63 * 8 * (65536 + 128) + 65536
    few[:, 3] = 64 * 65536
    assert not use_two_phase(few, "automatic", write=True)


@pytest.mark.parametrize("how", ["scatter", "spans", "chosen", "shared", "mapped"])
def test_sieved_reads_match_brute_force(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from strataio.collective import driver as driver_module
    from strataio.collective import fileio
    from strataio.collective.driver import PosixDriver
    from strataio.collective.fileio import ReadPlan
    from strataio.layout.extents import Extents
    from strataio.storage import mapped, vectored

    shared: list[int] = []
    gathered: list[bool] = []
    if how == "mapped":  # staged reads of any size copied out of a mapping, where taken
        if mapped._mapcopy is None:
            pytest.skip("_mapcopy not built")
        for module in (fileio, mapped, vectored):
            monkeypatch.setattr(module, "MAPPED_READ_BYTES", 1)
        monkeypatch.setattr(driver_module, "SPLIT_READ_BYTES", 10_000)  # (shared by threads)
        gather = vectored.gather_cached
        monkeypatch.setattr(
            vectored,
            "gather_cached",
            lambda *a, **k: gathered.append(ok := gather(*a, **k)) or ok,
        )
    if how == "shared":  # staged batches shared among 3 threads from 10 kB staged
        monkeypatch.setattr(fileio, "SPLIT_READ_BYTES", 10_000)
        run = fileio.run_shared
        monkeypatch.setattr(
            fileio, "run_shared", lambda work: shared.append(len(work)) or run(work)
        )
    rng = np.random.default_rng(7)
    path = tmp_path / "s.bin"
    for _ in range(40):
        n = int(rng.integers(1, 2000))
        lens = rng.integers(1, 300, n)
        offs = np.cumsum(rng.integers(0, 400, n) + lens) - lens
        size = max(int(offs[-1] + lens[-1]) - int(rng.integers(0, 200)), 0)  # EOF inside
        init = rng.integers(0, 256, size, dtype=np.uint8)
        path.write_bytes(init.tobytes())
        perm = rng.permutation(n)
        mem = np.empty(n, dtype=np.int64)
        mem[perm] = np.cumsum(lens[perm]) - lens[perm]
        out = np.full(int(lens.sum()), 7, dtype=np.uint8)
        driver = PosixDriver.open(str(path), os.O_RDONLY)
        driver.threads = 3
        try:
            hole = int(rng.integers(0, 500))
            ext = Extents(offs, lens, mem)
            if how == "scatter":
                ReadPlan(ext, 0, hole, scatter=True).run(driver, out)
            elif how == "chosen":
                ReadPlan(ext, int(rng.integers(1, 5000)), hole).run(driver, out)
            elif how in ("shared", "mapped"):
                ReadPlan(ext, int(rng.integers(500, 5000)), hole, scatter=False).run(driver, out)
            else:
                span = int(rng.integers(1, 5000))
                ReadPlan(ext, span, hole, scatter=False).run(driver, out)
        finally:
            driver.close()
        full = np.concatenate([init, np.zeros(1000, dtype=np.uint8)])  # zeros past EOF
        within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        expect = np.empty_like(out)
        expect[np.repeat(mem, lens) + within] = full[np.repeat(offs, lens) + within]
        assert np.array_equal(out, expect)
    if how == "shared":
        assert len(shared) > 20 and set(shared) <= {2, 3}  # (fewer batches than threads: 2)
    if how == "mapped":  # (declined where the file ends inside the pieces: read staged)
        assert gathered.count(True) > 20 and gathered.count(False) > 5


@given(
    raw=st.integers(0, 2**40),
    file_offset=st.integers(0, 2**40),
    first_dst=st.integers(0, 2**41),
)
def test_staging_buffers_keep_both_copies_off_4k_aliasing(
    raw: int, file_offset: int, first_dst: int
) -> None:
    """A staged read places its buffer so that neither the kernel's copy into it nor the copy
    out of it writes a few bytes ahead of where it reads within a page (4K aliasing: 3-9
    GB/s against about 20)."""
    from strataio.collective.fileio import _stage_at
    from strataio.storage.mapped import ALIAS_BYTES as _AHEAD
    from strataio.storage.mapped import PAGE as _PAGE

    at = _stage_at(raw, file_offset, first_dst)
    stage = raw + at
    assert 0 <= at < _PAGE
    assert not 0 < (stage - file_offset) % _PAGE < _AHEAD  # kernel: file -> stage
    assert not 0 < (first_dst - stage) % _PAGE < _AHEAD  # numpy: stage -> caller
    if not 0 < (first_dst - file_offset) % _PAGE < _AHEAD:
        assert (stage - file_offset) % _PAGE == 0  # page-aligned on both sides when it can


def test_a_file_cut_by_another_handle_reads_short_after_sync(tmp_path: Path) -> None:
    """MPI's sync makes another handle's (or process's) change of the file visible: a read
    past the new end returns the bytes before it and moves the pointer by them only."""
    path = tmp_path / "f.bin"
    with strataio.File.open(MPI.COMM_SELF, path, "w") as f:
        f.write_at(0, np.full(2000, 7, np.uint8))
        f.read_at(0, np.zeros(1500, np.uint8))  # (the size it knows: 2000)
        with strataio.File.open(MPI.COMM_SELF, path, "r+") as g:
            g.set_size(100)
        f.sync()
        buf = np.full(500, 0xEE, np.uint8)
        assert f.read_at(0, buf) == 100
        assert (buf[:100] == 7).all()
        f.seek(0)
        assert f.read(buf) == 100 and f.get_position() == 100


def test_fortran_ordered_arrays_are_buffers_in_memory_order(tmp_path: Path) -> None:
    """As mpi4py takes them: the bytes of a Fortran-ordered array in memory order, to write
    and to read into; a non-contiguous array is refused with a clear error."""
    path = tmp_path / "f.bin"
    a = np.asfortranarray(np.arange(12, dtype="f8").reshape(3, 4))
    with strataio.File.open(MPI.COMM_SELF, path, "w") as f:
        f.write_at(0, a)
    assert path.read_bytes() == a.T.tobytes()  # (memory order)
    back = np.asfortranarray(np.zeros((3, 4)))
    with strataio.File.open(MPI.COMM_SELF, path, "r") as f:
        f.read_at(0, back)
        np.testing.assert_array_equal(back, a)
        with pytest.raises(StrataError, match="not contiguous"):
            f.read_at(0, np.zeros((3, 8))[:, ::2])


def test_files_reuse_the_private_communicator_of_closed_files(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    user = MPI.COMM_SELF.Dup()
    first = strataio.File.open(user, path, "w")
    mine = first.comm
    assert mine != user and mine != MPI.COMM_NULL
    first.close()
    with pytest.raises(StrataError):  # failing before it takes one: kept
        strataio.File.open(user, tmp_path / "missing.bin", "r")
    assert mine != MPI.COMM_NULL
    with pytest.raises(StrataError):  # failing after (creating): freed
        strataio.File.open(user, path, "x")
    assert mine == MPI.COMM_NULL
    again = strataio.File.open(user, path, "r")
    other = strataio.File.open(user, path, "r")  # open at once: a communicator of its own
    assert again.comm != other.comm
    kept = [other.comm, again.comm]
    other.close()
    again.close()
    with strataio.File.open(user, path, "r") as reused:  # the last one handed back
        assert reused.comm == kept[1]
    still_open = strataio.File.open(user, path, "r")
    assert still_open.comm == kept[1]
    user.Free()  # frees the kept ones; an open file's goes when it closes
    assert kept[0] == MPI.COMM_NULL and still_open.comm != MPI.COMM_NULL
    still_open.close()
    assert still_open.comm == MPI.COMM_NULL


def test_read_plans_stage_dense_small_pieces_and_scatter_sparse_large_ones() -> None:
    from strataio.collective.fileio import _scatters
    from strataio.layout.extents import Extents

    def strided(piece: int, hole: int, n: int = 1000) -> Extents:
        return Extents(np.arange(n) * (piece + hole), np.full(n, piece), np.arange(n) * piece)

    # the measured cases (see fileio.SCATTER_PIECE)
    assert not _scatters(strided(512, 128))  # HPIO 512 B at one rank
    assert not _scatters(strided(512, 768))  # ... at two ranks
    assert not _scatters(strided(4096, 128))  # holes short next to the pieces
    assert not _scatters(strided(64, 8192))  # small pieces
    assert _scatters(strided(4096, 4096)) and _scatters(strided(1024, 2048))
    assert _scatters(strided(1 << 20, 0, 1))  # one piece
    # pieces beyond the measured sizes: staging would only copy every byte twice
    assert _scatters(strided(1 << 20, 64 << 10, 16))
    assert _scatters(strided(8 << 20, 1 << 20, 4))
    assert _scatters(strided(64 << 20, 4096, 2))


@pytest.mark.parametrize("ds", ["automatic", "enable", "disable"])
def test_repeated_calls_reuse_plans_correctly(ds: str, tmp_path: Path) -> None:
    """Calls that repeat a view, a buffer type and an offset reuse one memoized plan: every
    call must still move its own buffer's bytes, and a new view or offset must not reuse it."""
    rng = np.random.default_rng(11)
    mt = MPI.BYTE.Create_hvector(64, 48, 80).Commit()  # 48 of every 80 bytes of memory
    ft = MPI.BYTE.Create_hvector(16, 96, 224).Create_resized(0, 16 * 224).Commit()  # 96 of 224
    hints = {"romio_ds_read": ds, "romio_ds_write": ds}
    path = tmp_path / "p.bin"
    oracle = np.zeros(0, dtype=np.uint8)
    try:
        with strataio.File.open(None, path, "w", hints=hints) as f:
            for step in range(6):
                disp = 0 if step < 4 else 100  # the last calls change the view
                f.set_view(disp, MPI.BYTE, ft)
                at = 2 * 96 * 16 * (step % 2)  # alternate between two offsets (bytes)
                buf = rng.integers(0, 256, 64 * 80, dtype=np.uint8)
                f.write_at_all(at, [buf, 1, mt])
                data = buf.reshape(64, 80)[:, :48].ravel()  # the stream, in order
                tiles = np.arange(data.size) // 96
                within = np.arange(data.size) % 96
                pos = disp + (at // 96 + tiles) * 224 + within
                if oracle.size < pos.max() + 1:
                    oracle = np.concatenate(
                        (oracle, np.zeros(pos.max() + 1 - oracle.size, np.uint8))
                    )
                oracle[pos] = data
                back = np.zeros_like(buf)
                f.read_at_all(at, [back, 1, mt])
                assert np.array_equal(back.reshape(64, 80)[:, :48].ravel(), data)
        assert np.array_equal(np.fromfile(path, dtype=np.uint8), oracle)
    finally:
        mt.Free()
        ft.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 3])
def test_node_layout_is_counted_and_cached(nprocs: int, tmp_path: Path) -> None:
    out = json.loads(run_mpi(nprocs, "node_layout.py", tmp_path).strip().splitlines()[-1])
    assert out["answer"] == out["expected"] == out["cached"] == out["file"]


@pytest.mark.mpi
def test_failed_overlapped_read_leaves_no_io_behind(tmp_path: Path) -> None:
    out = json.loads(run_mpi(2, "two_phase_failure_overlap.py", tmp_path).strip().splitlines()[-1])
    assert out == {"read": ["BackendError", "BackendError"], "wrong": 0}


@pytest.mark.parametrize("write", [True, False])
def test_a_failed_two_phase_access_names_the_file_and_the_rank(
    write: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An aggregator's failed write (a full disk) or read in two-phase I/O raises a
    BackendError that names the file and the aggregator's rank, as every other BackendError of
    a File names the file."""
    from strataio.collective.driver import PosixDriver

    path = tmp_path / "f.bin"
    data = np.zeros(1_200_000, dtype=np.uint8)
    data.tofile(path)
    code = errno.ENOSPC if write else errno.EIO

    def fails(self, buf, offset):  # type: ignore[no-untyped-def]
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(PosixDriver, "pwrite" if write else "pread", fails)
    hints = {"romio_cb_write": "enable", "romio_cb_read": "enable"}
    with strataio.File.open(None, path, "r+", hints=hints) as f:
        with pytest.raises(BackendError) as failed:
            (f.write_at_all if write else f.read_at_all)(0, data)
        assert f.last_path == "two-phase"
    what = "write" if write else "read"
    assert str(failed.value) == (
        f"{path}: {what} of 1200000 bytes at 0 by rank 0 failed: [Errno {code}] {os.strerror(code)}"
    )


@pytest.mark.parametrize("sieve", ["enable", "disable"])
def test_a_failed_independent_write_names_the_file_once(
    sieve: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A strided independent write on a full disk, through data sieving (read-modify-write
    of a span) or one vectored write of its pieces: the BackendError names the file once."""
    from strataio.collective.driver import PosixDriver

    def full(self, *args):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    path = tmp_path / "f.bin"
    np.zeros(400_000, dtype=np.uint8).tofile(path)
    monkeypatch.setattr(PosixDriver, "pwrite", full)
    monkeypatch.setattr(PosixDriver, "writev", full)
    every_other = MPI.BYTE.Create_vector(1000, 100, 200).Commit()
    try:
        with strataio.File.open(None, path, "r+", hints={"romio_ds_write": sieve}) as f:
            f.set_view(0, MPI.BYTE, every_other)
            with pytest.raises(BackendError) as failed:
                f.write_at(0, np.ones(100_000, dtype=np.uint8))
    finally:
        every_other.Free()
    what = "199900 bytes at 0 failed:" if sieve == "enable" else "1000 pieces:"
    assert str(failed.value) == f"{path}: write of {what} [Errno 28] {os.strerror(errno.ENOSPC)}"


@pytest.mark.mpi
def test_planning_failure_of_any_kind_raises_on_every_rank(tmp_path: Path) -> None:
    """A MemoryError while one rank plans a two-phase write: every rank raises before a byte is
    written, and the next collective call on the file works."""
    out = json.loads(run_mpi(2, "two_phase_unexpected_failure.py", "planning", tmp_path))
    write = out["write"]
    assert write[1] == "MemoryError: injected: no memory for the realms"
    assert write[0].startswith("StrataError: injected: no memory for the realms")
    assert "rank 1" in write[0]
    assert out["size_after_failure"] == 0
    assert out["second_write_whole"] is True
    size = out["set_size"]
    assert size[1] == "StrataError: set_size: size must be an integer, not 'ten'"
    assert size[0].startswith("StrataError: set_size: size must be") and "rank 1" in size[0]
    assert out["size_after_set_size"] == 2 * 3 * 4096


@pytest.mark.mpi
@pytest.mark.parametrize("where", ["exchange", "descriptors"])
def test_broken_exchange_aborts_the_job_instead_of_hanging(tmp_path: Path, where: str) -> None:
    """A rank that fails inside a collective the others are already in (building its side of an
    exchange, or after the planning's first collective) ends the job with a message
    (MPI_Abort); without that the other rank would wait forever."""
    proc = launch_mpi(2, "two_phase_unexpected_failure.py", where, tmp_path, timeout=60)
    assert proc.returncode != 0
    assert "rank 1: a two-phase exchange broke off (MemoryError" in proc.stderr
    assert "rank 0 finished" not in proc.stdout


def test_exchange_side_frees_its_datatypes_when_building_one_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A typed exchange side builds one datatype per peer; when building the second fails, the
    first is freed before the error leaves (no datatype leaks per failed call)."""
    from strataio.collective import exchange

    built: list[MPI.Datatype] = []
    real = exchange.ExchangeSide._describe

    def describe(self, peer, pos, lens):  # type: ignore[no-untyped-def]
        if built:
            raise MemoryError("no room for another datatype")
        real(self, peer, pos, lens)
        built.extend(self.types[peer : peer + 1])

    monkeypatch.setattr(exchange.ExchangeSide, "_describe", describe)
    buf = np.zeros(1 << 16, dtype=np.uint8)
    pos = np.array([0, 4096, 8192, 12288], dtype=np.int64)  # 2 KiB pieces with gaps: typed
    lens = np.full(4, 2048, dtype=np.int64)
    peers = np.array([1, 1, 2, 2], dtype=np.int64)
    with pytest.raises(MemoryError):
        exchange.ExchangeSide(buf, pos, lens, peers, 3, 0, send=True)
    assert len(built) == 1 and built[0] == MPI.DATATYPE_NULL


def test_agreement_falls_back_to_a_plain_allgather_without_persistent_collectives() -> None:
    """An MPI before 4.0 has no ``MPI_Allgather_init``: the agreement then gathers per call."""
    from strataio.collective.access import Access
    from strataio.collective.agreement import Agreement, agreement_row
    from strataio.layout.extents import Extents

    class OldComm:  # two ranks that both bring the same row
        def Get_size(self) -> int:
            return 2

        def Allgather_init(self, row: np.ndarray, out: np.ndarray) -> None:
            raise NotImplementedError

        def Allgather(self, row: np.ndarray, out: np.ndarray) -> None:
            assert row.dtype == out.dtype  # matching type signatures, as MPI requires
            out[:] = row

    agreement = Agreement(OldComm())  # type: ignore[arg-type]
    access = Access(Extents(np.array([10]), np.array([10])), np.zeros(10, dtype=np.uint8))
    rows = agreement(agreement_row(access, 0))
    assert rows == [[0, 10, 20, 10, 1]] * 2
    assert np.array_equal(agreement.table, np.array(rows))
    assert agreement(agreement_row(access, 3)) == [[3, 10, 20, 10, 1]] * 2
    agreement.free()


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 4])
def test_aggregator_hints_match_romio(nprocs: int, tmp_path: Path) -> None:
    """cb_config_list, cb_nodes and romio_no_indep_rw choose, report and open as ROMIO does."""
    out = run_mpi(nprocs, "aggregators_vs_romio.py", tmp_path)
    assert f"ok 11 on {nprocs} ranks" in out, out


def test_file_refuses_hints_of_engines_not_built_before_creating(tmp_path: Path) -> None:
    path = tmp_path / "never.bin"
    with pytest.raises(HintError, match="strataio_trace.*not supported yet"):
        strataio.File.open(None, path, "w", hints={"strataio_trace": "enable"})
    assert not path.exists()
    with strataio.File.open(None, path, "w", hints={"romio_no_indep_rw": "true"}) as f:
        shown = f.hints
        assert "strataio_trace" not in shown and "striping_factor" not in shown
        assert (shown["romio_cb_read"], shown["romio_cb_write"]) == ("enable", "enable")
        assert f.aggregators == [0] and f.driver is not None  # the one rank aggregates
        f.write_all(np.arange(10, dtype=np.uint8))
        with pytest.raises(HintError, match="independent write"):
            f.write_at(0, np.zeros(4, np.uint8))
        with pytest.raises(HintError, match="independent read"):
            f.read(np.zeros(4, np.uint8))
        back = np.zeros(10, np.uint8)
        f.read_at_all(0, back)
    assert back.tolist() == list(range(10))


def test_the_open_memo_tells_a_value_from_its_text(tmp_path: Path) -> None:
    """Opens remember what they made of the hints: a value and its text (True, "True") parse
    differently and must not share what was remembered."""
    path = tmp_path / "f.bin"
    with strataio.File.open(None, path, "w", hints={"romio_cb_write": True}) as f:
        assert f.hints["romio_cb_write"] == "enable"
    with pytest.raises(HintError):
        strataio.File.open(None, path, "r", hints={"romio_cb_write": "True"})


def test_spare_cores_are_shared_with_the_job_s_other_ranks_on_the_node(monkeypatch) -> None:
    """A file every rank opens on COMM_SELF: the job's other processes on the node (as the
    launcher says) take their share of the spare cores."""
    from strataio.collective.node import NodeLayout

    alone = NodeLayout(nodes=1, spare_cores=7, names=("n0",))
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert alone.spare_per_rank(0) == 7
    monkeypatch.setenv("MPI_LOCALNRANKS", "4")  # 8 CPUs, 4 processes of the job
    assert alone.spare_per_rank(0) == 1
    monkeypatch.setenv("MPI_LOCALNRANKS", "8")
    assert alone.spare_per_rank(0) == 0
    two = NodeLayout(nodes=1, spare_cores=6, names=("n0", "n0"))  # 2 of the 8 processes
    assert two.spare_per_rank(1) == 0
    monkeypatch.setenv("MPI_LOCALNRANKS", "2")
    assert two.spare_per_rank(1) == 3
    assert NodeLayout(nodes=1, spare_cores=-2, names=("n0",) * 4).spare_per_rank(0) == 0


def test_the_read_threads_hint(tmp_path: Path) -> None:
    """``strataio_read_threads``: a number (clamped to MAX_READ_THREADS, and shown clamped:
    the hints show the number in force, as ROMIO shows cb_nodes) or automatic; anything else
    is refused before the file is opened."""
    from strataio.collective.driver import MAX_READ_THREADS

    path = tmp_path / "f.bin"
    np.zeros(1000, np.uint8).tofile(path)
    top = MAX_READ_THREADS
    for asked, want in (("1", 1), ("2", 2), (str(top), top), ("64", top), ("100", top)):
        with strataio.File.open(None, path, "r", hints={"strataio_read_threads": asked}) as f:
            assert f.driver.threads == want
            assert f.hints["strataio_read_threads"] == str(want)
    with strataio.File.open(None, path, "r") as f:
        assert f.hints["strataio_read_threads"] == "automatic"
        assert 1 <= f.driver.threads <= MAX_READ_THREADS
    for bad in ("0", "many", "-2"):
        with pytest.raises(HintError, match="strataio_read_threads"):
            strataio.File.open(None, path, "r", hints={"strataio_read_threads": bad})
