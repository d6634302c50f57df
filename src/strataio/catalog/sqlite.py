"""The embedded catalog: one SQLite file in WAL mode.

WAL lets readers proceed while a writer commits, so several processes (or a CLI next to a
running job) can open the same catalog; writers take the lock up front (``BEGIN IMMEDIATE``)
and wait up to ``timeout`` seconds for each other rather than failing.

A commit is durable before it returns: the mover deletes a source copy only after the catalog
says the destination holds it, so a commit lost to a power cut could lose data. The
connection runs at ``synchronous=NORMAL`` (a commit is appended to the WAL, whose fsync waits
for a checkpoint) and a durable commit then fsyncs the WAL itself (:meth:`sync_log`), which is
what ``synchronous=FULL`` does inside the commit. A commit asked not to be durable
(``durable=False``, a rewrite's announcement) skips that fsync: every connection sees it at
once, and the next durable commit, of any process, makes it durable too (the WAL is one file,
appended in commit order). One setting for both kinds spares each announcement the two
``PRAGMA synchronous`` switches a per-transaction setting would cost (about 20 µs of 70).
A durable commit whose fsync fails raises :class:`~strataio.errors.BackendError` although
other connections may already see it (SQLite's own fsync inside the commit would have kept
it from them).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence

from strataio.catalog.liveness import LockFiles
from strataio.catalog.sql import SQLCatalog
from strataio.errors import BackendError


class SQLiteCatalog(SQLCatalog):
    """A catalog in the SQLite file at ``path`` (created, with its directory, if missing).

    ``timeout``: seconds a writer waits for another process's transaction to finish.
    """

    TYPES = {"bigint": "INTEGER", "real": "REAL", "serial_pk": "INTEGER PRIMARY KEY", "c": ""}
    INTEGRITY_ERRORS = (sqlite3.IntegrityError,)
    DATABASE_ERRORS = (sqlite3.OperationalError, sqlite3.DatabaseError)

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0) -> None:
        self.path = os.fspath(path)
        self.timeout = float(timeout)
        # writers' liveness: an fcntl lock per writer, on files beside the database
        self._locks = LockFiles(os.path.abspath(self.path) + ".writers")
        super().__init__(self.path)

    def _connect(self) -> sqlite3.Connection:
        parent = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(parent, exist_ok=True)
            # isolation_level=None: no implicit transactions; _begin issues them explicitly.
            conn = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise BackendError(f"cannot open catalog {self.path!r}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            mode = self._wal_mode(conn)
            if mode.lower() != "wal":
                raise BackendError(
                    f"catalog {self.path!r}: cannot switch to WAL mode (got {mode!r}); "
                    "is it on a file system without shared memory support?"
                )
            conn.execute("PRAGMA synchronous = NORMAL")  # (durable commits: see the module doc)
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            conn.close()
            raise BackendError(f"cannot open catalog {self.path!r}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _wal_mode(self, conn: sqlite3.Connection) -> str:
        """Switch ``conn`` to WAL and return the journal mode it got. Two processes opening
        a new catalog at once may both try the switch; SQLite then answers "database is
        locked" at once, without calling the busy handler, so the switch is retried here for
        up to ``timeout`` seconds."""
        deadline = time.monotonic() + self.timeout
        pause = 0.005
        while True:
            try:
                return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _disconnect(self) -> None:
        self._conn.close()

    def sync_log(self) -> None:
        """fsync the WAL: every frame a commit appended, durable or not, is then on disk."""
        with self._lock:
            self._check_open()
            self._sync_wal()

    def _sync_wal(self) -> None:
        try:
            fd = os.open(self.path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # no WAL: every commit is in the database file, synced at checkpoint
        except OSError as exc:
            raise BackendError(f"catalog {self.path!r}: cannot open its WAL: {exc}") from exc
        try:
            os.fsync(fd)
        except OSError as exc:
            raise BackendError(f"catalog {self.path!r}: cannot sync its WAL: {exc}") from exc
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _begin(self, durable: bool = True) -> Iterator[sqlite3.Cursor]:
        cur = self._conn.cursor()
        try:
            # IMMEDIATE: take the write lock now, so a reader-turned-writer never deadlocks
            # on lock upgrade (which the busy timeout cannot resolve).
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.rollback()
                raise
        finally:
            cur.close()
        if durable:
            self._sync_wal()  # (synchronous=NORMAL: see the module doc)

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
