"""The catalog over SQL: one implementation, with dialect hooks for SQLite and PostgreSQL.

All SQL is written once, with ``?`` placeholders and ``{bigint}`` / ``{real}`` / ``{serial_pk}``
type slots that a dialect fills in. A dialect supplies the connection, the transaction, the
table-existence probe and, where it has a faster way than ``executemany``, the bulk statements
(PostgreSQL uses COPY and ``unnest`` arrays).

Every public method takes the connection lock, so the mover's worker threads can share one
catalog; every write is one transaction.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import json
import os
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from strataio.backoff import Backoff
from strataio.catalog.base import (
    COPY_STATES,
    TIER_STATES,
    Catalog,
    ChunkCopy,
    CommitOutcome,
    CopyId,
    DatasetRecord,
    OvertakenRewrite,
    PerfRow,
    TierRecord,
    TierUsage,
    VerifiedCopy,
    WriterRecord,
    committed_checksum,
)
from strataio.catalog.liveness import new_writer_id
from strataio.errors import (
    BackendError,
    ClosedError,
    DatasetInUseError,
    ExistsError,
    MetadataError,
    NotFoundError,
    StrataError,
)

Cursor = Any  # a DB-API cursor of the dialect's driver

# -- schema and migrations ----------------------------------------------------------------
#
# MIGRATIONS[i] upgrades a database from version i to version i + 1; a new database runs them
# all, so the upgrade path of every released version is exercised by every fresh catalog.
# Never edit a released step: append a new one.

_V1 = [
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    "INSERT INTO schema_version (version) VALUES (0)",
    """CREATE TABLE tiers (
        name TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        role TEXT NOT NULL,
        capacity_bytes {bigint},
        ord INTEGER NOT NULL)""",
    """CREATE TABLE datasets (
        name TEXT PRIMARY KEY,
        shape TEXT NOT NULL,
        dtype TEXT NOT NULL,
        chunks TEXT NOT NULL,
        codec TEXT NOT NULL,
        hint TEXT NOT NULL,
        attrs TEXT NOT NULL,
        state TEXT NOT NULL)""",
    """CREATE TABLE residency (
        dataset TEXT NOT NULL REFERENCES datasets (name) ON DELETE CASCADE,
        key TEXT NOT NULL,
        tier TEXT NOT NULL REFERENCES tiers (name),
        nbytes {bigint} NOT NULL,
        checksum TEXT NOT NULL,
        dirty INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (dataset, key, tier))""",
]

# Version 2: tier health, a copy state in place of the dirty flag (copies can be in transit),
# last access times for LRU eviction, and the performance database.
_V2 = [
    "ALTER TABLE tiers ADD COLUMN state TEXT NOT NULL DEFAULT 'up'",
    "ALTER TABLE residency ADD COLUMN state TEXT NOT NULL DEFAULT 'valid'",
    "ALTER TABLE residency ADD COLUMN last_access {real} NOT NULL DEFAULT 0",
    "UPDATE residency SET state = 'dirty' WHERE dirty <> 0",
    "ALTER TABLE residency DROP COLUMN dirty",
    "CREATE INDEX residency_lru ON residency (tier, last_access)",
    """CREATE TABLE perf (
        id {serial_pk},
        tier TEXT NOT NULL,
        op TEXT NOT NULL,
        nbytes {bigint} NOT NULL,
        seconds {real} NOT NULL,
        concurrency INTEGER NOT NULL,
        measured_at {real} NOT NULL)""",
    "CREATE INDEX perf_tier ON perf (tier, measured_at)",
]

# Version 3: announced rewrites keep the replaced bytes' checksum and name their writer;
# writers register (their liveness is a lock the kernel or the server releases) with the
# datasets they have in use.
_V3 = [
    "ALTER TABLE residency ADD COLUMN old_checksum TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE residency ADD COLUMN writer TEXT NOT NULL DEFAULT ''",
    """CREATE TABLE writers (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        started {real} NOT NULL)""",
    """CREATE TABLE writer_datasets (
        writer TEXT NOT NULL REFERENCES writers (id) ON DELETE CASCADE,
        dataset TEXT NOT NULL,
        PRIMARY KEY (writer, dataset))""",
]

# Version 4: a writer's mark on a dataset says whether it is evicting from it (a process
# that opens the dataset waits for such a mark to go) or has it open.
_V4 = ["ALTER TABLE writer_datasets ADD COLUMN evicting INTEGER NOT NULL DEFAULT 0"]

# Version 5: a copy whose bytes end with their own CRC-32C (codec crc32c last) is recorded
# with that CRC, not with its whole CRC-32C, which is one constant for all such bytes and
# tells no versions apart; those constants recorded before are marked as plain CRC-32C, which
# their copies keep until a rewrite.
_V5 = [
    "UPDATE residency SET checksum = 'crc32c:' || checksum WHERE checksum = '48674bc7'",
    "UPDATE residency SET old_checksum = 'crc32c:' || old_checksum WHERE old_checksum = '48674bc7'",
]

# Version 6: copies a read found intact, with the object version it read (the verified-once
# rule across processes: a later reader of the same object version need not check it whole).
_V6 = [
    """CREATE TABLE verified (
        dataset TEXT NOT NULL REFERENCES datasets (name) ON DELETE CASCADE,
        key TEXT NOT NULL,
        tier TEXT NOT NULL,
        checksum TEXT NOT NULL,
        version TEXT NOT NULL,
        PRIMARY KEY (dataset, key, tier))""",
]

# Version 7: a dataset's generation, moved on by every commit that changes its rows (a
# process that learned rows at one generation may take them as the catalog's while it holds).
_V7 = ["ALTER TABLE datasets ADD COLUMN generation {bigint} NOT NULL DEFAULT 0"]

# Version 8: the residency and the checks kept in their key's order (SQLite: WITHOUT ROWID
# tables), so that a lookup of a chunk's rows reads one b-tree, not an index and then the
# table: fewer pages, which a process's first read of a section reads from disk when cold.
# (PostgreSQL has no rowid: it rebuilds both tables as they were, once.)
_V8 = [
    """CREATE TABLE residency_v8 (
        dataset TEXT NOT NULL REFERENCES datasets (name) ON DELETE CASCADE,
        key TEXT NOT NULL,
        tier TEXT NOT NULL REFERENCES tiers (name),
        nbytes {bigint} NOT NULL,
        checksum TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'valid',
        last_access {real} NOT NULL DEFAULT 0,
        old_checksum TEXT NOT NULL DEFAULT '',
        writer TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (dataset, key, tier)){without_rowid}""",
    "INSERT INTO residency_v8 (dataset, key, tier, nbytes, checksum, state, last_access, "
    "old_checksum, writer) SELECT dataset, key, tier, nbytes, checksum, state, last_access, "
    "old_checksum, writer FROM residency",
    "DROP TABLE residency",
    "ALTER TABLE residency_v8 RENAME TO residency",
    "CREATE INDEX residency_lru ON residency (tier, last_access)",
    """CREATE TABLE verified_v8 (
        dataset TEXT NOT NULL REFERENCES datasets (name) ON DELETE CASCADE,
        key TEXT NOT NULL,
        tier TEXT NOT NULL,
        checksum TEXT NOT NULL,
        version TEXT NOT NULL,
        PRIMARY KEY (dataset, key, tier)){without_rowid}""",
    "INSERT INTO verified_v8 (dataset, key, tier, checksum, version) "
    "SELECT dataset, key, tier, checksum, version FROM verified",
    "DROP TABLE verified",
    "ALTER TABLE verified_v8 RENAME TO verified",
]

# Version 9: the tiers where a deleted dataset's objects may remain (its remnants): its name
# is not free again until they are gone from each.
_V9 = [
    """CREATE TABLE remnants (
        dataset TEXT NOT NULL,
        tier TEXT NOT NULL,
        PRIMARY KEY (dataset, tier))""",
]

# Version 10: announced rewrites another writer's announcement replaced before their put
# (see Catalog.overtaken): the put may still land, after the other writer's commit settled
# the row, and then only this record names the bytes the object holds.
_V10 = [
    """CREATE TABLE overtaken (
        dataset TEXT NOT NULL REFERENCES datasets (name) ON DELETE CASCADE,
        key TEXT NOT NULL,
        tier TEXT NOT NULL,
        writer TEXT NOT NULL,
        checksum TEXT NOT NULL,
        PRIMARY KEY (dataset, key, tier, writer)){without_rowid}""",
    # (and why a tier was marked down, so that another process can say it)
    "ALTER TABLE tiers ADD COLUMN why TEXT NOT NULL DEFAULT ''",
    # (and the tier settings each calibration measured, so that a prediction made after
    # they changed is refused rather than off by their factor)
    "ALTER TABLE perf ADD COLUMN settings TEXT NOT NULL DEFAULT ''",
]

MIGRATIONS: list[list[str]] = [_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10]
#: the schema version this code writes
SCHEMA_VERSION = len(MIGRATIONS)

# residency columns and the upsert of one copy row (the PostgreSQL dialect bulk-loads with them)
COPY_COLS = "dataset, key, tier, nbytes, checksum, state, last_access, old_checksum, writer"
UPSERT_COPY = (
    f"INSERT INTO residency ({COPY_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (dataset, key, tier) DO UPDATE SET nbytes = excluded.nbytes, "
    "checksum = excluded.checksum, state = excluded.state, last_access = excluded.last_access, "
    "old_checksum = excluded.old_checksum, writer = excluded.writer"
)
_COPY_FIELDS = (
    "r.dataset, r.key, r.tier, r.nbytes, r.checksum, r.state, r.last_access, r.old_checksum, "
    "r.writer"
)
_SELECT_COPIES = f"SELECT {_COPY_FIELDS} FROM residency r JOIN tiers t ON t.name = r.tier"
#: a dataset's copies, each with the check recorded for it (NULLs where none)
#: and the dataset's generation (one statement: the rows and the generation agree)
_SELECT_CHECKED = (
    "SELECT r.dataset, r.key, r.tier, r.nbytes, r.checksum, r.state, r.last_access, r.old_checksum, "
    "r.writer, v.checksum, v.version, (SELECT generation FROM datasets WHERE name = ?) "
    "FROM residency r LEFT JOIN verified v "
    "ON v.dataset = r.dataset AND v.key = r.key AND v.tier = r.tier WHERE r.dataset = ?"
)
_DATASET_COLS = "name, shape, dtype, chunks, codec, hint, attrs, state"
#: a writer's row (kept where it is there already: a connection opened again restores it)
_INSERT_WRITER = (
    "INSERT INTO writers (id, host, pid, started) VALUES (?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
)
#: a writer's mark on a dataset, or whether an existing one is an eviction's claim
_MARK_DATASET = (
    "INSERT INTO writer_datasets (writer, dataset, evicting) VALUES (?, ?, ?) "
    "ON CONFLICT (writer, dataset) DO UPDATE SET evicting = excluded.evicting"
)
#: the note of an announced rewrite another writer's announcement or write replaced
_NOTE_OVERTAKEN = (
    "INSERT INTO overtaken (dataset, key, tier, writer, checksum) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (dataset, key, tier, writer) DO UPDATE SET checksum = excluded.checksum"
)


def _remnants_near_query(name: str) -> tuple[str, tuple[Any, ...]]:
    """The statement (its dialect slots unfilled) and parameters that select ``(dataset,
    tier)`` of the remnants of ``name`` and of the names above or below it."""
    parts = name.split("/")
    near = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    below = name + "/"
    marks = ", ".join("?" * len(near))
    statement = (
        f"SELECT dataset, tier FROM remnants WHERE dataset IN ({marks})"
        " OR substr(dataset, 1, ?) = ? ORDER BY dataset{c}, tier{c}"
    )
    return statement, (*near, len(below), below)


def _dataset_row(r: DatasetRecord) -> tuple:
    return (
        r.name,
        json.dumps(list(r.shape)),
        r.dtype,
        json.dumps(list(r.chunks)),
        r.codec,
        r.hint,
        r.attrs,
        r.state,
    )


@functools.lru_cache(maxsize=256)
def _dataset_record(row: tuple[Any, ...]) -> DatasetRecord:
    """The record of a ``datasets`` row (records are immutable: one per row text, as a
    dataset opened again and again reads the same row)."""
    name, shape, dtype, chunks, codec, hint, attrs, state = row
    return DatasetRecord(
        name, tuple(json.loads(shape)), dtype, tuple(json.loads(chunks)), codec, hint, attrs, state
    )


def _version_text(version: Sequence[int | str]) -> str:
    """An object version as the catalog keeps it: integers comma-separated (a POSIX file's
    inode, size and change time; read back fast), anything else as a JSON list."""
    if all(type(p) is int for p in version):
        return ",".join(map(str, version))
    return json.dumps(list(version))


def _version_of(text: str) -> tuple[int | str, ...]:
    """The object version :func:`_version_text` wrote."""
    try:
        return tuple(map(int, text.split(",")))
    except ValueError:  # (a JSON list, or no version)
        return tuple(json.loads(text)) if text else ()


#: a row as a value type, at a tuple's cost: for rows of a fixed SELECT, whose columns are the
#: type's fields in order (the named tuple's own constructor checks the arity, per call)
_as = tuple.__new__


class SQLCatalog(Catalog):
    """A :class:`Catalog` over a DB-API connection; subclasses supply the dialect."""

    #: filled into the ``{...}`` slots of statements: column types, ``{c}``, the collation
    #: that orders text by code point (as Python's ``sorted`` does) on every database, and
    #: ``{without_rowid}``, what makes a table a b-tree in its primary key's order
    TYPES: dict[str, str] = {}
    #: driver exceptions meaning a constraint failed / the database failed
    INTEGRITY_ERRORS: tuple[type[BaseException], ...] = ()
    DATABASE_ERRORS: tuple[type[BaseException], ...] = ()

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.RLock()
        self._closed = False
        self.schema_version = 0
        self._sql_cache: dict[str, str] = {}
        self._writers: list[str] = []  # registered through this object, oldest first
        self._uses: Counter[tuple[str, str]] = Counter()  # (writer, dataset) -> uses
        # (writer, dataset) -> time.monotonic() at which its mark, no longer used, goes
        self._lingering: dict[tuple[str, str], float] = {}
        self._linger_timer: threading.Timer | None = None
        self._claims: set[tuple[str, str]] = set()  # (writer, dataset) marked as a claim
        self._reconnect_due = False  # the connection was lost and is not open again yet
        self._resuming = False  # _reconnect is taking back what the lost connection held
        self._conn = self._connect()
        try:
            self._migrate()
        except BaseException:
            self._disconnect()
            raise

    # -- dialect hooks -------------------------------------------------------------------

    @abc.abstractmethod
    def _connect(self) -> Any:
        """Open the connection (in autocommit mode: transactions are explicit)."""

    @abc.abstractmethod
    def _disconnect(self) -> None: ...

    def _connection_lost(self, exc: BaseException | None = None) -> bool:
        """Whether the connection has ended under this object (a server restart, a backend
        terminated), as it shows now or as ``exc``, the error a call met, says:
        :meth:`_reconnect` can open it again. Never, for an embedded database."""
        return False

    @abc.abstractmethod
    def _begin(self, durable: bool = True) -> contextlib.AbstractContextManager[Cursor]:
        """A write transaction: commits on normal exit, rolls back on an exception; with
        ``durable=False`` the commit does not wait for the disk (see :meth:`Catalog.commit`)."""

    def _explain(self, exc: BaseException) -> str:
        """The text of ``exc``, a database error, for a message naming the catalog: with
        what caused it and what to do, where the dialect can tell."""
        return str(exc)

    def _sql(self, statement: str) -> str:
        """``statement`` with the dialect's slots filled, in the driver's placeholder style."""
        out = self._sql_cache.get(statement)
        if out is None:
            out = self._sql_cache[statement] = self._placeholders(statement.format(**self.TYPES))
        return out

    def _placeholders(self, statement: str) -> str:
        return statement

    @abc.abstractmethod
    def _has_table(self, cur: Cursor, name: str) -> bool: ...

    def _lock_schema(self, cur: Cursor) -> None:
        """Serialize migrations across processes (inside the migration transaction)."""

    @abc.abstractmethod
    def _hold_token(self, writer: str) -> None:
        """Take ``writer``'s liveness token, for as long as this process (and this catalog
        object) lives."""

    @abc.abstractmethod
    def _release_token(self, writer: str) -> None: ...

    @abc.abstractmethod
    def _live_tokens(self, writers: Sequence[str]) -> set[str]:
        """The writers among ``writers`` whose token is held."""

    def _forget_tokens(self, writers: Sequence[str]) -> None:
        """Remove what dead writers' tokens left behind (nothing, by default)."""

    def _executemany(self, cur: Cursor, statement: str, rows: Sequence[tuple]) -> None:
        if rows:
            cur.executemany(self._sql(statement), rows)

    def _bulk_upsert(self, cur: Cursor, rows: Sequence[tuple]) -> None:
        self._executemany(cur, UPSERT_COPY, rows)

    def _bulk_delete(self, cur: Cursor, ids: Sequence[CopyId]) -> None:
        self._executemany(
            cur, "DELETE FROM residency WHERE dataset = ? AND key = ? AND tier = ?", ids
        )

    def _bulk_touch(self, cur: Cursor, dataset: str, keys: Sequence[str], when: float) -> None:
        self._executemany(
            cur,
            "UPDATE residency SET last_access = ? WHERE dataset = ? AND key = ?",
            [(when, dataset, k) for k in keys],
        )

    def _bulk_perf(self, cur: Cursor, rows: Sequence[tuple]) -> None:
        self._executemany(
            cur,
            "INSERT INTO perf (tier, op, nbytes, seconds, concurrency, measured_at, settings) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    # -- plumbing ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self, durable: bool = True) -> Iterator[Cursor]:
        with self._lock:
            self._check_open()
            try:
                with contextlib.ExitStack() as stack:
                    yield self._transaction(durable, stack)
            except self.INTEGRITY_ERRORS as exc:
                raise MetadataError(f"catalog {self._label()}: constraint failed: {exc}") from exc
            except self.DATABASE_ERRORS as exc:
                if self._connection_lost(exc):
                    self._reconnect_due = True
                    raise BackendError(
                        f"catalog {self._label()}: the connection was lost during a change "
                        f"({exc}); the server kept the change only if it had received its "
                        "commit, and the next call opens the connection again"
                    ) from exc
                raise BackendError(f"catalog {self._label()}: {self._explain(exc)}") from exc

    def _transaction(self, durable: bool, stack: contextlib.ExitStack) -> Cursor:
        """A write transaction begun on ``stack``; one whose begin found the connection lost
        (nothing of it reached the server) is begun again on a connection opened anew."""
        try:
            return stack.enter_context(self._begin(durable))
        except self.DATABASE_ERRORS as exc:
            if not self._connection_lost(exc):
                raise
            self._reconnect(exc)
            return stack.enter_context(self._begin(durable))

    def _query(self, statement: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            self._check_open()
            try:
                return self._fetch(statement, params)
            except self.DATABASE_ERRORS as exc:
                if not self._connection_lost(exc):
                    raise BackendError(f"catalog {self._label()}: {self._explain(exc)}") from exc
                cause = exc
            # (a query changes nothing: asked again on a connection opened anew)
            self._reconnect(cause)
            try:
                return self._fetch(statement, params)
            except self.DATABASE_ERRORS as exc:
                self._reconnect_due = self._connection_lost(exc)
                raise BackendError(f"catalog {self._label()}: {self._explain(exc)}") from exc

    def _fetch(self, statement: str, params: Sequence[Any]) -> list[tuple]:
        cur = self._conn.cursor()
        try:
            cur.execute(self._sql(statement), params)
            return cur.fetchall()
        finally:
            cur.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"catalog {self._label()} is closed")
        if self._reconnect_due:
            self._reconnect(None)

    def _reconnect(self, cause: BaseException | None) -> None:
        """Open the connection again after it was lost (the caller holds the lock), and take
        back what this object held on the old one: its writers' liveness tokens, their rows
        and the marks of the datasets they use. Meanwhile other processes saw those writers
        dead; what they did on that ground (a rewrite in flight settled by fsck, an eviction
        from a dataset in use) meets this process as another writer's change would: a flush
        that reports a rewrite lost, a read that finds a copy gone and asks again."""
        if self._resuming:
            # (lost again while the tokens were being taken back: taking them all again on
            # yet another connection from here would take some twice on it, and those would
            # stay held, their writers alive to every process, after their release)
            raise BackendError(
                f"catalog {self._label()}: the connection was lost again while it was being "
                f"opened anew ({cause}); the next call opens it again"
            )
        self._reconnect_due = True
        with contextlib.suppress(Exception):
            self._disconnect()
        try:
            self._conn = self._connect()
        except BackendError as exc:
            why = f" ({cause})" if cause is not None else ""
            raise BackendError(
                f"catalog {self._label()}: the connection was lost{why} and could not be "
                f"opened again: {exc}"
            ) from exc
        self._reconnect_due = False
        self._resuming = True
        try:
            self._resume_writers()
        except BaseException:
            # (the next call opens a connection afresh, holding nothing, and takes every
            # token back once on it)
            self._reconnect_due = True
            raise
        finally:
            self._resuming = False

    def _resume_writers(self) -> None:
        """Retake the tokens of the writers registered here, and restore their rows and
        marks where another process forgot them as dead (:meth:`forget_writers`)."""
        if not self._writers:
            return
        for w in self._writers:
            self._hold_token(w)
        marks = {k: k in self._claims for k, n in self._uses.items() if n > 0}
        marks.update((k, False) for k in self._lingering)
        with self._write(durable=False) as cur:
            self._executemany(
                cur,
                _INSERT_WRITER,
                [(w, socket.gethostname(), os.getpid(), time.time()) for w in self._writers],
            )
            self._executemany(cur, _MARK_DATASET, [(w, d, int(e)) for (w, d), e in marks.items()])

    def _label(self) -> str:
        return self.url

    def _migrate(self) -> None:
        with self._write() as cur:
            self._lock_schema(cur)
            version = 0
            if self._has_table(cur, "schema_version"):
                cur.execute("SELECT version FROM schema_version")
                row = cur.fetchone()
                version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise MetadataError(
                    f"catalog {self._label()} has schema version {version}, newer than the "
                    f"{SCHEMA_VERSION} this strataio supports; upgrade strataio"
                )
            for step in MIGRATIONS[version:]:
                for statement in step:
                    cur.execute(self._sql(statement))
            if version < SCHEMA_VERSION:
                cur.execute(self._sql("UPDATE schema_version SET version = ?"), (SCHEMA_VERSION,))
        self.schema_version = SCHEMA_VERSION

    # -- tiers ---------------------------------------------------------------------------

    def register_tiers(self, tiers: Sequence[TierRecord]) -> None:
        rows = [(t.name, t.url, t.role, t.capacity_bytes, t.order, t.state, t.why) for t in tiers]
        with self._write() as cur:
            self._executemany(
                cur,
                "INSERT INTO tiers (name, url, role, capacity_bytes, ord, state, why) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "url = excluded.url, role = excluded.role, "
                "capacity_bytes = excluded.capacity_bytes, ord = excluded.ord, "
                "state = excluded.state, why = excluded.why",
                rows,
            )

    def tiers(self) -> list[TierRecord]:
        rows = self._query(
            "SELECT name, url, role, capacity_bytes, ord, state, why FROM tiers "
            "ORDER BY ord, name{c}"
        )
        return [TierRecord(*r) for r in rows]

    def set_tier_state(self, name: str, state: str, why: str = "") -> None:
        if state not in TIER_STATES:
            raise MetadataError(f"tier state {state!r} is not one of {', '.join(TIER_STATES)}")
        why = why if state != "up" else ""
        with self._write() as cur:
            cur.execute(
                self._sql("UPDATE tiers SET state = ?, why = ? WHERE name = ?"), (state, why, name)
            )
            if cur.rowcount == 0:
                raise NotFoundError(f"no tier {name!r} in catalog {self._label()}")

    # -- datasets ------------------------------------------------------------------------

    def create_dataset(self, record: DatasetRecord) -> None:
        with self._write() as cur:
            self._lock_dataset_names(cur)
            nested = self._nesting(cur, record.name)
            if nested is not None:
                inside = record.name.startswith(nested + "/")
                raise ExistsError(
                    f"dataset {record.name!r} cannot be created in catalog {self._label()}: "
                    + (
                        f"it would lie inside dataset {nested!r}"
                        if inside
                        else f"dataset {nested!r} lies inside it"
                    )
                    + " (a dataset's objects are stored under its name on every tier, so the "
                    "two would mix; choose a name that neither starts nor extends another's)"
                )
            left = self._remnants_near(cur, record.name)
            if left:
                where = ", ".join(f"{d!r} on tier {t!r}" for d, t in left)
                raise ExistsError(
                    f"dataset {record.name!r} cannot be created in catalog {self._label()} "
                    f"yet: objects of a deleted dataset may remain ({where}), which a dataset "
                    "of this name would take for its own; they go at the next create_dataset "
                    "of this name or `strataio fsck --repair` once their tier answers and no "
                    "other process is deleting or creating the name (try again then), but "
                    "never from a read-only tier: remove them there by hand, or make the tier "
                    "writable"
                )
            # (a random first generation: a dataset deleted and created again under its name
            # never has a generation rows learned of the one before had)
            cur.execute(
                self._sql(
                    f"INSERT INTO datasets ({_DATASET_COLS}, generation) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING"
                ),
                (*_dataset_row(record), secrets.randbits(62)),
            )
            if cur.rowcount == 0:
                raise ExistsError(
                    f"dataset {record.name!r} already exists in catalog {self._label()}"
                )

    def _settle_replaced(
        self,
        cur: Cursor,
        replaced: Mapping[CopyId, ChunkCopy],
        sizes: Callable[[Sequence[CopyId]], Mapping[CopyId, int]],
        latest: dict[CopyId, ChunkCopy],
    ) -> None:
        """Settle the rows of written copies ``replaced`` (their objects replaced by another
        writer's put) that are still this writer's announcements: such an announcement took
        the bytes of the writer whose announcement it replaced for its old ones, and that
        writer's put is the one that replaced the object, so the row becomes a settled row
        of those bytes (the object's size now, from ``sizes``). Left as they are, they
        would stand as announcements no writer settles."""
        mine = {
            (d, k, t): old
            for d, k, t, state, checksum, old, _ in self._rows_of(cur, {i[:2] for i in replaced})
            if (d, k, t) in replaced
            and state == "in-transit"
            and checksum == replaced[d, k, t].checksum
            and old
        }
        if not mine:
            return
        now = sizes(list(mine))
        for i, old in mine.items():
            if now.get(i) is not None:
                latest[i] = replaced[i]._replace(
                    nbytes=int(now[i]), checksum=old, old_checksum="", writer=""
                )

    def _nesting(self, cur: Cursor, name: str) -> str | None:
        """The name of a dataset that lies above ``name`` (``a`` of ``a/b``) or below it
        (``a/b/c`` of ``a/b``), if any."""
        parts = name.split("/")
        above = ["/".join(parts[:i]) for i in range(1, len(parts))]
        below = name + "/"
        where = "substr(name, 1, ?) = ?" + (
            f" OR name IN ({', '.join('?' * len(above))})" if above else ""
        )
        cur.execute(
            self._sql(f"SELECT name FROM datasets WHERE {where} ORDER BY name{{c}} LIMIT 1"),
            (len(below), below, *above),
        )
        row = cur.fetchone()
        return None if row is None else str(row[0])

    def _remnants_near(self, cur: Cursor, name: str) -> list[tuple[str, str]]:
        """``(dataset, tier)`` of the remnants of ``name`` and of the names that lie above or
        below it (see :meth:`_nesting`)."""
        statement, params = _remnants_near_query(name)
        cur.execute(self._sql(statement), params)
        return [(str(d), str(t)) for d, t in cur.fetchall()]

    def _lock_dataset_names(self, cur: Cursor) -> None:
        """Make the names of datasets stand until this transaction ends (no other creation
        meanwhile), for :meth:`_nesting`. SQLite's write lock, taken when the transaction
        begins, already does."""

    def update_dataset(self, record: DatasetRecord) -> None:
        row = _dataset_row(record)
        with self._write() as cur:
            cur.execute(
                self._sql(
                    "UPDATE datasets SET shape = ?, dtype = ?, chunks = ?, codec = ?, hint = ?, "
                    "attrs = ?, state = ?, generation = generation + 1 WHERE name = ?"
                ),
                (*row[1:], row[0]),
            )
            if cur.rowcount == 0:
                raise NotFoundError(f"no dataset {record.name!r} in catalog {self._label()}")

    def annotate_dataset(self, name: str, key: str, change: Callable[[Any], Any]) -> Any:
        with self._write() as cur:
            self._lock_annotations(cur, name)
            cur.execute(self._sql("SELECT attrs FROM datasets WHERE name = ?"), (name,))
            row = cur.fetchone()
            if row is None:
                raise NotFoundError(f"no dataset {name!r} in catalog {self._label()}")
            notes = json.loads(row[0] or "{}")
            old = notes.get(key)
            new = change(old)
            if new == old:
                return new
            if new is None:
                del notes[key]
            else:
                notes[key] = new
            cur.execute(
                self._sql("UPDATE datasets SET attrs = ? WHERE name = ?"),
                (json.dumps(notes, sort_keys=True), name),
            )
            return new

    def _lock_annotations(self, cur: Cursor, name: str) -> None:
        """Make this transaction's read of dataset ``name``'s annotations stand until it
        ends (no other annotation of it meanwhile). SQLite's write lock, taken when the
        transaction begins, already does."""

    def get_dataset(self, name: str) -> DatasetRecord:
        rows = self._query(f"SELECT {_DATASET_COLS} FROM datasets WHERE name = ?", (name,))
        if not rows:
            raise NotFoundError(f"no dataset {name!r} in catalog {self._label()}")
        return _dataset_record(tuple(rows[0]))

    def generation(self, name: str) -> int | None:
        rows = self._query("SELECT generation FROM datasets WHERE name = ?", (name,))
        return int(rows[0][0]) if rows else None

    def list_datasets(self) -> list[DatasetRecord]:
        rows = self._query(f"SELECT {_DATASET_COLS} FROM datasets ORDER BY name{{c}}")
        return [_dataset_record(tuple(r)) for r in rows]

    def delete_dataset(
        self, name: str, *, remnants: Iterable[str] | None = None
    ) -> list[TierUsage]:
        with self._lock:
            here = [w for w in self._writers if self._uses[w, name]]
        if here:
            raise DatasetInUseError(
                f"dataset {name!r} is open in this process (writer {here[0]}): close it "
                "before deleting it"
            )
        self._claim_to_delete(name)
        try:
            with self._write() as cur:
                self._lock_dataset_names(cur)
                cur.execute(
                    self._sql(
                        "SELECT r.tier, COUNT(*), SUM(r.nbytes) FROM residency r "
                        "JOIN tiers t ON t.name = r.tier WHERE r.dataset = ? "
                        "GROUP BY r.tier, t.ord ORDER BY t.ord"
                    ),
                    (name,),
                )
                removed = [TierUsage(name, str(t), int(n), int(b)) for t, n, b in cur.fetchall()]
                if remnants is not None:
                    remnants = [*remnants, *(u.tier for u in removed)]
                # Explicit, so the residency goes even where foreign keys are not enforced.
                cur.execute(self._sql("DELETE FROM residency WHERE dataset = ?"), (name,))
                cur.execute(self._sql("DELETE FROM verified WHERE dataset = ?"), (name,))
                cur.execute(self._sql("DELETE FROM datasets WHERE name = ?"), (name,))
                if cur.rowcount == 0:
                    raise NotFoundError(f"no dataset {name!r} in catalog {self._label()}")
                self._executemany(
                    cur,
                    "INSERT INTO remnants (dataset, tier) VALUES (?, ?) "
                    "ON CONFLICT (dataset, tier) DO NOTHING",
                    [(name, t) for t in dict.fromkeys(remnants or ())],
                )
        finally:
            self.release_eviction(name)
        return removed

    def _claim_to_delete(self, name: str) -> None:
        """Claim dataset ``name`` (:meth:`claim_eviction`: no process opens it until
        :meth:`release_eviction`), waiting out for a while the marks other processes left
        lingering when they closed it; raise :class:`DatasetInUseError` naming a live writer
        that has it in use still. Without a writer registered here nothing is marked, and
        only the look is made."""
        wait = Backoff(self.MARK_LINGER_S + 1.0, 0.01, 0.2)
        while True:
            if self._writer(None) is None:
                others = self._other_marks("", name, evicting_only=False)
                if not others:
                    return
            elif self.claim_eviction(name):
                return
            else:
                others = self._other_marks(self._writer(None) or "", name, evicting_only=False)
            if others and wait.expired:
                raise DatasetInUseError(
                    f"dataset {name!r} is in use by another process (writer "
                    f"{', '.join(sorted(others))}, which has it open or is evicting from it): "
                    "close it there before deleting it"
                )
            wait.pause()

    def remnants(self, name: str | None = None, *, near: bool = False) -> list[tuple[str, str]]:
        if name is None:
            rows = self._query("SELECT dataset, tier FROM remnants ORDER BY dataset{c}, tier{c}")
        elif near:
            rows = self._query(*_remnants_near_query(name))
        else:
            rows = self._query(
                "SELECT dataset, tier FROM remnants WHERE dataset = ? ORDER BY tier{c}", (name,)
            )
        return [(str(d), str(t)) for d, t in rows]

    def clear_remnants(self, name: str, tiers: Iterable[str]) -> None:
        gone = [(name, t) for t in dict.fromkeys(tiers)]
        if not gone:
            return
        with self._write() as cur:
            self._executemany(cur, "DELETE FROM remnants WHERE dataset = ? AND tier = ?", gone)

    # -- residency -----------------------------------------------------------------------

    def residency(self, dataset: str, keys: Iterable[str] | None = None) -> list[ChunkCopy]:
        if keys is None:
            rows = self._query(
                f"{_SELECT_COPIES} WHERE r.dataset = ? ORDER BY r.key{{c}}, t.ord", (dataset,)
            )
            return [_as(ChunkCopy, r) for r in rows]
        out: list[ChunkCopy] = []
        for part, marks in _key_parts(keys):
            rows = self._query(
                f"{_SELECT_COPIES} WHERE r.dataset = ? AND r.key IN ({marks}) "
                "ORDER BY r.key{c}, t.ord",
                (dataset, *part),
            )
            out.extend(_as(ChunkCopy, r) for r in rows)
        return out

    def residency_checked(
        self, dataset: str, keys: Iterable[str] | None = None
    ) -> tuple[list[ChunkCopy], list[VerifiedCopy], int | None]:
        # (in no order: a residency sorts a chunk's copies by tier itself)
        parts = [None] if keys is None else list(_key_parts(keys))
        before = self.generation(dataset) if len(parts) > 1 else None
        got: list[tuple] = []
        for part in parts:
            if part is None:
                got += self._query(_SELECT_CHECKED, (dataset, dataset))
            else:
                got += self._query(
                    f"{_SELECT_CHECKED} AND r.key IN ({part[1]})", (dataset, dataset, *part[0])
                )
        rows = [_as(ChunkCopy, r[:9]) for r in got]
        checks = [
            _as(VerifiedCopy, (r[1], r[2], r[9], _version_of(r[10])))
            for r in got
            if r[9] is not None
        ]
        # One statement: the generation its rows carry. Several: the one read before the
        # first (a commit between two parts makes it older than some rows, never newer).
        if len(parts) > 1:
            generation = before
        elif not got:  # (no row to carry it: chunks never written, asked for apart)
            generation = self.generation(dataset)
        else:
            generation = None if got[0][11] is None else int(got[0][11])
        return rows, checks, generation

    def all_residency(self) -> list[ChunkCopy]:
        rows = self._query(f"{_SELECT_COPIES} ORDER BY r.dataset{{c}}, r.key{{c}}, t.ord")
        return [_as(ChunkCopy, r) for r in rows]

    def lru_copies(self, tier: str, limit: int, *, exclude: Iterable[str] = ()) -> list[ChunkCopy]:
        limit = max(0, int(limit))
        skip = set(exclude)
        out: list[ChunkCopy] = []
        offset = 0
        # One fixed statement (the residency_lru index gives the order); excluded datasets
        # are skipped here, and a further page is read only if they filled the first one.
        while len(out) < limit:
            rows = self._query(
                f"SELECT {COPY_COLS} FROM residency WHERE tier = ? "
                "ORDER BY last_access, dataset{c}, key{c} LIMIT ? OFFSET ?",
                (tier, limit, offset),
            )
            out.extend(c for c in (_as(ChunkCopy, r) for r in rows) if c.dataset not in skip)
            if len(rows) < limit:
                break
            offset += limit
        return out[:limit]

    def commit(
        self,
        upserts: Iterable[ChunkCopy] = (),
        deletes: Iterable[CopyId] = (),
        *,
        durable: bool = True,
        supersede: Sequence[CopyId] = (),
        stale: Callable[[Sequence[CopyId]], set[CopyId]] | None = None,
        dropped: Iterable[tuple[str, str]] | None = None,
        expect: Mapping[CopyId, tuple[str, str] | None] | None = None,
        copied: Iterable[CopyId] = (),
        revalidated: Iterable[CopyId] = (),
        writer: str = "",
        present: Callable[[Sequence[CopyId]], set[CopyId]] | None = None,
        sizes: Callable[[Sequence[CopyId]], Mapping[CopyId, int]] | None = None,
    ) -> CommitOutcome:
        # Last write wins within a batch, as executemany would do; deduplicating first also
        # keeps PostgreSQL's set-based upsert from touching one row twice.
        latest = {(c.dataset, c.key, c.tier): c for c in upserts}
        bad = {c.state for c in latest.values()} - set(COPY_STATES)
        if bad:
            raise MetadataError(
                f"chunk copy state(s) {sorted(bad)} not one of {', '.join(COPY_STATES)}"
            )
        ids = list(dict.fromkeys(tuple(d) for d in deletes))
        copied = [tuple(i) for i in copied]
        revalidated = [tuple(i) for i in revalidated if tuple(i) in latest]
        if not latest and not ids:
            return CommitOutcome([], [])
        removed: list[CopyId] = []
        kept: list[CopyId] = []
        orphaned: list[CopyId] = []
        overtaken: list[CopyId] = []
        # (this writer's own announced rewrites, recorded or left out by this commit; rank 0
        # of a parallel job records its ranks' rewrites with no expect: those superseding)
        own_rewrites = (
            [i for i, c in latest.items() if expect.get(i) == ("in-transit", c.checksum)]
            if expect
            else [i for i in map(tuple, supersede) if i in latest]
        )
        put_over: set[CopyId] = set()  # (written copies whose object another put replaced)
        try:
            with self._write(durable) as cur:
                new = [tuple(c) for c in supersede if tuple(c) in latest]
                # (written copies whose object another writer's put replaced, while their
                # row may still be this writer's announcement)
                replaced_own: dict[CopyId, ChunkCopy] = {}
                if stale is not None and latest:
                    gone = stale(list(latest))
                    put_over = set(gone)
                    for c in gone:
                        got = latest.pop(c, None)
                        if got is not None and (expect or {}).get(c) == (
                            "in-transit",
                            got.checksum,
                        ):
                            replaced_own[c] = got
                    # (a write or move left out takes none of its chunk's other copies
                    # with it: they are all that is left of the chunk where its object went)
                    ids = self._keep_chunks_of(
                        ids, {c[:2] for c in [*new, *copied] if c in gone}, kept
                    )
                    new = [c for c in new if c not in gone]
                guarded = [i for i in ids if expect and i in expect]
                deleting = set(ids)
                # (writes of copies the caller announced: recorded unless another writer has
                # announced a rewrite there since, whose put may land after this one's)
                own = {
                    i
                    for i, c in latest.items()
                    if expect and expect.get(i) == ("in-transit", c.checksum)
                }
                claims = [
                    i
                    for i in latest
                    if expect and i in expect and i not in deleting and i not in own
                ]
                # announcements that do not know the bytes they replace
                unknown_old = [
                    i for i, c in latest.items() if c.state == "in-transit" and not c.old_checksum
                ]
                sup = {(d, k) for d, k, _ in new}
                moves = [tuple(i) for i in copied if tuple(i) in latest]
                if (
                    new
                    or guarded
                    or claims
                    or unknown_old
                    or moves
                    or revalidated
                    or (dropped is not None and ids)
                    or (present is not None and ids)
                    or replaced_own
                    or own
                ):
                    # (rows of other processes' commits decide these: taken under a lock
                    # where the database lets one read them while it runs)
                    self._lock_residency(
                        cur,
                        {d for d, _, _ in [*new, *ids, *claims, *unknown_old, *moves]}
                        | {d for d, _, _ in [*replaced_own, *own, *revalidated]},
                    )
                if replaced_own and sizes is not None:
                    self._settle_replaced(cur, replaced_own, sizes, latest)
                # (the rows of the chunks this commit writes, read once: nothing here
                # changes them before the upsert at the end)
                chunk_rows = self._rows_of(cur, {i[:2] for i in [*own, *new]}) if own else None
                if own:
                    announced = [
                        (d, k, t)
                        for d, k, t, state, checksum, _, _ in chunk_rows
                        if (d, k, t) in own
                        and state == "in-transit"
                        and checksum != latest[d, k, t].checksum
                    ]
                    for i in announced:
                        del latest[i]
                    overtaken = [*overtaken, *announced]
                if present is not None and ids:
                    # (an object there now was put since the caller found it missing; a
                    # commit recording it comes after this one, or has come before and
                    # its row is the one at that place now: either way the row stays)
                    back = present(list(ids))
                    if back:
                        kept += [i for i in ids if i in back]
                        ids = [i for i in ids if i not in back]
                        left = set(ids)
                        guarded = [i for i in guarded if i in left]
                if unknown_old:
                    # (an announced rewrite of a settled row takes its checksum as the old
                    # one: the object holds those bytes until the put, so after a crash
                    # before it fsck finds the old value, not bytes it cannot place)
                    settled = {
                        (d, k, t): checksum
                        for d, k, t, state, checksum, _, _ in self._rows_of(
                            cur, {i[:2] for i in unknown_old}
                        )
                        if state != "in-transit"
                    }
                    for i in unknown_old:
                        if settled.get(i):
                            latest[i] = latest[i]._replace(old_checksum=settled[i])
                if claims:
                    assert expect is not None
                    # (a row written only over the row its caller saw there: another
                    # process's announced rewrite or recorded copy there since is left be)
                    claimed = {
                        (d, k, t): (state, checksum, who)
                        for d, k, t, state, checksum, _, who in self._rows_of(
                            cur, {i[:2] for i in claims}
                        )
                    }
                    moved_on = [
                        i for i in claims if (claimed[i][:2] if i in claimed else None) != expect[i]
                    ]
                    for i in moved_on:
                        del latest[i]
                    overtaken = [*overtaken, *moved_on]
                    moves = [i for i in moves if i in latest]
                    self._record_overtaken(cur, latest, claims, claimed)
                if moves:
                    # (a row holds the bytes it stands for as committed: another move's
                    # announced copy, or a rewrite's new bytes, may never be put)
                    held: dict[tuple[str, str], list[tuple[str, str]]] = {}
                    rewriting: set[CopyId] = set()  # slots another writer announced
                    for d, k, t, state, checksum, old, who in self._rows_of(
                        cur, {i[:2] for i in moves}
                    ):
                        held.setdefault((d, k), []).append(
                            (t, committed_checksum(state, checksum, old))
                        )
                        if state == "in-transit" and who and who != writer:
                            rewriting.add((d, k, t))
                    # (a move's copy where another writer has announced a rewrite since is
                    # left out, and its object, which that writer is replacing, stays)
                    rewritten = [i for i in moves if i in rewriting]
                    for i in rewritten:
                        del latest[i]
                    if rewritten:
                        ids = self._keep_chunks_of(ids, {i[:2] for i in rewritten}, kept)
                        left = set(ids)
                        guarded = [i for i in guarded if i in left]
                    overtaken = [*overtaken, *rewritten]
                    moves = [i for i in moves if i not in rewriting]
                    orphaned = [
                        i
                        for i in moves
                        if not any(
                            t != i[2] and stands_for == latest[i].checksum
                            for t, stands_for in held.get(i[:2], [])
                        )
                    ]
                    for i in orphaned:
                        del latest[i]
                if revalidated:
                    # (a copy marked valid stands only where its row still holds the same
                    # bytes, settled: the caller's view of it may be stale)
                    now_rows = self._states_of(cur, revalidated)
                    changed_rows = [
                        i
                        for i in revalidated
                        if now_rows.get(i)
                        not in (
                            ("valid", latest[i].checksum),
                            ("dirty", latest[i].checksum),
                        )
                    ]
                    for i in changed_rows:
                        del latest[i]
                    overtaken = [*overtaken, *changed_rows]
                if guarded:
                    assert expect is not None
                    now = self._states_of(cur, guarded)
                    changed = [
                        i for i in guarded if _changed_since(now.get(i), expect[i], i[:2] in sup)
                    ]
                    if changed:
                        kept += changed
                        keep = set(changed)
                        ids = [i for i in ids if i not in keep]
                if new:  # (rows this commit records or removes itself are its own)
                    named = set(ids) | set(latest)
                    chunks = {(d, k) for d, k, _ in new}
                    holds = {(d, k): t for d, k, t in new}
                    # (another live writer's announced rewrite is left to that writer's
                    # commit, which supersedes in turn: its object may be written right now)
                    now_rows = chunk_rows if chunk_rows is not None else self._rows_of(cur, chunks)
                    removed = [
                        (d, k, t)
                        for d, k, t, state, _, _, _ in now_rows
                        if (d, k) in holds
                        and holds[d, k] != t
                        and (d, k, t) not in named
                        and state != "in-transit"
                    ]
                    if not expect and writer:
                        # (rank 0 of a parallel job records its ranks' writes with no expect:
                        # one over another writer's announced rewrite notes it, as an
                        # announcement over it does, for that writer's put may land after)
                        self._executemany(
                            cur,
                            _NOTE_OVERTAKEN,
                            [
                                (d, k, t, who, checksum)
                                for d, k, t, state, checksum, _, who in now_rows
                                if (d, k, t) in latest
                                and state == "in-transit"
                                and who
                                and who != writer
                            ],
                        )
                if dropped is not None and ids:
                    last = self._last_rows(cur, ids, latest, set(dropped), writer)
                    if last:
                        keep = set(last)
                        ids = [i for i in ids if i not in keep]
                        kept += last
                rows = [
                    (
                        c.dataset, c.key, c.tier, int(c.nbytes), c.checksum, c.state,
                        float(c.last_access), c.old_checksum, c.writer,
                    )
                    for c in latest.values()
                ]  # fmt: skip
                # (in key order, as every commit and record_verified takes its rows: two
                # transactions upserting rows of the same chunks never wait on each other
                # in a cycle, which the server would fail one of as a deadlock)
                rows.sort(key=lambda r: r[:3])
                self._bulk_upsert(cur, rows)
                settled_own = [
                    i
                    for i in own_rewrites
                    if i in latest or i in replaced_own or (not expect and i in put_over)
                ]
                if writer and settled_own and self._has_overtaken(cur, writer):
                    # (this writer's rewrites recorded, or settled to the put that replaced
                    # its object, or its object replaced by another put: no announcement of
                    # its there is fsck's to settle any more)
                    self._executemany(
                        cur,
                        "DELETE FROM overtaken "
                        "WHERE dataset = ? AND key = ? AND tier = ? AND writer = ?",
                        [(*i, writer) for i in settled_own],
                    )
                self._bulk_delete(cur, ids + removed)
                changed = {c.dataset for c in latest.values()} | {i[0] for i in ids + removed}
                self._executemany(
                    cur,
                    "UPDATE datasets SET generation = generation + 1 WHERE name = ?",
                    [(d,) for d in sorted(changed)],
                )
        except MetadataError:
            raise MetadataError(self._explain_unknown(latest.values())) from None
        return CommitOutcome(removed, kept, orphaned, overtaken)

    def _record_overtaken(
        self,
        cur: Cursor,
        latest: Mapping[CopyId, ChunkCopy],
        claims: Sequence[CopyId],
        rows: Mapping[CopyId, tuple[str, str, str]],
    ) -> None:
        """Note each announced rewrite of another writer that an announcement of ``latest``
        replaces now (``rows``: ``(state, checksum, writer)`` of the rows there): that
        writer's put may come after the new announcer's commit (see :meth:`overtaken`)."""
        passed = [
            (*i, row[2], row[1])
            for i in claims
            if (c := latest.get(i)) is not None
            and c.state == "in-transit"
            and (row := rows.get(i)) is not None
            and row[0] == "in-transit"
            and row[2]
            and row[2] != c.writer
        ]
        self._executemany(cur, _NOTE_OVERTAKEN, passed)

    def _has_overtaken(self, cur: Cursor, writer: str) -> bool:
        """Whether an announcement of ``writer`` is noted as overtaken: a flush of many
        rewrites deletes notes only where its writer has any (the table holds a note only
        while two writers race on one chunk, so this look is all most flushes pay)."""
        cur.execute(self._sql("SELECT 1 FROM overtaken WHERE writer = ? LIMIT 1"), (writer,))
        return cur.fetchone() is not None

    def overtaken(self) -> list[OvertakenRewrite]:
        rows = self._query(
            "SELECT dataset, key, tier, writer, checksum FROM overtaken "
            "ORDER BY dataset{c}, key{c}, tier{c}, writer{c}"
        )
        return [OvertakenRewrite(*r) for r in rows]

    def clear_overtaken(self, entries: Iterable[OvertakenRewrite]) -> None:
        ids = [(e.dataset, e.key, e.tier, e.writer, e.checksum) for e in entries]
        if not ids:
            return
        with self._write() as cur:
            self._executemany(
                cur,
                "DELETE FROM overtaken WHERE dataset = ? AND key = ? AND tier = ? AND writer = ? "
                "AND checksum = ?",
                ids,
            )

    @staticmethod
    def _keep_chunks_of(
        ids: list[CopyId], chunks: set[tuple[str, str]], kept: list[CopyId]
    ) -> list[CopyId]:
        """``ids`` less the deletes of rows of ``chunks``, which are added to ``kept``."""
        if not chunks:
            return ids
        kept += [i for i in ids if i[:2] in chunks]
        return [i for i in ids if i[:2] not in chunks]

    def _lock_residency(self, cur: Cursor, datasets: Iterable[str]) -> None:
        """Make this transaction's reads of the residency of ``datasets`` stand until it ends
        (no other commit changes those rows meanwhile). SQLite's write lock, taken when the
        transaction begins, already does."""

    def _states_of(self, cur: Cursor, ids: Iterable[CopyId]) -> dict[CopyId, tuple[str, str]]:
        """The ``(state, checksum)`` of the rows of the chunks of ``ids`` (every row of
        those chunks, keyed by its id)."""
        return {
            (d, k, t): (state, checksum)
            for d, k, t, state, checksum, _, _ in self._rows_of(cur, {i[:2] for i in ids})
        }

    def _rows_of(
        self, cur: Cursor, chunks: Iterable[tuple[str, str]]
    ) -> list[tuple[str, str, str, str, str, str, str]]:
        """Every row of the ``(dataset, key)`` chunks, as ``(dataset, key, tier, state,
        checksum, old_checksum, writer)`` (one query per few hundred chunks)."""
        by_dataset: dict[str, list[str]] = {}
        for d, k in chunks:
            by_dataset.setdefault(d, []).append(k)
        found: list[tuple[str, str, str, str, str, str, str]] = []
        for d, keys in by_dataset.items():
            for i in range(0, len(keys), 500):
                part = keys[i : i + 500]
                marks = ", ".join("?" * len(part))
                cur.execute(
                    self._sql(
                        "SELECT dataset, key, tier, state, checksum, old_checksum, writer "
                        "FROM residency "
                        f"WHERE dataset = ? AND key IN ({marks})"
                    ),
                    (d, *part),
                )
                found.extend(tuple(r) for r in cur.fetchall())
        return found

    def _last_rows(
        self,
        cur: Cursor,
        ids: Sequence[CopyId],
        latest: dict[CopyId, ChunkCopy],
        dropped: set[tuple[str, str]],
        writer: str = "",
    ) -> list[CopyId]:
        """Of the rows ``ids`` to delete, those that exist, of chunks not ``dropped``, that
        would leave their chunk without any row once ``latest`` is recorded too; but not
        ``writer``'s own announced rewrites naming no old bytes: withdrawn (their put
        failed), they stand for no value of their chunk."""
        chunks = {(d, k) for d, k, _ in ids} - dropped
        if not chunks:
            return []
        left: dict[tuple[str, str], set[str]] = {c: set() for c in chunks}
        exist: set[CopyId] = set()
        for d, k, t, state, _, old, who in self._rows_of(cur, chunks):
            left[d, k].add(t)
            if not (writer and who == writer and state == "in-transit" and not old):
                exist.add((d, k, t))
        for d, k, t in latest:
            if (d, k) in left:
                left[d, k].add(t)
        for d, k, t in ids:
            if (d, k) in left:
                left[d, k].discard(t)
        return [i for i in ids if i in exist and not left[i[0], i[1]]]

    def _explain_unknown(self, copies: Iterable[ChunkCopy]) -> str:
        datasets = {c.dataset for c in copies}
        tiers = {c.tier for c in copies}
        known_d = {r[0] for r in self._query("SELECT name FROM datasets")}
        known_t = {r[0] for r in self._query("SELECT name FROM tiers")}
        parts = []
        if datasets - known_d:
            parts.append(f"unknown dataset(s) {sorted(datasets - known_d)}")
        if tiers - known_t:
            parts.append(f"unknown tier(s) {sorted(tiers - known_t)}")
        what = " and ".join(parts) or "rows the catalog rejected"
        return f"residency commit to catalog {self._label()} names {what}; nothing was applied"

    def verified_copies(
        self, dataset: str, keys: Iterable[str] | None = None
    ) -> list[VerifiedCopy]:
        select = "SELECT key, tier, checksum, version FROM verified WHERE dataset = ?"
        if keys is None:
            rows = self._query(select, (dataset,))
        else:
            rows = []
            for part, marks in _key_parts(keys):
                rows += self._query(f"{select} AND key IN ({marks})", (dataset, *part))
        return [_as(VerifiedCopy, (k, t, c, _version_of(v))) for k, t, c, v in rows]

    def record_verified(self, dataset: str, copies: Iterable[VerifiedCopy]) -> None:
        rows = sorted(  # (in key order: see commit)
            (dataset, c.key, c.tier, c.checksum, _version_text(c.version)) for c in copies
        )
        if not rows:
            return
        # (advisory rows, each checked again against the copy and its object when used: no
        # fsync of their own; a dataset deleted meanwhile takes none)
        with self._write(durable=False) as cur:
            self._executemany(
                cur,
                "INSERT INTO verified (dataset, key, tier, checksum, version) "
                "SELECT ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM datasets WHERE name = ?) "
                "ON CONFLICT (dataset, key, tier) DO UPDATE SET checksum = excluded.checksum, "
                "version = excluded.version",
                [(*r, dataset) for r in rows],
            )

    def touch(self, dataset: str, keys: Iterable[str], when: float) -> None:
        keys = list(dict.fromkeys(keys))
        if not keys:
            return
        # (access times only order evictions: one lost with the machine costs nothing, so
        # no fsync of the log waits for them)
        with self._write(durable=False) as cur:
            self._bulk_touch(cur, dataset, keys, float(when))

    def usage(self) -> list[TierUsage]:
        rows = self._query(
            "SELECT r.dataset, r.tier, COUNT(*), SUM(r.nbytes) FROM residency r "
            "JOIN tiers t ON t.name = r.tier GROUP BY r.dataset, r.tier, t.ord "
            "ORDER BY r.dataset{c}, t.ord"
        )
        return [TierUsage(d, t, int(n), int(b)) for d, t, n, b in rows]

    # -- writers -------------------------------------------------------------------------

    def register_writer(self) -> str:
        writer = new_writer_id()
        with self._lock:
            self._check_open()
            self._hold_token(writer)
            # (listed before its row is written: a connection lost in between is opened
            # again with its token taken back, as the others', not without it)
            self._writers.append(writer)
            try:
                with self._write() as cur:
                    cur.execute(
                        self._sql(_INSERT_WRITER),
                        (writer, socket.gethostname(), os.getpid(), time.time()),
                    )
            except BaseException:
                self._writers.remove(writer)
                self._release_token(writer)
                raise
        return writer

    def release_writer(self, writer: str) -> None:
        with self._lock:
            if writer not in self._writers:
                return
            self._writers.remove(writer)
            for k in [k for k in self._uses if k[0] == writer]:
                del self._uses[k]
            for k in [k for k in self._lingering if k[0] == writer]:
                del self._lingering[k]  # (its marks go with its rows below)
            self._claims = {k for k in self._claims if k[0] != writer}
            try:
                if not self._closed:
                    with self._write() as cur:
                        cur.execute(
                            self._sql("DELETE FROM writer_datasets WHERE writer = ?"), (writer,)
                        )
                        cur.execute(self._sql("DELETE FROM writers WHERE id = ?"), (writer,))
            finally:
                self._release_token(writer)

    def _writer(self, writer: str | None) -> str | None:
        """``writer`` (default: the first registered here) if registered through this object
        and not released; else None (a mark for it would have no one to release it)."""
        if writer is None:
            return self._writers[0] if self._writers else None
        return writer if writer in self._writers else None

    def use_dataset(self, name: str, writer: str | None = None) -> None:
        with self._lock:
            w = self._writer(writer)
            if w is None:
                return
            self._uses[w, name] += 1
            if self._uses[w, name] > 1:
                return
            if self._lingering.pop((w, name), None) is not None:
                # the mark never went: no claim of another process can have begun since
                # this one last waited them out (it would have seen the mark and given up)
                return
            try:
                self._mark(w, name, evicting=False)
            except BaseException:
                self._uses[w, name] -= 1
                raise
        # (waited out of the lock: an eviction round of this very object must be able to end)
        wait = Backoff(self.EVICTION_WAIT, 0.005, 0.2)
        while evictors := self._other_marks(w, name, evicting_only=True):
            if wait.expired:
                self.unuse_dataset(name, w, linger=False)
                raise BackendError(
                    f"dataset {name!r}: writer {', '.join(sorted(evictors))} has been evicting "
                    f"from it for over {self.EVICTION_WAIT:.0f} s; try again later, or run "
                    "`strataio fsck` if that process is stuck"
                )
            wait.pause()

    def claim_eviction(self, name: str, writer: str | None = None) -> bool:
        with self._lock:
            w = self._writer(writer)
            if w is None:
                return True  # no writers here: nobody else registers either (no marks to see)
            if self._uses[w, name]:
                return False  # open here: evicted from by its own residency, not this way
            # (a mark left lingering here becomes the claim: _mark turns it into one)
            lingering = self._lingering.pop((w, name), None)
            try:
                self._mark(w, name, evicting=True)
            except BaseException:
                if lingering is not None:
                    self._lingering[w, name] = lingering  # (still there: its timer drops it)
                raise
            if self._other_marks(w, name, evicting_only=False):
                self._unmark(w, name)
                return False
            self._uses[w, name] += 1
            self._claims.add((w, name))
            return True

    def release_eviction(self, name: str, writer: str | None = None) -> None:
        self.unuse_dataset(name, writer)  # (a claim never lingers: opens would wait on it)

    def _mark(self, writer: str, name: str, *, evicting: bool) -> None:
        """Insert ``writer``'s mark on dataset ``name`` (or set whether an existing one is a
        claim), committed before this returns.

        Marks (and their removal) are committed without waiting for the disk: every process
        sees them at once, and only a live writer's mark counts (:meth:`_other_marks`), so
        one lost with the machine, its writer gone with it, was never needed. A durable
        commit cost an fsync of the log at every open and close of a dataset (0.35 ms)."""
        with self._write(durable=False) as cur:
            cur.execute(self._sql(_MARK_DATASET), (writer, name, int(evicting)))

    def _unmark(self, writer: str, name: str) -> None:
        with self._write(durable=False) as cur:  # (see _mark)
            cur.execute(
                self._sql("DELETE FROM writer_datasets WHERE writer = ? AND dataset = ?"),
                (writer, name),
            )

    def _other_marks(self, writer: str, name: str, *, evicting_only: bool) -> set[str]:
        """Live writers other than ``writer`` with a mark on dataset ``name`` (only evicting
        marks with ``evicting_only``); a dead writer's leftover mark is not counted."""
        extra = " AND evicting = 1" if evicting_only else ""
        with self._lock:
            rows = self._query(
                f"SELECT writer FROM writer_datasets WHERE dataset = ? AND writer <> ?{extra}",
                (name, writer),
            )
            return self._live_tokens([r[0] for r in rows]) if rows else set()

    def unuse_dataset(self, name: str, writer: str | None = None, *, linger: bool = True) -> None:
        with self._lock:
            w = self._writer(writer)
            if w is None or self._uses[w, name] <= 0:
                return
            self._uses[w, name] -= 1
            if self._uses[w, name]:
                return
            del self._uses[w, name]
            claim = (w, name) in self._claims
            self._claims.discard((w, name))
            if linger and not claim and self.MARK_LINGER_S > 0:
                self._lingering[w, name] = time.monotonic() + self.MARK_LINGER_S
                if self._linger_timer is None:
                    self._linger_after(self.MARK_LINGER_S)
            else:
                self._unmark(w, name)

    def _linger_after(self, seconds: float) -> None:
        """Run :meth:`end_lingering` in ``seconds`` on a timer thread (caller holds the lock)."""
        timer = self._linger_timer = threading.Timer(max(seconds, 0.0), self._lingering_due)
        timer.daemon = True
        timer.start()

    def _lingering_due(self) -> None:
        with self._lock:
            self._linger_timer = None
            if self._closed:
                return
            with contextlib.suppress(StrataError):
                self.end_lingering(due_only=True)
            if self._lingering and self._linger_timer is None:
                self._linger_after(min(self._lingering.values()) - time.monotonic())

    def end_lingering(self, *, due_only: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            for key, due in sorted(self._lingering.items()):
                if due_only and due > now:
                    continue
                self._unmark(*key)  # (if this fails, the mark stays listed: tried again)
                del self._lingering[key]
            if not self._lingering and self._linger_timer is not None:
                self._linger_timer.cancel()
                self._linger_timer = None

    def lingering_marks(self) -> set[tuple[str, str]]:
        with self._lock:
            return set(self._lingering)

    def writers(self) -> list[WriterRecord]:
        with self._lock:
            rows = self._query("SELECT id, host, pid, started FROM writers ORDER BY id{c}")
            uses = self._query("SELECT writer, dataset FROM writer_datasets ORDER BY dataset{c}")
            alive = self._live_tokens([r[0] for r in rows])
        datasets: dict[str, list[str]] = {}
        for w, d in uses:
            datasets.setdefault(w, []).append(d)
        return [
            WriterRecord(i, h, int(p), float(t), i in alive, tuple(datasets.get(i, ())))
            for i, h, p, t in rows
        ]

    def alive(self, writers: Iterable[str]) -> set[str]:
        ids = [w for w in dict.fromkeys(writers) if w]
        return self._live_tokens(ids) if ids else set()

    def forget_writers(self, writers: Iterable[str]) -> None:
        ids = [w for w in dict.fromkeys(writers) if w not in self._writers]
        if not ids:
            return
        with self._write() as cur:
            self._executemany(
                cur, "DELETE FROM writer_datasets WHERE writer = ?", [(w,) for w in ids]
            )
            self._executemany(cur, "DELETE FROM writers WHERE id = ?", [(w,) for w in ids])
        self._forget_tokens(ids)

    # -- performance database ------------------------------------------------------------

    def record_perf(self, rows: Iterable[PerfRow]) -> None:
        data = [
            (
                p.tier, p.op, int(p.nbytes), float(p.seconds), int(p.concurrency),
                float(p.when), p.settings,
            )
            for p in rows
        ]  # fmt: skip
        if not data:
            return
        with self._write() as cur:
            self._bulk_perf(cur, data)

    def perf_rows(self, tier: str | None = None) -> list[PerfRow]:
        cols = "tier, op, nbytes, seconds, concurrency, measured_at, settings"
        if tier is None:
            rows = self._query(f"SELECT {cols} FROM perf ORDER BY measured_at, id")
        else:
            rows = self._query(
                f"SELECT {cols} FROM perf WHERE tier = ? ORDER BY measured_at, id", (tier,)
            )
        return [PerfRow(*r) for r in rows]

    # -- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                for w in list(self._writers):
                    with contextlib.suppress(Exception):
                        self.release_writer(w)
                if self._linger_timer is not None:
                    self._linger_timer.cancel()
                    self._linger_timer = None
                self._closed = True
                self._disconnect()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"schema v{self.schema_version}"
        return f"{type(self).__name__}({self._label()!r}, {state})"


def _changed_since(
    row: tuple[str, str] | None, expected: tuple[str, str] | None, superseded: bool
) -> bool:
    """Whether a row to delete, now ``(state, checksum)`` (None: gone), is no longer the one
    its deleter saw (``expected``; None: it saw none): another process rewrote, replaced,
    announced or dropped that copy since, and its object may be that process's. A row of a
    chunk the same commit supersedes goes anyway (the write is newer), but another writer's
    announced rewrite."""
    if row is None:
        return expected is not None  # (its object may be a put not recorded yet)
    if superseded:
        return row[0] == "in-transit" and row != expected
    return row != expected


def _key_parts(keys: Iterable[str]) -> Iterator[tuple[list[str], str]]:
    """``keys`` (each once, sorted) in parts of at most 500, each with its ``?`` marks: the
    parts of an ``IN (...)`` list (SQLite allows 32 766 parameters, older builds 999)."""
    wanted = sorted(set(keys))
    for i in range(0, len(wanted), 500):
        part = wanted[i : i + 500]
        yield part, ", ".join("?" * len(part))
