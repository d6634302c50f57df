"""Sessions of several processes working on one catalog never lose a chunk.

Each session reads a chunk's rows into its dataset's residency once: the first time it looks
the chunk up (one process), or all of them at open (a parallel job's ranks, and the
``looked_up`` runs here, which make every view old from the start). Another process may move
its chunks afterwards (an eviction round writes a copy back to the archive and deletes the fast copy).
A session acting on such a stale residency looks at the catalog again where a copy it
believes in is missing or changed, and must never drop a row, or delete an object, that the
other process recorded; a write supersedes every copy, known or not.

Two sessions of one process stand for the two processes here: each has its own catalog
connection, writer, tiers and residencies, and the interleaving is made exact.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np
import pytest

import strataio
from strataio.errors import BackendError, ChunksNotStoredError, ObjectError
from strataio.tiers.fsck import fsck
from strataio.tiers.residency import Residency, object_key

sys.path.insert(0, str(Path(__file__).parent))
from servers import s3_tier_toml  # noqa: E402

CONFIG = """
[catalog]
url = "cat.db"

[[tiers]]
name = "fast"
kind = "posix"
role = "localdisk"
path = "fast"

[[tiers]]
name = "archive"
kind = "posix"
role = "remotetape"
path = "archive"
"""

A = np.arange(20 * 20, dtype="f4").reshape(20, 20)  # 4 chunks of 10x10


@pytest.fixture(autouse=True, params=["on_demand", "looked_up"])
def residency_views(request, monkeypatch):
    """Every test twice: datasets learning their chunks' rows on demand, and datasets that
    look every chunk up as they open (so each process's view dates from its open, as a
    parallel job's does, and the other process's moves make it stale)."""
    if request.param == "looked_up":
        open_dataset = strataio.Session.open_dataset

        def opened_looked_up(self, *args, **kwargs):
            ds = open_dataset(self, *args, **kwargs)
            ds.store.res.chunk_keys()  # (iterating the copy map learns every row)
            return ds

        monkeypatch.setattr(strataio.Session, "open_dataset", opened_looked_up)
    return request.param


# "fast" with room for the four chunks of one such dataset (400 bytes each) and little
# more
SMALL_FAST = 'path = "fast"\ncapacity = "2KiB"'


def session(root) -> strataio.Session:
    return strataio.Session(config=root / "strataio.toml")


def dataset_a_on_fast(root, config: str = CONFIG) -> None:
    """The configuration under ``root`` and dataset "a" holding ``A``, its chunks on "fast"."""
    (root / "strataio.toml").write_text(config)
    with session(root) as s:
        ds = s.create_dataset("a", A.shape, "f4", (10, 10), hint="LOCALDISK")
        ds[...] = A
        ds.close()


@contextlib.contextmanager
def after_the_first_move_read(monkeypatch, action):
    """Run ``action`` (another session's step) once, right after a move of this block first
    reads its source copy: the move then copies a value that ``action`` may have replaced."""
    from strataio.tiers import mover

    read_checked = mover.read_checked
    done = []

    def read_then_act(*args, **kw):
        data = read_checked(*args, **kw)
        if not done:
            done.append(True)
            action()
        return data

    monkeypatch.setattr(mover, "read_checked", read_then_act)
    try:
        yield
    finally:
        monkeypatch.setattr(mover, "read_checked", read_checked)


def test_a_write_back_from_a_stale_residency_keeps_the_copy_another_session_recorded(
    tmp_path,
):
    dataset_a_on_fast(tmp_path)
    reader, evictor = session(tmp_path), session(tmp_path)
    stale = reader.open_dataset("a")  # its residency: every chunk on "fast" only
    moved = evictor.open_dataset("a")
    moved.evict(tier="fast").wait()  # written back to the archive, fast copies deleted
    moved.close()
    evictor.close()
    assert {c.tier for c in reader.catalog.residency("a")} == {"archive"}
    # the stale session evicts too: each fast copy it names is missing, so nothing can be
    # written back; it looks at the catalog again and finds the chunks on the archive, whose
    # copies (recorded by the other session) must stay
    done = stale.evict(tier="fast").result()
    assert not done.failed, done.failed
    stale.close()
    reader.close()
    with session(tmp_path) as s:
        assert len(s.catalog.residency("a")) == 4
        np.testing.assert_array_equal(s.open_dataset("a")[...], A)
        assert fsck(s.catalog, s.tiers).clean


def test_a_read_from_a_stale_residency_finds_the_copy_another_session_moved(tmp_path):
    dataset_a_on_fast(tmp_path)
    with session(tmp_path) as reader:
        stale = reader.open_dataset("a")  # its residency: every chunk on "fast" only
        with session(tmp_path) as evictor:
            moved = evictor.open_dataset("a")
            moved.evict(tier="fast").wait()  # written back to the archive, fast copies gone
            moved.close()
        # the fast copies it names are missing: it asks the catalog where they are now
        np.testing.assert_array_equal(stale[...], A)
        stale.close()
    with session(tmp_path) as s:
        assert {c.tier for c in s.catalog.residency("a")} <= {"fast", "archive"}
        assert len({c.key for c in s.catalog.residency("a")}) == 4
        np.testing.assert_array_equal(s.open_dataset("a")[...], A)
        assert fsck(s.catalog, s.tiers).clean


def test_a_chunk_lost_for_good_still_reads_as_lost(tmp_path):
    dataset_a_on_fast(tmp_path)
    (tmp_path / "fast" / "a" / "c" / "1" / "0").unlink()
    with session(tmp_path) as s:
        ds = s.open_dataset("a")
        with pytest.raises(BackendError, match=r"'c/1/0' of 'a'"):
            ds[...]
        ds.close()


def test_an_eviction_round_leaves_a_dataset_opened_after_its_listing(tmp_path):
    """An eviction round lists its victims, then acts; a dataset another process opens in
    between (and may be writing) is left alone: its claim on the dataset decides, not the
    listing."""
    (tmp_path / "strataio.toml").write_text(CONFIG.replace('path = "fast"', SMALL_FAST))
    with session(tmp_path) as s:
        ds = s.create_dataset("x", A.shape, "f4", (10, 10), hint="LOCALDISK")
        ds[...] = A
        ds.close()
        assert {c.tier for c in s.catalog.residency("x")} == {"fast"}
    evictor, opener = session(tmp_path), session(tmp_path)
    listing = evictor.catalog.lru_copies
    opened = []

    def list_then_let_the_other_open(*args, **kwargs):
        victims = listing(*args, **kwargs)
        if not opened:
            opened.append(opener.open_dataset("x", mode="r+"))
        return victims

    evictor.catalog.lru_copies = list_then_let_the_other_open
    try:
        y = evictor.create_dataset("y", A.shape, "f4", (10, 10), hint="LOCALDISK")
        y[...] = A + 1  # needs room on "fast", held by x's chunks
        y.close()
        assert opened, "the write did not need an eviction round"
        # x was opened before the round acted: every chunk of it is still on fast only
        assert {(c.key, c.tier) for c in opener.catalog.residency("x")} == {
            (k, "fast") for k in ("c/0/0", "c/0/1", "c/1/0", "c/1/1")
        }
        x = opened[0]
        x[:10, :10] = -A[:10, :10]
        x.close()
    finally:
        evictor.close()
        opener.close()
    want = A.copy()
    want[:10, :10] = -A[:10, :10]
    with session(tmp_path) as s:
        np.testing.assert_array_equal(s.open_dataset("x")[...], want)
        np.testing.assert_array_equal(s.open_dataset("y")[...], A + 1)
        assert fsck(s.catalog, s.tiers).clean


def test_a_write_from_a_stale_residency_supersedes_the_copy_another_session_made(tmp_path):
    """Session A has the dataset open; session B migrates it to the archive (its fast copies
    deleted); A rewrites a chunk. A's write is the chunk's content from then on: the archive
    copy B recorded, old now, is no copy of it any more, so no eviction brings it back."""
    dataset_a_on_fast(tmp_path)
    writer, mover = session(tmp_path), session(tmp_path)
    stale = writer.open_dataset("a", "r+")  # its residency: every chunk on "fast" only
    moved = mover.open_dataset("a", "r+")
    moved.migrate(None, to="archive").wait()
    moved.close()
    mover.close()
    stale[0:10, 0:10] = -1.0  # chunk c/0/0, written to "fast" again
    stale.close()
    rows = [c for c in writer.catalog.residency("a") if c.key == "c/0/0"]
    assert [c.tier for c in rows] == ["fast"], rows
    assert not (tmp_path / "archive" / "a" / "c" / "0" / "0").exists()  # its object too
    writer.close()
    want = A.copy()
    want[0:10, 0:10] = -1.0
    with session(tmp_path) as s:
        ds = s.open_dataset("a", "r+")
        ds.evict(tier="fast").wait()  # written back first: the new content, not the old
        np.testing.assert_array_equal(ds[...], want)
        ds.close()
        assert fsck(s.catalog, s.tiers).clean


@pytest.mark.parametrize("last", ["first writer", "second writer"])
def test_two_sessions_writing_one_chunk_leave_one_of_their_values(tmp_path, last):
    """A and B write the same chunk, neither knowing of the other; the one whose object was
    replaced must not record its checksum over the other's bytes, whichever closes last:
    the chunk reads back as the value whose object stands, and fsck finds nothing."""
    dataset_a_on_fast(tmp_path)
    one, two = session(tmp_path), session(tmp_path)
    a = one.open_dataset("a", "r+")
    b = two.open_dataset("a", "r+")
    a[0:10, 0:10] = 1.0  # put, not yet recorded
    b[0:10, 0:10] = 2.0  # replaces a's object
    for ds in (b, a) if last == "first writer" else (a, b):
        ds.close()
    one.close()
    two.close()
    with session(tmp_path) as s:
        got = s.open_dataset("a")[0:10, 0:10]
        np.testing.assert_array_equal(got, np.full((10, 10), 2.0, "f4"))
        assert fsck(s.catalog, s.tiers).clean


def test_moves_from_a_stale_residency_look_again_at_chunks_another_session_changed(tmp_path):
    """A has the dataset open; B rewrites a chunk, then moves every chunk to the archive. A's
    migrate and evict find the chunks where the catalog now says they are, instead of
    failing on its own stale rows (a checksum "the catalog says", an only copy on a tier
    that holds none)."""
    dataset_a_on_fast(tmp_path)
    stale_one, other = session(tmp_path), session(tmp_path)
    a = stale_one.open_dataset("a", "r+")
    b = other.open_dataset("a", "r+")
    b[0:10, 0:10] = -1.0
    b.flush()
    done = a.migrate(None, to="archive").result()  # c/0/0's checksum changed under A
    assert not done.failed, done.failed
    b.migrate(None, to="archive").wait()
    b.evict(tier="fast").wait()
    b.close()
    done = a.evict(tier="fast").result()  # A's rows still name copies on "fast"
    assert not done.failed, done.failed
    a.close()
    stale_one.close()
    other.close()
    want = A.copy()
    want[0:10, 0:10] = -1.0
    with session(tmp_path) as s:
        np.testing.assert_array_equal(s.open_dataset("a")[...], want)
        assert fsck(s.catalog, s.tiers).clean


def test_a_failed_put_of_a_new_chunk_leaves_it_writable(tmp_path):
    """A put that fails leaves a deletion of a row the catalog never held; the commit keeps
    nothing of it, and the next write of that chunk goes ahead (it once waited forever)."""
    import threading

    dataset_a_on_fast(tmp_path)
    with session(tmp_path) as s:
        ds = s.create_dataset("b", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        ds[:10, :10] = 1.0
        ds.flush()
        fast = s.tiers["fast"]
        put = fast.backend.put_new  # (a new chunk's put: nothing is there yet)

        def failing(key, data, **kw):
            if key.endswith("c/1/0"):
                raise ValueError("refused")
            return put(key, data, **kw)

        fast.backend.put_new = failing
        with pytest.raises(ValueError, match="refused"):
            ds[10:, :10] = 2.0
        fast.backend.put_new = put
        ds.flush()
        retry = threading.Thread(target=ds.__setitem__, args=(np.s_[10:, :10], 3.0), daemon=True)
        retry.start()
        retry.join(30)
        assert not retry.is_alive(), "the write of the chunk waits forever"
        assert (ds[10:, :10] == 3.0).all()
        ds.close()
        assert fsck(s.catalog, s.tiers).clean


class _Killed(BaseException):
    """A process's work stops here, as at a kill -9."""


def _kill(s: strataio.Session) -> None:
    """``s``'s process dies now: its liveness token goes, and it takes no further step."""
    s.catalog._locks.release(s.writer)


def test_a_rewrite_over_a_killed_writer_s_unrecorded_put_names_the_bytes_there(tmp_path):
    """A writes a chunk no copy of which is recorded yet (a new object) and is killed before
    its flush; B rewrites the chunk, announcing it over A's object, and is killed before its
    put. B's announcement names the bytes A's object holds as the old ones (read there), so
    the chunk reads them back after ``fsck --repair``; named after the chunk's recorded
    copies, of which there were none, it read as corrupt for good."""
    (tmp_path / "strataio.toml").write_text(CONFIG)
    with session(tmp_path) as s:
        s.create_dataset("b", (10, 10), "f4", (10, 10), hint="LOCALDISK").close()
    a = session(tmp_path)
    a.open_dataset("b", "r+")[...] = 1.0
    _kill(a)
    b = session(tmp_path)
    fast = b.tiers["fast"].backend

    def killed(*args, **kwargs):
        raise _Killed

    fast.put_versioned = killed  # (after the announcement: the put itself)
    with pytest.raises(_Killed):
        b.open_dataset("b", "r+")[...] = 2.0
    _kill(b)
    with session(tmp_path) as s:
        fsck(s.catalog, s.tiers, repair=True)
        assert fsck(s.catalog, s.tiers).clean
        np.testing.assert_array_equal(s.open_dataset("b")[...], np.full((10, 10), 1.0, "f4"))


def test_a_stage_that_read_the_old_value_records_nothing_beside_a_rewrite(tmp_path, monkeypatch):
    """B's stage reads the chunk's archive copy; A then rewrites the chunk onto another tier
    and flushes (superseding the archive copy); B's copy, of the old value, must not be
    recorded beside A's: its commit finds no row holding its bytes and deletes its object."""

    root = tmp_path
    (root / "strataio.toml").write_text(
        CONFIG.replace('role = "remotetape"', 'role = "remotedisk"')
        + '\n[[tiers]]\nname = "tape"\nkind = "posix"\nrole = "remotetape"\npath = "tape"\n'
    )
    with session(root) as s:
        ds = s.create_dataset("a", (10, 10), "f4", (10, 10), hint="REMOTEDISK")
        ds[...] = 1.0
        ds.flush()
        ds.migrate(to="tape").wait()
        ds.close()
    a, b = session(root), session(root)
    da, db = a.open_dataset("a", "r+"), b.open_dataset("a", "r+")

    def rewrite():
        da[...] = 2.0  # onto "archive" (REMOTEDISK), not in place: nothing announced
        da.flush()

    with after_the_first_move_read(monkeypatch, rewrite):
        db.stage(to="fast").result()
    assert [c.tier for c in a.catalog.residency("a")] == ["archive"]
    assert not (root / "fast" / "a" / "c" / "0" / "0").exists()
    np.testing.assert_array_equal(db[...], 2.0)
    da.close(), db.close(), a.close(), b.close()
    with session(root) as s:
        np.testing.assert_array_equal(s.open_dataset("a")[...], 2.0)
        assert fsck(s.catalog, s.tiers).clean


@pytest.mark.parametrize("shaped", [False, True], ids=["posix", "shaped"])
def test_a_move_that_read_a_value_since_rewritten_in_place_records_nothing(
    tmp_path, monkeypatch, shaped
):
    """B's migration reads the chunk's value 1; A then writes 2 and flushes, and rewrites it
    in place to 3 without flushing (its row announced: new 3, old 2). B's copy of 1 is held
    by no row (the announced rewrite holds 2 or 3): it must not be recorded, or a crash of A
    before its flush leaves fsck a "good" older copy to fall back to, and the flushed 2 is
    lost. Also where the destination is a cost-model tier (whose reads keep no versions)."""
    config = CONFIG.replace('role = "remotetape"', 'role = "remotedisk"')
    if shaped:
        config = config.replace(
            'path = "archive"', 'path = "archive"\nshaped = "remote_disk_2002"\ntime_scale = 0.001'
        )
    (tmp_path / "strataio.toml").write_text(config)
    with session(tmp_path) as s:
        ds = s.create_dataset("a", (10, 10), "f4", (10, 10), hint="LOCALDISK")
        ds[...] = 1.0
        ds.close()
    a, b = session(tmp_path), session(tmp_path)
    da, db = a.open_dataset("a", "r+"), b.open_dataset("a", "r")

    def rewrite():
        da[...] = 2.0
        da.flush()
        da[...] = 3.0  # in place on "fast": announced, not flushed

    with after_the_first_move_read(monkeypatch, rewrite):
        db.migrate(to="archive").result()
    rows = {c.tier: c for c in a.catalog.residency("a")}
    assert list(rows) == ["fast"] and rows["fast"].state == "in-transit"
    assert not (tmp_path / "archive" / "a" / "c" / "0" / "0").exists()
    # were A to die now, fsck would find no older copy to fall back to; A flushes instead
    da.close(), db.close(), a.close(), b.close()
    with session(tmp_path) as s:
        np.testing.assert_array_equal(s.open_dataset("a")[...], 3.0)
        assert fsck(s.catalog, s.tiers).clean


def test_a_move_never_replaces_an_object_put_after_it_looked(tmp_path, monkeypatch):
    """Another process's put lands on the destination between a move's look for an unknown
    object there and the move's own put: the move's put (a link that fails on a taken name)
    refuses, and the other process's bytes stand."""
    from strataio.tiers.commit import Commit

    dataset_a_on_fast(tmp_path)
    theirs = tmp_path / "archive" / "a" / "c" / "0" / "0"
    prepare_copy = Commit.prepare_copy

    def put_meanwhile(self, res, src, dst):
        held = prepare_copy(self, res, src, dst)
        if src.key == "c/0/0":
            theirs.parent.mkdir(parents=True, exist_ok=True)
            theirs.write_bytes(b"\x01" * 400)  # (another process's put, not recorded yet)
        return held

    monkeypatch.setattr(Commit, "prepare_copy", put_meanwhile)
    with session(tmp_path) as s:
        ds = s.open_dataset("a", "r+")
        with pytest.raises(strataio.errors.StrataError, match="c/0/0"):
            ds.migrate(to="archive").wait()
        assert theirs.read_bytes() == b"\x01" * 400
        rows = {(c.key, c.tier) for c in s.catalog.residency("a")}
        assert ("c/0/0", "fast") in rows and ("c/0/0", "archive") not in rows
        assert {("c/0/1", "archive"), ("c/1/0", "archive"), ("c/1/1", "archive")} <= rows
        np.testing.assert_array_equal(ds[...], A)
        ds.close()


def test_a_read_that_keeps_finding_the_chunk_rewritten_says_so(tmp_path, monkeypatch):
    """Another process rewrites (and flushes) the chunk before each of this process's reads
    of it: each read finds a version newer than the rows it just looked up. After a bounded
    number of looks the read raises ChunkChangedError (not a ChecksumError telling the user
    to run fsck); once the writer stops, the read gives its value."""
    from strataio.errors import ChunkChangedError
    from strataio.tiers.store import TieredChunkStore

    dataset_a_on_fast(tmp_path)
    a, b = session(tmp_path), session(tmp_path)
    da, db = a.open_dataset("a", "r+"), b.open_dataset("a", "r")
    db.clear_cache()
    read_group = TieredChunkStore._read_group
    rewrites = []

    def rewritten_before_each_read(self, *args):
        if self is db.store and len(rewrites) < 100:
            rewrites.append(len(rewrites))
            da[0:10, 0:10] = float(len(rewrites))
            da.flush()
        return read_group(self, *args)

    monkeypatch.setattr(TieredChunkStore, "_read_group", rewritten_before_each_read)
    with pytest.raises(ChunkChangedError, match="changed .* times while it was read"):
        db.store.get_chunks(["c/0/0"])
    assert len(rewrites) > TieredChunkStore.REFRESHES
    rewrites.extend(range(100))  # the writer stops
    db.clear_cache()
    np.testing.assert_array_equal(db[0:10, 0:10], da[0:10, 0:10])
    da.close(), db.close(), a.close(), b.close()


def config_with_fast(request, fast: str, prefix: str) -> str:
    """:data:`CONFIG` ("fast" a POSIX tier), or for ``fast="s3"`` with "fast" an S3 tier on
    the test session's server under ``prefix``."""
    if fast != "s3":
        return CONFIG
    return CONFIG.replace(
        'kind = "posix"\nrole = "localdisk"\npath = "fast"',
        'role = "localdisk"\n' + s3_tier_toml(request.getfixturevalue("s3_server"), prefix),
    )


@pytest.mark.parametrize("fast", ["posix", "shaped", "s3"])
def test_an_object_put_anew_after_its_row_went_is_not_deleted(tmp_path, request, fast):
    """B migrates the chunk to the archive: its commit records the archive copy and drops
    the fast row, then deletes the fast object. A, whose rewrite of the chunk on "fast" lands
    between the two (announced after B's commit dropped the row), must keep its bytes: B
    deletes the object only while it is the one B saw before its commit, and A's flush then
    records the new value. Also where "fast" is a cost-model tier, whose reads keep no
    versions (its deletes were unchecked, and took A's bytes), and an S3 tier (whose versions
    are ETags)."""
    dataset_a_on_fast(tmp_path, config_with_fast(request, fast, tmp_path.name))
    if fast == "shaped":
        (tmp_path / "strataio.toml").write_text(
            CONFIG.replace(
                'path = "fast"', 'path = "fast"\nshaped = "remote_disk_2002"\ntime_scale = 0.001'
            )
        )
    a, b = session(tmp_path), session(tmp_path)
    da, db = a.open_dataset("a", "r+"), b.open_dataset("a", "r")
    commit = db.store.commit
    delete = commit._delete

    def rewritten_first(res, objs, seen=None, **kw):
        if ("fast", "c/0/0") in objs and not getattr(rewritten_first, "done", False):
            rewritten_first.done = True
            da[0:10, 0:10] = -1.0  # in place on "fast" (A still knows its copy there)
        return delete(res, objs, seen, **kw)

    commit._delete = rewritten_first
    db.migrate(np.s_[0:10, 0:10], to="archive").wait()
    assert rewritten_first.done
    da.flush()
    rows = {(c.key, c.tier): c.state for c in a.catalog.residency("a") if c.key == "c/0/0"}
    assert rows == {("c/0/0", "fast"): "valid"}
    np.testing.assert_array_equal(da[0:10, 0:10], -1.0)
    da.close(), db.close(), a.close(), b.close()
    with session(tmp_path) as s:
        np.testing.assert_array_equal(s.open_dataset("a")[0:10, 0:10], -1.0)
        assert fsck(s.catalog, s.tiers).clean


def test_a_rewrite_put_between_a_delete_s_look_and_its_request_is_not_deleted(tmp_path, request):
    """As above on an S3 tier, with A's rewrite landing inside B's delete of the object:
    after B looked at its version, before B's DELETE reached the server. The server checks
    the version B saw as it deletes (``If-Match``), so A's bytes stay (a look, then a plain
    DELETE, took them: flushed values were lost after kill -9 runs on S3)."""
    dataset_a_on_fast(tmp_path, config_with_fast(request, "s3", tmp_path.name))
    a, b = session(tmp_path), session(tmp_path)
    da, db = a.open_dataset("a", "r+"), b.open_dataset("a", "r")
    backend = b.tiers["fast"].backend
    delete_if, look = backend.delete_if, backend.object_versions
    deleting, rewrote = [], []

    def deleting_if(key, version):
        deleting.append(key)
        try:
            return delete_if(key, version)
        finally:
            deleting.remove(key)

    def look_then_rewrite(keys):
        got = look(keys)
        if deleting and deleting[0].endswith("c/0/0") and not rewrote:
            rewrote.append(True)
            da[0:10, 0:10] = -1.0  # in place on "fast" (A still knows its copy there)
            da.flush()
        return got

    backend.delete_if, backend.object_versions = deleting_if, look_then_rewrite
    db.migrate(np.s_[0:10, 0:10], to="archive").wait()
    assert rewrote
    rows = {(c.key, c.tier): c.state for c in a.catalog.residency("a") if c.key == "c/0/0"}
    assert rows == {("c/0/0", "fast"): "valid"}
    da.close(), db.close(), a.close(), b.close()
    with session(tmp_path) as s:
        np.testing.assert_array_equal(s.open_dataset("a")[0:10, 0:10], -1.0)
        assert fsck(s.catalog, s.tiers).clean


def test_a_flush_whose_new_object_was_deleted_before_it_says_so(tmp_path):
    """A's rewrite of a chunk lands on "fast"; another process deletes that object before
    A's flush. The flush raises, naming the chunk (it returned, and the chunk read back its
    older value, as if the write had been kept); the other chunk's write is recorded, the
    lost one reads its previous value, and fsck is clean."""
    dataset_a_on_fast(tmp_path)
    a, b = session(tmp_path), session(tmp_path)
    da = a.open_dataset("a", "r+")
    da.migrate(np.s_[0:10, 0:10], to="archive").wait()
    da[0:10, 0:10] = -1.0
    da[10:20, 0:10] = -2.0
    b.tiers["fast"].backend.delete(object_key("a", "c/0/0"))
    with pytest.raises(ChunksNotStoredError, match=r"c/0/0 keeps its previous value") as err:
        da.flush()
    assert err.value.keys == ["c/0/0"] and "'fast'" in str(err.value)
    da.flush()  # (reported once)
    da.close(), a.close(), b.close()
    with session(tmp_path) as s:
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[0:10, 0:10], A[0:10, 0:10])
        np.testing.assert_array_equal(ds[10:20, 0:10], -2.0)
        assert fsck(s.catalog, s.tiers).clean


def test_a_flush_whose_rewrite_in_place_was_deleted_says_the_chunk_has_no_value_left(tmp_path):
    """A's rewrite in place of two chunks on "fast" replaced their only copies; another
    process deletes one new object before A's flush. The flush says that chunk has no value
    left (it said the chunk kept its previous value, which went with the object), and a read
    of it says the same; the other chunk's write is recorded."""
    dataset_a_on_fast(tmp_path)
    a, b = session(tmp_path), session(tmp_path)
    da = a.open_dataset("a", "r+")
    da[0:20, 0:10] = -1.0
    b.tiers["fast"].backend.delete(object_key("a", "c/0/0"))
    with pytest.raises(ChunksNotStoredError) as err:
        da.flush()
    msg = str(err.value)
    assert err.value.keys == ["c/0/0"] and "on tier 'fast' is gone" in msg, msg
    assert "c/0/0 has no value left (the write replaced its only copy in place" in msg, msg
    assert "previous value" not in msg, msg
    da.close(), a.close(), b.close()
    with session(tmp_path) as s:
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[10:20, 0:10], -1.0)
        with pytest.raises(BackendError, match="c/0/0.*missing"):
            ds[0:10, 0:10]


#: what chunk c/0/0 was before a rewrite (see _rewritten)
REWRITES = ("unwritten", "elsewhere", "in-place")


def _rewritten(tmp_path, before):
    """Dataset "a" on "fast" and a session that has written -1 into chunk c/0/0 and -2 into
    c/1/0, not flushed: ``before`` the write, c/0/0 was never written ("unwritten"; the
    dataset created empty), was on the archive only ("elsewhere": the write puts a new copy
    on "fast"), or on "fast" ("in-place": the write replaces that object)."""
    dataset_a_on_fast(tmp_path)
    if before == "unwritten":
        with session(tmp_path) as s:
            s.delete_dataset("a")
            s.create_dataset("a", A.shape, "f4", (10, 10), hint="LOCALDISK").close()
    a = session(tmp_path)
    da = a.open_dataset("a", "r+")
    if before == "elsewhere":
        da.migrate(np.s_[0:10, 0:10], to="archive").wait()
    was = {c.tier: c.checksum for c in a.catalog.residency("a", ["c/0/0"])}
    da[0:10, 0:10] = -1.0
    da[10:20, 0:10] = -2.0
    return a, da, was


@pytest.mark.parametrize(
    ("before", "thing"),
    [
        *((b, t) for t in ("directory", "file", "nothing") for b in REWRITES),
        ("unwritten", "file-at-folder"),  # (c/0/0 is the only chunk under a/c/0 then)
    ],
)
def test_a_flush_whose_new_object_something_replaced_before_it_raises_naming_it(
    tmp_path, before, thing
):
    """Between A's put of chunk c/0/0 on "fast" and its flush, the object is replaced by a
    directory (or its folder by a file), or by a file no write of strataio's put, or
    deleted. The commit leaves the write out (the object is not the put's), as it does
    where another process's put replaced it; but no other write stands for the chunk, so
    A's value is lost: the flush raises :class:`ObjectError` naming the chunk and what
    stands there (:class:`ChunksNotStoredError` for an object deleted), and the tier stays
    up. It returned, and the chunk read back as its fill value or its older value, silently
    (so did a rewrite in place whose new object was deleted; a file in the way of the
    object's folder failed the flush as a tier failing, marked the tier down and kept the
    write buffered for good). The other chunk's write is recorded, and once what was in the
    way is gone the chunk is written again."""
    a, da, was = _rewritten(tmp_path, before)
    obj = tmp_path / "fast" / "a" / "c" / "0" / "0"
    obj.unlink()
    if thing == "directory":
        obj.mkdir()
    elif thing == "file":
        obj.write_bytes(b"not a chunk")
    elif thing == "file-at-folder":
        obj.parent.rmdir()
        obj.parent.write_bytes(b"")
    with pytest.raises(ChunksNotStoredError if thing == "nothing" else ObjectError) as err:
        da.flush()
    assert err.value.keys == ["c/0/0"]
    said = str(err.value)
    assert "'c/0/0'" in said or "c/0/0 " in said
    if thing != "nothing":
        assert "'fast'" in said and "a/c/0/0" in said
        what = {"directory": "Is a directory", "file": "of 11 bytes"}
        assert what.get(thing, "Not a directory") in said
    assert all(t.up for t in a.tiers)  # (one object's trouble: the tier answers)
    da.flush()  # (reported once)
    # the catalog records no value of the write (an announcement of it stands for the old)
    rows = {c.tier: c.committed_checksum for c in a.catalog.residency("a", ["c/0/0"])}
    assert rows == was
    if before == "unwritten":
        np.testing.assert_array_equal(da[0:10, 0:10], 0.0)
    elif before == "elsewhere":
        np.testing.assert_array_equal(da[0:10, 0:10], A[0:10, 0:10])  # (the archive's)
    elif thing != "file":  # (the old object went with it: its loss is read as such)
        with pytest.raises(BackendError, match="'fast'"):
            da[0:10, 0:10]
    np.testing.assert_array_equal(da[10:20, 0:10], -2.0)
    # once what stood there is gone, the chunk is written again and kept
    if thing == "directory":
        obj.rmdir()
    elif thing == "file-at-folder":
        obj.parent.unlink()
    da[0:10, 0:10] = -3.0
    da.close()
    a.close()
    with session(tmp_path) as s:
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[0:10, 0:10], -3.0)
        np.testing.assert_array_equal(ds[10:20, 0:10], -2.0)


@pytest.mark.parametrize("before", REWRITES)
@pytest.mark.parametrize("flushed", [True, False], ids=["b-flushed", "b-not-flushed"])
def test_a_flush_whose_object_another_process_s_write_replaced_keeps_that_value(
    tmp_path, before, flushed
):
    """Between A's put of chunk c/0/0 on "fast" and its flush, B writes the chunk there too:
    B's put replaces A's object, announced in the catalog (and recorded, where B flushes
    first). A's flush leaves its write out and returns: the two writes were not ordered, and
    B's value, the one on the tier, is the chunk's, as before."""
    a, da, was = _rewritten(tmp_path, before)
    obj = tmp_path / "fast" / "a" / "c" / "0" / "0"
    put = obj.stat().st_ino
    b = session(tmp_path)
    db = b.open_dataset("a", "r+")
    db[0:10, 0:10] = 7.0
    assert obj.stat().st_ino != put  # (B's put replaced A's object)
    if flushed:
        db.flush()
    da.flush()
    np.testing.assert_array_equal(da[10:20, 0:10], -2.0)
    db.close(), da.close(), a.close(), b.close()
    with session(tmp_path) as s:
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[0:10, 0:10], 7.0)
        np.testing.assert_array_equal(ds[10:20, 0:10], -2.0)
        assert fsck(s.catalog, s.tiers).clean


@pytest.mark.parametrize("before", ["elsewhere", "in-place"])
def test_a_flush_whose_object_another_writer_put_back_at_the_old_value_keeps_that_value(
    tmp_path, before
):
    """Between A's put of chunk c/0/0 and its flush, B writes the chunk's previous value
    back there and flushes: B's put replaces A's object, and the only value the chunk's rows
    name is the one A's write replaced. That is B's value, not a loss: the object holds
    bytes a row names. A's flush returns (it raised an ObjectError saying that no write
    stood for the object, "put there by hand?"), and the chunk is B's value."""
    a, da, _ = _rewritten(tmp_path, before)
    b = session(tmp_path)
    db = b.open_dataset("a", "r+")
    db[0:10, 0:10] = A[0:10, 0:10]
    db.flush()
    da.flush()
    db.close(), da.close(), a.close(), b.close()
    with session(tmp_path) as s:
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[0:10, 0:10], A[0:10, 0:10])
        np.testing.assert_array_equal(ds[10:20, 0:10], -2.0)


def _write_lost_by_hand(root, thing: str) -> None:
    """A session writes -1 into chunk c/0/0 of dataset "a" under ``root``, a new object or a
    rewrite on "fast"; then that object is deleted, a directory or a file put in its place
    where ``thing`` says. The flush says the write is lost."""
    a = session(root)
    da = a.open_dataset("a", "r+")
    da[0:10, 0:10] = -1.0
    obj = root / "fast" / "a" / "c" / "0" / "0"
    obj.unlink()
    if thing == "directory":
        obj.mkdir()
    elif thing == "file":
        obj.write_bytes(b"not a chunk")
    with pytest.raises(ChunksNotStoredError if thing == "nothing" else ObjectError) as err:
        da.flush()
    assert err.value.keys == ["c/0/0"]
    da.close(), a.close()


@pytest.mark.parametrize("thing", ["nothing", "directory", "file"])
def test_a_rewrite_over_a_dead_writer_s_whose_object_is_lost_by_hand_says_so(tmp_path, thing):
    """D rewrites chunk c/0/0 in place and dies after its put; A rewrites it over D's
    announcement, which names D's new bytes (those its object holds) as the old ones. Then
    A's object is deleted, or replaced by hand, before A's flush: the chunk is back at D's
    value, and A's is lost. The flush says so; it returned, as the value A's write replaced
    was taken from D's row (D's old bytes), not from the object."""
    dataset_a_on_fast(tmp_path)
    d = session(tmp_path)
    d.open_dataset("a", "r+")[0:10, 0:10] = 5.0
    d.catalog._locks.release(d.writer)  # (D's process dies: its liveness token goes)
    _write_lost_by_hand(tmp_path, thing)


@pytest.mark.parametrize("thing", ["nothing", "directory", "file"])
def test_a_dead_writer_s_announcement_on_another_tier_hides_no_lost_write(tmp_path, thing):
    """Chunk c/0/0 is on the archive only, under an announced rewrite of a writer long dead
    (its put never landed; fsck has not run). A writes the chunk, a new object on "fast",
    which is deleted or replaced by hand before A's flush. No put of that writer's replaced
    A's object (it rewrites another tier's): the flush says A's write is lost. It returned,
    as though another writer's put had replaced the object."""
    dataset_a_on_fast(tmp_path)
    with session(tmp_path) as s:
        s.open_dataset("a", "r+").migrate(np.s_[0:10, 0:10], to="archive").wait()
        (row,) = s.catalog.residency("a", ["c/0/0"])
        assert row.tier == "archive"
        ghost = row._replace(
            state="in-transit", checksum="0" * 8, old_checksum=row.checksum, writer="gone"
        )
        s.catalog.commit([ghost], [])
    _write_lost_by_hand(tmp_path, thing)


def test_a_catalog_failing_the_look_at_left_out_writes_leaves_no_put_waiting(tmp_path):
    """A's flush records its writes, one of them left out as B's put replaced its object;
    the look at that chunk's rows that follows (is A's value lost?) fails, as a busy or
    lost catalog connection does. The objects the commit made obsolete are dealt with all
    the same: a later move onto one of their places goes ahead. The look came before them,
    and the failure left them marked as being deleted, so the move waited for good."""
    a, da, _ = _rewritten(tmp_path, "in-place")
    da.migrate(np.s_[10:20, 0:10], to="archive").wait()  # (flushes A's writes)
    da[10:20, 0:10] = -3.0  # a new copy on "fast": the archive's goes at the commit
    da[0:10, 0:10] = -4.0
    b = session(tmp_path)
    db = b.open_dataset("a", "r+")
    db[0:10, 0:10] = 7.0  # (B's put replaces A's object of c/0/0)
    db.flush()
    residency, failed = a.catalog.residency, []

    def busy(dataset, keys=None, *args, **kwargs):
        if keys == ["c/0/0"] and not failed:
            failed.append(keys)
            raise BackendError("catalog busy")
        return residency(dataset, keys, *args, **kwargs)

    a.catalog.residency = busy
    with contextlib.suppress(BackendError):
        da.flush()
    a.catalog.residency = residency
    assert failed
    waiting = set(da.store.res._deleting)
    da.store.res.deleted(waiting)  # (else the move below, and the close, wait for good)
    assert not waiting, "puts of these wait for a deletion that never ends"
    da.migrate(np.s_[10:20, 0:10], to="archive").wait()
    np.testing.assert_array_equal(da[10:20, 0:10], -3.0)
    db.close(), da.close(), a.close(), b.close()


def test_a_write_over_an_object_it_did_not_know_is_announced_and_wins_over_the_move(
    tmp_path, monkeypatch
):
    """B's stage puts the chunk on "fast"; before B records it, A writes the chunk, knowing
    it on the archive only: A's put finds B's object there, announces its rewrite and
    replaces it. B's commit must leave its row out (A's announcement stands there) and keep
    the object, now A's; A's flush records A's value."""
    from strataio.tiers import mover

    dataset_a_on_fast(tmp_path)
    with session(tmp_path) as s:
        s.open_dataset("a", "r+").migrate(to="archive").wait()
    a, b = session(tmp_path), session(tmp_path)
    da, db = a.open_dataset("a", "r+"), b.open_dataset("a", "r")
    put_checked = mover.put_checked

    def written_meanwhile(dst, dataset, key, data, **kw):
        out = put_checked(dst, dataset, key, data, **kw)
        if key == "c/0/0":
            da[0:10, 0:10] = -1.0  # onto "fast" (LOCALDISK), where A knows no copy
        return out

    monkeypatch.setattr(mover, "put_checked", written_meanwhile)
    db.stage(np.s_[0:10, 0:10], to="fast").wait()
    monkeypatch.setattr(mover, "put_checked", put_checked)
    row = {c.tier: c for c in a.catalog.residency("a") if c.key == "c/0/0"}["fast"]
    assert row.state == "in-transit" and row.writer == a.writer
    da.flush()
    np.testing.assert_array_equal(da[0:10, 0:10], -1.0)
    da.close(), db.close(), a.close(), b.close()
    with session(tmp_path) as s:
        np.testing.assert_array_equal(s.open_dataset("a")[0:10, 0:10], -1.0)
        assert fsck(s.catalog, s.tiers).clean


def test_a_copy_marked_valid_on_a_stale_view_is_not_recorded(tmp_path, monkeypatch):
    """A migrate that finds the chunk's copy on its target already, dirty, only marks it
    valid. If another session rewrote the chunk since this one loaded its rows (its write
    superseded that copy, row and object), the mark is left out: no row of the old value
    comes back beside the new one, and none names an object that is gone."""
    dataset_a_on_fast(tmp_path)
    writer, mover = session(tmp_path), session(tmp_path)
    try:
        w = writer.open_dataset("a", "r+")
        fast = writer.tiers["fast"]
        fast.capacity = 1  # the next write of a chunk goes to the archive: a dirty copy
        w[0:10, 0:10] = -1.0
        w.flush()
        assert [(c.tier, c.state) for c in w.residency()["c/0/0"]] == [("archive", "dirty")]
        m = mover.open_dataset("a", "r+")
        fast.capacity = None
        mark_valid = Residency.mark_valid

        def rewritten_first(res, copy):  # the writer's rewrite lands right before the mark
            if res is m.store.res:
                w[0:10, 0:10] = -2.0  # back on "fast": supersedes the archive copy
                w.flush()
            return mark_valid(res, copy)

        monkeypatch.setattr(Residency, "mark_valid", rewritten_first)
        m.migrate(np.s_[0:10, 0:10], to="archive").wait()  # finds it there, dirty: marks it
        monkeypatch.undo()
        m.close()
        w.close()
    finally:
        mover.close()
        writer.close()
    with session(tmp_path) as s:
        rows = s.catalog.residency("a", ["c/0/0"])
        assert len({c.checksum for c in rows}) == 1, rows
        report = fsck(s.catalog, s.tiers)
        assert report.clean, report.problems
        np.testing.assert_array_equal(s.open_dataset("a")[0:10, 0:10], -2.0)


def test_a_copy_found_missing_and_put_back_at_its_place_meanwhile_is_read(tmp_path, monkeypatch):
    """A reads a chunk it knows on "fast" only. B has moved it to "remote" since, so A finds
    the object missing; before A looks at the catalog again, B stages it back to "fast" and
    drops the "remote" copy. The catalog then shows what A knew: A's look finds no change,
    and must read the copy again (it raised "no readable intact copy" before)."""
    from strataio.tiers.store import TieredChunkStore

    config = CONFIG.replace(
        '[[tiers]]\nname = "archive"',
        '[[tiers]]\nname = "remote"\nkind = "posix"\nrole = "remotedisk"\npath = "remote"\n\n'
        '[[tiers]]\nname = "archive"',
    )
    (tmp_path / "strataio.toml").write_text(config)
    with session(tmp_path) as s:
        ds = s.create_dataset("a", A.shape, "f4", (10, 10), hint="LOCALDISK")
        ds[...] = A
        ds.close()
    a, b = session(tmp_path), session(tmp_path)
    da, db = a.open_dataset("a"), b.open_dataset("a", "r+")
    da.clear_cache()
    da.store.res.chunk_keys()  # (A looks its chunks up: its view dates from now)
    db.migrate(np.s_[0:10, 0:10], to="remote").wait()  # A's view: still on "fast"
    refresh = TieredChunkStore._refresh
    put_back = []

    def moved_back_first(self, keys):
        if self is da.store and not put_back:
            put_back.append(True)
            db.stage(np.s_[0:10, 0:10], to="fast").wait()
            db.evict(np.s_[0:10, 0:10], tier="remote").wait()
        return refresh(self, keys)

    monkeypatch.setattr(TieredChunkStore, "_refresh", moved_back_first)
    np.testing.assert_array_equal(da[0:10, 0:10], A[0:10, 0:10])
    assert put_back
    assert {c.tier for c in a.catalog.residency("a") if c.key == "c/0/0"} == {"fast"}
    da.close(), db.close(), a.close(), b.close()


def test_a_move_never_announces_over_another_process_s_rewrite(tmp_path, monkeypatch):
    """B holds a copy of the chunk's old value on "fast" in its view and is about to put a
    copy there (a move announces first, over the row it saw). A rewrites the chunk in place
    there meanwhile: A's announcement stands, B's is refused before B puts anything, and
    A's flush records A's value (B's announcement used to replace A's, and B's put and
    commit then took the place of A's flushed write)."""
    from strataio.errors import ExistsError

    dataset_a_on_fast(tmp_path)
    a, b = session(tmp_path), session(tmp_path)
    da, db = a.open_dataset("a", "r+"), b.open_dataset("a", "r+")
    db.store.res.chunk_keys()  # (B looks its chunks up: its view dates from now)
    fast = a.tiers["fast"]
    put = fast.backend.put_versioned
    refused = []

    def move_first(key, data, **kw):  # A has announced its rewrite; B's move comes now
        if key == "a/c/0/0" and not refused:
            res = db.store.res
            old = res.copy_on("c/0/0", "fast")
            with pytest.raises(ExistsError, match="another process changed its copy"):
                db.store.commit.prepare_copy(res, old, b.tiers["fast"])
            refused.append(True)
        return put(key, data, **kw)

    monkeypatch.setattr(fast.backend, "put_versioned", move_first)
    da[0:10, 0:10] = -1.0
    assert refused
    row = {c.tier: c for c in a.catalog.residency("a") if c.key == "c/0/0"}["fast"]
    assert (row.state, row.writer) == ("in-transit", a.writer)
    da.flush()
    da.close(), db.close(), a.close(), b.close()
    with session(tmp_path) as s:
        np.testing.assert_array_equal(s.open_dataset("a")[0:10, 0:10], -1.0)
        assert fsck(s.catalog, s.tiers).clean


@pytest.mark.parametrize("fast", ["posix", "s3"])
def test_a_move_s_put_never_replaces_a_rewrite_announced_after_the_move_s(tmp_path, request, fast):
    """B announces its copy onto "fast", over the row it saw there; A then rewrites the
    chunk in place there (its announcement replaces B's) and puts its bytes. B's put, which
    may replace only the object B saw before its announcement, is refused, and A's flushed
    value stands (B's put used to replace A's object, and A's flush lost its write). On S3
    the refusal is the server's, to a conditional PUT."""
    from strataio.errors import ExistsError
    from strataio.tiers.tier import put_checked

    dataset_a_on_fast(tmp_path, config_with_fast(request, fast, tmp_path.name))
    a, b = session(tmp_path), session(tmp_path)
    da, db = a.open_dataset("a", "r+"), b.open_dataset("a", "r+")
    res = db.store.res
    old = res.copy_on("c/0/0", "fast")
    replace, seen = db.store.commit.prepare_copy(res, old, b.tiers["fast"])
    assert replace and seen is not None
    da[0:10, 0:10] = -1.0  # announced over B's row, and put
    with pytest.raises(ExistsError):
        put_checked(b.tiers["fast"], "a", "c/0/0", b"\0" * old.nbytes, over=seen)
    da.flush()
    da.close(), db.close(), a.close(), b.close()
    with session(tmp_path) as s:
        np.testing.assert_array_equal(s.open_dataset("a")[0:10, 0:10], -1.0)
        assert fsck(s.catalog, s.tiers).clean


def test_an_orphaned_move_never_deletes_the_object_a_write_put_over_it(tmp_path, monkeypatch):
    """B's stage puts the chunk's value 1 on "fast"; before B records it, A rewrites the
    chunk on the archive (its "fast" full) and flushes: no row holds 1 any more, and B's
    commit leaves its copy out as orphaned. Between that commit and B's deletion of its
    object, A writes the chunk again, onto "fast" now, over B's object, and flushes. B
    deletes the object only while it is the one B put: A's flushed bytes stay (B's deletion
    took them before)."""
    from strataio.tiers import mover
    from strataio.tiers.commit import Commit

    dataset_a_on_fast(tmp_path)
    with session(tmp_path) as s:
        s.open_dataset("a", "r+").migrate(to="archive").wait()
    a, b = session(tmp_path), session(tmp_path)
    da, db = a.open_dataset("a", "r+"), b.open_dataset("a", "r")
    fast = a.tiers["fast"]
    put_checked = mover.put_checked

    def rewritten_on_the_archive(dst, dataset, key, data, **kw):
        out = put_checked(dst, dataset, key, data, **kw)
        if key == "c/0/0":
            fast.capacity = 1
            da[0:10, 0:10] = -1.0  # onto the archive, over the value B copied
            da.flush()
            fast.capacity = None
        return out

    delete = Commit._delete
    steps = []

    def rewritten_on_fast_first(self, res, objs, seen=None, **kw):
        if res is db.store.res and ("fast", "c/0/0") in objs and not steps:
            steps.append("orphaned")
            da[0:10, 0:10] = -2.0  # onto "fast", over B's object
            da.flush()
        return delete(self, res, objs, seen, **kw)

    monkeypatch.setattr(mover, "put_checked", rewritten_on_the_archive)
    monkeypatch.setattr(Commit, "_delete", rewritten_on_fast_first)
    db.stage(np.s_[0:10, 0:10], to="fast").wait()
    monkeypatch.undo()
    assert steps == ["orphaned"]
    da.close(), db.close(), a.close(), b.close()
    with session(tmp_path) as s:
        np.testing.assert_array_equal(s.open_dataset("a")[0:10, 0:10], -2.0)
        assert fsck(s.catalog, s.tiers).clean


def test_an_object_missing_when_a_commit_looked_is_not_deleted_after_it(tmp_path):
    """A commit looks at the objects it is to delete before its rows go. One missing then
    (another process moved the copy away and deleted it) is none of its own: an object put
    there after the look (another process's move back, say) stays (an unconditional delete
    took it, and that process's recorded copy with it)."""
    dataset_a_on_fast(tmp_path)
    with session(tmp_path) as s:
        ds = s.open_dataset("a", "r+")
        commit, res = ds.store.commit, ds.store.res
        theirs = tmp_path / "fast" / "a" / "c" / "9" / "9"
        seen = commit._versions_of("a", [("fast", "c/9/9")])  # (nothing there yet)
        theirs.parent.mkdir(parents=True, exist_ok=True)
        theirs.write_bytes(b"theirs")  # (another process's put, after the look)
        commit._delete(res, [("fast", "c/9/9")], seen)
        assert theirs.read_bytes() == b"theirs"
        ds.close()


def test_a_move_that_gives_up_before_its_put_leaves_the_object_there(tmp_path, monkeypatch):
    """B's stage holds the put slot on "fast", where another process has just put its own
    object (not recorded yet), and then finds its source changed: it looks again and puts
    nothing. The object on "fast" is not B's: B neither deletes nor replaces it (B marked it
    obsolete before, and its next put or commit took A's bytes)."""
    dataset_a_on_fast(tmp_path)
    with session(tmp_path) as s:
        s.open_dataset("a", "r+").migrate(to="archive").wait()
    theirs = tmp_path / "fast" / "a" / "c" / "0" / "0"
    with session(tmp_path) as b:
        db = b.open_dataset("a", "r")
        res = db.store.res
        is_current = Residency.is_current
        changed = []

        def changed_once(self, copy):
            if self is res and copy.key == "c/0/0" and not changed:
                changed.append(True)
                theirs.parent.mkdir(parents=True, exist_ok=True)
                theirs.write_bytes(b"\x01" * 400)  # (another process's put, not recorded yet)
                return False
            return is_current(self, copy)

        monkeypatch.setattr(Residency, "is_current", changed_once)
        db.stage(np.s_[0:10, 0:10], to="fast").result()
        monkeypatch.undo()
        db.close()
    assert changed and theirs.read_bytes() == b"\x01" * 400


def test_a_missing_copy_no_other_copy_stands_for_reads_as_lost_not_as_an_older_value(tmp_path):
    """The chunk's newest copy ("fast") lost its object by hand; the archive still holds an
    older value of it (left by some earlier failure). A read raises, naming the missing copy,
    instead of reading the older value as the chunk's; fsck reports the loss, and its
    repair leaves the older value, said so."""
    dataset_a_on_fast(tmp_path)
    with session(tmp_path) as s:
        ds = s.open_dataset("a", "r+")
        ds.migrate(np.s_[0:10, 0:10], to="archive").wait()
        old = bytes(s.tiers["archive"].backend.get(object_key("a", "c/0/0")))
        (was,) = [c for c in s.catalog.residency("a") if c.key == "c/0/0"]
        ds[0:10, 0:10] = -1.0
        ds.close()
        s.tiers["archive"].backend.put(object_key("a", "c/0/0"), old)
        s.catalog.commit([was])  # (the older copy's row, as a failure could leave it)
        rows = {c.tier for c in s.catalog.residency("a") if c.key == "c/0/0"}
        assert rows == {"fast", "archive"}
        s.tiers["fast"].backend.delete(object_key("a", "c/0/0"))
    with session(tmp_path) as s:
        ds = s.open_dataset("a")
        with pytest.raises(BackendError, match=r"'c/0/0'.*copy on tier 'fast' is missing"):
            ds[0:10, 0:10]
        np.testing.assert_array_equal(ds[10:20, 10:20], A[10:20, 10:20])  # (others read)
        ds.close()
        report = fsck(s.catalog, s.tiers)
        assert not report.clean
        fsck(s.catalog, s.tiers, repair=True)
        assert fsck(s.catalog, s.tiers).clean
        np.testing.assert_array_equal(s.open_dataset("a")[0:10, 0:10], A[0:10, 0:10])


def test_a_copy_found_missing_and_staged_back_before_its_row_goes_keeps_the_new_row(
    tmp_path, monkeypatch
):
    """A reads a chunk it knows on "fast" and "archive". B has migrated it to "archive"
    since, so A finds the "fast" object missing and drops that row. Between A's look at
    the object and A's transaction, B stages the chunk back to "fast" and records its new
    copy, a row like the one A saw (the same state and checksum). A's drop leaves B's row
    (it used to take it, and B's staged object stood on "fast" with no row naming it)."""
    dataset_a_on_fast(tmp_path)
    a, b = session(tmp_path), session(tmp_path)
    db = b.open_dataset("a", "r+")
    db.migrate(np.s_[0:10, 0:10], to="archive").wait()
    db.stage(np.s_[0:10, 0:10], to="fast").wait()  # ("fast" and "archive")
    da = a.open_dataset("a")
    da.clear_cache()
    da.store.res.chunk_keys()  # (A looks its chunks up: its view dates from now)
    assert {c.tier for c in da.store.res.copies("c/0/0")} == {"fast", "archive"}
    db.migrate(np.s_[0:10, 0:10], to="archive").wait()  # A's view: still on "fast" too
    backend = a.tiers["fast"].backend
    exists = backend.exists
    staged = []

    def staged_back_after_the_look(key):
        there = exists(key)
        if key == object_key("a", "c/0/0") and not there and not staged:
            staged.append(True)
            db.stage(np.s_[0:10, 0:10], to="fast").wait()
        return there

    monkeypatch.setattr(backend, "exists", staged_back_after_the_look)
    np.testing.assert_array_equal(da[0:10, 0:10], A[0:10, 0:10])
    monkeypatch.undo()
    assert staged
    assert {c.tier for c in a.catalog.residency("a") if c.key == "c/0/0"} == {"fast", "archive"}
    da.close(), db.close(), a.close(), b.close()
    with session(tmp_path) as s:
        report = fsck(s.catalog, s.tiers)
        assert report.clean, report.problems
        np.testing.assert_array_equal(s.open_dataset("a")[0:10, 0:10], A[0:10, 0:10])
