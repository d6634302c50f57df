"""The embedded catalog: one SQLite file in WAL mode.

WAL lets readers proceed while a writer commits, so several processes (or a CLI next to a
running job) can open the same catalog; writers take the lock up front (``BEGIN IMMEDIATE``)
and wait up to ``timeout`` seconds for each other rather than failing.

A commit is durable before it returns (``synchronous=FULL``: SQLite fsyncs the WAL inside
the commit, and a commit whose fsync fails is never seen): the mover deletes a source copy only
after the catalog says the destination holds it, so a commit lost to a power cut could lose
data. A commit asked not to be durable (``durable=False``, a rewrite's announcement) goes
through a second connection, opened on first use and kept at ``synchronous=NORMAL``: appended
to the WAL without an fsync, seen by every connection at once, and made durable by the next
durable commit of any process (the WAL is one file, appended in commit order) or by
:meth:`SQLiteCatalog.sync_log`. A connection of its own spares each announcement the two
``PRAGMA synchronous`` switches that one shared connection would need (about 20 µs of 75).

An empty file (0 bytes) at the catalog's path is refused (:class:`MetadataError`), never taken
for a new catalog: SQLite would take it for an empty database, and every dataset of a catalog
truncated by a crash or a copy, or replaced by ``touch``, would silently seem gone. A
catalog strataio creates is never seen empty at its path (:meth:`SQLiteCatalog._create_file`;
on file systems with hard links), so an empty file there is not one another process is
creating at that moment.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import stat
import sys
from collections.abc import Iterator, Sequence

from strataio.backoff import Backoff
from strataio.catalog.liveness import LockFiles
from strataio.catalog.sql import SQLCatalog
from strataio.errors import BackendError, MetadataError, StrataError


class SQLiteCatalog(SQLCatalog):
    """A catalog in the SQLite file at ``path`` (created, with its directory, if missing).

    ``timeout``: seconds a writer waits for another process's transaction to finish. An
    empty file at ``path`` raises :class:`MetadataError` naming it (delete it to start a new
    catalog there).
    """

    TYPES = {
        "bigint": "INTEGER",
        "real": "REAL",
        "serial_pk": "INTEGER PRIMARY KEY",
        "c": "",
        "without_rowid": " WITHOUT ROWID",
    }
    INTEGRITY_ERRORS = (sqlite3.IntegrityError,)
    DATABASE_ERRORS = (sqlite3.OperationalError, sqlite3.DatabaseError)

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0) -> None:
        self.path = os.fspath(path)
        self.timeout = float(timeout)
        # writers' liveness: an fcntl lock per writer, on files beside the database
        self._locks = LockFiles(os.path.abspath(self.path) + ".writers")
        # the connection of commits that do not wait for the disk (opened on first use)
        self._relaxed: sqlite3.Connection | None = None
        self._file: str | None = None
        super().__init__(self.path)
        # the file SQLite opened (its name made absolute, links followed), for the second
        # connection and the WAL beside it: the path as given may name it no longer (a
        # relative path after a chdir)
        (self._file,) = [r[2] for r in self._conn.execute("PRAGMA database_list") if r[1] == "main"]
        self._wal = self._file + "-wal"

    def _connect(self) -> sqlite3.Connection:
        parent = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(parent, exist_ok=True)
            if self._file is None:  # (the first connection: the file is checked, or made)
                self._check_file()
            # isolation_level=None: no implicit transactions; _begin issues them explicitly.
            conn = sqlite3.connect(
                self._file or self.path,
                timeout=self.timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        except StrataError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise BackendError(f"cannot open catalog {self.path!r}: {self._explain(exc)}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            mode = self._wal_mode(conn)
            if mode.lower() != "wal":
                raise self._no_wal(mode)
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            conn.close()
            raise BackendError(f"cannot open catalog {self.path!r}: {self._explain(exc)}") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_file(self) -> None:
        """Create the database file if ``path`` names none; raise :class:`MetadataError`
        if it names an empty one."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if not os.path.lexists(self.path):  # (a link to nowhere: SQLite makes its target)
                self._create_file()
            return
        if stat.S_ISREG(st.st_mode) and st.st_size == 0:
            raise MetadataError(
                f"catalog {self.path!r} is an empty file (0 bytes), not a catalog: its "
                "contents may have been lost (a crash, a truncated copy), or it was made "
                "empty; it is not taken for a new catalog, which would show every dataset "
                "gone. Restore it from a backup, or delete it to start a new catalog"
            )

    def _create_file(self) -> None:
        """Make the database file at ``path`` with its header written before it appears
        there: made under a temporary name beside it (switching it to WAL writes the
        header), then hard-linked into place, which fails where another process linked its
        own first (that one is then kept). Where the file system has no hard links, SQLite
        makes the file in place, as it would: another process opening the catalog in that
        instant may find it empty and refuse it (it fails; nothing is lost)."""
        parent, base = os.path.split(os.path.abspath(self.path))
        draft = os.path.join(parent, f".{base}.{secrets.token_hex(6)}.new")
        try:
            try:
                conn = sqlite3.connect(draft, timeout=self.timeout, isolation_level=None)
                try:
                    mode = self._wal_mode(conn)
                finally:
                    conn.close()
            except sqlite3.Error as exc:
                raise BackendError(f"cannot create catalog {self.path!r}: {exc}") from exc
            if mode.lower() != "wal":
                raise self._no_wal(mode)
            try:
                os.link(draft, self.path)
            except FileExistsError:
                return  # (another process made it first: that one is opened)
            except OSError:
                return  # (no hard links here: the connection makes the file in place)
            _sync_directory(parent)
        finally:
            for leftover in (draft, draft + "-wal", draft + "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)

    def _explain(self, exc: BaseException) -> str:
        """SQLite's text of ``exc``, with the cause and what to do where SQLite says: a lock
        waited on in vain (SQLITE_BUSY: how long this process waited and, where this host
        can tell, the process holding the lock), no room (SQLITE_FULL), no write access
        (SQLITE_READONLY, SQLITE_CANTOPEN), a file not a database or damaged (SQLITE_NOTADB,
        SQLITE_CORRUPT)."""
        text = str(exc)
        code = getattr(exc, "sqlite_errorname", "")
        file = os.path.abspath(self._file or self.path)
        folder = os.path.dirname(file)
        if code.startswith("SQLITE_BUSY") or text.endswith("is locked"):
            return (
                f"{text}: another process kept its transaction open past this one's "
                f"{self.timeout:g} s wait{_lock_holder(file)}; "
                "try again once that transaction has ended"
            )
        if code == "SQLITE_FULL":
            return (
                f"{text}: the file system holding the catalog ({folder}) has no room for its "
                "change, which was not made; free space there, then try again (chunks "
                "written meanwhile stay on their tiers: a flush that succeeds records them, "
                "and 'strataio fsck --repair' adopts those of a process that ended)"
            )
        if code == "SQLITE_CANTOPEN" and os.path.isdir(file):
            return f"{text}: {file} is a directory, not a catalog file"
        if code.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
            denied = [p for p in (file, folder) if os.path.exists(p) and not os.access(p, os.W_OK)]
            which = f" ({' and '.join(denied)} not writable here)" if denied else ""
            return (
                f"{text}: strataio writes to its catalog whenever it opens one (sessions and "
                "the datasets they use are recorded there), so it needs write access to "
                f"{file} and to its directory, where SQLite keeps the files -wal and -shm "
                f"beside it{which}; a read-only copy of a catalog cannot be opened"
            )
        if code.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
            return (
                f"{text}: the file {file} is not an SQLite database, or is damaged (cut "
                "short, overwritten); restore it from a backup. Moved aside, it makes way "
                "for a new catalog, which knows none of its datasets"
            )
        return text

    def _no_wal(self, mode: str) -> BackendError:
        """The error of a catalog that SQLite would not switch to WAL (it gave ``mode``)."""
        return BackendError(
            f"catalog {self.path!r}: cannot switch to WAL mode (got {mode!r}); "
            "is it on a file system without shared memory support?"
        )

    def _wal_mode(self, conn: sqlite3.Connection) -> str:
        """Switch ``conn`` to WAL and return the journal mode it got. Two processes opening
        a new catalog at once may both try the switch; SQLite then answers "database is
        locked" at once, without calling the busy handler, so the switch is retried here for
        up to ``timeout`` seconds."""
        wait = Backoff(self.timeout, 0.005, 0.1)
        while True:
            try:
                return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or wait.expired:
                    raise
            wait.pause()

    def _disconnect(self) -> None:
        self._conn.close()
        if self._relaxed is not None:
            self._relaxed.close()
            self._relaxed = None

    def drop_cached_pages(self) -> None:
        with self._lock:
            self._check_open()
            for conn in (self._conn, self._relaxed):
                if conn is not None:
                    conn.execute("PRAGMA shrink_memory")

    def _relaxed_connection(self) -> sqlite3.Connection:
        """The connection of commits that do not wait for the disk (the caller holds the
        catalog's lock)."""
        if self._relaxed is None:
            conn = self._connect()
            try:
                conn.execute("PRAGMA synchronous = NORMAL")
            except sqlite3.Error as exc:
                conn.close()
                raise BackendError(f"catalog {self.path!r}: {exc}") from exc
            self._relaxed = conn
        return self._relaxed

    def sync_log(self) -> None:
        """fsync the WAL: every frame a commit appended, durable or not, is then on disk."""
        with self._lock:
            self._check_open()
            try:
                fd = os.open(self._wal, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:  # (this open connection keeps the WAL in place)
                raise BackendError(f"catalog {self.path!r}: cannot open its WAL: {exc}") from exc
            try:
                os.fsync(fd)
            except OSError as exc:
                raise BackendError(f"catalog {self.path!r}: cannot sync its WAL: {exc}") from exc
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def _begin(self, durable: bool = True) -> Iterator[sqlite3.Cursor]:
        conn = self._conn if durable else self._relaxed_connection()
        cur = conn.cursor()
        try:
            # IMMEDIATE: take the write lock now, so a reader-turned-writer never deadlocks
            # on lock upgrade (which the busy timeout cannot resolve).
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise
        finally:
            cur.close()

    def _hold_token(self, writer: str) -> None:
        try:
            self._locks.hold(writer)
        except OSError as exc:
            raise BackendError(
                f"catalog {self.path!r}: cannot lock {self._locks.path(writer)}: {exc}"
            ) from exc

    def _release_token(self, writer: str) -> None:
        self._locks.release(writer)

    def _live_tokens(self, writers: Sequence[str]) -> set[str]:
        return self._locks.alive(writers)

    def _forget_tokens(self, writers: Sequence[str]) -> None:
        self._locks.forget(writers)

    def _has_table(self, cur: sqlite3.Cursor, name: str) -> bool:
        cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        return cur.fetchone() is not None


#: the bytes of the WAL index (the ``-shm`` file) whose locks SQLite takes for its write lock,
#: a checkpoint and a recovery (``WALINDEX_LOCK_OFFSET`` 120 and the next two)
_WAL_LOCKS = {120: "write", 121: "checkpoint", 122: "recovery"}


def _lock_holder(database: str) -> str:
    """``" (held by process PID: COMMAND)"``, the process holding one of the WAL locks of
    the SQLite file ``database``, as ``/proc/locks`` lists it (Linux); ``""`` where none is
    found. The lock is read from that list, not asked of a descriptor of the ``-shm`` file:
    closing one would drop the locks this process's own connections hold on it."""
    if not sys.platform.startswith("linux"):
        return ""
    try:
        st = os.stat(os.path.realpath(database) + "-shm")
        with open("/proc/locks") as f:
            table = f.read().splitlines()
    except OSError:
        return ""
    here = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in table:
        fields = line.split()
        if len(fields) < 8 or fields[1] != "POSIX" or fields[3] != "WRITE":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            where = (int(major, 16), int(minor, 16), int(inode))
            pid, start = int(fields[4]), int(fields[6])
        except ValueError:
            continue
        if where == here and start in _WAL_LOCKS and pid > 0:
            return f" (its {_WAL_LOCKS[start]} lock is held by process {pid}{_command(pid)})"
    return ""


def _command(pid: int) -> str:
    """``": COMMAND"``, the command line of process ``pid`` (its first 160 characters), or
    ``""`` where it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read(4096).split(b"\0")
    except OSError:
        return ""
    line = " ".join(" ".join(a.decode(errors="replace") for a in argv).split())
    return f": {line[:157]}..." if len(line) > 160 else f": {line}" if line else ""


def _sync_directory(path: str) -> None:
    """fsync directory ``path``, so that a name just made in it outlives a power cut (where
    the file system cannot sync a directory, as some network ones, nothing is done)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
