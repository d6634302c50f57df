"""PosixBackend: key safety, batched preadv/pwritev against a numpy oracle, atomic put."""

from __future__ import annotations

import errno
import os
import shutil
import sys
import sysconfig
import tempfile
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strataio.errors import BackendError, InvalidKeyError, NotFoundError, ShapeMismatchError
from strataio.layout.extents import Extents
from strataio.storage import posix
from strataio.storage.posix import TMP_SUFFIX, LeftoverState, PosixBackend, judge_leftover
from strataio.storage.vectored import IOV_MAX
from strataio.tiers.tier import in_the_way


@pytest.fixture
def backend(tmp_path) -> PosixBackend:
    return PosixBackend(tmp_path / "root")


def test_invalid_keys_leave_the_root_empty(backend: PosixBackend) -> None:
    # The refusals themselves are in the backend contract suite; here: nothing reached disk.
    for key in ("../x", "a/../../x", "/etc/passwd", "a\x00b", "C:x", "a\\b"):
        with pytest.raises(InvalidKeyError):
            backend.put(key, b"x")
        with pytest.raises(InvalidKeyError):
            backend.write(key, Extents.single(0, 1), b"x")
    assert not os.listdir(backend.root)


def test_missing_objects(backend: PosixBackend) -> None:
    with pytest.raises(NotFoundError):
        backend.get("nope")
    with pytest.raises(NotFoundError):
        backend.read("nope", Extents.single(0, 4))
    with pytest.raises(NotFoundError):
        backend.size("nope")
    backend.delete("nope")  # missing is fine
    assert not backend.exists("nope")


def _scattered(rng: np.random.Generator, n: int, piece: int, file_size: int) -> Extents:
    """``n`` disjoint pieces in random file order, packed in the stream."""
    slots = rng.choice(file_size // piece, n, replace=False)
    lens = rng.integers(1, piece + 1, n)
    return Extents(slots * piece, lens)


def test_pwritev_preadv_many_pieces_match_numpy(backend: PosixBackend) -> None:
    rng = np.random.default_rng(1)
    size = 1 << 16
    oracle = np.zeros(size, dtype=np.uint8)
    backend.truncate("f", size)

    # (1) scattered pieces, more than IOV_MAX, in random order
    n = 3 * IOV_MAX + 17
    ext = _scattered(rng, n, 16, size)
    data = rng.integers(0, 256, ext.nbytes, dtype=np.uint8)
    backend.write("f", ext, data)
    oracle[ext.byte_indices()] = data

    # (2) file-adjacent pieces whose stream positions are shuffled: they cannot coalesce, so
    # one run holds more than IOV_MAX buffers and must be split across calls
    m = 2 * IOV_MAX + 5
    lens = rng.integers(1, 8, m)
    offs = 1000 + np.concatenate(([0], np.cumsum(lens)[:-1]))
    order = rng.permutation(m)
    mem = np.empty(m, dtype=np.int64)
    mem[order] = np.concatenate(([0], np.cumsum(lens[order])[:-1]))
    adj = Extents(offs, lens, mem)
    assert len(adj.coalesce()) > IOV_MAX
    stream = rng.integers(0, 256, int(lens.sum()), dtype=np.uint8)
    backend.write("f", adj, stream)
    for o, ln, p in zip(offs.tolist(), lens.tolist(), mem.tolist()):
        oracle[o : o + ln] = stream[p : p + ln]

    assert np.array_equal(np.frombuffer(backend.get("f"), np.uint8), oracle)
    got = np.frombuffer(backend.read("f", ext), np.uint8)
    assert np.array_equal(got, oracle[ext.byte_indices()])
    got = np.frombuffer(backend.read("f", adj), np.uint8)
    assert np.array_equal(got, stream)

    # readinto a caller buffer at the stream positions
    out = bytearray(ext.nbytes)
    backend.readinto("f", ext, out)
    assert np.array_equal(np.frombuffer(out, np.uint8), oracle[ext.byte_indices()])


def test_write_creates_and_grows_read_past_eof_zero_fills(backend: PosixBackend) -> None:
    backend.write("d/e/f", Extents([10, 30], [4, 2]), b"abcdXY")
    assert backend.size("d/e/f") == 32
    raw = bytes(backend.get("d/e/f"))
    assert raw == b"\0" * 10 + b"abcd" + b"\0" * 16 + b"XY"
    # pieces past end-of-file read as zeros (a hole), after a partial piece at the end
    got = bytes(backend.read("d/e/f", Extents([12, 30, 40, 100], [2, 8, 5, 3])))
    assert got == b"cd" + b"XY" + b"\0" * 6 + b"\0" * 5 + b"\0" * 3
    # many pieces entirely past the end
    ext = Extents(np.arange(IOV_MAX + 10) * 3 + 1000, np.full(IOV_MAX + 10, 2))
    assert bytes(backend.read("d/e/f", ext)) == b"\0" * ext.nbytes
    assert list(backend.list()) == ["d/e/f"]
    assert list(backend.list("d/e")) == ["d/e/f"]


def test_put_is_atomic_replace_without_leftovers(backend: PosixBackend) -> None:
    backend.put("a/b", b"first version, longer")
    backend.put("a/b", b"second", durable=True)
    assert bytes(backend.get("a/b")) == b"second"
    assert backend.size("a/b") == 6
    assert list(backend.leftovers()) == []
    names = os.listdir(backend.root / "a")
    assert names == ["b"] and not any(n.endswith(TMP_SUFFIX) for n in names)
    backend.put("empty", b"")
    assert bytes(backend.get("empty")) == b""
    big = np.random.default_rng(2).integers(0, 256, 3 << 20, dtype=np.uint8)
    backend.put("big", memoryview(big))
    assert np.array_equal(np.frombuffer(backend.get("big"), np.uint8), big)
    assert sorted(backend.list()) == ["a/b", "big", "empty"]


def test_put_failure_leaves_old_object_and_no_temp(backend: PosixBackend) -> None:
    backend.put("k", b"old")

    class Boom:
        def __buffer__(self, flags: int) -> memoryview:
            raise RuntimeError("source failed")

    with pytest.raises((RuntimeError, TypeError)):
        backend.put("k", Boom())  # type: ignore[arg-type]
    assert bytes(backend.get("k")) == b"old"
    assert list(backend.leftovers()) == []


def test_leftovers_reports_interrupted_put(backend: PosixBackend) -> None:
    backend.put("x", b"1")
    stale = backend.root / f"x.123.0{TMP_SUFFIX}"
    stale.write_bytes(b"partial")
    assert list(backend.leftovers()) == [str(stale)]
    assert list(backend.list()) == ["x"]  # temp files are not objects


def test_a_leftover_is_judged_by_its_puts_lock(backend: PosixBackend, monkeypatch) -> None:
    """A put holds its temporary file's lock until after its rename: while it runs the file
    is live and no judge deletes it; a file no process holds is dead and deleted at once."""
    import threading

    stale = backend.root / f"x.4242.7{TMP_SUFFIX}"
    backend.root.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"half")  # a put killed before its rename: nobody holds it
    assert judge_leftover(str(stale)) is LeftoverState.DEAD and stale.exists()

    at_rename, go_on = threading.Event(), threading.Event()
    real_replace = os.replace

    def slow_replace(src, dst):
        at_rename.set()
        assert go_on.wait(10)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", slow_replace)
    writer = threading.Thread(target=backend.put, args=("y", b"new bytes"))
    writer.start()
    assert at_rename.wait(10)
    (live,) = [p for p in backend.leftovers() if os.path.basename(p).startswith("y.")]
    for remove in (False, True):
        assert judge_leftover(live, remove=remove) is LeftoverState.LIVE
        assert os.path.exists(live)
    go_on.set()
    writer.join(10)
    assert bytes(backend.get("y")) == b"new bytes"
    assert judge_leftover(live, remove=True) is LeftoverState.GONE

    assert judge_leftover(str(stale), remove=True) is LeftoverState.DEAD
    assert not stale.exists() and list(backend.leftovers()) == []


def test_a_put_whose_temporary_file_is_judged_before_its_lock_starts_over(
    backend: PosixBackend, monkeypatch
) -> None:
    """Between creating its temporary file and locking it a put holds nothing: a judge
    there deletes the file, and the put, finding it unlinked under its lock, takes a new one."""
    real_flock = posix.fcntl.flock
    judged: list[LeftoverState] = []

    def flock(fd, op):
        if op == posix.fcntl.LOCK_EX and not judged:  # the put's own (blocking) lock
            (tmp,) = backend.leftovers()
            judged.append(judge_leftover(tmp, remove=True))
        return real_flock(fd, op)

    monkeypatch.setattr(posix.fcntl, "flock", flock)
    backend.put("z", b"whole")
    assert judged == [LeftoverState.DEAD]
    assert bytes(backend.get("z")) == b"whole" and list(backend.leftovers()) == []


def test_a_put_whose_temporary_file_is_unlinked_on_nfs_before_its_lock_starts_over(
    backend: PosixBackend, monkeypatch
) -> None:
    """On NFS a file unlinked while a client holds it open is renamed to a hidden name and
    keeps its link count: a put whose temporary file a judge deleted so before its lock
    sees the name gone (or naming another file) and takes a new one."""
    real_flock = posix.fcntl.flock
    moved: list[str] = []

    def flock(fd, op):
        if op == posix.fcntl.LOCK_EX and len(moved) < 2:  # the put's own (blocking) lock
            (tmp,) = backend.leftovers()
            hidden = str(backend.root / f".nfs{len(moved)}")
            os.rename(tmp, hidden)  # (what NFS makes of the judge's unlink)
            if moved:  # another file at the name
                with open(tmp, "wb"):
                    pass
            moved.append(hidden)
        return real_flock(fd, op)

    monkeypatch.setattr(posix.fcntl, "flock", flock)
    backend.put("z", b"whole")
    assert bytes(backend.get("z")) == b"whole"
    assert all(os.stat(m).st_nlink == 1 for m in moved) and len(moved) == 2
    (other,) = backend.leftovers()  # (the file put at the name, never the put's)
    assert os.path.getsize(other) == 0


def test_drop_cache_and_sync_keep_data(backend: PosixBackend) -> None:
    data = np.arange(1 << 18, dtype=np.uint32)
    backend.write("c", Extents.single(0, data.nbytes), memoryview(data).cast("B"))
    backend.drop_cache("c")  # flushes dirty pages, then evicts
    backend.drop_cache("missing")  # no error
    backend.sync()
    backend.sync(["c", "missing"])
    assert np.array_equal(np.frombuffer(backend.get("c"), np.uint32), data)


def test_root_must_exist_without_create(tmp_path) -> None:
    with pytest.raises(NotFoundError):
        PosixBackend(tmp_path / "absent", create=False)


def test_readinto_range_and_sizes(backend: PosixBackend) -> None:
    data = np.random.default_rng(4).integers(0, 256, 10_000, dtype=np.uint8)
    backend.put("r", memoryview(data))
    out = bytearray(3000)
    assert backend.readinto_range("r", 500, memoryview(out)) == data.size
    assert bytes(out) == data[500:3500].tobytes()
    # a range running past the end: the tail reads as zeros, the size is reported
    out = bytearray(b"\xff" * 4000)
    assert backend.readinto_range("r", 8000, memoryview(out)) == data.size
    assert bytes(out) == data[8000:].tobytes() + b"\0" * 2000
    # nowait on pages just written (in the page cache) completes like a plain read
    out = bytearray(1000)
    try:
        backend.readinto_range("r", 0, memoryview(out), nowait=True)
    except BlockingIOError:
        pytest.skip("the kernel refused RWF_NOWAIT on cached pages")
    assert bytes(out) == data[:1000].tobytes()
    buf = bytearray(8)
    assert backend.readinto("r", Extents([9996, 20_000], [4, 4]), buf) == data.size
    assert bytes(buf) == data[9996:].tobytes() + b"\0" * 4
    with pytest.raises(NotFoundError):
        backend.readinto_range("missing", 0, memoryview(bytearray(4)))


def test_pieces_outside_the_buffer_are_refused(tmp_path) -> None:
    b = PosixBackend(tmp_path)
    b.put("k", bytes(100))
    ext = Extents(np.array([0, 50]), np.array([10, 10]), np.array([0, 30]))
    with pytest.raises(ShapeMismatchError, match="reach byte 40"):
        b.readinto("k", ext, bytearray(39))
    with pytest.raises(ShapeMismatchError, match="overflows"):
        b.write(
            "k",
            Extents(np.array([0]), np.array([np.iinfo(np.int64).max - 1]), np.array([5])),
            bytes(8),
        )
    assert b.get("k") == bytes(100)


def test_a_nowait_read_off_the_page_cache_starts_the_fetch(backend: PosixBackend) -> None:
    """A nowait read that would wait on the disk raises BlockingIOError with errno
    EINPROGRESS (the kernel was asked for the pages), and the blocking read after it returns
    the bytes."""
    data = np.random.default_rng(5).integers(0, 256, 64 << 10, dtype=np.uint8)
    backend.put("cold", memoryview(data), durable=True)
    backend.drop_cache("cold")
    out = bytearray(40_000)
    try:
        backend.readinto_range("cold", 1000, memoryview(out), nowait=True)
    except BlockingIOError as exc:
        assert exc.errno == errno.EINPROGRESS
        # the pages were asked for (a recent kernel's refused RWF_NOWAIT read starts that
        # itself; the backend's WILLNEED makes sure elsewhere): a read that does not wait
        # soon finds them all
        deadline = time.monotonic() + 5
        while True:
            try:
                backend.readinto_range("cold", 1000, memoryview(out), nowait=True)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "the fetch never started"
                time.sleep(0.001)
    else:
        pytest.skip("the pages stayed in memory (no page cache to drop here)")
    assert bytes(out) == data[1000:41_000].tobytes()


# --- one call reading a range of each of many files: compiled and Python loops -------------


@pytest.fixture(params=["compiled", "python"])
def batch_loop(request, monkeypatch) -> str:
    """Runs a test with the compiled batch read and again with its pure-Python fallback."""
    if request.param == "python":
        monkeypatch.setattr(posix, "_filebatch", None)
    elif posix._filebatch is None:
        pytest.skip("strataio.storage._filebatch was not built here")
    return request.param


def test_the_compiled_batch_read_is_built_where_it_can_be() -> None:
    """On Linux with a C compiler and Python's headers the install builds it (a silent build
    failure would leave every first read of small chunks on the slower Python loop)."""
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not sys.platform.startswith("linux") or shutil.which("cc") is None:
        pytest.skip("no C compiler: the Python loop is the one that runs")
    if not os.path.exists(headers):
        pytest.skip("no Python headers: the Python loop is the one that runs")
    assert posix._filebatch is not None


def test_batch_read_answers_per_file(backend: PosixBackend, batch_loop: str) -> None:
    """Each key gets its own outcome: the bytes and (size, version) of a file, zeros past a
    file's end, NotFoundError for a missing one; nothing stops at a failing key."""
    rng = np.random.default_rng(11)
    blobs = {
        f"c/{i}": rng.integers(0, 256, n, dtype=np.uint8) for i, n in enumerate((0, 7, 4096, 20000))
    }
    for k, b in blobs.items():
        backend.put(k, memoryview(b))
    keys = ["c/3", "c/missing", "c/1", "c/2", "c/0", "c/3"]
    spans = [(100, 5000), (0, 8), (3, 10), (4000, 200), (0, 4), (19990, 30)]
    bufs = [bytearray(b"\xff" * n) for _, n in spans]
    got = backend.readinto_ranges_versioned(
        keys, [o for o, _ in spans], [memoryview(b) for b in bufs], nowait=True
    )
    versions = dict(zip(blobs, backend.versions(list(blobs))))
    for k, (off, n), buf, g in zip(keys, spans, bufs, got):
        if k == "c/missing":
            assert isinstance(g, NotFoundError) and "c/missing" in str(g)
            continue
        data = blobs[k].tobytes()
        want = data[off : off + n]
        assert bytes(buf) == want + bytes(n - len(want)), (k, off, n)
        assert g == (len(data), versions[k])
    assert backend.readinto_ranges_versioned([], [], []) == []


def test_something_in_an_object_s_way_is_named_by_its_path(
    backend: PosixBackend, batch_loop: str
) -> None:
    """A directory where an object should be, or a file where one of its folders should be,
    fails with EISDIR or ENOTDIR naming the object's path, for puts (not their temporary
    file's, and a put of a new object too) and reads alike, so its tier can tell the one
    object from the storage failing."""
    (backend.root / "d" / "0").mkdir(parents=True)
    backend.put("f", b"x")
    path = {"d/0": str(backend.root / "d" / "0"), "f/0": str(backend.root / "f" / "0")}
    for key, err in (("d/0", errno.EISDIR), ("f/0", errno.ENOTDIR)):
        calls = [
            lambda k: backend.put(k, b"y"),
            lambda k: backend.put_new(k, b"y"),
            lambda k: backend.write(k, Extents.single(0, 1), b"y"),
            lambda k: backend.get(k),
            lambda k: backend.read(k, Extents.single(0, 1)),
            lambda k: backend.size(k),
        ]
        for call in calls:
            with pytest.raises(OSError) as got:
                call(key)
            blocked = in_the_way(got.value)
            assert (blocked.errno, blocked.filename) == (err, path[key]), (key, call)
        (g,) = backend.readinto_ranges_versioned([key], [0], [memoryview(bytearray(1))])
        assert isinstance(g, OSError) and (g.errno, g.filename) == (err, path[key])
    assert not list(backend.leftovers())


@pytest.mark.parametrize("how", ["gone", "a file"])
def test_a_root_that_is_no_directory_does_not_answer(tmp_path, batch_loop: str, how: str) -> None:
    """A root gone since it was made, or with a file in its place, is a backend that does not
    answer (BackendError naming the root), never one holding no objects (the listing was
    empty, objects missing, a read-only probe's look-up answered), and no put makes it
    again; with its directory back, its objects are there."""
    backend = PosixBackend(tmp_path / "root")
    backend.put("a/b", b"x")
    (tmp_path / "root").rename(tmp_path / "away")
    if how == "a file":
        (tmp_path / "root").write_bytes(b"")
    calls = [
        lambda: list(backend.list()),
        lambda: list(backend.list("a")),
        lambda: backend.get("a/b"),
        lambda: backend.read("a/b", Extents.single(0, 1)),
        lambda: backend.size("a/b"),
        lambda: backend.exists("a/b"),
        lambda: backend.versions(["a/b"]),
        lambda: backend.delete("a/b"),
        lambda: backend.put("a/c", b"y"),
        lambda: backend.put("c", b"y"),
        lambda: backend.write("c", Extents.single(0, 1), b"y"),
    ]
    for call in calls:
        # (a file in its place: the system's ENOTDIR, which the tier's probe then judges)
        with pytest.raises(BackendError if how == "gone" else OSError) as got:
            call()
        assert not isinstance(got.value, FileNotFoundError)
        assert str(tmp_path / "root") in str(got.value) or in_the_way(got.value), call
    (got,) = backend.readinto_ranges_versioned(["a/b"], [0], [memoryview(bytearray(1))])
    assert isinstance(got, OSError) and not isinstance(got, FileNotFoundError)
    assert (tmp_path / "root").is_file() if how == "a file" else not (tmp_path / "root").exists()
    if how == "a file":
        (tmp_path / "root").unlink()
    (tmp_path / "away").rename(tmp_path / "root")
    assert list(backend.list()) == ["a/b"] and backend.get("a/b") == b"x"


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 9000), min_size=1, max_size=6),
    reads=st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 10000), st.integers(0, 3000)), max_size=12
    ),
    nowait=st.booleans(),
)
def test_compiled_and_python_batch_reads_agree(tmp_path_factory, sizes, reads, nowait) -> None:
    """The compiled loop and the Python loop give the same bytes and outcomes as a numpy
    oracle, for ranges inside, across and past the end of files, for missing files and a
    directory, and the same versions."""
    root = tmp_path_factory.mktemp("batch")
    backend = PosixBackend(root)
    rng = np.random.default_rng(len(sizes) * 7919 + len(reads))
    files = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    for i, f in enumerate(files):
        backend.put(f"f/{i}", memoryview(f))
    keys = [f"f/{i}" for i, _, _ in reads]
    outcomes = {}
    for loop in ("compiled", "python"):
        if loop == "compiled" and posix._filebatch is None:
            continue
        saved = posix._filebatch
        if loop == "python":
            posix._filebatch = None
        try:
            bufs = [bytearray(n) for _, _, n in reads]
            got = backend.readinto_ranges_versioned(
                keys, [o for _, o, _ in reads], [memoryview(b) for b in bufs], nowait=nowait
            )
        finally:
            posix._filebatch = saved
        for (i, off, n), buf, g in zip(reads, bufs, got):
            if i >= len(files):
                assert isinstance(g, NotFoundError)
                continue
            want = files[i][off : off + n].tobytes()
            assert bytes(buf) == want + bytes(n - len(want))
            assert g[0] == len(files[i])
        outcomes[loop] = [type(g).__name__ if isinstance(g, Exception) else g for g in got]
        saved = posix._filebatch
        if loop == "python":
            posix._filebatch = None
        try:  # a key that is a directory: the same error from both loops
            (err,) = backend.readinto_ranges_versioned(["f"], [0], [memoryview(bytearray(4))])
        finally:
            posix._filebatch = saved
        assert isinstance(err, IsADirectoryError)
        outcomes[loop].append(type(err).__name__)
        if loop == "python":
            posix._filebatch = None
        try:  # the versions of the files (a stat each), missing ones included
            outcomes[loop].append(backend.versions(keys + ["f/missing"]))
        finally:
            posix._filebatch = saved
    if len(outcomes) == 2:
        assert outcomes["compiled"] == outcomes["python"]


def test_a_batch_read_off_the_page_cache_starts_the_fetch(
    backend: PosixBackend, batch_loop: str
) -> None:
    """In a nowait batch, a file whose pages are not in memory comes back as
    BlockingIOError EINPROGRESS with its pages asked for, the others are read."""
    data = np.random.default_rng(5).integers(0, 256, 64 << 10, dtype=np.uint8)
    backend.put("cold", memoryview(data), durable=True)
    backend.put("warm", b"warm bytes")
    backend.drop_cache("cold")
    out, small = bytearray(40_000), bytearray(4)
    got = backend.readinto_ranges_versioned(
        ["cold", "warm"], [1000, 5], [memoryview(out), memoryview(small)], nowait=True
    )
    assert bytes(small) == b"byte" and got[1][0] == 10
    if not isinstance(got[0], BlockingIOError):
        pytest.skip("the pages stayed in memory (no page cache to drop here)")
    assert got[0].errno == errno.EINPROGRESS
    (again,) = backend.readinto_ranges_versioned(["cold"], [1000], [memoryview(out)])
    assert again[0] == len(data) and bytes(out) == data[1000:41_000].tobytes()


def test_sections_read_the_same_through_either_loop(tmp_path, batch_loop: str) -> None:
    """A dataset's first reads, raw and checksummed chunks, go through the batch read."""
    import strataio

    want = np.random.default_rng(3).random((50, 70)).astype("f4")
    for codec in (None, "crc32c"):
        with strataio.create_dataset(
            tmp_path / f"{batch_loop}-{codec}", want.shape, want.dtype, (8, 9), codec=codec
        ) as ds:
            ds[...] = want
            for sel in (np.s_[3:47, 5:66], np.s_[:, 4:5], np.s_[7:8, :], np.s_[...]):
                ds.clear_cache()
                np.testing.assert_array_equal(ds[sel], want[sel])


def test_a_batch_read_with_lists_of_different_lengths_is_refused(
    backend: PosixBackend, batch_loop: str
) -> None:
    backend.put("k", b"0123")
    out = bytearray(b"....")
    with pytest.raises(ShapeMismatchError, match="2 keys, 1 offsets, 1 buffers"):
        backend.readinto_ranges_versioned(["k", "k"], [0], [memoryview(out)])
    assert out == b"...."


def test_a_conditional_delete_never_deletes_a_put_made_after_its_look(tmp_path) -> None:
    """Two backends on one folder stand for two processes. One deletes a file it saw at a
    version; the other puts a new file there right between that look and the unlink. The
    new file stands: the look and the unlink hold the folder's lock, which a put's rename
    takes too (without it, the unlink took the new file)."""
    import threading

    deleter, putter = PosixBackend(tmp_path / "r"), PosixBackend(tmp_path / "r")
    putter.put("a/c/0", b"old")
    (seen,) = putter.versions(["a/c/0"])
    looked, put_done = threading.Event(), threading.Event()
    look = deleter.versions

    def look_then_let_the_other_put(keys):
        got = look(keys)
        looked.set()
        put_done.wait(0.5)  # (a put that had to wait for the lock is not done yet)
        return got

    deleter.versions = look_then_let_the_other_put

    def put_new_bytes():
        looked.wait()
        putter.put("a/c/0", b"new")
        put_done.set()

    t = threading.Thread(target=put_new_bytes)
    t.start()
    assert deleter.delete_if("a/c/0", seen)  # (the old file, still there at its look)
    t.join()
    assert putter.get("a/c/0") == b"new"
    # and a delete of the version it sees now still deletes
    (now,) = putter.versions(["a/c/0"])
    assert PosixBackend(tmp_path / "r").delete_if("a/c/0", now)
    assert not putter.exists("a/c/0")


def test_a_conditional_put_replaces_only_the_version_seen(backend: PosixBackend) -> None:
    """put_if puts only over the object at the version given (None: where there is none);
    another process's put since is left in place and ExistsError raised."""
    from strataio.errors import ExistsError

    assert backend.put_if("a/c/0", b"first", None) == backend.versions(["a/c/0"])[0]
    with pytest.raises(ExistsError):
        backend.put_if("a/c/0", b"second", None)
    (seen,) = backend.versions(["a/c/0"])
    PosixBackend(backend.root).put("a/c/0", b"theirs")  # (another process, after the look)
    with pytest.raises(ExistsError):
        backend.put_if("a/c/0", b"mine", seen)
    assert backend.get("a/c/0") == b"theirs"
    assert not [n for n in os.listdir(backend.root / "a" / "c") if n.endswith(TMP_SUFFIX)]
    (now,) = backend.versions(["a/c/0"])
    version = backend.put_if("a/c/0", b"mine", now, durable=True)
    assert backend.get("a/c/0") == b"mine" and backend.versions(["a/c/0"]) == [version]


@pytest.mark.parametrize("shaped", [False, True])
def test_remove_empty_folders_removes_only_empty_ones_under_the_prefix(tmp_path, shaped) -> None:
    """The folders a deleted prefix leaves empty go, deepest first and its own included;
    a folder holding a file (a temporary file of a put running, too), the folders above the
    prefix and the root stay (a Shaped tier passes the call to its directory)."""
    from strataio.storage.shaped import Shaped

    inner = PosixBackend(tmp_path / "root")
    backend = Shaped(inner, "remote_tape_2002", time_scale=0) if shaped else inner
    root = inner.root
    for k in ("run/a/c/0/0", "run/a/c/0/1", "run/a/c/1/0", "run/a/zarr.json", "run/b/c/0"):
        backend.put(k, b"x")
    (root / "run" / "a" / "c" / "2").mkdir()
    (root / "run" / "a" / "c" / "3").mkdir()
    (root / "run" / "a" / "c" / "3" / f"0.1.2{TMP_SUFFIX}").write_bytes(b"")
    for k in ("run/a/c/0/0", "run/a/c/0/1", "run/a/c/1/0", "run/a/zarr.json"):
        backend.delete(k)
    assert backend.remove_empty_folders("run/a") == 3  # c/0, c/1, c/2
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        "run", "run/a", "run/a/c", "run/a/c/3", f"run/a/c/3/0.1.2{TMP_SUFFIX}",
        "run/b", "run/b/c", "run/b/c/0",
    ]  # fmt: skip
    (root / "run" / "a" / "c" / "3" / f"0.1.2{TMP_SUFFIX}").unlink()
    assert backend.remove_empty_folders("run/a") == 3  # c/3, c, a
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        "run", "run/b", "run/b/c", "run/b/c/0",
    ]  # fmt: skip
    backend.delete("run/b/c/0")
    assert backend.remove_empty_folders("run/b/c") == 1
    assert (root / "run" / "b").is_dir() and root.is_dir()  # (above the prefix: kept)


def test_a_put_whose_folder_is_removed_before_its_file_is_made_makes_it_again(
    backend: PosixBackend, monkeypatch
) -> None:
    """A put (or write) that makes its folders, which another process removes as empty
    (the purge of a deleted dataset of the same name) before the put's file is in them,
    makes them again: it failed with FileNotFoundError."""
    make = PosixBackend._ensure_parent
    removals = 0

    def made_then_removed(self, path):
        nonlocal removals
        make(self, path)
        if removals < 3:  # (three times in a row: each try finds them gone)
            removals += 1
            os.rmdir(os.path.dirname(path))

    monkeypatch.setattr(PosixBackend, "_ensure_parent", made_then_removed)
    backend.put("d/c/0/0", b"put")
    assert bytes(backend.get("d/c/0/0")) == b"put"
    removals = 0
    backend.write("e/c/0/0", Extents.single(0, 5), b"write")
    assert bytes(backend.get("e/c/0/0")) == b"write"


SHM = "/dev/shm"


def test_a_nowait_read_where_the_file_system_refuses_nowait_reads_the_bytes(
    batch_loop: str,
) -> None:
    """A file system that takes no RWF_NOWAIT read (tmpfs, FUSE: EOPNOTSUPP) is read as
    without ``nowait``: a dataset on /dev/shm could not be read at all."""
    if not os.path.isdir(SHM) or not os.access(SHM, os.W_OK):
        pytest.skip("no writable /dev/shm here")
    where = tempfile.mkdtemp(dir=SHM)
    try:
        backend = PosixBackend(where)
        backend.put("c/0", bytes(range(200)))
        out = bytearray(100)
        assert backend.readinto_range("c/0", 50, memoryview(out), nowait=True) == 200
        assert bytes(out) == bytes(range(50, 150))
        got = backend.readinto_ranges_versioned(
            ["c/0", "c/1"],
            [0, 0],
            [memoryview(bytearray(8)), memoryview(bytearray(8))],
            nowait=True,
        )
        assert got[0][0] == 200 and isinstance(got[1], NotFoundError)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_a_nowait_read_refused_by_the_file_system_waits_instead(backend, monkeypatch) -> None:
    """The Python loop where ``preadv`` refuses RWF_NOWAIT (EOPNOTSUPP): a plain read."""
    monkeypatch.setattr(posix, "_filebatch", None)
    backend.put("k", bytes(range(64)))
    plain = os.preadv

    def preadv(fd, bufs, offset, flags=0):
        if flags & os.RWF_NOWAIT:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return plain(fd, bufs, offset)

    monkeypatch.setattr(os, "preadv", preadv)
    out = bytearray(10)
    assert backend.readinto_range("k", 4, memoryview(out), nowait=True) == 64
    assert bytes(out) == bytes(range(4, 14))
