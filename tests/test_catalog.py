"""One catalog suite, run against SQLite (a temporary file) and PostgreSQL (a real server)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from urllib.parse import quote

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from strataio.catalog import (
    ChunkCopy,
    DatasetRecord,
    PerfRow,
    TierRecord,
    TierUsage,
    VerifiedCopy,
    open_catalog,
)
from strataio.catalog.base import Catalog
from strataio.catalog.sql import SCHEMA_VERSION
from strataio.catalog.sqlite import SQLiteCatalog
from strataio.errors import (
    BackendError,
    ClosedError,
    DatasetInUseError,
    ExistsError,
    MetadataError,
    NotFoundError,
)

TIERS = [
    TierRecord("archive", "posix:/arch", "remotetape", None, 2),
    TierRecord("mem", "memory:", "memory", 1 << 30, 0),
    TierRecord("local", "posix:/scratch", "localdisk", 10 << 30, 1),
]


def _ds(name: str, **kw) -> DatasetRecord:
    base = dict(shape=(100, 80), dtype="<f8", chunks=(10, 20), codec='["zstd"]', hint="AUTO")
    base.update(kw)
    return DatasetRecord(name, **base)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "cat" / "catalog.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def cat(url):
    c = open_catalog(url)
    c.register_tiers(TIERS)
    yield c
    c.close()


@contextlib.contextmanager
def statement_log(cat):
    """Collect the verb (BEGIN, INSERT, SELECT, COMMIT...) of every statement the database
    executes for ``cat``, from the driver's own trace hook: SQLite's trace callback, libpq's
    protocol trace (one CommandComplete per executed statement)."""
    verbs: list[str] = []
    conn = cat._conn
    if isinstance(conn, sqlite3.Connection):
        # (SQLite's connection of commits that do not wait for the disk, if open: its verbs
        # marked with a leading "~")
        conns = {"": conn, "~": getattr(cat, "_relaxed", None)}
        for mark, c in conns.items():
            if c is not None:
                c.set_trace_callback(
                    lambda sql, mark=mark: verbs.append(mark + sql.split(None, 1)[0].upper())
                )
        try:
            yield verbs
        finally:
            for c in conns.values():
                if c is not None:
                    c.set_trace_callback(None)
        return
    from psycopg import pq

    with tempfile.TemporaryFile("w+") as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield verbs
        finally:
            conn.pgconn.untrace()
            f.flush()
            f.seek(0)
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 4 and parts[0] == "B" and parts[2] == "CommandComplete":
                    verbs.append(parts[3].strip().strip('"').split()[0].upper())


def test_tiers_round_trip(cat):
    assert [t.name for t in cat.tiers()] == ["mem", "local", "archive"]
    assert cat.tiers()[1] == TIERS[2]
    # register is an upsert by name
    cat.register_tiers([TierRecord("local", "posix:/fast", "localdisk", 5, 1)])
    local = cat.tiers()[1]
    assert (local.url, local.capacity_bytes) == ("posix:/fast", 5)
    cat.set_tier_state("archive", "down", "EIO reading probe")
    assert (cat.tiers()[2].state, cat.tiers()[2].why) == ("down", "EIO reading probe")
    cat.register_tiers([TierRecord("archive", "posix:/arch", "remotetape", None, 2)])
    assert (cat.tiers()[2].state, cat.tiers()[2].why) == ("up", "")
    cat.set_tier_state("archive", "down", "EIO")
    cat.set_tier_state("archive", "up", "ignored: an up tier has no error")
    assert (cat.tiers()[2].state, cat.tiers()[2].why) == ("up", "")
    with pytest.raises(NotFoundError, match="nosuch"):
        cat.set_tier_state("nosuch", "down")
    with pytest.raises(MetadataError, match="sideways"):
        cat.set_tier_state("local", "sideways")
    with pytest.raises(MetadataError, match="role"):
        TierRecord("x", "memory:", "floppy", None, 0)


def test_dataset_names_do_not_nest(cat):
    """A dataset's objects lie under its name on every tier: no dataset is created inside
    another (or around one), which would mix their objects; siblings sharing a prefix that
    stops short of a ``/`` are fine."""
    cat.create_dataset(_ds("run/v"))
    for name, other in (("run/v/c/0", "run/v"), ("run/v/x", "run/v"), ("run", "run/v")):
        with pytest.raises(ExistsError, match=f"dataset {other!r}"):
            cat.create_dataset(_ds(name))
    for name in ("run/v2", "run/w", "runs/v", "ru"):
        cat.create_dataset(_ds(name))
    assert [d.name for d in cat.list_datasets()] == ["ru", "run/v", "run/v2", "run/w", "runs/v"]


def test_datasets(cat):
    a, b = _ds("b/temp", attrs='{"units": "K"}'), _ds("a/press", shape=(7,), chunks=(3,))
    cat.create_dataset(a)
    cat.create_dataset(b)
    assert cat.get_dataset("b/temp") == a
    assert cat.get_dataset("a/press").shape == (7,)
    assert cat.list_datasets() == [b, a]
    with pytest.raises(ExistsError, match="b/temp"):
        cat.create_dataset(_ds("b/temp", dtype="<i4"))
    assert cat.get_dataset("b/temp").dtype == "<f8"
    cat.update_dataset(_ds("b/temp", hint="REMOTETAPE", state="disabled"))
    got = cat.get_dataset("b/temp")
    assert (got.hint, got.state) == ("REMOTETAPE", "disabled")
    with pytest.raises(NotFoundError):
        cat.update_dataset(_ds("ghost"))
    cat.commit([ChunkCopy("b/temp", "c/0/0", "local", 10), ChunkCopy("a/press", "c/0", "mem", 3)])
    cat.delete_dataset("b/temp")
    with pytest.raises(NotFoundError, match="b/temp"):
        cat.get_dataset("b/temp")
    with pytest.raises(NotFoundError):
        cat.delete_dataset("b/temp")
    assert [c.dataset for c in cat.all_residency()] == ["a/press"]
    # a recreated dataset of the same name starts with no residency
    cat.create_dataset(a)
    assert cat.residency("b/temp") == []


def test_residency_commit_upsert_delete(cat):
    cat.create_dataset(_ds("d"))
    cat.create_dataset(_ds("e"))
    batch = [
        ChunkCopy("d", "c/1/0", "archive", 800, "aa", "valid", 5.0),
        ChunkCopy("d", "c/0/0", "archive", 800, "bb"),
        ChunkCopy("d", "c/0/0", "mem", 1600, "cc", "dirty"),
        ChunkCopy("d", "c/0/0", "local", 800, "bb", "in-transit"),
        ChunkCopy("e", "c/0/0", "local", 16),
    ]
    cat.commit(batch)
    # by key, then tier order (mem, local, archive)
    assert cat.residency("d") == [batch[2], batch[3], batch[1], batch[0]]
    assert cat.residency("nosuch") == []
    # upsert replaces by (dataset, key, tier); a duplicate in one batch: the last one wins
    v2 = ChunkCopy("d", "c/0/0", "local", 900, "dd", "valid", 9.0)
    cat.commit([ChunkCopy("d", "c/0/0", "local", 1, "zz", "dirty"), v2], deletes=[])
    assert cat.residency("d")[1] == v2
    # deletes in the same transaction as upserts; a missing row is fine
    cat.commit(
        [ChunkCopy("d", "c/2/0", "local", 8)],
        deletes=[("d", "c/0/0", "mem"), ("d", "c/1/0", "archive"), ("d", "c/9/9", "mem")],
    )
    assert [(c.key, c.tier) for c in cat.residency("d")] == [
        ("c/0/0", "local"),
        ("c/0/0", "archive"),
        ("c/2/0", "local"),
    ]
    assert [c.dataset for c in cat.all_residency()] == ["d", "d", "d", "e"]
    assert cat.usage() == [
        TierUsage("d", "local", 2, 908),
        TierUsage("d", "archive", 1, 800),
        TierUsage("e", "local", 1, 16),
    ]
    before = cat.all_residency()
    # an unknown dataset or tier rejects the whole batch, named in the message
    with pytest.raises(MetadataError, match=r"unknown tier\(s\) \['tape9'\]"):
        cat.commit([ChunkCopy("d", "c/5/0", "local", 1), ChunkCopy("d", "c/5/0", "tape9", 1)])
    with pytest.raises(MetadataError, match=r"unknown dataset\(s\) \['zz'\]"):
        cat.commit([ChunkCopy("zz", "c/0", "local", 1)], deletes=[("d", "c/2/0", "local")])
    with pytest.raises(MetadataError, match="lost"):
        cat.commit([ChunkCopy("d", "c/5/0", "local", 1, state="lost")])
    assert cat.all_residency() == before


def _text_in_code_point_order(cat) -> None:
    """Every listing of ``cat`` that is ordered by text orders it as Python's ``sorted``."""
    from strataio.catalog import OvertakenRewrite

    names = ["b", "B", "a_b", "a-c", "ab", "a/b", "A/c", "é", "z"]
    for n in names:
        cat.create_dataset(_ds(n))
    keys = ["c/1/0", "c/10/0", "c/1_0", "c/1/00", "C/2", "c-1"]
    cat.commit([ChunkCopy("b", k, "local", 1) for k in keys])
    cat.commit([ChunkCopy("B", k, "local", 1) for k in ("c/1_0", "C/2")])
    assert [d.name for d in cat.list_datasets()] == sorted(names)
    assert [c.key for c in cat.residency("b")] == sorted(keys)
    assert [c[:2] for c in cat.all_residency()] == sorted(
        [*(("b", k) for k in keys), ("B", "c/1_0"), ("B", "C/2")]
    )
    # announced rewrites of writers "W" and "w" that writer "x"'s announcements overtook
    for name in ("b", "B"):
        for k in ("c/1_0", "C/2"):
            i = (name, k, "local")
            for w, seen in (("W", ("valid", "")), ("w", ("in-transit", "W")), ("x", None)):
                if seen is None:
                    seen = ("in-transit", "w")
                c = ChunkCopy(*i, 8, w, "in-transit", 0.0, "old", w)
                cat.commit([c], durable=False, expect={i: seen}, writer=w)
    assert cat.overtaken() == sorted(
        OvertakenRewrite(d, k, "local", w, w) for d in ("b", "B") for k in ("c/1_0", "C/2")
        for w in ("W", "w")
    )  # fmt: skip
    # (a name with datasets below it is refused naming the first of them)
    with pytest.raises(ExistsError, match="dataset 'A/c' lies inside it"):
        cat.create_dataset(_ds("A"))
    cat.create_dataset(_ds("n/b"))
    cat.create_dataset(_ds("n/B"))
    with pytest.raises(ExistsError, match="dataset 'n/B' lies inside it"):
        cat.create_dataset(_ds("n"))


def test_text_order_is_code_point_order_on_every_database(cat):
    _text_in_code_point_order(cat)


@pytest.fixture(scope="module")
def en_us_url():
    """A ``postgresql://`` URL of a database whose text order is en_US.UTF-8's ('a' < 'B' <
    'b', '_' and '-' ignored at first), the default of many servers: the wheel's own server
    orders by code point. The locale is compiled here (``localedef``) for the server alone."""
    import psycopg

    from servers import start_postgres

    sources = "/usr/share/i18n/locales/en_US"
    if shutil.which("localedef") is None or not os.path.exists(sources):
        pytest.skip("localedef and the en_US locale source are needed to compile en_US.UTF-8")
    # (not under pytest's basetemp: the server, run as root, reads it as its own user)
    locales = tempfile.mkdtemp(prefix="strataio-locale-")
    os.chmod(locales, 0o755)
    try:
        subprocess.run(
            ["localedef", "-i", "en_US", "-f", "UTF-8", f"{locales}/en_US.UTF-8"],
            capture_output=True,
        )
        if not os.path.exists(f"{locales}/en_US.UTF-8/LC_COLLATE"):
            pytest.skip("localedef could not compile en_US.UTF-8")
        before = os.environ.get("LOCPATH")
        os.environ["LOCPATH"] = locales  # (read by the server, which inherits it)
        try:
            srv, root = start_postgres()
        finally:
            if before is None:
                del os.environ["LOCPATH"]
            else:
                os.environ["LOCPATH"] = before
        try:
            with psycopg.connect(srv.get_uri(), autocommit=True) as conn:
                conn.execute(
                    "CREATE DATABASE en_us TEMPLATE template0 LC_COLLATE 'en_US.UTF-8' "
                    "LC_CTYPE 'en_US.UTF-8'"
                )
            uri = srv.get_uri()
            assert "/postgres?" in uri, uri
            yield uri.replace("/postgres?", "/en_us?")
            srv.cleanup()
        finally:
            shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(locales, ignore_errors=True)


def test_text_order_is_code_point_order_on_a_database_ordering_text_otherwise(en_us_url):
    with open_catalog(en_us_url) as cat:
        cat.register_tiers(TIERS)
        assert cat._query("SELECT 'a' < 'B'") == [(True,)]  # (the database's own order)
        _text_in_code_point_order(cat)


def test_touch(cat):
    cat.create_dataset(_ds("d"))
    cat.commit([ChunkCopy("d", f"c/{i}/0", t, 1) for i in range(4) for t in ("local", "archive")])
    cat.touch("d", ["c/1/0", "c/3/0", "c/3/0", "c/missing"], 123.5)
    got = {(c.key, c.tier): c.last_access for c in cat.residency("d")}
    assert got == {
        (f"c/{i}/0", t): (123.5 if i in (1, 3) else 0.0)
        for i in range(4)
        for t in ("local", "archive")
    }
    cat.touch("d", [], 999.0)  # nothing to do
    assert max(got.values()) == 123.5


def test_lru_copies_oldest_first_skipping_excluded_datasets(cat):
    for n in ("d", "e"):
        cat.create_dataset(_ds(n))
    # e holds the 4 oldest copies on local; d the 4 after; ties break by dataset then key
    rows = [ChunkCopy("e", f"c/{i}/0", "local", 10, "", "valid", 1.0 + i) for i in range(4)]
    rows += [ChunkCopy("d", f"c/{i}/0", "local", 20, "", "valid", 10.0 - i) for i in range(4)]
    rows += [ChunkCopy("d", "c/9/0", "local", 20, "", "valid", 1.0)]
    rows += [ChunkCopy("d", f"c/{i}/0", "archive", 20, "", "valid", 0.0) for i in range(4)]
    cat.commit(rows)
    oracle = sorted(
        (c for c in rows if c.tier == "local"), key=lambda c: (c.last_access, c.dataset, c.key)
    )
    assert cat.lru_copies("local", 3) == oracle[:3]
    assert [(c.dataset, c.key) for c in oracle[:2]] == [("d", "c/9/0"), ("e", "c/0/0")]
    assert cat.lru_copies("local", 100) == oracle
    assert cat.lru_copies("local", 0) == []
    assert cat.lru_copies("mem", 5) == []
    # the excluded dataset fills the first page: a further one is read
    not_e = [c for c in oracle if c.dataset != "e"]
    assert cat.lru_copies("local", 3, exclude={"e"}) == not_e[:3]
    assert cat.lru_copies("local", 10, exclude=["e"]) == not_e
    assert cat.lru_copies("local", 10, exclude=["d", "e"]) == []
    # the generic implementation agrees
    assert Catalog.lru_copies(cat, "local", 4, exclude={"e"}) == not_e[:4]


def test_perf_rows(cat):
    rows = [
        PerfRow("local", "write", 1 << 20, 0.002, 1, 10.0),
        PerfRow("archive", "read", 1 << 20, 3.5, 2, 11.0),
        PerfRow("local", "read", 4096, 1e-5, 4, 9.0),
    ]
    cat.record_perf(rows)
    assert cat.perf_rows() == [rows[2], rows[0], rows[1]]
    assert cat.perf_rows("local") == [rows[2], rows[0]]
    many = [PerfRow("mem", "read", n, n * 1e-9, 1, 20.0 + n) for n in range(200)]
    cat.record_perf(many)
    assert cat.perf_rows("mem") == many
    assert cat.perf_rows("nosuch") == []


def test_concurrent_opens(url, cat):
    """Two connections to one catalog, committing from two threads at once: nothing is lost,
    and each sees the other's commits."""
    cat.create_dataset(_ds("d"))
    other = open_catalog(url)
    try:
        assert other.get_dataset("d") == cat.get_dataset("d")
        errors: list[BaseException] = []

        def writer(c, tier):
            try:
                for i in range(40):
                    c.commit([ChunkCopy("d", f"c/{i}/{j}", tier, i + j) for j in range(5)])
                    c.residency("d")
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=writer, args=(cat, "local")),
            threading.Thread(target=writer, args=(other, "archive")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        for c in (cat, other):
            assert Counter(x.tier for x in c.residency("d")) == {"local": 200, "archive": 200}
    finally:
        other.close()


_WORKER = """
import sys
from strataio.catalog import ChunkCopy, DatasetRecord, TierRecord, open_catalog
from strataio.errors import ExistsError
url, tier = sys.argv[1], sys.argv[2]
with open_catalog(url) as c:
    c.register_tiers([TierRecord(tier, "memory:", "memory", None, len(tier))])
    try:
        c.create_dataset(DatasetRecord("shared", (8,), "<i4", (1,)))
    except ExistsError:
        pass
    for i in range(10):
        c.commit([ChunkCopy("shared", f"c/{i}/{j}", tier, 1) for j in range(10)])
"""


def test_concurrent_processes_create_migrate_and_commit(url):
    """Two processes open a catalog that does not exist yet at the same moment: one creates
    the schema, the other waits for it; then both commit batches side by side."""
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER, url, tier], stderr=subprocess.PIPE)
        for tier in ("t1", "t22")
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
    with open_catalog(url) as c:
        assert c.schema_version == SCHEMA_VERSION
        assert Counter(x.tier for x in c.residency("shared")) == {"t1": 100, "t22": 100}


def test_sqlite_an_empty_file_at_the_catalog_path_is_refused_not_taken_as_new(tmp_path):
    """A catalog file emptied (a crash, a truncated copy) or made by ``touch`` is refused with
    MetadataError naming it, by open_catalog and by a Session, and left as it is: taken for a
    new catalog, it would show every dataset gone. Deleted, a new catalog is made there."""
    import strataio
    from strataio.storage.posix import PosixBackend
    from strataio.tiers.tier import Tier, TierSet

    path = tmp_path / "cat" / "catalog.db"
    with open_catalog(path) as c:
        c.register_tiers(TIERS)
        c.create_dataset(_ds("temp"))
    os.truncate(path, 0)
    touched = tmp_path / "touched.db"
    touched.touch()
    for p in (path, touched):
        with pytest.raises(MetadataError, match=r"catalog '.*" + p.name + "' is an empty file"):
            open_catalog(p)
        tiers = TierSet([Tier("local", PosixBackend(tmp_path / "local"), "localdisk", order=0)])
        with pytest.raises(MetadataError, match="empty file"):
            strataio.Session(tiers=tiers, catalog=p)
        assert p.stat().st_size == 0
    path.unlink()
    with open_catalog(path) as c:
        assert c.schema_version == SCHEMA_VERSION and c.list_datasets() == []


def test_sqlite_catalog_is_made_under_another_name_then_linked_in_place(tmp_path, monkeypatch):
    """A new catalog file never stands empty at its path (where another process opening it
    would refuse it): SQLite writes its header under a draft name, which is linked into
    place and removed. Where the file system has no hard links, it is made in place."""
    seen: list[bool] = []
    wal_mode = SQLiteCatalog._wal_mode

    def noting(self, conn):
        seen.append(os.path.exists(self.path))
        return wal_mode(self, conn)

    monkeypatch.setattr(SQLiteCatalog, "_wal_mode", noting)
    path = tmp_path / "catalog.db"
    with open_catalog(path) as c:
        c.register_tiers(TIERS)
    assert seen[0] is False  # the header was written before the path named the file
    assert [p.name for p in tmp_path.iterdir()] == ["catalog.db"]  # (no draft left)

    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with open_catalog(tmp_path / "here.db") as c:
        c.register_tiers(TIERS)
        assert [t.name for t in c.tiers()] == ["mem", "local", "archive"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".new")]


def test_sqlite_is_wal_and_reader_not_blocked_by_writer(tmp_path):
    path = tmp_path / "c.db"
    a = SQLiteCatalog(path)
    a.register_tiers(TIERS)
    a.create_dataset(_ds("d"))
    assert a._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    b = SQLiteCatalog(path, timeout=0.2)
    try:
        # a writer mid-transaction does not block a reader in WAL mode
        with a._write() as cur:
            cur.execute("DELETE FROM residency")
            assert b.get_dataset("d").name == "d"
            # ...but a second writer waits for the busy timeout, then fails cleanly
            with pytest.raises(BackendError, match="locked"):
                b.create_dataset(_ds("x"))
        b.create_dataset(_ds("x"))
        assert [d.name for d in a.list_datasets()] == ["d", "x"]
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names the holder on Linux")
def test_sqlite_a_write_lock_held_too_long_names_the_process_holding_it(tmp_path):
    """A writer that waited its whole timeout for another process's transaction raises
    BackendError naming the catalog, the wait, and the process holding the lock (its pid and
    command), not SQLite's bare "database is locked"; once that process ends, writes go on."""
    path = tmp_path / "c.db"
    with open_catalog(path) as c:
        c.register_tiers(TIERS)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
            str(path),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"held\n"
        t0 = time.monotonic()
        with pytest.raises(BackendError) as err:
            SQLiteCatalog(path, timeout=0.5)
        assert time.monotonic() - t0 >= 0.5
        text = str(err.value)
        assert str(path) in text and "0.5 s" in text
        assert f"process {holder.pid}" in text and "sqlite3" in text
    finally:
        holder.kill()
        holder.wait()
    with SQLiteCatalog(path, timeout=0.5) as c:
        c.create_dataset(_ds("after"))
        assert [d.name for d in c.list_datasets()] == ["after"]


def test_sqlite_a_catalog_out_of_room_or_not_writable_says_so_and_what_to_do(tmp_path):
    """A write that SQLite refuses for want of room (SQLITE_FULL) or of write access
    (SQLITE_READONLY) raises BackendError naming the catalog, its directory and what to do,
    not SQLite's bare text; the catalog is left as it was and takes writes again once the
    cause is gone."""
    path = tmp_path / "c.db"
    with SQLiteCatalog(path) as c:
        c.register_tiers(TIERS)
        c.create_dataset(_ds("kept"))
        pages = c._conn.execute("PRAGMA page_count").fetchone()[0]
        c._conn.execute(f"PRAGMA max_page_count = {pages}")  # (a file system out of room)
        with pytest.raises(BackendError) as err:
            for i in range(100):
                c.create_dataset(_ds(f"d{i}", attrs='{"pad": "' + "x" * 2000 + '"}'))
        text = str(err.value)
        assert "database or disk is full" in text and str(tmp_path) in text
        assert "free space" in text and "fsck --repair" in text
        c._conn.execute(f"PRAGMA max_page_count = {2**30}")
        c._conn.execute("PRAGMA query_only = ON")  # (a file or directory not writable)
        with pytest.raises(BackendError) as err:
            c.create_dataset(_ds("ro"))
        text = str(err.value)
        assert "readonly" in text and str(path) in text and "write access" in text
        c._conn.execute("PRAGMA query_only = OFF")
        c.create_dataset(_ds("after"))
        assert {d.name for d in c.list_datasets()} >= {"kept", "after"}
        assert not {d.name for d in c.list_datasets()} & {"ro"}
    (tmp_path / "folder.db").mkdir()
    with pytest.raises(BackendError, match=r"folder\.db is a directory, not a catalog file"):
        SQLiteCatalog(tmp_path / "folder.db")


def test_sqlite_a_file_not_a_catalog_or_damaged_is_refused_saying_what_to_do(tmp_path):
    """A file at the catalog's path that is not an SQLite database, or one cut short, is
    refused with BackendError naming it and what to do (restore it; moved aside, a new
    catalog knows none of its datasets), and left as it is."""
    text_file = tmp_path / "text.db"
    text_file.write_text("not a database\n" * 100)
    cut = tmp_path / "cut.db"
    with SQLiteCatalog(cut) as c:
        c.register_tiers(TIERS)
        for i in range(50):
            c.create_dataset(_ds(f"d{i}", attrs='{"pad": "' + "x" * 500 + '"}'))
    os.truncate(cut, 5000)
    for p in (text_file, cut):
        before = p.read_bytes()
        with pytest.raises(BackendError) as err:
            SQLiteCatalog(p)
        text = str(err.value)
        assert str(p) in text and "restore it from a backup" in text
        assert "knows none of its datasets" in text
        assert p.read_bytes() == before


# The schema as strataio first shipped it (version 1), in SQL both databases accept.
V1_SCHEMA = [
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    "INSERT INTO schema_version (version) VALUES (1)",
    "CREATE TABLE tiers (name TEXT PRIMARY KEY, url TEXT NOT NULL, role TEXT NOT NULL, "
    "capacity_bytes BIGINT, ord INTEGER NOT NULL)",
    "CREATE TABLE datasets (name TEXT PRIMARY KEY, shape TEXT NOT NULL, dtype TEXT NOT NULL, "
    "chunks TEXT NOT NULL, codec TEXT NOT NULL, hint TEXT NOT NULL, attrs TEXT NOT NULL, "
    "state TEXT NOT NULL)",
    "CREATE TABLE residency (dataset TEXT NOT NULL REFERENCES datasets (name) ON DELETE CASCADE, "
    "key TEXT NOT NULL, tier TEXT NOT NULL REFERENCES tiers (name), nbytes BIGINT NOT NULL, "
    "checksum TEXT NOT NULL, dirty INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (dataset, key, tier))",
    "INSERT INTO tiers VALUES ('disk', 'posix:/d', 'localdisk', 1000, 0)",
    "INSERT INTO tiers VALUES ('tape', 'posix:/t', 'remotetape', NULL, 1)",
    "INSERT INTO datasets VALUES ('old', '[4, 4]', '<i2', '[2, 2]', '[]', 'AUTO', '{}', 'active')",
    "INSERT INTO residency VALUES ('old', 'c/0/0', 'disk', 8, 'x1', 1)",
    "INSERT INTO residency VALUES ('old', 'c/0/0', 'tape', 8, 'x0', 0)",
    "INSERT INTO residency VALUES ('old', 'c/1/1', 'tape', 8, 'x2', 0)",
]


def _raw_execute(url: str, statements: list[str]) -> None:
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            for s in statements:
                conn.execute(s)
    else:
        os.makedirs(os.path.dirname(url), exist_ok=True)
        conn = sqlite3.connect(url)
        with conn:
            for s in statements:
                conn.execute(s)
        conn.close()


def test_migration_from_version_1(url):
    _raw_execute(url, V1_SCHEMA)
    with open_catalog(url) as c:
        assert c.schema_version == SCHEMA_VERSION == 10
        assert [(t.name, t.state, t.capacity_bytes) for t in c.tiers()] == [
            ("disk", "up", 1000),
            ("tape", "up", None),
        ]
        assert c.get_dataset("old") == DatasetRecord(
            "old", (4, 4), "<i2", (2, 2), "[]", "AUTO", "{}", "active"
        )
        assert c.residency("old") == [
            ChunkCopy("old", "c/0/0", "disk", 8, "x1", "dirty", 0.0),
            ChunkCopy("old", "c/0/0", "tape", 8, "x0", "valid", 0.0),
            ChunkCopy("old", "c/1/1", "tape", 8, "x2", "valid", 0.0),
        ]
        # the version-2 features work on the migrated database
        c.touch("old", ["c/1/1"], 7.0)
        c.record_perf([PerfRow("tape", "read", 8, 1.0, 1, 1.0)])
        c.set_tier_state("tape", "down")
        # and the version-3 ones: writers, announced rewrites with both checksums
        w = c.register_writer()
        c.commit([ChunkCopy("old", "c/1/1", "tape", 8, "x3", "in-transit", 7.0, "x2", w)])
        assert c.residency("old")[2].old_checksum == "x2"
        # and the version-6 one: checks of copies recorded for later readers
        c.record_verified("old", [VerifiedCopy("c/0/0", "tape", "x0", (3, 8, 11))])
        # and the version-7 one: a dataset's generation, moved on by a commit of its rows
        before = c.generation("old")
        c.commit([ChunkCopy("old", "c/1/1", "tape", 8, "x3", "valid", 7.0)])
        assert c.generation("old") == before + 1
        # and the version-8 one: the residency and the checks in their key's order, with the
        # rows, the LRU index and the cascade of a dataset's deletion as before
        if not url.startswith("postgresql://"):
            tables = dict(c._query("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
            assert "WITHOUT ROWID" in tables["residency"] and "WITHOUT ROWID" in tables["verified"]
            assert not any(name.endswith("_v8") for name in tables)
        assert [r.tier for r in c.lru_copies("tape", 5)] == ["tape", "tape"]
    # reopening does not migrate again, and keeps what was written
    with open_catalog(url) as c:
        assert c.residency("old")[2].last_access == 7.0
        assert c.perf_rows("tape") == [PerfRow("tape", "read", 8, 1.0, 1, 1.0)]
        assert c.tiers()[1].state == "down"
        assert c.verified_copies("old") == [VerifiedCopy("c/0/0", "tape", "x0", (3, 8, 11))]


def test_a_dataset_s_generation_moves_with_every_change_of_its_rows(cat):
    """Every commit that changes a dataset's rows (and an update of its record) moves its
    generation on, once per commit, and only its own; a dataset created again under the name
    of a deleted one starts at another generation."""
    cat.register_tiers(TIERS)
    cat.create_dataset(_ds("a"))
    cat.create_dataset(_ds("b"))
    assert cat.generation("nothing") is None
    a, b = cat.generation("a"), cat.generation("b")
    assert isinstance(a, int) and a != b  # (random starts)
    cat.commit([ChunkCopy("a", f"c/{i}", "local", 4, "aa") for i in range(3)])
    assert (cat.generation("a"), cat.generation("b")) == (a + 1, b)
    cat.commit([ChunkCopy("a", "c/9", "local", 4, "aa")], [("b", "c/0", "local")])
    assert (cat.generation("a"), cat.generation("b")) == (a + 2, b + 1)
    cat.commit([], [])
    cat.touch("a", ["c/0"], 5.0)
    cat.record_verified("a", [VerifiedCopy("c/0", "local", "aa", (1, 4, 0))])
    assert cat.generation("a") == a + 2  # (no row changed)
    cat.update_dataset(_ds("a"))
    assert cat.generation("a") == a + 3
    cat.delete_dataset("a")
    assert cat.generation("a") is None
    cat.create_dataset(_ds("a"))
    assert cat.generation("a") not in (a, a + 1, a + 2, a + 3)


def test_an_annotation_changes_alone_and_no_concurrent_change_is_lost(cat, url):
    """annotate_dataset sets one annotation of a record from its value then, keeps the
    others and the generation, writes nothing for an unchanged value, and removes it for
    None; changes through two connections at once each start from the other's."""
    cat.create_dataset(_ds("a", attrs='{"keep": 1}'))
    gen = cat.generation("a")
    assert cat.annotate_dataset("a", "n", lambda v: (v or 0) + 1) == 1
    assert cat.annotate_dataset("a", "n", lambda v: v) == 1
    assert cat.get_dataset("a").attrs == '{"keep": 1, "n": 1}'
    other = open_catalog(url)
    try:

        def count(c: Catalog) -> None:
            for _ in range(10):
                c.annotate_dataset("a", "n", lambda v: v + 1)

        workers = [threading.Thread(target=count, args=(c,)) for c in (cat, other)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        other.close()
    assert cat.annotate_dataset("a", "n", lambda v: v) == 21
    assert cat.annotate_dataset("a", "n", lambda v: None) is None
    assert cat.get_dataset("a").attrs == '{"keep": 1}'
    assert cat.generation("a") == gen
    with pytest.raises(NotFoundError):
        cat.annotate_dataset("nothing", "n", lambda v: 1)


def test_the_generation_of_rows_read_in_parts_is_never_newer_than_a_part(cat):
    """Rows of more chunks than one statement takes come in parts; a commit between two
    parts makes the generation returned older than the catalog's, never newer than what a
    part saw (rows learned with it would otherwise pass for the catalog's)."""
    cat.register_tiers(TIERS)
    cat.create_dataset(_ds("a", shape=(1200,), chunks=(1,)))
    keys = [f"c/{i:04d}" for i in range(1200)]
    cat.commit([ChunkCopy("a", k, "local", 4, "aa") for k in keys[600:]])  # second part only
    query, parts = cat._query, []

    def between(statement, params=()):
        got = query(statement, params)
        if "IN (" in statement:
            parts.append(len(got))
            if len(parts) == 1:  # another process commits rows of the first part now
                cat.commit([ChunkCopy("a", k, "local", 4, "bb") for k in keys[:10]])
        return got

    cat._query = between
    try:
        rows, _, generation = cat.residency_checked("a", keys)
    finally:
        cat._query = query
    assert parts == [0, 400, 200]  # (500 + 500 + 200 keys: the rows of c/0600 on)
    assert len(rows) == 600 and generation == cat.generation("a") - 1


def test_a_lingering_mark_whose_drop_fails_is_tried_again(cat):
    cat.create_dataset(_ds("d"))
    w = cat.register_writer()
    cat.MARK_LINGER_S = 3600.0
    cat.use_dataset("d")
    cat.unuse_dataset("d")
    unmark = cat._unmark

    def failing(*a, **kw):
        raise BackendError("database is locked")

    cat._unmark = failing
    with pytest.raises(BackendError):
        cat.end_lingering()
    assert cat.lingering_marks() == {(w, "d")}  # (still listed: the next try drops it)
    cat._unmark = unmark
    mark = cat._mark
    cat._mark = failing
    with pytest.raises(BackendError):
        cat.claim_eviction("d")  # (its claim failed: the mark stays lingering, not lost)
    assert cat.lingering_marks() == {(w, "d")}
    cat._mark = mark
    cat.end_lingering()
    assert cat.lingering_marks() == set() and [x.datasets for x in cat.writers()] == [()]


def test_recorded_checks_replace_earlier_ones_and_go_with_their_dataset(cat):
    """A copy's check recorded again replaces the earlier record; checks of a dataset that is
    gone are not recorded, and deleting a dataset deletes its checks."""
    cat.register_tiers(TIERS)
    cat.create_dataset(_ds("a"))
    cat.create_dataset(_ds("b"))
    cat.record_verified("a", [VerifiedCopy("c/0", "local", "aa", (1, 10, 5))])
    cat.record_verified(
        "a",
        [
            VerifiedCopy("c/0", "local", "bb", (2, 10, 6)),
            VerifiedCopy("c/1", "local", "cc", ("e",)),
        ],
    )
    cat.record_verified("b", [VerifiedCopy("c/0", "local", "dd", (3, 10, 7))])
    assert sorted(cat.verified_copies("a"), key=lambda v: v.key) == [
        VerifiedCopy("c/0", "local", "bb", (2, 10, 6)),
        VerifiedCopy("c/1", "local", "cc", ("e",)),
    ]
    cat.record_verified("gone", [VerifiedCopy("c/0", "local", "ee", (4, 10, 8))])
    assert cat.verified_copies("gone") == []
    cat.delete_dataset("a")
    assert cat.verified_copies("a") == []
    assert cat.verified_copies("b") == [VerifiedCopy("c/0", "local", "dd", (3, 10, 7))]


def test_rows_and_checks_of_some_chunks_only(cat):
    """``residency`` and ``verified_copies`` with keys: the rows of those chunks (each asked
    for once however often named, across the parts of a long ``IN`` list), none of others."""
    cat.create_dataset(_ds("a", shape=(1200,), chunks=(1,)))
    keys = [f"c/{i}" for i in range(1200)]
    cat.commit([ChunkCopy("a", k, "local", 4, f"{i:08x}") for i, k in enumerate(keys)])
    cat.record_verified(
        "a", [VerifiedCopy(k, "local", f"{i:08x}", (i, 4, 0)) for i, k in enumerate(keys)]
    )
    wanted = keys[3:1103:2] + ["c/5", "c/5", "c/nothing"]  # (551 keys: two parts of the IN list)
    got = cat.residency("a", wanted)
    assert sorted(c.key for c in got) == sorted(set(wanted) - {"c/nothing"})
    checks = cat.verified_copies("a", wanted)
    assert sorted(v.key for v in checks) == sorted(set(wanted) - {"c/nothing"})
    assert {v.key: v.version for v in checks}["c/1101"] == (1101, 4, 0)
    assert cat.residency("a", []) == [] and cat.verified_copies("a", []) == []
    assert len(cat.verified_copies("a")) == 1200


def test_rows_with_their_checks_in_one_query(cat):
    """``residency_checked`` gives what ``residency`` and ``verified_copies`` give of the
    same chunks (the checks of copies a row names only), as the Catalog's default does."""
    cat.create_dataset(_ds("a", shape=(1200,), chunks=(1,)))
    keys = [f"c/{i}" for i in range(1200)]
    cat.commit(
        [ChunkCopy("a", k, "local", 4, f"{i:08x}") for i, k in enumerate(keys)]
        + [ChunkCopy("a", k, "archive", 4, f"{i:08x}") for i, k in enumerate(keys[:40])]
    )
    cat.record_verified(
        "a",
        [VerifiedCopy(k, "local", f"{i:08x}", (i, 4, 0)) for i, k in enumerate(keys) if i % 3]
        + [VerifiedCopy("c/7", "archive", "00000007", ("etag-7",))]
        + [VerifiedCopy("c/8", "mem", "00000008", (8, 4, 0))],  # (no row on "mem")
    )
    wanted = keys[3:1103:2] + ["c/7", "c/8", "c/7", "c/nothing"]  # (two parts of the IN list)
    key = lambda v: (v.key, v.tier)  # noqa: E731
    for ks in (wanted, None, []):
        rows, checks, generation = cat.residency_checked("a", ks)
        assert generation == cat.generation("a")
        assert sorted(rows, key=key) == sorted(cat.residency("a", ks), key=key)
        named = {(c.key, c.tier) for c in rows}
        want = [v for v in cat.verified_copies("a", ks) if (v.key, v.tier) in named]
        assert sorted(checks, key=key) == sorted(want, key=key)
        default_rows, default_checks, default_generation = Catalog.residency_checked(cat, "a", ks)
        assert default_generation == cat.generation("a")
        assert sorted(default_rows, key=key) == sorted(rows, key=key)
        assert sorted(default_checks, key=key) == sorted(checks, key=key)
    rows, checks, _ = cat.residency_checked("a", ["c/7", "c/8"])
    assert sorted((v.key, v.tier, v.version) for v in checks) == [
        ("c/7", "archive", ("etag-7",)),
        ("c/7", "local", (7, 4, 0)),
        ("c/8", "local", (8, 4, 0)),
    ]


def test_newer_schema_is_refused(url):
    with open_catalog(url):
        pass
    _raw_execute(url, ["UPDATE schema_version SET version = 99"])
    with pytest.raises(MetadataError, match="99"):
        open_catalog(url)


def test_commits_supersede_check_staleness_and_keep_last_copies(cat):
    """A write's row supersedes every other copy of its chunk (those the caller named or
    upserts itself excepted), a row ``stale`` names is left out, and a delete that would
    leave a chunk not dropped on purpose without a row is kept."""
    cat.create_dataset(_ds("d"))
    old = [
        ChunkCopy("d", "c/0/0", "archive", 8, "aa"),
        ChunkCopy("d", "c/0/0", "mem", 8, "aa"),
        ChunkCopy("d", "c/1/0", "archive", 8, "bb"),
        ChunkCopy("d", "c/2/0", "archive", 8, "cc"),
    ]
    cat.commit(old)
    new = ChunkCopy("d", "c/0/0", "local", 8, "new")
    moved = ChunkCopy("d", "c/0/0", "mem", 8, "new")  # upserted too: its own
    done = cat.commit([new, moved], supersede=[("d", "c/0/0", "local")])
    assert done.superseded == [("d", "c/0/0", "archive")] and done.kept == []
    assert {(c.key, c.tier, c.checksum) for c in cat.residency("d") if c.key == "c/0/0"} == {
        ("c/0/0", "local", "new"),
        ("c/0/0", "mem", "new"),
    }
    # a row whose object another process replaced since its put: left out, superseding too
    asked = []

    def stale(ids):
        asked.extend(ids)
        return {("d", "c/1/0", "local")}

    done = cat.commit(
        [ChunkCopy("d", "c/1/0", "local", 8, "mine")], supersede=[("d", "c/1/0", "local")],
        stale=stale,
    )  # fmt: skip
    assert asked == [("d", "c/1/0", "local")] and done.superseded == []
    assert [(c.tier, c.checksum) for c in cat.residency("d") if c.key == "c/1/0"] == [
        ("archive", "bb")
    ]
    # the last copy of a chunk is kept unless the chunk is dropped on purpose
    done = cat.commit(
        deletes=[("d", "c/1/0", "archive"), ("d", "c/2/0", "archive")], dropped=[("d", "c/2/0")]
    )
    assert done.kept == [("d", "c/1/0", "archive")]
    assert {c.key for c in cat.residency("d")} == {"c/0/0", "c/1/0"}


def test_a_delete_applies_only_to_the_row_the_caller_saw(cat):
    """A delete with an expected (state, checksum) is left out (reported kept) where the row
    holds another now, or is gone (another process rewrote, replaced, announced or dropped
    that copy); one the caller knew of no row for keeps any row found, and goes through where
    none is."""
    cat.create_dataset(_ds("d"))
    cat.commit(
        [
            ChunkCopy("d", "c/0/0", "local", 8, "rewritten", "in-transit", 0.0, "aa", "w2"),
            ChunkCopy("d", "c/0/0", "archive", 8, "aa"),
            ChunkCopy("d", "c/1/0", "local", 8, "bb"),
            ChunkCopy("d", "c/1/0", "archive", 8, "bb"),
            ChunkCopy("d", "c/2/0", "local", 8, "cc"),
            ChunkCopy("d", "c/2/0", "archive", 8, "cc"),
        ]
    )
    ids = [("d", f"c/{i}/0", "local") for i in range(5)]
    done = cat.commit(
        deletes=ids,
        expect={
            ids[0]: ("valid", "aa"),
            ids[1]: ("valid", "bb"),
            ids[2]: None,
            ids[3]: ("valid", "dd"),
            ids[4]: None,
        },
    )
    assert sorted(done.kept) == [ids[0], ids[2], ids[3]]
    assert sorted((c.key, c.tier) for c in cat.residency("d") if c.tier == "local") == [
        ("c/0/0", "local"),
        ("c/2/0", "local"),
    ]
    # an announcement of the same bytes is a change too
    cat.commit([ChunkCopy("d", "c/2/0", "archive", 8, "cc", "in-transit", 0.0, "cc", "w2")])
    done = cat.commit(
        deletes=[("d", "c/2/0", "archive")], expect={("d", "c/2/0", "archive"): ("valid", "cc")}
    )
    assert done.kept == [("d", "c/2/0", "archive")]
    # a write's commit removes the other rows of its chunk, changed since or not, but
    # another writer's announced rewrite
    cat.commit([ChunkCopy("d", "c/1/0", "archive", 8, "changed")])
    done = cat.commit(
        [ChunkCopy("d", "c/1/0", "local", 8, "new")],
        [("d", "c/1/0", "archive")],
        supersede=[("d", "c/1/0", "local")],
        expect={("d", "c/1/0", "archive"): ("valid", "bb")},
    )
    assert done.kept == [] and [c.tier for c in cat.residency("d", ["c/1/0"])] == ["local"]
    done = cat.commit(
        [ChunkCopy("d", "c/0/0", "archive", 8, "new")],
        [("d", "c/0/0", "local")],
        supersede=[("d", "c/0/0", "archive")],
        expect={("d", "c/0/0", "local"): ("valid", "aa")},
    )
    assert done.kept == [("d", "c/0/0", "local")]
    assert {c.tier for c in cat.residency("d", ["c/0/0"])} == {"local", "archive"}


def test_an_announcement_over_another_writers_notes_it_until_that_writer_records(cat):
    """An announced rewrite made over another writer's announcement (known to the caller)
    notes the one it replaces (Catalog.overtaken): that writer's put may still land. The
    note stays through the new announcer's commit and goes when its own writer records its
    rewrite there, or with the dataset; clear_overtaken removes only notes as given."""
    from strataio.catalog import OvertakenRewrite

    cat.create_dataset(_ds("d"))
    cat.commit([ChunkCopy("d", "c/0/0", "local", 8, "aa")])
    i = ("d", "c/0/0", "local")
    a = ChunkCopy(*i, 8, "A", "in-transit", 0.0, "aa", "w1")
    b = ChunkCopy(*i, 8, "B", "in-transit", 0.0, "aa", "w2")
    cat.commit([a], durable=False, expect={i: ("valid", "aa")}, writer="w1")
    assert cat.overtaken() == []
    cat.commit([b], durable=False, expect={i: ("in-transit", "A")}, writer="w2")
    note = OvertakenRewrite("d", "c/0/0", "local", "w1", "A")
    assert cat.overtaken() == [note]
    # (an announcement over its own, or over a settled row, notes nothing)
    cat.commit([b], durable=False, expect={i: ("in-transit", "B")}, writer="w2")
    cat.commit([ChunkCopy(*i, 8, "B")], expect={i: ("in-transit", "B")}, writer="w2")
    assert cat.overtaken() == [note]
    cat.clear_overtaken([note._replace(checksum="other")])
    assert cat.overtaken() == [note]
    cat.commit([ChunkCopy(*i, 8, "A")], expect={i: ("in-transit", "A")}, writer="w1")
    assert cat.overtaken() == []
    assert [(c.state, c.checksum) for c in cat.residency("d")] == [("valid", "A")]
    cat.commit([a._replace(old_checksum="A")], durable=False, expect={i: ("valid", "A")})
    cat.commit([b], durable=False, expect={i: ("in-transit", "A")}, writer="w2")
    assert len(cat.overtaken()) == 1
    cat.delete_dataset("d")
    assert cat.overtaken() == []


def test_a_parallel_jobs_recorded_rewrite_ends_the_note_of_its_overtaken_announcement(cat):
    """Rank 0 of a parallel job records its ranks' rewrites with no ``expect`` (they
    supersede their chunk's other copies): one recorded where the job's announcement was
    overtaken ends the note, as a single process's flush does; so does one whose object
    another put replaced since (the job's bytes are gone). The notes stayed for as long as
    the job ran, and fsck left a bad copy there to a put that had long landed."""
    from strataio.catalog import OvertakenRewrite

    cat.create_dataset(_ds("d"))
    cat.commit([ChunkCopy("d", k, "local", 8, "aa") for k in ("c/0/0", "c/0/1")])
    for k in ("c/0/0", "c/0/1"):
        i = ("d", k, "local")
        a = ChunkCopy(*i, 8, "A", "in-transit", 0.0, "aa", "job")
        cat.commit([a], durable=False, expect={i: ("valid", "aa")}, writer="job")
        b = ChunkCopy(*i, 8, "B", "in-transit", 0.0, "A", "w2")
        cat.commit([b], durable=False, expect={i: ("in-transit", "A")}, writer="w2")
        cat.commit([ChunkCopy(*i, 8, "B")], expect={i: ("in-transit", "B")}, writer="w2")
    assert [(e.key, e.writer) for e in cat.overtaken()] == [("c/0/0", "job"), ("c/0/1", "job")]
    ids = [("d", "c/0/0", "local"), ("d", "c/0/1", "local")]
    cat.commit([ChunkCopy(*ids[0], 8, "A")], supersede=ids[:1], writer="job")
    assert cat.overtaken() == [OvertakenRewrite("d", "c/0/1", "local", "job", "A")]
    cat.commit(
        [ChunkCopy(*ids[1], 8, "A")], supersede=ids[1:], writer="job", stale=lambda ids: set(ids)
    )
    assert cat.overtaken() == []
    assert [(c.key, c.checksum) for c in cat.residency("d")] == [("c/0/0", "A"), ("c/0/1", "B")]


def test_a_parallel_jobs_write_over_another_writers_announcement_notes_it(cat):
    """Rank 0 of a parallel job records its ranks' writes with no ``expect``: one recorded
    over another writer's announced rewrite notes that announcement, as an announcement
    over it does (that writer's put may land after, and it may die before its flush); the
    job's own announcements are no one else's and note nothing."""
    from strataio.catalog import OvertakenRewrite

    cat.create_dataset(_ds("d"))
    ids = [("d", k, "local") for k in ("c/0/0", "c/0/1")]
    cat.commit([ChunkCopy(*i, 8, "aa") for i in ids])
    cat.commit(
        [ChunkCopy(*ids[0], 8, "W", "in-transit", 0.0, "aa", "w1")],
        durable=False,
        expect={ids[0]: ("valid", "aa")},
        writer="w1",
    )
    cat.commit(
        [ChunkCopy(*ids[1], 8, "J", "in-transit", 0.0, "aa", "job")],
        durable=False,
        expect={ids[1]: ("valid", "aa")},
        writer="job",
    )
    cat.commit([ChunkCopy(*i, 8, "J") for i in ids], supersede=ids, writer="job")
    assert cat.overtaken() == [OvertakenRewrite("d", "c/0/0", "local", "w1", "W")]
    assert [(c.state, c.checksum) for c in cat.residency("d")] == [("valid", "J")] * 2


def test_a_row_written_over_the_row_its_caller_saw_only(cat):
    """An upsert that ``expect`` names is written only while the row at its place is what
    the caller saw there (None: none); else it is left out and reported overtaken, and the
    row there (another process's announced rewrite, or a copy it recorded) stays."""
    cat.create_dataset(_ds("d"))
    cat.commit(
        [
            ChunkCopy("d", "c/0/0", "local", 8, "new", "in-transit", 0.0, "aa", "w2"),
            ChunkCopy("d", "c/1/0", "local", 8, "bb"),
        ]
    )
    moved = [
        ChunkCopy("d", f"c/{i}/0", "local", 8, "old", "in-transit", 0.0, "", "w1") for i in range(3)
    ]
    ids = [("d", c.key, c.tier) for c in moved]
    done = cat.commit(
        moved,
        durable=False,
        expect={ids[0]: ("valid", "aa"), ids[1]: ("valid", "bb"), ids[2]: ("valid", "cc")},
        writer="w1",
    )
    assert sorted(done.overtaken) == [ids[0], ids[2]]
    rows = {c.key: (c.state, c.checksum, c.writer) for c in cat.residency("d")}
    assert rows == {
        "c/0/0": ("in-transit", "new", "w2"),  # another writer's rewrite: left be
        "c/1/0": ("in-transit", "old", "w1"),  # the row seen: replaced
    }  # and none where the caller saw one that is gone
    done = cat.commit([moved[2]], expect={ids[2]: None}, writer="w1")
    assert done.overtaken == [] and len(cat.residency("d", ["c/2/0"])) == 1


def test_batched_commit_is_one_transaction(cat):
    """10,000 copies commit in ONE transaction, and a dataset's residency loads in ONE query,
    counted by the database driver's own statement trace."""
    cat.create_dataset(_ds("big", shape=(10_000,), chunks=(1,)))
    copies = [ChunkCopy("big", f"c/{i}", "local", 1000 + i, f"{i:08x}") for i in range(10_000)]
    with statement_log(cat) as verbs:
        cat.commit(copies)
    counts = Counter(verbs)
    assert counts["BEGIN"] == 1 and counts["COMMIT"] == 1, counts
    assert counts["ROLLBACK"] == 0
    with statement_log(cat) as verbs:
        got = cat.residency("big")
    assert verbs == ["SELECT"]
    assert sorted(got, key=lambda c: c.nbytes) == copies
    # the update path (all rows exist) and a 10,000-row delete batch: one transaction each
    moved = [ChunkCopy("big", c.key, "archive", c.nbytes, c.checksum) for c in copies]
    cat.touch("big", ["c/0"], 4.0)  # (access times commit without waiting for the disk:
    # on SQLite through a second connection, opened here so that the log traces it too)
    with statement_log(cat) as verbs:
        cat.commit(moved, deletes=[(c.dataset, c.key, c.tier) for c in copies])
        cat.touch("big", [c.key for c in copies], 5.0)
    counts = Counter(v.lstrip("~") for v in verbs)
    assert counts["BEGIN"] == 2 and counts["COMMIT"] == 2, counts
    got = cat.residency("big")
    assert len(got) == 10_000 and {(c.tier, c.last_access) for c in got} == {("archive", 5.0)}


def test_closed_catalog_refuses(cat):
    cat.close()
    cat.close()  # idempotent
    with pytest.raises(ClosedError):
        cat.tiers()
    with pytest.raises(ClosedError):
        cat.commit([ChunkCopy("d", "c/0", "local", 1)])


def test_open_catalog_urls(tmp_path):
    with open_catalog(f"sqlite://{tmp_path}/x/a.db") as c:
        assert isinstance(c, SQLiteCatalog) and c.path == f"{tmp_path}/x/a.db"
    assert (tmp_path / "x" / "a.db").exists()
    with pytest.raises(MetadataError, match="unsupported scheme"):
        open_catalog("mysql://h/db")


_WRITER_CHILD = """
import sys, time
from strataio.catalog import open_catalog
cat = open_catalog(sys.argv[1])
w = cat.register_writer()
cat.use_dataset("d")
print(w, flush=True)
time.sleep(120)
"""


def test_writers_alive_until_their_process_dies(url, cat):
    """A writer's liveness is a lock the kernel (SQLite: fcntl on a lock file) or the server
    (PostgreSQL: a session advisory lock) releases the moment its process dies."""
    cat.create_dataset(_ds("d"))
    cat.create_dataset(_ds("e"))
    mine = cat.register_writer()
    cat.use_dataset("e")
    cat.use_dataset("e")  # counted
    child = subprocess.Popen(
        [sys.executable, "-c", _WRITER_CHILD, url], stdout=subprocess.PIPE, text=True
    )
    try:
        theirs = child.stdout.readline().strip()
        assert theirs
        alive = {w.id: w for w in cat.writers()}
        assert alive[mine].alive and alive[theirs].alive
        assert alive[theirs].datasets == ("d",) and alive[mine].datasets == ("e",)
        assert cat.datasets_in_use() == {"d", "e"}
        # a second catalog object in this process sees the same (and must not drop our lock)
        with open_catalog(url) as other:
            assert {w.id for w in other.writers() if w.alive} == {mine, theirs}
        assert {w.id for w in cat.writers() if w.alive} == {mine, theirs}
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 5.0  # PostgreSQL ends the dead client's backend at once
    while any(w.alive for w in cat.writers() if w.id == theirs) and time.monotonic() < deadline:
        time.sleep(0.01)
    state = {w.id: w.alive for w in cat.writers()}
    assert state == {mine: True, theirs: False}
    assert cat.datasets_in_use() == {"e"}
    cat.forget_writers([theirs])
    assert [w.id for w in cat.writers()] == [mine]
    cat.unuse_dataset("e")
    assert cat.datasets_in_use() == {"e"}
    cat.unuse_dataset("e")
    assert cat.datasets_in_use() == set()
    cat.release_writer(mine)
    assert cat.writers() == []


_EVICTOR_CHILD = """
import sys, time
from strataio.catalog import open_catalog
cat = open_catalog(sys.argv[1])
cat.register_writer()
print(cat.claim_eviction("d"), flush=True)
sys.stdin.readline()  # hold the claim until told
cat.release_eviction("d")
print("released", flush=True)
time.sleep(120)
"""


def _evictor(url: str) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", _EVICTOR_CHILD, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "True"
    return child


def test_an_open_waits_out_another_process_s_eviction_round(url, cat):
    """A process claiming a dataset for eviction keeps others from opening it until the
    round is over; a process with the dataset open keeps others from claiming it."""
    cat.create_dataset(_ds("d"))
    cat.register_writer()
    child = _evictor(url)
    try:
        opened = threading.Event()

        def open_it():
            cat.use_dataset("d")
            opened.set()

        t = threading.Thread(target=open_it)
        t.start()
        assert not opened.wait(0.5)  # the claim is held: the open waits
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "released"
        assert opened.wait(10)
        t.join()
    finally:
        child.kill()
        child.wait()
    # now this process has it open: nobody else may claim it
    with open_catalog(url) as other:
        other.register_writer()
        assert not other.claim_eviction("d")
        assert other.datasets_in_use() == {"d"}
    cat.unuse_dataset("d")


def test_a_dead_evictor_s_claim_does_not_block_an_open(url, cat):
    cat.create_dataset(_ds("d"))
    cat.register_writer()
    child = _evictor(url)
    child.kill()
    child.wait()
    deadline = time.monotonic() + 5.0  # PostgreSQL ends the dead client's backend at once
    while "d" in cat.datasets_in_use() and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    cat.use_dataset("d")
    assert time.monotonic() - t0 < 2.0
    assert cat.claim_eviction("d") is False  # open here
    cat.unuse_dataset("d")
    assert cat.claim_eviction("d") is True
    cat.release_eviction("d")


def test_announced_rewrite_keeps_both_checksums(cat):
    cat.create_dataset(_ds("d"))
    w = cat.register_writer()
    row = ChunkCopy("d", "c/0/0", "local", 8, "new", "in-transit", 1.0, "old", w)
    cat.commit([row])
    (got,) = cat.residency("d")
    assert got == row
    assert got.accepts("new") and got.accepts("old") and not got.accepts("other")
    valid = ChunkCopy("d", "c/0/0", "local", 8, "new")
    assert valid.accepts("new") and not valid.accepts("old")
    assert ChunkCopy("d", "c/0/0", "local", 8).accepts("anything")


def test_an_announcement_not_knowing_the_old_bytes_takes_the_settled_row_s(cat):
    """An announced rewrite whose caller does not know the bytes it replaces (a copy it
    forgot, a move's copy) takes the checksum of the settled row at its place as its old
    one: the object holds those bytes until the put. Over another announcement, or where
    no row is, it keeps none."""
    cat.create_dataset(_ds("d"))
    cat.commit(
        [
            ChunkCopy("d", "c/0/0", "local", 8, "aa"),
            ChunkCopy("d", "c/1/0", "local", 8, "bb", "in-transit", 0.0, "b0", "w2"),
        ]
    )
    cat.commit(
        [
            ChunkCopy("d", f"c/{i}/0", "local", 8, "new", "in-transit", 0.0, "", "w1")
            for i in range(3)
        ],
        durable=False,
    )
    old = {c.key: c.old_checksum for c in cat.residency("d")}
    assert old == {"c/0/0": "aa", "c/1/0": "", "c/2/0": ""}


_NOWAIT_CHILD = """
import os, signal, sys
from strataio.catalog import ChunkCopy, open_catalog
cat = open_catalog(sys.argv[1])
cat.commit([ChunkCopy("d", "c/0/1", "local", 8, "new", "in-transit", 1.0, "old")], durable=False)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_commit_that_does_not_wait_for_the_disk(url, cat):
    """``durable=False`` (a rewrite's announcement): the database is told not to wait for
    the disk for that transaction alone; the rows are visible to every connection at once
    and outlive the committing process's kill -9; the next commit waits again."""
    cat.create_dataset(_ds("d"))
    row = ChunkCopy("d", "c/0/0", "local", 8, "new", "in-transit", 1.0, "old")
    if isinstance(cat, SQLiteCatalog):
        cat._relaxed_connection()  # (opened on first use: traced from the start here)
    with statement_log(cat) as nowait:
        cat.commit([row], durable=False)
    with statement_log(cat) as durable:
        cat.commit([ChunkCopy("d", "c/0/0", "local", 8, "new")])
    if isinstance(cat, SQLiteCatalog):
        # a connection of its own, kept at NORMAL; the durable one stays at FULL
        assert nowait == ["~BEGIN", "~INSERT", "~UPDATE", "~COMMIT"]  # (the generation)
        assert durable == ["BEGIN", "INSERT", "UPDATE", "COMMIT"]
        assert cat._relaxed.execute("PRAGMA synchronous").fetchone()[0] == 1
        assert cat._conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    else:
        assert nowait[0] == "BEGIN" and "SET" in nowait and nowait[-1] == "COMMIT"
    assert "SET" not in durable and "PRAGMA" not in durable
    # the log synced on demand: SQLite fsyncs its WAL, PostgreSQL commits synchronously
    with statement_log(cat) as synced:
        cat.sync_log()
    assert synced == [] if isinstance(cat, SQLiteCatalog) else synced[-1] == "COMMIT"
    with pytest.raises(MetadataError):
        cat.commit([ChunkCopy("nope", "c/0/0", "local", 8, "x")], durable=False)
    child = subprocess.run([sys.executable, "-c", _NOWAIT_CHILD, url], capture_output=True)
    assert child.returncode == -9, child.stderr
    with open_catalog(url) as other:
        got = {c.key: c for c in other.residency("d")}
    assert got["c/0/0"] == ChunkCopy("d", "c/0/0", "local", 8, "new")
    assert got["c/0/1"].state == "in-transit" and got["c/0/1"].accepts("old")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names fds via /proc")
@pytest.mark.parametrize("opened_as", ["symlink", "relative, then chdir"])
def test_sqlite_sync_log_syncs_the_wal_sqlite_writes(tmp_path, monkeypatch, opened_as):
    """``sync_log`` fsyncs the WAL beside the file SQLite opened, whatever path the catalog
    was given (a link to it; a relative path when the process has since changed directory),
    and says so when it cannot."""
    import strataio.catalog.sqlite as sqlite_module

    real = tmp_path / "real"
    real.mkdir()
    if opened_as == "symlink":
        (tmp_path / "link.db").symlink_to(real / "c.db")
        cat = SQLiteCatalog(tmp_path / "link.db")
    else:
        monkeypatch.chdir(real)
        cat = SQLiteCatalog("c.db")
        monkeypatch.chdir(tmp_path)
    cat.register_tiers(TIERS)
    cat.create_dataset(_ds("d"))
    cat.commit([ChunkCopy("d", "c/0/0", "local", 8, "a")], durable=False)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(sqlite_module.os, "fsync", fsync)
    cat.sync_log()
    assert synced == [os.path.realpath(real / "c.db-wal")]

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(sqlite_module.os, "fsync", failing)
    with pytest.raises(BackendError, match="cannot sync its WAL"):
        cat.sync_log()
    cat.close()


class WriterRegistry(RuleBasedStateMachine):
    """Writers registered, released, marking datasets in use (counted; the last use's mark
    lingering until dropped) and claiming them for eviction through one catalog object: the
    catalog always answers as the model says."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="strataio-writers-")
        self.cat = open_catalog(os.path.join(self.dir, "cat.db"))
        self.cat.EVICTION_WAIT = 0.02  # a use that must wait for a claim here fails at once
        self.cat.MARK_LINGER_S = 3600.0  # dropped by the rule below only
        self.uses: dict[str, Counter] = {}
        self.evicting: set[tuple[str, str]] = set()  # (writer, dataset) whose mark is a claim
        self.lingering: set[tuple[str, str]] = set()  # (writer, dataset) no longer used

    def _others(self, w: str, name: str, *, evicting: bool) -> bool:
        if evicting:
            return any(
                c[name] > 0 and (v, name) in self.evicting for v, c in self.uses.items() if v != w
            )
        return any(
            c[name] > 0 or (v, name) in self.lingering for v, c in self.uses.items() if v != w
        )

    writers = Bundle("writers")

    @rule(target=writers)
    def register(self):
        w = self.cat.register_writer()
        self.uses[w] = Counter()
        return w

    @rule(w=writers)
    def release(self, w):
        self.cat.release_writer(w)
        self.uses.pop(w, None)
        self.evicting = {(v, d) for v, d in self.evicting if v != w}
        self.lingering = {(v, d) for v, d in self.lingering if v != w}

    @rule(w=writers, name=st.sampled_from(["a", "b", "c/d"]))
    def use(self, w, name):
        if (
            w in self.uses
            and self.uses[w][name] == 0
            and (w, name) not in self.lingering
            and self._others(w, name, evicting=True)
        ):
            with pytest.raises(BackendError, match="evicting"):
                self.cat.use_dataset(name, w)
            return
        self.cat.use_dataset(name, w)
        if w in self.uses:
            self.uses[w][name] += 1
            self.lingering.discard((w, name))

    @rule(w=writers, name=st.sampled_from(["a", "b", "c/d"]))
    def unuse(self, w, name):
        self.cat.unuse_dataset(name, w)
        self._unused(w, name)

    def _unused(self, w, name):
        if w in self.uses and self.uses[w][name] > 0:
            self.uses[w][name] -= 1
            if self.uses[w][name] == 0:
                if (w, name) in self.evicting:
                    self.evicting.discard((w, name))  # a claim never lingers
                else:
                    self.lingering.add((w, name))

    @rule(w=writers, name=st.sampled_from(["a", "b", "c/d"]))
    def claim_eviction(self, w, name):
        got = self.cat.claim_eviction(name, w)
        if w not in self.uses:
            assert got  # a released writer marks nothing, as with use_dataset
        elif self.uses[w][name]:
            assert not got
        else:
            self.lingering.discard((w, name))  # a lingering mark becomes the claim, or goes
            if self._others(w, name, evicting=False):
                assert not got
            else:
                assert got
                self.uses[w][name] += 1
                self.evicting.add((w, name))

    @rule(w=writers, name=st.sampled_from(["a", "b", "c/d"]))
    def release_eviction(self, w, name):
        self.cat.release_eviction(name, w)
        self._unused(w, name)

    @rule()
    def end_lingering(self):
        self.cat.end_lingering()
        self.lingering.clear()

    @invariant()
    def agrees(self):
        got = {w.id: (w.alive, set(w.datasets)) for w in self.cat.writers()}
        want = {
            w: (True, {d for d, n in c.items() if n > 0} | {d for v, d in self.lingering if v == w})
            for w, c in self.uses.items()
        }
        assert got == want
        assert self.cat.lingering_marks() == self.lingering
        # (lingering marks are this object's own: they count for other processes only)
        assert self.cat.datasets_in_use() == {
            d for c in self.uses.values() for d, n in c.items() if n > 0
        }
        claims = self.cat._query("SELECT writer, dataset FROM writer_datasets WHERE evicting = 1")
        assert {tuple(r) for r in claims} == self.evicting  # (what other processes' opens wait on)

    def teardown(self):
        self.cat.close()
        # closing released every writer: no lock file is left behind
        locks = os.path.join(self.dir, "cat.db.writers")
        assert not os.path.isdir(locks) or os.listdir(locks) == []
        shutil.rmtree(self.dir, ignore_errors=True)


WriterRegistry.TestCase.settings = settings(max_examples=40, stateful_step_count=15, deadline=None)
test_writer_registry = WriterRegistry.TestCase


def test_residency_of_some_keys(cat):
    """``residency(dataset, keys)`` gives the rows of those chunks only, across batches of
    keys, in key then tier order."""
    cat.create_dataset(_ds("d", shape=(1200,), chunks=(1,)))
    cat.commit(
        [ChunkCopy("d", f"c/{i}", "local", 1, "aa") for i in range(1200)]
        + [ChunkCopy("d", "c/7", "archive", 1, "aa")]
    )
    want = [f"c/{i}" for i in range(0, 1200, 2)] + ["c/7", "c/9999"]
    got = cat.residency("d", want)
    assert [(c.key, c.tier) for c in got] == sorted(
        [(k, "local") for k in set(want) - {"c/9999"}] + [("c/7", "archive")],
        key=lambda r: (r[0], r[1] != "local"),
    )
    assert cat.residency("d", []) == []


def test_a_moved_copy_of_a_chunk_rewritten_since_is_left_out(cat):
    """A move's row (``copied``) is recorded only while another row of its chunk holds its
    bytes (a settled row's checksum, or an announced rewrite's old one): where another
    process rewrote the chunk since the move read it, the row is left out as ``orphaned``,
    its object the caller's to delete. Where another writer has announced a rewrite at the
    move's own place since, the row is left out as ``overtaken`` (the object is that
    writer's)."""
    cat.create_dataset(_ds("d"))
    cat.commit(
        [
            ChunkCopy("d", "c/0/0", "archive", 8, "old"),  # the move's source, still there
            ChunkCopy("d", "c/1/0", "archive", 8, "new"),  # rewritten since the move read "old"
            ChunkCopy("d", "c/2/0", "archive", 8, "x", "in-transit", 0.0, "old", "w2"),
            # rewritten twice: "old" is no version of it any more
            ChunkCopy("d", "c/3/0", "archive", 8, "x", "in-transit", 0.0, "new", "w2"),
            # another move's announced copy of "old": not put yet, holds nothing
            ChunkCopy("d", "c/4/0", "archive", 8, "old", "in-transit", 0.0, "", "w3"),
            # the move's source, and another writer's rewrite announced where it put its copy
            ChunkCopy("d", "c/5/0", "archive", 8, "old"),
            ChunkCopy("d", "c/5/0", "local", 8, "y", "in-transit", 0.0, "", "w2"),
        ]
    )
    moved = [ChunkCopy("d", f"c/{i}/0", "local", 8, "old") for i in range(6)]
    ids = [(c.dataset, c.key, c.tier) for c in moved]
    source = ("d", "c/5/0", "archive")  # (a migration deletes its source in the same commit)
    done = cat.commit(moved, [source], copied=ids, writer="w1")
    assert done.orphaned == [ids[1], ids[3], ids[4]]
    assert done.overtaken == [ids[5]]
    assert done.kept == [source]  # (all that is left of the chunk if that writer dies)
    local = {c.key: c for c in cat.residency("d") if c.tier == "local"}
    assert sorted(local) == ["c/0/0", "c/2/0", "c/5/0"]
    assert local["c/5/0"].state == "in-transit" and local["c/5/0"].writer == "w2"


def test_a_copy_marked_valid_while_another_commit_supersedes_it_is_left_out(cat, url):
    """A mark of a copy as valid, committed while another process's write of the chunk is
    committing (its copy superseding that one), waits for that commit and is left out: the
    superseded row does not come back beside the new value (PostgreSQL reads rows a commit
    in flight is changing, unless the mark takes the dataset's lock too)."""
    cat.create_dataset(_ds("d"))
    cat.commit([ChunkCopy("d", "c/0", "archive", 8, "00000001", "dirty")])
    other = open_catalog(url)
    inside, release = threading.Event(), threading.Event()
    bulk_delete = other._bulk_delete

    def delete_then_wait(cur, ids):  # (the write's commit, held open after its changes)
        bulk_delete(cur, ids)
        inside.set()
        release.wait(10)

    other._bulk_delete = delete_then_wait
    outcomes: list = []
    write = threading.Thread(
        target=lambda: other.commit(
            [ChunkCopy("d", "c/0", "local", 8, "00000002", "dirty")],
            supersede=[("d", "c/0", "local")],
        )
    )
    mark = threading.Thread(
        target=lambda: outcomes.append(
            cat.commit(
                [ChunkCopy("d", "c/0", "archive", 8, "00000001", "valid")],
                revalidated=[("d", "c/0", "archive")],
            )
        )
    )
    try:
        write.start()
        assert inside.wait(10)
        mark.start()
        time.sleep(0.3)  # (the mark reaches the point where it waits)
        release.set()
        write.join(10)
        mark.join(10)
    finally:
        release.set()
        other.close()
    assert [(c.tier, c.checksum) for c in cat.residency("d")] == [("local", "00000002")]
    assert outcomes[0].overtaken == [("d", "c/0", "archive")]


def test_dropping_cached_pages_keeps_every_row(cat, url):
    """``drop_cached_pages`` empties the pages SQLite's connections (durable and relaxed)
    cache in the process; the rows read after are the same. A closed catalog refuses."""
    cat.create_dataset(_ds("a", shape=(40,), chunks=(1,)))
    rows = [ChunkCopy("a", f"c/{i}", "local", 4, f"{i:08x}") for i in range(40)]
    cat.commit(rows[:20])
    cat.commit(rows[20:], durable=False)  # (through the relaxed connection, where SQLite)
    before = sorted(cat.residency("a"))
    issued = []
    if not url.startswith("postgresql://"):
        for conn in (cat._conn, cat._relaxed):
            conn.set_trace_callback(lambda s, conn=conn: issued.append((conn, s)))
    cat.drop_cached_pages()
    if not url.startswith("postgresql://"):
        assert {conn for conn, s in issued if s == "PRAGMA shrink_memory"} == {
            cat._conn,
            cat._relaxed,
        }
    assert sorted(cat.residency("a")) == before == sorted(rows)
    cat.close()
    sqlite = not url.startswith("postgresql://")
    with pytest.raises(ClosedError) if sqlite else contextlib.nullcontext():
        cat.drop_cached_pages()


def test_a_deleted_datasets_remnants_keep_its_name_until_cleared(cat):
    """A deletion records the tiers where the dataset's objects may remain (those named, and
    those its rows name), and returns what its rows named per tier; until each remnant is
    cleared, no dataset of that name, nor one above or below it, can be created."""
    cat.create_dataset(_ds("run/a"))
    cat.commit(
        [ChunkCopy("run/a", "c/0/0", "local", 10), ChunkCopy("run/a", "c/0/1", "local", 5)]
        + [ChunkCopy("run/a", "c/0/0", "archive", 7)]
    )
    assert cat.delete_dataset("run/a", remnants=["archive", "archive"]) == [
        TierUsage("run/a", "local", 2, 15),
        TierUsage("run/a", "archive", 1, 7),
    ]  # (tier order)
    assert cat.remnants() == [("run/a", "archive"), ("run/a", "local")]
    assert cat.remnants("run/a") == cat.remnants() and cat.remnants("run") == []
    for name in ("run/a", "run", "run/a/b"):
        assert cat.remnants(name, near=True) == cat.remnants()
    assert cat.remnants("run/ab", near=True) == cat.remnants("other", near=True) == []
    for name in ("run/a", "run", "run/a/b"):
        with pytest.raises(ExistsError, match=r"'run/a' on tier 'archive'.*fsck --repair"):
            cat.create_dataset(_ds(name))
    cat.create_dataset(_ds("run/ab"))  # (a name that neither starts nor extends it)
    cat.clear_remnants("run/a", ["local"])
    assert cat.remnants() == [("run/a", "archive")]
    cat.clear_remnants("run/a", ["archive"])
    cat.create_dataset(_ds("run/a"))
    assert cat.residency("run/a") == [] and cat.remnants() == []
    cat.commit([ChunkCopy("run/ab", "c/0/0", "local", 10)])
    cat.delete_dataset("run/ab")  # (remnants None: none recorded)
    assert cat.remnants() == []
    cat.create_dataset(_ds("run/ab"))
    assert cat.delete_dataset("run/ab") == []  # (no rows)
    cat.create_dataset(_ds("run/ab"))
    cat.commit([ChunkCopy("run/ab", "c/0/0", "local", 10)])
    cat.delete_dataset("run/ab", remnants=[])
    assert cat.remnants() == [("run/ab", "local")]


def test_a_dataset_in_use_elsewhere_is_not_deleted(url):
    """A live writer's mark on a dataset (open, or evicting from it) refuses its deletion,
    naming that writer; the mark a close leaves lingering is waited out; this process's own
    open is refused at once; a writer that died holds nothing."""
    with open_catalog(url) as mine, open_catalog(url) as other:
        mine.register_tiers(TIERS)
        mine.create_dataset(_ds("d"))
        w = other.register_writer()
        me = mine.register_writer()
        mine.MARK_LINGER_S = 0.0  # (the wait for lingering marks: 1 s more)
        other.use_dataset("d")
        t0 = time.monotonic()
        with pytest.raises(DatasetInUseError, match=rf"'d' is in use by another.*{w}"):
            mine.delete_dataset("d", remnants=["local"])
        assert time.monotonic() - t0 >= 1.0
        assert mine.get_dataset("d") and mine.remnants() == []
        assert [x.datasets for x in mine.writers() if x.id == me] == [()]  # (claim released)
        mine.use_dataset("d")
        with pytest.raises(DatasetInUseError, match="'d' is open in this process"):
            mine.delete_dataset("d")
        mine.unuse_dataset("d", linger=False)
        other.MARK_LINGER_S = 0.3
        other.unuse_dataset("d")  # (its mark lingers 0.3 s)
        assert other.lingering_marks() == {(w, "d")}
        mine.delete_dataset("d", remnants=["local"])
        assert mine.remnants() == [("d", "local")]
        assert not other.lingering_marks()


def test_a_schema_missing_is_named_with_the_way_to_make_it(pg_server):
    """A URL whose search_path names no schema of the database is refused, saying so and
    how to make one (not with an SQL error about a CREATE TABLE)."""
    uri = pg_server.get_uri()
    url = f"{uri}{'&' if '?' in uri else '?'}options={quote('-csearch_path=no_such_schema')}"
    with pytest.raises(BackendError, match=r"search_path \(no_such_schema\).*CREATE SCHEMA"):
        open_catalog(url)


def test_a_touch_and_a_commit_of_the_same_rows_never_deadlock(pg_url):
    """A touch of chunks whose rows another process's transaction is changing (a commit of
    rewrites, locking its rows in its own order) waits on none of them: it records the
    times of the rows it can and lets the other transaction run, where waiting on each
    other's rows the server failed one of the two as a deadlock."""
    import psycopg

    with open_catalog(pg_url) as cat:
        cat.register_tiers(TIERS)
        cat.create_dataset(_ds("d"))
        cat.commit([ChunkCopy("d", f"c/{i}", "local", 8, "aa") for i in range(2)])
        errors: list[BaseException] = []

        def touch() -> None:
            try:
                cat.touch("d", ["c/0", "c/1"], 5.0)
            except BaseException as exc:
                errors.append(exc)

        with psycopg.connect(pg_url) as other:  # (its statements run in one transaction)
            other.execute("UPDATE residency SET checksum = 'bb' WHERE key = 'c/1'")
            toucher = threading.Thread(target=touch)
            toucher.start()
            toucher.join(2.0)  # (a touch that waits on c/1 holds c/0 meanwhile)
            other.execute("UPDATE residency SET checksum = 'bb' WHERE key = 'c/0'")
            other.commit()
        toucher.join()
        assert errors == []
        times = {c.key: c.last_access for c in cat.residency("d")}
        assert times["c/0"] == 5.0


@pytest.mark.parametrize("change", ["commit", "record_verified"])
def test_two_changes_of_the_same_rows_never_deadlock(pg_url, change):
    """Two transactions changing rows of the same chunks (commits of copies, records of
    checks) take them in one order, key order, whatever order their caller named them in:
    the second waits for the first, where in two orders each held a row the other wanted
    and the server failed one of them as a deadlock."""
    import psycopg

    table = "residency" if change == "commit" else "verified"
    with open_catalog(pg_url) as cat:
        cat.register_tiers(TIERS)
        cat.create_dataset(_ds("d"))
        cat.commit([ChunkCopy("d", f"c/{i}", "local", 8, "aa") for i in range(2)])
        cat.record_verified("d", [VerifiedCopy(f"c/{i}", "local", "aa", (i,)) for i in range(2)])
        errors: list[BaseException] = []

        def run() -> None:
            try:
                if change == "commit":
                    cat.commit([ChunkCopy("d", f"c/{i}", "local", 8, "cc") for i in (1, 0)])
                else:
                    cat.record_verified(
                        "d", [VerifiedCopy(f"c/{i}", "local", "aa", (7,)) for i in (1, 0)]
                    )
            except BaseException as exc:
                errors.append(exc)

        with psycopg.connect(pg_url) as other:  # (its statements run in one transaction)
            other.execute(f"UPDATE {table} SET checksum = 'bb' WHERE key = 'c/0'")
            changer = threading.Thread(target=run)
            changer.start()
            changer.join(2.0)  # (a change that took c/1 first holds it, waiting on c/0)
            other.execute(f"UPDATE {table} SET checksum = 'bb' WHERE key = 'c/1'")
            other.commit()
        changer.join()
        assert errors == []
